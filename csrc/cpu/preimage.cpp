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
// use GCC/Clang vector extensions, so they compile to AVX-512, AVX2 or SSE: this file is compiled
// once per instruction-set variant (csrc/cpu/isa.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops.h"
#include "preimage.h"
#include "simd.h"

namespace geomkern {
namespace GEOMKERN_ISA_NS {
namespace {

using namespace simd;      // csrc/cpu/simd.h: vector types, splat, panel_product, run_tiles
using namespace preimage;  // csrc/cpu/preimage.h: Method, Inputs, run_entry, Panels, weight

template <typename T>
struct Problem : Inputs<T> {
  const T* Bp1;    // B packed for phase 1: [S/NB blocks][D][NB], zero rows past S
  const T* Bp2;    // B packed for phase 2: [D/NB blocks][S][NB], zero columns past D
  const T* bn;     // (S,) |b_s|^2
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
        V acc[NB][PV] = {};
        panel_product<T, PV, NB>(pr.Bp1 + blk * D * NB, Zt, D, acc);
        const int64_t s0 = blk * NB;
        const int ni = static_cast<int>(std::min<int64_t>(NB, S - s0));
        V part[PV] = {};
        for (int i = 0; i < ni; ++i) {
          const int64_t s = s0 + i;
          const V bns = splat<V>(pr.bn[s]);
#pragma GCC unroll 8
          for (int v = 0; v < PV; ++v) {
            const V d2 = (zn[v] + bns) - T(2) * acc[i][v];
            const V w = weight<M>(d2, neg_gamma, Ct[s * PV + v]);
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
        V acc[NB][PV] = {};
        panel_product<T, PV, NB>(pr.Bp2 + blk * S * NB, W, S, acc);
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

  static void run(const Inputs<T>& in) {
    const int64_t S = in.S, D = in.D;
    const Panels<T, NB> bp(in.B, S, D, in.nthreads);
    std::vector<T> bn(static_cast<size_t>(S));
#pragma omp parallel for schedule(static) num_threads(in.nthreads)
    for (int64_t s = 0; s < S; ++s) {
      const T* row = in.B + s * D;
      double acc = 0;  // |b|^2 once per call: accumulate in double
      for (int64_t d = 0; d < D; ++d) acc += double(row[d]) * double(row[d]);
      bn[s] = T(acc);
    }
    const Problem<T> pr{in, bp.rows.data(), bp.cols.data(), bn.data()};
    run_tiles<V>((in.b + P - 1) / P, in.nthreads, TileScratch<V>::size(S, D, PV),
                 [&](int64_t t, V* mine) {
                   TileScratch<V> sc(mine, S, D, PV);
                   run_tile(pr, t * P, sc);
                 });
  }
};

}  // namespace

void preimage::check_preimage_inputs(const char* op, const Tensor& Z0, const Tensor& B,
                                     const Tensor& C, const char* cname) {
  GK_CHECK_VALUE(Z0.is_cpu() && B.is_cpu() && C.is_cpu(), op,
           ": the native CPU kernel takes CPU tensors (Z0, B, ", cname, ")");
  GK_CHECK_TYPE(st::is_floating(Z0), op, ": Z0 must be float32 or float64");
  GK_CHECK_TYPE(B.scalar_type() == Z0.scalar_type() && C.scalar_type() == Z0.scalar_type(), op,
           ": Z0, B and ", cname, " must share one dtype");
  GK_CHECK_VALUE(Z0.dim() == 2 && B.dim() == 2 && C.dim() == 2, op, ": Z0, B and ", cname, " must be 2-D");
  GK_CHECK_VALUE(B.size(1) == Z0.size(1), op, ": B has D=", B.size(1), " but Z0 has D=", Z0.size(1));
  GK_CHECK_VALUE(C.size(0) == Z0.size(0) && C.size(1) == B.size(0), op, ": ", cname,
           " must have shape (b, S) = (", Z0.size(0), ", ", B.size(0), ")");
}

// The entry points: preimage.h's run_entry (argument checks, tile width) with this kernel.
Tensor preimage_gd_cpu(const Tensor& Z0, const Tensor& B, const Tensor& T,
                           double gamma, int64_t steps, const Tensor& lr) {
  return run_entry<Method::GD, PreimageKernel>("preimage_gd", Z0, B, T, gamma, steps, &lr);
}

Tensor preimage_fixed_point_cpu(const Tensor& Z0, const Tensor& B, const Tensor& A,
                                    double gamma, int64_t steps) {
  return run_entry<Method::FixedPoint, PreimageKernel>("preimage_fixed_point", Z0, B, A, gamma,
                                                       steps, nullptr);
}

}  // namespace GEOMKERN_ISA_NS
}  // namespace geomkern
