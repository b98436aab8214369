#pragma once
// torch's stable ABI only (stable.h): the kernel sources include this, each compiled once per
// instruction-set variant (bindings: geomkern.cpp).
#include "stable.h"

#include <string>
#include <vector>

namespace geomkern {
// csrc/cpu/isa.cpp: the instruction-set variant of the hot kernels below that runs (picked at
// load: the widest this CPU supports): "avx512f", "avx2+fma" or "baseline" (x86-64); a build
// with GEOMKERN_NATIVE_ARCH=1 or for another architecture has one variant, named after its
// compile-time target: "avx512f", "avx2+fma", "avx", "sse2" or "generic".
std::string cpu_isa();
// The variants in this library, widest first; runnable_only: those this CPU supports.
std::vector<std::string> cpu_isas(bool runnable_only);
// Runs the variant named isa from now on; an error naming the ones this CPU runs when it is not
// one of them (the Python loader checks the name first and raises ValueError).
void select_cpu_isa(const std::string& isa);

// The hot kernels: each calls its copy in the selected variant (isa.cpp), which is defined with
// this signature in namespace geomkern::<variant> by the source named.
// csrc/cpu/preimage.cpp: fused pre-image loops, same math as geomkern/ops/preimage.py
Tensor preimage_gd_cpu(const Tensor& Z0, const Tensor& B, const Tensor& T,
                           double gamma, int64_t steps, const Tensor& lr);
Tensor preimage_fixed_point_cpu(const Tensor& Z0, const Tensor& B, const Tensor& A,
                                    double gamma, int64_t steps);
// csrc/cpu/preimage_span.cpp: the same two loops iterated in span(z0, B) (one S x S product per
// step instead of two S x D ones; the native default where S <= D)
Tensor preimage_gd_span_cpu(const Tensor& Z0, const Tensor& B, const Tensor& T,
                                double gamma, int64_t steps, const Tensor& lr);
Tensor preimage_fixed_point_span_cpu(const Tensor& Z0, const Tensor& B,
                                         const Tensor& A, double gamma, int64_t steps);
// csrc/cpu/rbf.cpp: K(X, Y) V tiled, K never stored; and K(X, Y) itself (Y None: the symmetric
// K(X, X) from the tiles on and above its diagonal), tiles in one parallel region
Tensor rbf_matmul_cpu(const Tensor& X, const Tensor& Y, const Tensor& V, double gamma);
Tensor rbf_gram_cpu(const Tensor& X, const std::optional<Tensor>& Y, double gamma);
// csrc/cpu/kmeans.cpp: greedy k-means++ per set (one splitmix64 stream per seed and set), and
// Lloyd per set from given centres, each set stopping on its own;
// returns labels (N,), centers (m, k, D), assignment passes per set (m,) and the inertia per set
// (m,) float64, from exact squared distances
Tensor kmeanspp_cpu(const Tensor& X, const Tensor& offsets, int64_t k, int64_t seed);
std::tuple<Tensor, Tensor, Tensor, Tensor> kmeans_lloyd_cpu(const Tensor& X, const Tensor& offsets,
                                         const Tensor& centers, int64_t iters);
}  // namespace geomkern
