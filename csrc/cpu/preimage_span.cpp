// The pre-image loops of csrc/cpu/preimage.cpp iterated in span(z0, B) (benchmarks/NOTES.md §8,
// §13): every gd step moves z by a combination of z and the basis rows, so
//   z_t = a_t z0 + sum_s C_t[s] b_s      (a scalar a_t and S coefficients C_t per point),
// and with P = <z0, b_s> and G = B B^T made once per call
//   <z, b_s> = a P_s + (G C)_s,   |z|^2 = a^2 |z0|^2 + 2 a <C, P> + <C, G C>.
// A step is then one S x S product (Q = G C) plus elementwise work over S, instead of the two
// S x D products of the direct form: half the flops at S = D, less where S < D. The fixed
// point is the same with a = 0 after its first step (z = C B, C = w / sum w).
//
// Per tile of P points (transposed, points in the SIMD lanes, as in preimage.cpp):
//   once     Pt = B z0 (the phase-1 panels of the direct kernel), |z0|^2
//   per step Q = G C, <C, P>, <C, Q> (one panel product over G), then k, w, sum_s w, then C, a
//   once     z = a z0 + B^T C (the phase-2 panels of the direct kernel)
// G is accumulated in double (once per call); every sum runs in a fixed order whatever the tile
// width, so the result does not depend on the thread count.
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops.h"
#include "simd.h"

namespace geomkern {
namespace {

using namespace simd;

enum class Method { GD, FixedPoint };

template <typename T>
struct SpanProblem {
  int64_t b, S, D, steps;
  T gamma, tiny;
  const T* Z0;    // (b, D)
  const T* coef;  // (b, S): targets (gd) or expansion coefficients (fixed point)
  const T* lr;    // (b,) gd only
  const T* Bp1;   // B packed [S/NB][D][NB] (rows past S zero): P = B z0
  const T* Bp2;   // B packed [D/NB][S][NB] (columns past D zero): B^T C
  const T* Gp;    // G packed [S/NB][S][NB] (rows past S zero)
  const T* bn;    // (S,) |b_s|^2
  T* out;         // (b, D)
};

template <typename T, int PV, int NB, Method M>
struct SpanKernel {
  using V = vec_t<T>;
  static constexpr int L = kVecBytes / sizeof(T);
  static constexpr int P = PV * L;

  // scratch per thread, in vectors: Zt [D][PV], Pt, Ct, Tt, Qt [S][PV]
  static int64_t scratch(int64_t S, int64_t D) { return (D + 4 * S) * PV; }

  static void run_tile(const SpanProblem<T>& pr, int64_t p0, V* base) {
    const int64_t S = pr.S, D = pr.D;
    const int64_t np = std::min<int64_t>(P, pr.b - p0);
    V* __restrict Zt = base;
    V* __restrict Pt = Zt + D * PV;
    V* __restrict Ct = Pt + S * PV;
    V* __restrict Tt = Ct + S * PV;
    V* __restrict Qt = Tt + S * PV;
    T* Zs = reinterpret_cast<T*>(Zt);
    T* Ts = reinterpret_cast<T*>(Tt);
    alignas(64) T steps_s[P];
    for (int64_t p = 0; p < P; ++p) {  // lanes past the last point: z = 0, target 0, step 0
      const bool real = p < np;
      for (int64_t d = 0; d < D; ++d) Zs[d * P + p] = real ? pr.Z0[(p0 + p) * D + d] : T(0);
      for (int64_t s = 0; s < S; ++s) Ts[s * P + p] = real ? pr.coef[(p0 + p) * S + s] : T(0);
      steps_s[p] = (M == Method::GD && real) ? T(4) * pr.gamma * pr.lr[p0 + p] : T(0);
    }
    V zz0[PV], a[PV], stp[PV];
    for (int v = 0; v < PV; ++v) {
      zz0[v] = V{};
      a[v] = splat<V>(T(1));
      for (int l = 0; l < L; ++l) stp[v][l] = steps_s[v * L + l];
    }
    for (int64_t d = 0; d < D; ++d)
      for (int v = 0; v < PV; ++v) zz0[v] += Zt[d * PV + v] * Zt[d * PV + v];
    const int64_t nblkS = (S + NB - 1) / NB, nblkD = (D + NB - 1) / NB;
    for (int64_t blk = 0; blk < nblkS; ++blk) {  // P = B z0
      V acc[NB][PV] = {};
      panel_product<T, PV, NB>(pr.Bp1 + blk * D * NB, Zt, D, acc);
      const int ni = static_cast<int>(std::min<int64_t>(NB, S - blk * NB));
      for (int i = 0; i < ni; ++i)
        for (int v = 0; v < PV; ++v) Pt[(blk * NB + i) * PV + v] = acc[i][v];
    }
    for (int64_t i = 0; i < S * PV; ++i) Ct[i] = V{};

    const V neg_gamma = splat<V>(-pr.gamma);
    for (int64_t it = 0; it < pr.steps; ++it) {
      // Q = G C with <C, P> and <C, Q> (C = 0 at the first step: skip the product)
      V cp[PV] = {}, cq[PV] = {};
      if (it > 0 || M == Method::FixedPoint) {
        for (int64_t blk = 0; blk < nblkS; ++blk) {
          V acc[NB][PV] = {};
          if (it > 0) panel_product<T, PV, NB>(pr.Gp + blk * S * NB, Ct, S, acc);
          const int ni = static_cast<int>(std::min<int64_t>(NB, S - blk * NB));
          for (int i = 0; i < ni; ++i) {
            const int64_t s = blk * NB + i;
            for (int v = 0; v < PV; ++v) {
              const V c = Ct[s * PV + v];
              Qt[s * PV + v] = acc[i][v];
              cp[v] += c * Pt[s * PV + v];
              cq[v] += c * acc[i][v];
            }
          }
        }
      } else {
        for (int64_t i = 0; i < S * PV; ++i) Qt[i] = V{};
      }
      // kernel values and weights (w overwrites Q), sum_s w
      V sw[PV] = {};
      for (int v = 0; v < PV; ++v) {
        const V zz = (a[v] * a[v]) * zz0[v] + (T(2) * a[v]) * cp[v] + cq[v];
        for (int64_t s = 0; s < S; ++s) {
          const V zb = a[v] * Pt[s * PV + v] + Qt[s * PV + v];
          V d2 = (zz + pr.bn[s]) - T(2) * zb;
          d2 = d2 < V{} ? V{} : d2;  // clamp roundoff at 0; NaN passes through
          const V k = vexp(neg_gamma * d2);
          const V c = Tt[s * PV + v];
          const V w = M == Method::GD ? (k - c) * k : c * k;
          Qt[s * PV + v] = w;
          sw[v] += w;
        }
      }
      // the step: gd z <- (1 + step sum w) z - step w B; fixed point z <- w B / sum w
      for (int v = 0; v < PV; ++v) {
        if (M == Method::GD) {
          const V f = T(1) + stp[v] * sw[v];
          a[v] = a[v] * f;
          for (int64_t s = 0; s < S; ++s)
            Ct[s * PV + v] = Ct[s * PV + v] * f - stp[v] * Qt[s * PV + v];
        } else {
          const V mag = sw[v] < V{} ? -sw[v] : sw[v];
          const auto ok = mag > pr.tiny;  // a vanishing denominator: keep the iterate
          const V den = ok ? sw[v] : splat<V>(T(1));
          a[v] = ok ? V{} : a[v];
          for (int64_t s = 0; s < S; ++s)
            Ct[s * PV + v] = ok ? Qt[s * PV + v] / den : Ct[s * PV + v];
        }
      }
    }
    // z = a z0 + B^T C
    for (int64_t blk = 0; blk < nblkD; ++blk) {
      V acc[NB][PV] = {};
      panel_product<T, PV, NB>(pr.Bp2 + blk * S * NB, Ct, S, acc);
      const int nj = static_cast<int>(std::min<int64_t>(NB, D - blk * NB));
      for (int j = 0; j < nj; ++j) {
        V* zrow = Zt + (blk * NB + j) * PV;
        for (int v = 0; v < PV; ++v) zrow[v] = a[v] * zrow[v] + acc[j][v];
      }
    }
    for (int64_t p = 0; p < np; ++p)
      for (int64_t d = 0; d < D; ++d) pr.out[(p0 + p) * D + d] = Zs[d * P + p];
  }

  static void run(SpanProblem<T> pr, const T* B) {
    const int64_t S = pr.S, D = pr.D;
    const int64_t nblkS = (S + NB - 1) / NB, nblkD = (D + NB - 1) / NB;
    std::vector<T> Bp1(static_cast<size_t>(nblkS * D * NB), T(0));
    std::vector<T> Bp2(static_cast<size_t>(nblkD * S * NB), T(0));
    std::vector<T> Gp(static_cast<size_t>(nblkS * S * NB), T(0));
    std::vector<T> bn(static_cast<size_t>(S));
    const int nt = std::max(1, at::get_num_threads());
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static) nowait
      for (int64_t s = 0; s < S; ++s) {
        const T* row = B + s * D;
        T* dst = Bp1.data() + (s / NB) * D * NB + s % NB;
        for (int64_t d = 0; d < D; ++d) dst[d * NB] = row[d];
      }
#pragma omp for schedule(static) nowait
      for (int64_t blk = 0; blk < nblkD; ++blk) {
        const int64_t d0 = blk * NB, nj = std::min<int64_t>(NB, D - d0);
        T* dst = Bp2.data() + blk * S * NB;
        for (int64_t s = 0; s < S; ++s)
          for (int64_t j = 0; j < nj; ++j) dst[s * NB + j] = B[s * D + d0 + j];
      }
      // G = B B^T in double, each entry by one thread in one order (thread-count independent)
#pragma omp for schedule(dynamic, 4)
      for (int64_t s = 0; s < S; ++s) {
        const T* x = B + s * D;
        for (int64_t t = 0; t <= s; ++t) {
          const T* y = B + t * D;
          double acc[4] = {0, 0, 0, 0};
          int64_t d = 0;
          for (; d + 4 <= D; d += 4)
            for (int l = 0; l < 4; ++l) acc[l] += double(x[d + l]) * double(y[d + l]);
          for (; d < D; ++d) acc[0] += double(x[d]) * double(y[d]);
          const T g = T((acc[0] + acc[1]) + (acc[2] + acc[3]));
          Gp[(s / NB) * S * NB + t * NB + s % NB] = g;
          Gp[(t / NB) * S * NB + s * NB + t % NB] = g;
          if (t == s) bn[s] = g;
        }
      }
    }
    pr.Bp1 = Bp1.data();
    pr.Bp2 = Bp2.data();
    pr.Gp = Gp.data();
    pr.bn = bn.data();
    const int64_t ntiles = (pr.b + P - 1) / P;
    const int nthreads = static_cast<int>(std::min<int64_t>(nt, ntiles));
    const int64_t per_thread = scratch(S, D);
    std::vector<V> buf(static_cast<size_t>(per_thread * nthreads), V{});
#pragma omp parallel num_threads(nthreads)
    {
      V* mine = buf.data() + per_thread * omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < ntiles; ++t) run_tile(pr, t * P, mine);
    }
  }
};

// Tile widths and the rule picking one: simd.h (kNB, kWide, tile_width), as the direct kernel,
// so every width computes the same bits and a narrower tile only serves to give every thread work.
template <typename T, Method M>
void dispatch_span(const SpanProblem<T>& pr, const T* B) {
  const int best_pv = tile_width<T>(pr.b, std::max(1, at::get_num_threads()));
  if (best_pv == kWide) {
    SpanKernel<T, kWide, kNB, M>::run(pr, B);
  } else if (best_pv == 2) {
    SpanKernel<T, 2, kNB, M>::run(pr, B);
  } else {
    SpanKernel<T, 1, kNB, M>::run(pr, B);
  }
}

}  // namespace

at::Tensor preimage_gd_span_cpu(const at::Tensor& Z0_, const at::Tensor& B_, const at::Tensor& T_,
                                double gamma, int64_t steps, const at::Tensor& lr_) {
  check_preimage_inputs("preimage_gd_span", Z0_, B_, T_, "T");
  TORCH_CHECK_VALUE(steps >= 0, "preimage_gd_span: steps must be >= 0, got ", steps);
  TORCH_CHECK_VALUE(gamma > 0, "preimage_gd_span: gamma must be > 0, got ", gamma);
  TORCH_CHECK_TYPE(lr_.scalar_type() == Z0_.scalar_type(), "preimage_gd_span: lr must have Z0's dtype");
  TORCH_CHECK_VALUE(lr_.device().is_cpu() && lr_.dim() == 1 && lr_.size(0) == Z0_.size(0),
                    "preimage_gd_span: lr must be a CPU tensor of shape (b,) = (", Z0_.size(0),
                    ",), got ", lr_.sizes());
  auto Z0 = Z0_.contiguous(), B = B_.contiguous(), T = T_.contiguous(), lr = lr_.contiguous();
  if (Z0.numel() == 0 || steps == 0) return Z0.clone();  // z0 exactly, as the direct kernel
  auto out = at::empty_like(Z0);
  AT_DISPATCH_FLOATING_TYPES(Z0.scalar_type(), "preimage_gd_span_cpu", [&] {
    SpanProblem<scalar_t> pr{};
    pr.b = Z0.size(0); pr.S = B.size(0); pr.D = B.size(1); pr.steps = steps;
    pr.gamma = static_cast<scalar_t>(gamma);
    pr.Z0 = Z0.data_ptr<scalar_t>(); pr.coef = T.data_ptr<scalar_t>();
    pr.lr = lr.data_ptr<scalar_t>(); pr.out = out.data_ptr<scalar_t>();
    dispatch_span<scalar_t, Method::GD>(pr, B.data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor preimage_fixed_point_span_cpu(const at::Tensor& Z0_, const at::Tensor& B_,
                                         const at::Tensor& A_, double gamma, int64_t steps) {
  check_preimage_inputs("preimage_fixed_point_span", Z0_, B_, A_, "A");
  TORCH_CHECK_VALUE(steps >= 0, "preimage_fixed_point_span: steps must be >= 0, got ", steps);
  TORCH_CHECK_VALUE(gamma > 0, "preimage_fixed_point_span: gamma must be > 0, got ", gamma);
  auto Z0 = Z0_.contiguous(), B = B_.contiguous(), A = A_.contiguous();
  if (Z0.numel() == 0 || steps == 0) return Z0.clone();
  auto out = at::empty_like(Z0);
  AT_DISPATCH_FLOATING_TYPES(Z0.scalar_type(), "preimage_fixed_point_span_cpu", [&] {
    SpanProblem<scalar_t> pr{};
    pr.b = Z0.size(0); pr.S = B.size(0); pr.D = B.size(1); pr.steps = steps;
    pr.gamma = static_cast<scalar_t>(gamma);
    pr.tiny = std::sqrt(std::numeric_limits<scalar_t>::min());
    pr.Z0 = Z0.data_ptr<scalar_t>(); pr.coef = A.data_ptr<scalar_t>();
    pr.out = out.data_ptr<scalar_t>();
    dispatch_span<scalar_t, Method::FixedPoint>(pr, B.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace geomkern
