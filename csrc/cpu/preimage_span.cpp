// The pre-image loops of csrc/cpu/preimage.cpp iterated in span(z0, B) (docs/history.md §8,
// §15): every gd step moves z by a combination of z and the basis rows, so
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
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops.h"
#include "preimage.h"
#include "simd.h"

namespace geomkern {
namespace GEOMKERN_ISA_NS {
namespace {

using namespace simd;
using namespace preimage;  // csrc/cpu/preimage.h: Method, Inputs, run_entry, Panels, weight

template <typename T>
struct SpanProblem : Inputs<T> {
  const T* Bp1;   // B packed [S/NB][D][NB] (rows past S zero): P = B z0
  const T* Bp2;   // B packed [D/NB][S][NB] (columns past D zero): B^T C
  const T* Gp;    // G packed [S/NB][S][NB] (rows past S zero)
  const T* bn;    // (S,) |b_s|^2
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
          const V w = weight<M>((zz + pr.bn[s]) - T(2) * zb, neg_gamma, Tt[s * PV + v]);
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

  static void run(const Inputs<T>& in) {
    const int64_t S = in.S, D = in.D;
    const T* B = in.B;
    const Panels<T, NB> bp(B, S, D, in.nthreads);
    std::vector<T> Gp(static_cast<size_t>((S + NB - 1) / NB * S * NB), T(0));
    std::vector<T> bn(static_cast<size_t>(S));
    // G = B B^T in double, each entry by one thread in one order (thread-count independent)
#pragma omp parallel for schedule(dynamic, 4) num_threads(in.nthreads)
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
    const SpanProblem<T> pr{in, bp.rows.data(), bp.cols.data(), Gp.data(), bn.data()};
    run_tiles<V>((in.b + P - 1) / P, in.nthreads, scratch(S, D),
                 [&](int64_t t, V* mine) { run_tile(pr, t * P, mine); });
  }
};

}  // namespace

// The entry points: preimage.h's run_entry (argument checks, tile width: simd.h's rule, as the
// direct kernel, so every width computes the same bits) with this kernel.
Tensor preimage_gd_span_cpu(const Tensor& Z0, const Tensor& B, const Tensor& T,
                                double gamma, int64_t steps, const Tensor& lr) {
  return run_entry<Method::GD, SpanKernel>("preimage_gd_span", Z0, B, T, gamma, steps, &lr);
}

Tensor preimage_fixed_point_span_cpu(const Tensor& Z0, const Tensor& B,
                                         const Tensor& A, double gamma, int64_t steps) {
  return run_entry<Method::FixedPoint, SpanKernel>("preimage_fixed_point_span", Z0, B, A, gamma,
                                                   steps, nullptr);
}

}  // namespace GEOMKERN_ISA_NS
}  // namespace geomkern
