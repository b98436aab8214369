// Python bindings for geomkern._C. Kernels live in csrc/cpu/ (and csrc/cuda/ later); this file
// only declares and binds them.
#include <torch/extension.h>

#include "ops.h"

static std::vector<std::string> devices() {
  return {"cpu"};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "geomkern native kernels (CPU C++/OpenMP)";
  m.def("devices", &devices, "device types the compiled kernels run on");
  m.def("num_threads", &geomkern::num_threads, "OpenMP threads the kernels use");
  m.def("cpu_isa", &geomkern::cpu_isa, "widest x86 vector extension the CPU kernels were built for");
  m.def("preimage_gd", &geomkern::preimage_gd_cpu,
        "fused gradient-descent pre-image loop (all steps in one call)", py::arg("Z0"),
        py::arg("B"), py::arg("T"), py::arg("gamma"), py::arg("steps"), py::arg("lr"),
        py::call_guard<py::gil_scoped_release>());
  m.def("preimage_fixed_point", &geomkern::preimage_fixed_point_cpu,
        "fused fixed-point (Mika et al.) pre-image loop (all steps in one call)", py::arg("Z0"),
        py::arg("B"), py::arg("A"), py::arg("gamma"), py::arg("steps"),
        py::call_guard<py::gil_scoped_release>());
}
