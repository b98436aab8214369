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
}
