// geomkern._C's operators, registered with torch through its stable ABI (csrc/stable.h) in the
// namespace torch.ops.geomkern_native; geomkern/backends/native loads the library and calls
// them. Kernels live in csrc/cpu/ (the CUDA ones, geomkern._C_cuda, in csrc/cuda/ with their
// bindings in csrc/cuda_bindings/); this file only registers them. No Python C API: the library
// is the same for every Python >= 3.10 and every torch >= 2.10.
#include <string>
#include <tuple>
#include <vector>

#include "ops.h"

namespace {

using geomkern::Tensor;

// The boxed signatures take their arguments by value (TORCH_BOX unboxes into them).
std::string cpu_isa() { return geomkern::cpu_isa(); }
std::vector<std::string> cpu_isas(bool runnable_only) { return geomkern::cpu_isas(runnable_only); }
void select_cpu_isa(std::string isa) { geomkern::select_cpu_isa(isa); }
Tensor preimage_gd(Tensor Z0, Tensor B, Tensor T, double gamma, int64_t steps, Tensor lr) {
  return geomkern::preimage_gd_cpu(Z0, B, T, gamma, steps, lr);
}
Tensor preimage_fixed_point(Tensor Z0, Tensor B, Tensor A, double gamma, int64_t steps) {
  return geomkern::preimage_fixed_point_cpu(Z0, B, A, gamma, steps);
}
Tensor preimage_gd_span(Tensor Z0, Tensor B, Tensor T, double gamma, int64_t steps, Tensor lr) {
  return geomkern::preimage_gd_span_cpu(Z0, B, T, gamma, steps, lr);
}
Tensor preimage_fixed_point_span(Tensor Z0, Tensor B, Tensor A, double gamma, int64_t steps) {
  return geomkern::preimage_fixed_point_span_cpu(Z0, B, A, gamma, steps);
}
Tensor rbf_gram(Tensor X, std::optional<Tensor> Y, double gamma) {
  return geomkern::rbf_gram_cpu(X, Y, gamma);
}
Tensor rbf_matmul(Tensor X, Tensor Y, Tensor V, double gamma) {
  return geomkern::rbf_matmul_cpu(X, Y, V, gamma);
}
Tensor kmeanspp(Tensor X, Tensor offsets, int64_t k, int64_t seed) {
  return geomkern::kmeanspp_cpu(X, offsets, k, seed);
}
std::tuple<Tensor, Tensor, Tensor, Tensor> kmeans_lloyd(Tensor X, Tensor offsets, Tensor centers,
                                                        int64_t iters) {
  return geomkern::kmeans_lloyd_cpu(X, offsets, centers, iters);
}

}  // namespace

STABLE_TORCH_LIBRARY(geomkern_native, m) {
  // the instruction-set variant of the CPU kernels that runs: 'avx512f', 'avx2+fma' or 'baseline'
  m.def("cpu_isa() -> str");
  // the variants in this library, widest first (runnable_only: those this CPU supports)
  m.def("cpu_isas(bool runnable_only=True) -> str[]");
  // run the named variant from now on (the loader calls it for GEOMKERN_CPU_ISA)
  m.def("select_cpu_isa(str isa) -> ()");
  // fused pre-image loops (all steps in one call), and the same iterated in span(z0, B)
  m.def("preimage_gd(Tensor Z0, Tensor B, Tensor T, float gamma, int steps, Tensor lr) -> Tensor");
  m.def("preimage_fixed_point(Tensor Z0, Tensor B, Tensor A, float gamma, int steps) -> Tensor");
  m.def("preimage_gd_span(Tensor Z0, Tensor B, Tensor T, float gamma, int steps, Tensor lr) -> Tensor");
  m.def("preimage_fixed_point_span(Tensor Z0, Tensor B, Tensor A, float gamma, int steps) -> Tensor");
  // K(X, Y) in tiles (Y None: symmetric, from the tiles on and above the diagonal); K(X, Y) V,
  // K never stored
  m.def("rbf_gram(Tensor X, Tensor? Y, float gamma) -> Tensor");
  m.def("rbf_matmul(Tensor X, Tensor Y, Tensor V, float gamma) -> Tensor");
  // greedy k-means++ centres (m, k, D) for every set, deterministic for a seed; Lloyd per set from
  // given centres: labels, centers, passes and the inertia per set
  m.def("kmeanspp(Tensor X, Tensor offsets, int k, int seed) -> Tensor");
  m.def("kmeans_lloyd(Tensor X, Tensor offsets, Tensor centers, int iters) -> (Tensor, Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(geomkern_native, CPU, m) {
  m.impl("preimage_gd", TORCH_BOX(&preimage_gd));
  m.impl("preimage_fixed_point", TORCH_BOX(&preimage_fixed_point));
  m.impl("preimage_gd_span", TORCH_BOX(&preimage_gd_span));
  m.impl("preimage_fixed_point_span", TORCH_BOX(&preimage_fixed_point_span));
  m.impl("rbf_gram", TORCH_BOX(&rbf_gram));
  m.impl("rbf_matmul", TORCH_BOX(&rbf_matmul));
  m.impl("kmeanspp", TORCH_BOX(&kmeanspp));
  m.impl("kmeans_lloyd", TORCH_BOX(&kmeans_lloyd));
}

// no tensor arguments: no device to dispatch on
STABLE_TORCH_LIBRARY_IMPL(geomkern_native, CompositeExplicitAutograd, m) {
  m.impl("cpu_isa", TORCH_BOX(&cpu_isa));
  m.impl("cpu_isas", TORCH_BOX(&cpu_isas));
  m.impl("select_cpu_isa", TORCH_BOX(&select_cpu_isa));
}
