// What the two native pre-image kernels share: the direct one (preimage.cpp) and the span one
// (preimage_span.cpp). One entry-point body (argument checks, contiguous inputs, the tile-width
// dispatch), the packing of B into the panels both read, and the kernel-value weight both apply.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops.h"
#include "simd.h"  // last: the instruction-set region starts here (isa.h)

namespace geomkern {
namespace GEOMKERN_ISA_NS {
namespace preimage {

enum class Method { GD, FixedPoint };

// Shared argument checks of the pre-image entry points (Z0 (b, D), B (S, D), C (b, S), one dtype);
// preimage.cpp.
void check_preimage_inputs(const char* op, const Tensor& Z0, const Tensor& B, const Tensor& C,
                           const char* cname);

// One call's inputs, contiguous, as the entry point hands them to a kernel.
template <typename T>
struct Inputs {
  int64_t b, S, D, steps;
  T gamma;
  T tiny;          // fixed point: keep z where |sum w| <= sqrt(finfo.tiny)
  const T* Z0;     // (b, D)
  const T* B;      // (S, D)
  const T* coef;   // (b, S): targets T (gd) or expansion coefficients A (fixed point)
  const T* lr;     // (b,) gd only
  T* out;          // (b, D)
  int nthreads;    // torch's thread count at the call: the tile width's and the loops'
};

// The body of every pre-image entry point: checks the arguments (errors name op), then runs
// Kernel<T, PV, kNB, M>::run(inputs) with the tile width PV simd::tile_width picks. C is the
// targets T (gd) or the coefficients A (fixed point); lr is given for gd only. steps = 0 returns
// a copy of Z0, bit for bit (-0 kept).
template <Method M, template <typename, int, int, Method> class Kernel>
Tensor run_entry(const char* op, const Tensor& Z0_, const Tensor& B_, const Tensor& C_,
                 double gamma, int64_t steps, const Tensor* lr_) {
  check_preimage_inputs(op, Z0_, B_, C_, M == Method::GD ? "T" : "A");
  GK_CHECK_VALUE(steps >= 0, op, ": steps must be >= 0, got ", steps);
  GK_CHECK_VALUE(gamma > 0, op, ": gamma must be > 0, got ", gamma);
  if (M == Method::GD) {
    GK_CHECK_TYPE(lr_->scalar_type() == Z0_.scalar_type(), op, ": lr must have Z0's dtype");
    GK_CHECK_VALUE(lr_->is_cpu() && lr_->dim() == 1 && lr_->size(0) == Z0_.size(0), op,
             ": lr must be a CPU tensor of shape (b,) = (", Z0_.size(0), ",)");
  }
  auto Z0 = st::contiguous(Z0_), B = st::contiguous(B_), C = st::contiguous(C_);
  std::optional<Tensor> lr;
  if (M == Method::GD) lr = st::contiguous(*lr_);
  if (Z0.numel() == 0 || steps == 0) return st::clone(Z0);
  auto out = torch::stable::empty_like(Z0);
  st::dispatch_floating(Z0, [&](auto tag) {
    using scalar_t = decltype(tag);
    Inputs<scalar_t> in{};
    in.b = Z0.size(0); in.S = B.size(0); in.D = B.size(1); in.steps = steps;
    in.gamma = static_cast<scalar_t>(gamma);
    in.tiny = std::sqrt(std::numeric_limits<scalar_t>::min());
    in.Z0 = Z0.const_data_ptr<scalar_t>(); in.B = B.const_data_ptr<scalar_t>();
    in.coef = C.const_data_ptr<scalar_t>(); in.out = out.mutable_data_ptr<scalar_t>();
    if (M == Method::GD) in.lr = lr->const_data_ptr<scalar_t>();
    in.nthreads = std::max(1, st::num_threads());
    simd::dispatch_width<scalar_t>(in.b, in.nthreads, [&](auto pv) {
      Kernel<scalar_t, decltype(pv)::value, simd::kNB, M>::run(in);
    });
  });
  return out;
}

// B (S, D) packed once per call, on nthreads threads, into the two panel orders the kernels
// read sequentially: rows [S/NB blocks][D][NB] (zero rows past S) and cols [D/NB blocks][S][NB]
// (zero columns past D).
template <typename T, int NB>
struct Panels {
  std::vector<T> rows, cols;
  Panels(const T* B, int64_t S, int64_t D, int nthreads)
      : rows(static_cast<size_t>((S + NB - 1) / NB * D * NB), T(0)),
        cols(static_cast<size_t>((D + NB - 1) / NB * S * NB), T(0)) {
    const int64_t nblk2 = (D + NB - 1) / NB;
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static) nowait
      for (int64_t s = 0; s < S; ++s) {
        const T* row = B + s * D;
        T* dst = rows.data() + (s / NB) * D * NB + s % NB;
        for (int64_t d = 0; d < D; ++d) dst[d * NB] = row[d];
      }
#pragma omp for schedule(static) nowait
      for (int64_t blk = 0; blk < nblk2; ++blk) {
        const int64_t d0 = blk * NB, nj = std::min<int64_t>(NB, D - d0);
        T* dst = cols.data() + blk * S * NB;
        for (int64_t s = 0; s < S; ++s)
          for (int64_t j = 0; j < nj; ++j) dst[s * NB + j] = B[s * D + d0 + j];
      }
    }
  }
};

// The weight of one kernel value, per lane: k = exp(-gamma d2) with d2 (a squared distance)
// clamped at 0 against roundoff (NaN passes through), w = (k - c) k for gd (c the target) or
// c k for the fixed point (c the coefficient).
template <Method M, typename V>
inline V weight(V d2, V neg_gamma, V c) {
  d2 = d2 < V{} ? V{} : d2;
  const V k = simd::vexp(neg_gamma * d2);
  return M == Method::GD ? (k - c) * k : c * k;
}

}  // namespace preimage
}  // namespace GEOMKERN_ISA_NS
}  // namespace geomkern
