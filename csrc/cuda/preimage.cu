// Fused gradient-descent pre-image loop on the GPU: every step of a tile of points in one block
// (declared in kernels.h). Same math as geomkern/ops/preimage.py gd_reference and the CPU kernel
// csrc/cpu/preimage.cpp.
//
// One block of 256 threads (8 warps) owns P points (P = 32, 16 or 8). Its shared memory holds the
// iterate Z (P x Dp, rows zero-padded to Dp = D rounded up to KT), this step's weights W (P x Sp,
// likewise), one B tile (NC x KT, rows padded by one 16-byte vector), |b_s|^2 (S), per-point
// |z|^2, sum_s w_s and step. Both products are register-blocked (issue 13 item 3): thread
// (tp, tc) accumulates a 4 x 4 block, points 4 tp .. 4 tp + 3 times columns tc + TC j (j < 4),
// and reads its operands as 16-byte vectors along the reduction index (LDS.128: 4 floats or
// 2 doubles), so each step of the unrolled hot loop is 8 vector loads for 64 FFMA in float
// (32 DFMA in double): 1 LDS per 8 FFMA. A's 4 rows are the same for the whole warp (TC >= 32),
// so they are broadcasts; the B-tile rows of a quarter-warp land in 8 distinct 16-byte bank
// groups thanks to the padding. KT = P, so every tile holds NC x KT = 4,096 elements.
//   phase 1  G = Z B^T (P x S) in chunks of NC columns of S, the tile B[s][d] copied row-wise
//            (coalesced). Epilogue: k = exp(-gamma max(|z|^2 + |b|^2 - 2G, 0)), W = (k - T) k,
//            T read from global (coalesced along s).
//   phase 2  Y = W B (P x D) in chunks of NC columns of D, the tile stored transposed
//            (Bt[d][s]; a warp reads 8 d x 4 s: whole 32-byte sectors, conflict-free stores); epilogue z <- z + 4 gamma lr
//            ((sum w) z - Y) in place (each element of Z is read and written by its one owner).
// B (S x D) is read twice per step per block (P multiply-adds per element read; B stays in L2 for
// the usual S, D <= 1024). Rows past the last point are zero with step 0 and targets 0, so they
// stay finite and are never written out; padded columns of Z and W stay exactly zero. B offsets
// s D + d are 32-bit: a launch needs 8 (S + D) elements of shared memory, so S D < 2^31.
#include <cmath>
#include <cstdint>

#include "kernels.h"

namespace geomkern {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlockRows = 4;  // points per thread (register block)
constexpr int kBlockCols = 4;  // columns per thread (register block)

__device__ __forceinline__ float gk_exp(float x) { return expf(x); }
__device__ __forceinline__ double gk_exp(double x) { return exp(x); }

// 16-byte vector of T: what one LDS.128 reads.
template <typename T> struct Vec;
template <> struct Vec<float> { using type = float4; static constexpr int n = 4; };
template <> struct Vec<double> { using type = double2; static constexpr int n = 2; };

template <typename T, int P>
struct Tiling {
  static constexpr int kKT = P;                             // reduction depth of one B tile
  static constexpr int kTP = P / kBlockRows;                // point groups
  static constexpr int kTC = kThreads / kTP;                // column groups (multiple of 32)
  static constexpr int kNC = kTC * kBlockCols;              // columns per chunk
  static constexpr int kVW = Vec<T>::n;                     // elements per vector load
  static constexpr int kLdB = kKT + kVW;                    // padded B-tile row
  static_assert(kTC % 32 == 0, "a warp must share its point group (broadcast A loads)");
  static_assert(kKT % kVW == 0 && kKT % 4 == 0 && kNC % 8 == 0, "whole vectors; phase-2 copy: 8 x 4 per warp");
};

__host__ __device__ inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Shared-memory elements for P points: Z (P x Dp), W (P x Sp), the B tile (NC x (KT + VW)),
// |b|^2 (S), 3 per-point values, the row-sum scratch (kThreads). KT = P, NC = 4096 / P.
__host__ __device__ inline int64_t smem_elems(int P, int64_t S, int64_t D, int vw) {
  return P * (round_up(D, P) + round_up(S, P)) + (kThreads * kBlockRows * kBlockCols / P) * (P + vw) +
         S + 3 * P + kThreads;
}

// dst[p] = sum_x X[p][x] (or X[p][x]^2) for the P rows of X (P x len); kThreads / P threads per row,
// summed in a fixed order (deterministic).
template <typename T, int P>
__device__ void row_sums(const T* X, int len, bool square, T* dst, T* red) {
  constexpr int kParts = kThreads / P;
  const int tid = threadIdx.x, p = tid / kParts, part = tid % kParts;
  T acc = T(0);
  for (int x = part; x < len; x += kParts) {
    const T v = X[p * len + x];
    acc += square ? v * v : v;
  }
  red[tid] = acc;
  __syncthreads();
  if (tid < P) {
    T s = T(0);
    for (int q = 0; q < kParts; ++q) s += red[tid * kParts + q];
    dst[tid] = s;
  }
  __syncthreads();
}

__device__ __forceinline__ void mac(float (&acc)[kBlockRows][kBlockCols], const float4 (&a)[kBlockRows],
                                    const float4 (&b)[kBlockCols]) {
#pragma unroll
  for (int i = 0; i < kBlockRows; ++i) {
#pragma unroll
    for (int j = 0; j < kBlockCols; ++j) {
      acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
      acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
      acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
      acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
    }
  }
}

__device__ __forceinline__ void mac(double (&acc)[kBlockRows][kBlockCols], const double2 (&a)[kBlockRows],
                                    const double2 (&b)[kBlockCols]) {
#pragma unroll
  for (int i = 0; i < kBlockRows; ++i) {
#pragma unroll
    for (int j = 0; j < kBlockCols; ++j) {
      acc[i][j] = fma(a[i].x, b[j].x, acc[i][j]);
      acc[i][j] = fma(a[i].y, b[j].y, acc[i][j]);
    }
  }
}

// The hot loop: acc[i][j] += sum_{k < KT} A[i][k] Bt[tc + TC j][k]; A points at this thread's
// first row (row stride lda) at the tile's first k. Fully unrolled, all loads 16-byte vectors.
template <typename T, int P>
__device__ __forceinline__ void tile_mac(const T* A, int lda, const T* Bt, int tc,
                                         T (&acc)[kBlockRows][kBlockCols]) {
  using TL = Tiling<T, P>;
  using V = typename Vec<T>::type;
#pragma unroll
  for (int k = 0; k < TL::kKT; k += TL::kVW) {
    V a[kBlockRows], b[kBlockCols];
#pragma unroll
    for (int i = 0; i < kBlockRows; ++i) a[i] = *reinterpret_cast<const V*>(A + i * lda + k);
#pragma unroll
    for (int j = 0; j < kBlockCols; ++j)
      b[j] = *reinterpret_cast<const V*>(Bt + (tc + TL::kTC * j) * TL::kLdB + k);
    mac(acc, a, b);
  }
}

template <typename T, int P>
__global__ void __launch_bounds__(kThreads, 1)  // one block per SM: shared memory allows no more
preimage_gd_kernel(const T* __restrict__ Z0, const T* __restrict__ B, const T* __restrict__ Tg,
                   const T* __restrict__ lr, T* __restrict__ out, int64_t b, int S, int D, T gamma,
                   int64_t steps) {
  extern __shared__ __align__(16) unsigned char gk_smem[];
  using TL = Tiling<T, P>;
  constexpr int KT = TL::kKT, NC = TL::kNC, TC = TL::kTC, LdB = TL::kLdB;
  constexpr int kTileLoads = NC * KT / kThreads;  // 16: unrolled, so the k0 loop is innermost
  static_assert(NC * KT % kThreads == 0, "whole tile loads per thread");
  const int tid = threadIdx.x, tp = tid / TC, tc = tid % TC;
  const int lc = tid / KT, lk = tid % KT;  // phase-1 tile copy: first row, column of this thread
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * P;
  const int np = b - p0 < P ? static_cast<int>(b - p0) : P;
  const int Dp = static_cast<int>(round_up(D, KT)), Sp = static_cast<int>(round_up(S, KT));

  T* Zs = reinterpret_cast<T*>(gk_smem);  // P x Dp
  T* Ws = Zs + P * Dp;                    // P x Sp
  T* Bt = Ws + P * Sp;                    // NC x LdB
  T* bn = Bt + NC * LdB;                  // S
  T* zn = bn + S;                         // P: |z|^2
  T* sw = zn + P;                         // P: sum_s w_s
  T* st = sw + P;                         // P: 4 gamma lr
  T* red = st + P;                        // kThreads

  for (int i = tid; i < P * Dp; i += kThreads) {
    const int p = i / Dp, d = i - p * Dp;
    Zs[i] = (p < np && d < D) ? Z0[(p0 + p) * D + d] : T(0);
  }
  for (int i = tid; i < P * Sp; i += kThreads) Ws[i] = T(0);
  for (int s = tid; s < S; s += kThreads) {
    const T* row = B + static_cast<int64_t>(s) * D;
    T acc = T(0);
    for (int d = 0; d < D; ++d) acc += row[d] * row[d];
    bn[s] = acc;
  }
  for (int p = tid; p < P; p += kThreads) st[p] = p < np ? T(4) * gamma * lr[p0 + p] : T(0);
  __syncthreads();
  row_sums<T, P>(Zs, Dp, true, zn, red);

  const T* Zt = Zs + tp * kBlockRows * Dp;  // this thread's first point row
  const T* Wt = Ws + tp * kBlockRows * Sp;
  for (int64_t it = 0; it < steps; ++it) {
    // ---- phase 1: W = (k - T) k with k = exp(-gamma |z - b|^2), G = Z B^T by NC-column chunks
    for (int j0 = 0; j0 < S; j0 += NC) {
      T acc[kBlockRows][kBlockCols];
#pragma unroll
      for (int i = 0; i < kBlockRows; ++i)
#pragma unroll
        for (int j = 0; j < kBlockCols; ++j) acc[i][j] = T(0);
      for (int k0 = 0; k0 < Dp; k0 += KT) {
#pragma unroll
        for (int r = 0; r < kTileLoads; ++r) {  // row-wise copy: coalesced along d
          const int c = lc + r * (kThreads / KT), s = j0 + c, d = k0 + lk;
          Bt[c * LdB + lk] = (s < S && d < D) ? B[s * D + d] : T(0);
        }
        __syncthreads();
        tile_mac<T, P>(Zt + k0, Dp, Bt, tc, acc);
        __syncthreads();
      }
#pragma unroll
      for (int j = 0; j < kBlockCols; ++j) {
        const int s = j0 + tc + TC * j;
        if (s < S) {
#pragma unroll
          for (int i = 0; i < kBlockRows; ++i) {
            const int p = tp * kBlockRows + i;
            T d2 = zn[p] + bn[s] - T(2) * acc[i][j];
            d2 = d2 > T(0) ? d2 : T(0);
            const T k = gk_exp(-gamma * d2);
            const T t = p < np ? Tg[(p0 + p) * S + s] : T(0);
            Ws[p * Sp + s] = (k - t) * k;
          }
        }
      }
    }
    __syncthreads();
    row_sums<T, P>(Ws, Sp, false, sw, red);

    // ---- phase 2: Y = W B by NC-column chunks of D, then z <- z + step ((sum w) z - Y)
    for (int j0 = 0; j0 < D; j0 += NC) {
      T acc[kBlockRows][kBlockCols];
#pragma unroll
      for (int i = 0; i < kBlockRows; ++i)
#pragma unroll
        for (int j = 0; j < kBlockCols; ++j) acc[i][j] = T(0);
      for (int k0 = 0; k0 < Sp; k0 += KT) {
#pragma unroll
        for (int r = 0; r < kTileLoads; ++r) {
          // transposed. A warp covers 8 columns (d) x 4 rows (s): 4 full 32-byte sectors of B, and
          // float banks 4 c + k (LdB = 4 mod 32), all distinct: no store conflict
          const int e = tid + r * kThreads, rest = e / 32;
          const int c = (rest % (NC / 8)) * 8 + e % 8, k = (rest / (NC / 8)) * 4 + (e / 8) % 4;
          const int s = k0 + k, d = j0 + c;
          Bt[c * LdB + k] = (s < S && d < D) ? B[s * D + d] : T(0);
        }
        __syncthreads();
        tile_mac<T, P>(Wt + k0, Sp, Bt, tc, acc);
        __syncthreads();
      }
#pragma unroll
      for (int j = 0; j < kBlockCols; ++j) {
        const int d = j0 + tc + TC * j;
        if (d < D) {
#pragma unroll
          for (int i = 0; i < kBlockRows; ++i) {
            const int p = tp * kBlockRows + i;
            const T z = Zs[p * Dp + d];
            Zs[p * Dp + d] = z + st[p] * (sw[p] * z - acc[i][j]);
          }
        }
      }
    }
    __syncthreads();
    row_sums<T, P>(Zs, Dp, true, zn, red);
  }

  for (int i = tid; i < np * D; i += kThreads) {
    const int p = i / D, d = i - p * D;
    out[p0 * D + i] = Zs[p * Dp + d];
  }
}

int max_shared_bytes(cudaError_t* err) {
  int dev = 0, bytes = 0;
  *err = cudaGetDevice(&dev);
  if (*err == cudaSuccess)
    *err = cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  return bytes;
}

template <typename T>
int pick_points(int64_t S, int64_t D, int64_t max_bytes) {
  for (int P : {32, 16, 8}) {
    if (smem_elems(P, S, D, Vec<T>::n) * static_cast<int64_t>(sizeof(T)) <= max_bytes) return P;
  }
  return 0;
}

template <typename T, int P>
cudaError_t launch(const T* Z0, const T* B, const T* targets, const T* lr, T* out, int64_t b,
                   int64_t S, int64_t D, T gamma, int64_t steps, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(smem_elems(P, S, D, Vec<T>::n)) * sizeof(T);
  auto kernel = preimage_gd_kernel<T, P>;
  cudaError_t err = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>((b + P - 1) / P));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  return cudaLaunchKernelEx(&cfg, kernel, Z0, B, targets, lr, out, b, static_cast<int>(S),
                            static_cast<int>(D), gamma, steps);
}

}  // namespace

template <typename T>
cudaError_t preimage_gd_tile_points(int64_t S, int64_t D, int* points) {
  if (points == nullptr || S < 1 || D < 1) return cudaErrorInvalidValue;
  cudaError_t err;
  const int64_t max_bytes = max_shared_bytes(&err);
  if (err != cudaSuccess) return err;
  *points = pick_points<T>(S, D, max_bytes);
  return cudaSuccess;
}

template <typename T>
cudaError_t preimage_gd(const T* Z0, const T* B, const T* targets, const T* lr, T* out, int64_t b,
                        int64_t S, int64_t D, T gamma, int64_t steps, cudaStream_t stream) {
  if (b < 0 || S < 1 || D < 1 || steps < 0 || !(gamma > T(0))) return cudaErrorInvalidValue;
  if (b == 0) return cudaSuccess;
  int P = 0;
  cudaError_t err = preimage_gd_tile_points<T>(S, D, &P);
  if (err != cudaSuccess) return err;
  if ((b + P - 1) / (P > 0 ? P : 1) > 0x7fffffff) return cudaErrorInvalidValue;
  switch (P) {
    case 32: return launch<T, 32>(Z0, B, targets, lr, out, b, S, D, gamma, steps, stream);
    case 16: return launch<T, 16>(Z0, B, targets, lr, out, b, S, D, gamma, steps, stream);
    case 8: return launch<T, 8>(Z0, B, targets, lr, out, b, S, D, gamma, steps, stream);
    default: return cudaErrorInvalidValue;  // S + D too large for shared memory
  }
}

template cudaError_t preimage_gd_tile_points<float>(int64_t, int64_t, int*);
template cudaError_t preimage_gd_tile_points<double>(int64_t, int64_t, int*);
template cudaError_t preimage_gd<float>(const float*, const float*, const float*, const float*, float*,
                                        int64_t, int64_t, int64_t, float, int64_t, cudaStream_t);
template cudaError_t preimage_gd<double>(const double*, const double*, const double*, const double*,
                                         double*, int64_t, int64_t, int64_t, double, int64_t,
                                         cudaStream_t);

}  // namespace cuda
}  // namespace geomkern
