// Python bindings for geomkern._C. Kernels live in csrc/cpu/ (the CUDA ones, geomkern._C_cuda, in
// csrc/cuda/ with their bindings in csrc/cuda_bindings/); this file only binds them.
#include <torch/extension.h>

#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "geomkern native kernels (CPU C++/OpenMP)";
  m.def("cpu_isa", &geomkern::cpu_isa,
        "the instruction-set variant of the CPU kernels that runs: 'avx512f', 'avx2+fma' or 'baseline'");
  m.def("cpu_isas", &geomkern::cpu_isas,
        "the variants in this library, widest first (runnable_only: those this CPU supports)",
        py::arg("runnable_only") = true);
  m.def("select_cpu_isa", &geomkern::select_cpu_isa,
        "run the named variant from now on (the loader calls it for GEOMKERN_CPU_ISA); ValueError "
        "naming the variants this CPU runs if it is not one of them",
        py::arg("isa"));
  m.def("preimage_gd", &geomkern::preimage_gd_cpu,
        "fused gradient-descent pre-image loop (all steps in one call)", py::arg("Z0"),
        py::arg("B"), py::arg("T"), py::arg("gamma"), py::arg("steps"), py::arg("lr"),
        py::call_guard<py::gil_scoped_release>());
  m.def("preimage_fixed_point", &geomkern::preimage_fixed_point_cpu,
        "fused fixed-point (Mika et al.) pre-image loop (all steps in one call)", py::arg("Z0"),
        py::arg("B"), py::arg("A"), py::arg("gamma"), py::arg("steps"),
        py::call_guard<py::gil_scoped_release>());
  m.def("preimage_gd_span", &geomkern::preimage_gd_span_cpu,
        "preimage_gd iterated in span(z0, B): one S x S product per step", py::arg("Z0"),
        py::arg("B"), py::arg("T"), py::arg("gamma"), py::arg("steps"), py::arg("lr"),
        py::call_guard<py::gil_scoped_release>());
  m.def("preimage_fixed_point_span", &geomkern::preimage_fixed_point_span_cpu,
        "preimage_fixed_point iterated in span(B): one S x S product per step", py::arg("Z0"),
        py::arg("B"), py::arg("A"), py::arg("gamma"), py::arg("steps"),
        py::call_guard<py::gil_scoped_release>());
  m.def("rbf_gram", &geomkern::rbf_gram_cpu,
        "K(X, Y) in tiles (Y None: symmetric, from the tiles on and above the diagonal)",
        py::arg("X"), py::arg("Y"), py::arg("gamma"), py::call_guard<py::gil_scoped_release>());
  m.def("rbf_matmul", &geomkern::rbf_matmul_cpu, "K(X, Y) V, tiled, K never stored",
        py::arg("X"), py::arg("Y"), py::arg("V"), py::arg("gamma"),
        py::call_guard<py::gil_scoped_release>());
  m.def("kmeanspp", &geomkern::kmeanspp_cpu,
        "greedy k-means++ centres (m, k, D) for every set, deterministic for a seed",
        py::arg("X"), py::arg("offsets"), py::arg("k"), py::arg("seed"),
        py::call_guard<py::gil_scoped_release>());
  m.def("kmeans_lloyd", &geomkern::kmeans_lloyd_cpu,
        "Lloyd iterations per set from given centres, each set stopping when its labels are stable; "
        "returns labels, centers, passes and the inertia per set",
        py::arg("X"), py::arg("offsets"), py::arg("centers"), py::arg("iters"),
        py::call_guard<py::gil_scoped_release>());
}
