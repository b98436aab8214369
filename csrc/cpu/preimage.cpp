// Fused batched pre-image loops on the CPU (C++/OpenMP): method="gd" and method="fixed_point".
//
// Same math as geomkern/ops/preimage.py (gd_reference, fixed_point_reference), every step in
// one call. Points are processed in tiles of P (a few SIMD vectors' worth); a tile is stored
// transposed, points in the SIMD lanes, so every per-point quantity (|z|^2, sum_s w_s, the
// step, the fixed-point denominator) is a vertical vector op and no horizontal sums are
// needed. Per step and tile:
//
//   phase 1  G[s][p] = <b_s, z_p>     register block NB basis rows x PV vectors of points,
//            epilogue: k = exp(-gamma max(|z|^2 + |b|^2 - 2G, 0)), w = (k - T) k  or  A k,
//            W[s][p] = w, sum_s w accumulated per lane
//   phase 2  Y[d][p] = sum_s B[s][d] W[s][p]   same register block (NB columns of B x PV),
//            epilogue: z <- z + step ((sum w) z - Y)  or  z <- Y / sum w, new |z|^2
//
// Each element of B read in the inner loop is broadcast to all PV*L points of the tile, so B
// (packed once per call into the two panel orders the phases read sequentially) streams from
// L2/L3 while the tile's iterate, W and targets (S x P and D x P) stay in L2. The inner loops
// use GCC/Clang vector extensions, so they compile to AVX-512, AVX2 or SSE as -march allows.
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

using namespace simd;  // csrc/cpu/simd.h: vector types, splat, vexp

enum class Method { GD, FixedPoint };

template <typename T>
struct Problem {
  int64_t b, S, D, steps;
  T gamma;
  T tiny;          // fixed point: keep z where |sum w| <= sqrt(finfo.tiny)
  const T* Z0;     // (b, D)
  const T* coef;   // (b, S): targets T (gd) or expansion coefficients A (fixed point)
  const T* lr;     // (b,) gd only
  const T* Bp1;    // B packed for phase 1: [S/NB blocks][D][NB], zero rows past S
  const T* Bp2;    // B packed for phase 2: [D/NB blocks][S][NB], zero columns past D
  const T* bn;     // (S,) |b_s|^2
  T* out;          // (b, D)
};

// Cache-resident work arrays of one thread for one tile of P points, points in the lanes.
template <typename V>
struct TileScratch {
  V* Zt;    // [D][PV]  the iterate
  V* W;     // [S][PV]  w of the current step
  V* Ct;    // [S][PV]  targets / coefficients
  V* misc;  // [3][PV]  |z|^2, sum_s w, step
  static int64_t size(int64_t S, int64_t D, int PV) { return (D + 2 * S + 3) * PV; }
  TileScratch(V* base, int64_t S, int64_t D, int PV)
      : Zt(base), W(Zt + D * PV), Ct(W + S * PV), misc(Ct + S * PV) {}
};

template <typename T, int PV, int NB, Method M>
struct PreimageKernel {
  using V = vec_t<T>;
  static constexpr int L = kVecBytes / sizeof(T);
  static constexpr int P = PV * L;

  static void run_tile(const Problem<T>& pr, int64_t p0, TileScratch<V>& sc) {
    const int64_t S = pr.S, D = pr.D;
    const int64_t np = std::min<int64_t>(P, pr.b - p0);
    V* __restrict Zt = sc.Zt;
    V* __restrict W = sc.W;
    V* __restrict Ct = sc.Ct;
    V* __restrict zn = sc.misc;
    V* __restrict sw = zn + PV;
    V* __restrict stp = sw + PV;
    T* Zs = reinterpret_cast<T*>(Zt);
    T* Cs = reinterpret_cast<T*>(Ct);
    T* steps_s = reinterpret_cast<T*>(stp);

    // Load the tile transposed; lanes past the last point get z = 0, target 0, step 0 (they
    // stay finite and are never written out).
    for (int64_t p = 0; p < P; ++p) {
      if (p < np) {
        const T* z = pr.Z0 + (p0 + p) * D;
        const T* c = pr.coef + (p0 + p) * S;
        for (int64_t d = 0; d < D; ++d) Zs[d * P + p] = z[d];
        for (int64_t s = 0; s < S; ++s) Cs[s * P + p] = c[s];
        if (M == Method::GD) steps_s[p] = T(4) * pr.gamma * pr.lr[p0 + p];
      } else {
        for (int64_t d = 0; d < D; ++d) Zs[d * P + p] = T(0);
        for (int64_t s = 0; s < S; ++s) Cs[s * P + p] = T(0);
        steps_s[p] = T(0);
      }
    }
    for (int v = 0; v < PV; ++v) zn[v] = V{};
    for (int64_t d = 0; d < D; ++d)
      for (int v = 0; v < PV; ++v) zn[v] += Zt[d * PV + v] * Zt[d * PV + v];

    const int64_t nblk1 = (S + NB - 1) / NB, nblk2 = (D + NB - 1) / NB;
    const V neg_gamma = splat<V>(-pr.gamma);
    for (int64_t it = 0; it < pr.steps; ++it) {
      // ---- phase 1: kernel values and weights --------------------------------------------
      for (int v = 0; v < PV; ++v) sw[v] = V{};
      for (int64_t blk = 0; blk < nblk1; ++blk) {
        const T* __restrict pan = pr.Bp1 + blk * D * NB;
        V acc[NB][PV];
#pragma GCC unroll 32
        for (int i = 0; i < NB; ++i)
#pragma GCC unroll 8
          for (int v = 0; v < PV; ++v) acc[i][v] = V{};
        for (int64_t d = 0; d < D; ++d) {
          V z[PV];
#pragma GCC unroll 8
          for (int v = 0; v < PV; ++v) z[v] = Zt[d * PV + v];
#pragma GCC unroll 32
          for (int i = 0; i < NB; ++i) {
            const V bb = splat<V>(pan[d * NB + i]);
#pragma GCC unroll 8
            for (int v = 0; v < PV; ++v) acc[i][v] += bb * z[v];
          }
        }
        const int64_t s0 = blk * NB;
        const int ni = static_cast<int>(std::min<int64_t>(NB, S - s0));
        V part[PV] = {};
        for (int i = 0; i < ni; ++i) {
          const int64_t s = s0 + i;
          const V bns = splat<V>(pr.bn[s]);
#pragma GCC unroll 8
          for (int v = 0; v < PV; ++v) {
            V d2 = (zn[v] + bns) - T(2) * acc[i][v];
            d2 = d2 < V{} ? V{} : d2;  // clamp roundoff at 0; NaN passes through
            const V k = vexp(neg_gamma * d2);
            const V c = Ct[s * PV + v];
            const V w = M == Method::GD ? (k - c) * k : c * k;
            W[s * PV + v] = w;
            part[v] += w;
          }
        }
#pragma GCC unroll 8
        for (int v = 0; v < PV; ++v) sw[v] += part[v];
      }

      // ---- phase 2: Y = W^T B and the update ---------------------------------------------
      typename VecOf<T>::itype ok[PV];  // fixed point: lanes with a usable denominator
      if (M == Method::FixedPoint) {
        for (int v = 0; v < PV; ++v) {
          const V a = sw[v] < V{} ? -sw[v] : sw[v];
          ok[v] = a > pr.tiny;
        }
      }
      V zn_new[PV] = {};
      for (int64_t blk = 0; blk < nblk2; ++blk) {
        const T* __restrict pan = pr.Bp2 + blk * S * NB;
        V acc[NB][PV];
#pragma GCC unroll 32
        for (int j = 0; j < NB; ++j)
#pragma GCC unroll 8
          for (int v = 0; v < PV; ++v) acc[j][v] = V{};
        for (int64_t s = 0; s < S; ++s) {
          V w[PV];
#pragma GCC unroll 8
          for (int v = 0; v < PV; ++v) w[v] = W[s * PV + v];
#pragma GCC unroll 32
          for (int j = 0; j < NB; ++j) {
            const V bb = splat<V>(pan[s * NB + j]);
#pragma GCC unroll 8
            for (int v = 0; v < PV; ++v) acc[j][v] += bb * w[v];
          }
        }
        const int64_t d0 = blk * NB;
        const int nj = static_cast<int>(std::min<int64_t>(NB, D - d0));
        V part[PV] = {};
        for (int j = 0; j < nj; ++j) {
          V* zrow = Zt + (d0 + j) * PV;
#pragma GCC unroll 8
          for (int v = 0; v < PV; ++v) {
            const V z = zrow[v];
            V zz;
            if (M == Method::GD) {
              zz = z + stp[v] * (sw[v] * z - acc[j][v]);
            } else {
              zz = ok[v] != 0 ? acc[j][v] / sw[v] : z;
            }
            zrow[v] = zz;
            part[v] += zz * zz;
          }
        }
#pragma GCC unroll 8
        for (int v = 0; v < PV; ++v) zn_new[v] += part[v];
      }
      for (int v = 0; v < PV; ++v) zn[v] = zn_new[v];
    }

    for (int64_t p = 0; p < np; ++p) {
      T* o = pr.out + (p0 + p) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = Zs[d * P + p];
    }
  }

  static void run(Problem<T> pr, const T* B) {
    const int64_t S = pr.S, D = pr.D;
    const int64_t nblk1 = (S + NB - 1) / NB, nblk2 = (D + NB - 1) / NB;
    std::vector<T> Bp1(static_cast<size_t>(nblk1 * D * NB), T(0));
    std::vector<T> Bp2(static_cast<size_t>(nblk2 * S * NB), T(0));
    std::vector<T> bn(static_cast<size_t>(S));
    const int nt = std::max(1, at::get_num_threads());
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static) nowait
      for (int64_t s = 0; s < S; ++s) {
        const T* row = B + s * D;
        T* dst = Bp1.data() + (s / NB) * D * NB + s % NB;
        double acc = 0;  // |b|^2 once per call: accumulate in double
        for (int64_t d = 0; d < D; ++d) {
          acc += double(row[d]) * double(row[d]);
          dst[d * NB] = row[d];
        }
        bn[s] = T(acc);
      }
#pragma omp for schedule(static)
      for (int64_t blk = 0; blk < nblk2; ++blk) {
        const int64_t d0 = blk * NB, nj = std::min<int64_t>(NB, D - d0);
        T* dst = Bp2.data() + blk * S * NB;
        for (int64_t s = 0; s < S; ++s)
          for (int64_t j = 0; j < nj; ++j) dst[s * NB + j] = B[s * D + d0 + j];
      }
    }
    pr.Bp1 = Bp1.data();
    pr.Bp2 = Bp2.data();
    pr.bn = bn.data();

    const int64_t ntiles = (pr.b + P - 1) / P;
    const int nthreads = static_cast<int>(std::min<int64_t>(nt, ntiles));
    // Allocated here, not inside the parallel region, so a failed allocation throws normally.
    const int64_t per_thread = TileScratch<V>::size(S, D, PV);
    std::vector<V> scratch(static_cast<size_t>(per_thread * nthreads), V{});
#pragma omp parallel num_threads(nthreads)
    {
      TileScratch<V> sc(scratch.data() + per_thread * omp_get_thread_num(), S, D, PV);
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < ntiles; ++t) run_tile(pr, t * P, sc);
    }
  }
};

// Register blocks and the tile-width rule: simd.h (kNB, kWide, tile_width), shared with the span
// kernel.
template <typename T, Method M>
void dispatch_kernel(const Problem<T>& pr, const T* B) {
  const int best_pv = tile_width<T>(pr.b, std::max(1, at::get_num_threads()));
  if (best_pv == kWide) {
    PreimageKernel<T, kWide, kNB, M>::run(pr, B);
  } else if (best_pv == 2) {
    PreimageKernel<T, 2, kNB, M>::run(pr, B);
  } else {
    PreimageKernel<T, 1, kNB, M>::run(pr, B);
  }
}

}  // namespace

void check_preimage_inputs(const char* op, const at::Tensor& Z0, const at::Tensor& B,
                           const at::Tensor& C, const char* cname) {
  TORCH_CHECK_VALUE(Z0.device().is_cpu() && B.device().is_cpu() && C.device().is_cpu(), op,
                    ": the native CPU kernel takes CPU tensors (Z0, B, ", cname, ")");
  TORCH_CHECK_TYPE(Z0.scalar_type() == at::kFloat || Z0.scalar_type() == at::kDouble, op,
                   ": Z0 must be float32 or float64, got ", Z0.scalar_type());
  TORCH_CHECK_TYPE(B.scalar_type() == Z0.scalar_type() && C.scalar_type() == Z0.scalar_type(),
                   op, ": Z0, B and ", cname, " must share one dtype, got ", Z0.scalar_type(),
                   ", ", B.scalar_type(), ", ", C.scalar_type());
  TORCH_CHECK_VALUE(Z0.dim() == 2 && B.dim() == 2 && C.dim() == 2, op, ": Z0, B and ", cname,
                    " must be 2-D");
  TORCH_CHECK_VALUE(B.size(1) == Z0.size(1), op, ": B has D=", B.size(1), " but Z0 has D=",
                    Z0.size(1));
  TORCH_CHECK_VALUE(C.size(0) == Z0.size(0) && C.size(1) == B.size(0), op, ": ", cname,
                    " must have shape (b, S) = (", Z0.size(0), ", ", B.size(0), "), got ",
                    C.sizes());
}

at::Tensor preimage_gd_cpu(const at::Tensor& Z0_, const at::Tensor& B_, const at::Tensor& T_,
                           double gamma, int64_t steps, const at::Tensor& lr_) {
  check_preimage_inputs("preimage_gd", Z0_, B_, T_, "T");
  TORCH_CHECK_VALUE(steps >= 0, "preimage_gd: steps must be >= 0, got ", steps);
  TORCH_CHECK_VALUE(gamma > 0, "preimage_gd: gamma must be > 0, got ", gamma);
  TORCH_CHECK_TYPE(lr_.scalar_type() == Z0_.scalar_type(), "preimage_gd: lr must have Z0's dtype");
  TORCH_CHECK_VALUE(lr_.device().is_cpu() && lr_.dim() == 1 && lr_.size(0) == Z0_.size(0),
                    "preimage_gd: lr must be a CPU tensor of shape (b,) = (", Z0_.size(0),
                    ",), got ", lr_.sizes());
  auto Z0 = Z0_.contiguous(), B = B_.contiguous(), T = T_.contiguous(), lr = lr_.contiguous();
  auto out = at::empty_like(Z0);
  if (Z0.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(Z0.scalar_type(), "preimage_gd_cpu", [&] {
    Problem<scalar_t> pr{};
    pr.b = Z0.size(0); pr.S = B.size(0); pr.D = B.size(1); pr.steps = steps;
    pr.gamma = static_cast<scalar_t>(gamma);
    pr.Z0 = Z0.data_ptr<scalar_t>(); pr.coef = T.data_ptr<scalar_t>();
    pr.lr = lr.data_ptr<scalar_t>(); pr.out = out.data_ptr<scalar_t>();
    dispatch_kernel<scalar_t, Method::GD>(pr, B.data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor preimage_fixed_point_cpu(const at::Tensor& Z0_, const at::Tensor& B_,
                                    const at::Tensor& A_, double gamma, int64_t steps) {
  check_preimage_inputs("preimage_fixed_point", Z0_, B_, A_, "A");
  TORCH_CHECK_VALUE(steps >= 0, "preimage_fixed_point: steps must be >= 0, got ", steps);
  TORCH_CHECK_VALUE(gamma > 0, "preimage_fixed_point: gamma must be > 0, got ", gamma);
  auto Z0 = Z0_.contiguous(), B = B_.contiguous(), A = A_.contiguous();
  auto out = at::empty_like(Z0);
  if (Z0.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(Z0.scalar_type(), "preimage_fixed_point_cpu", [&] {
    Problem<scalar_t> pr{};
    pr.b = Z0.size(0); pr.S = B.size(0); pr.D = B.size(1); pr.steps = steps;
    pr.gamma = static_cast<scalar_t>(gamma);
    pr.tiny = std::sqrt(std::numeric_limits<scalar_t>::min());
    pr.Z0 = Z0.data_ptr<scalar_t>(); pr.coef = A.data_ptr<scalar_t>();
    pr.out = out.data_ptr<scalar_t>();
    dispatch_kernel<scalar_t, Method::FixedPoint>(pr, B.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace geomkern
