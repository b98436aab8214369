#pragma once
#include <torch/extension.h>

namespace geomkern {
int num_threads();
// Widest x86 vector extension the CPU kernels were compiled for (setup.py: -march=native unless
// GEOMKERN_PORTABLE=1): "avx512f", "avx2+fma", "avx", "sse2" or "generic".
std::string cpu_isa();

// csrc/cpu/preimage.cpp: fused pre-image loops, same math as geomkern/ops/preimage.py
at::Tensor preimage_gd_cpu(const at::Tensor& Z0, const at::Tensor& B, const at::Tensor& T,
                           double gamma, int64_t steps, const at::Tensor& lr);
at::Tensor preimage_fixed_point_cpu(const at::Tensor& Z0, const at::Tensor& B, const at::Tensor& A,
                                    double gamma, int64_t steps);
// Shared argument checks of the pre-image entry points (Z0 (b, D), B (S, D), C (b, S), one dtype).
void check_preimage_inputs(const char* op, const at::Tensor& Z0, const at::Tensor& B,
                           const at::Tensor& C, const char* cname);
// csrc/cpu/preimage_span.cpp: the same two loops iterated in span(z0, B) (one S x S product per
// step instead of two S x D ones; the native default where S <= D)
at::Tensor preimage_gd_span_cpu(const at::Tensor& Z0, const at::Tensor& B, const at::Tensor& T,
                                double gamma, int64_t steps, const at::Tensor& lr);
at::Tensor preimage_fixed_point_span_cpu(const at::Tensor& Z0, const at::Tensor& B,
                                         const at::Tensor& A, double gamma, int64_t steps);
// csrc/cpu/rbf.cpp: K(X, Y) V tiled, K never stored
at::Tensor rbf_matmul_cpu(const at::Tensor& X, const at::Tensor& Y, const at::Tensor& V, double gamma);
// csrc/cpu/kmeans.cpp: greedy k-means++ per set (one splitmix64 stream per seed and set), and
// Lloyd per set from given centres, each set stopping on its own;
// returns labels (N,), centers (m, k, D), assignment passes per set (m,) and the inertia per set
// (m,) float64, from exact squared distances
at::Tensor kmeanspp_cpu(const at::Tensor& X, const at::Tensor& offsets, int64_t k, int64_t seed);
std::vector<at::Tensor> kmeans_lloyd_cpu(const at::Tensor& X, const at::Tensor& offsets,
                                         const at::Tensor& centers, int64_t iters);
}  // namespace geomkern
