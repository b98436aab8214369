// Fused gradient-descent pre-image loop on the GPU: every step of a tile of points in one block
// (declared in kernels.h). Same math as geomkern/ops/preimage.py gd_reference and the CPU kernel
// csrc/cpu/preimage.cpp.
//
// One block of 256 threads (8 warps) owns P points (P = 32, 16 or 8). Its shared memory holds the
// iterate Z (P x D), this step's weights W (P x S), |b_s|^2 (S), per-point |z|^2, sum_s w_s and
// step, and one 32 x 32 tile of B. Per step:
//   phase 1  G = Z B^T (P x S) in column chunks of 32: lane j of warp w accumulates G[p][s0 + j]
//            for the P/8 points p = w, w + 8, ...; B comes through shared memory in 32 x 32
//            tiles read row-wise (coalesced), Z is a warp-wide broadcast. Epilogue:
//            k = exp(-gamma max(|z|^2 + |b|^2 - 2G, 0)), W = (k - T) k, T read from global
//            (coalesced along s).
//   phase 2  Y = W B (P x D) the same way, epilogue z <- z + 4 gamma lr ((sum w) z - Y) written
//            in place (each element of Z is read and written by the one thread that owns it).
// B (S x D) is read twice per step per block: with P points per block that is P multiply-adds
// per element read, and B stays in L2 for the usual S, D <= 1024. Rows past the last point are
// zero with step 0 and targets 0, so they stay finite and are never written out.
#include <cmath>
#include <cstdint>

#include "kernels.h"

namespace geomkern {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;          // B tile is kTile x kTile; a warp covers kTile columns
constexpr int kLd = kTile + 1;     // padded row: the transposed store is bank-conflict free

__device__ __forceinline__ float gk_exp(float x) { return expf(x); }
__device__ __forceinline__ double gk_exp(double x) { return exp(x); }

// Shared-memory elements for P points.
__host__ __device__ inline int64_t smem_elems(int P, int64_t S, int64_t D) {
  return P * (D + S) + kTile * kLd + S + 3 * P + kThreads;
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

template <typename T, int P>
__global__ void __launch_bounds__(kThreads)
preimage_gd_kernel(const T* __restrict__ Z0, const T* __restrict__ B, const T* __restrict__ Tg,
                   const T* __restrict__ lr, T* __restrict__ out, int64_t b, int S, int D, T gamma,
                   int64_t steps) {
  extern __shared__ __align__(16) unsigned char gk_smem[];
  constexpr int PPT = P / kWarps;  // points per thread
  const int tid = threadIdx.x, lane = tid % kTile, warp = tid / kTile;
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * P;
  const int np = b - p0 < P ? static_cast<int>(b - p0) : P;

  T* Zs = reinterpret_cast<T*>(gk_smem);  // P x D
  T* Ws = Zs + P * D;                     // P x S
  T* Bs = Ws + P * S;                     // kTile x kLd
  T* bn = Bs + kTile * kLd;               // S
  T* zn = bn + S;                         // P: |z|^2
  T* sw = zn + P;                         // P: sum_s w_s
  T* st = sw + P;                         // P: 4 gamma lr
  T* red = st + P;                        // kThreads

  for (int i = tid; i < P * D; i += kThreads) {
    const int p = i / D;
    Zs[i] = p < np ? Z0[p0 * D + i] : T(0);
  }
  for (int s = tid; s < S; s += kThreads) {
    const T* row = B + static_cast<int64_t>(s) * D;
    T acc = T(0);
    for (int d = 0; d < D; ++d) acc += row[d] * row[d];
    bn[s] = acc;
  }
  for (int p = tid; p < P; p += kThreads) st[p] = p < np ? T(4) * gamma * lr[p0 + p] : T(0);
  __syncthreads();
  row_sums<T, P>(Zs, D, true, zn, red);

  for (int64_t it = 0; it < steps; ++it) {
    // ---- phase 1: W = (k - T) k with k = exp(-gamma |z - b|^2), G = Z B^T by 32-column chunks
    for (int j0 = 0; j0 < S; j0 += kTile) {
      T acc[PPT];
#pragma unroll
      for (int i = 0; i < PPT; ++i) acc[i] = T(0);
      for (int k0 = 0; k0 < D; k0 += kTile) {
        for (int e = tid; e < kTile * kTile; e += kThreads) {
          const int kk = e % kTile, jj = e / kTile, s = j0 + jj, d = k0 + kk;
          Bs[kk * kLd + jj] = (s < S && d < D) ? B[static_cast<int64_t>(s) * D + d] : T(0);
        }
        __syncthreads();
        const int kn = D - k0 < kTile ? D - k0 : kTile;
        for (int kk = 0; kk < kn; ++kk) {
          const T bv = Bs[kk * kLd + lane];
#pragma unroll
          for (int i = 0; i < PPT; ++i) acc[i] += Zs[(warp + kWarps * i) * D + k0 + kk] * bv;
        }
        __syncthreads();
      }
      const int s = j0 + lane;
      if (s < S) {
#pragma unroll
        for (int i = 0; i < PPT; ++i) {
          const int p = warp + kWarps * i;
          T d2 = zn[p] + bn[s] - T(2) * acc[i];
          d2 = d2 > T(0) ? d2 : T(0);
          const T k = gk_exp(-gamma * d2);
          const T t = p < np ? Tg[(p0 + p) * S + s] : T(0);
          Ws[p * S + s] = (k - t) * k;
        }
      }
    }
    __syncthreads();
    row_sums<T, P>(Ws, S, false, sw, red);

    // ---- phase 2: Y = W B by 32-column chunks of D, then z <- z + step ((sum w) z - Y)
    for (int j0 = 0; j0 < D; j0 += kTile) {
      T acc[PPT];
#pragma unroll
      for (int i = 0; i < PPT; ++i) acc[i] = T(0);
      for (int k0 = 0; k0 < S; k0 += kTile) {
        for (int e = tid; e < kTile * kTile; e += kThreads) {
          const int jj = e % kTile, kk = e / kTile, s = k0 + kk, d = j0 + jj;
          Bs[kk * kLd + jj] = (s < S && d < D) ? B[static_cast<int64_t>(s) * D + d] : T(0);
        }
        __syncthreads();
        const int kn = S - k0 < kTile ? S - k0 : kTile;
        for (int kk = 0; kk < kn; ++kk) {
          const T bv = Bs[kk * kLd + lane];
#pragma unroll
          for (int i = 0; i < PPT; ++i) acc[i] += Ws[(warp + kWarps * i) * S + k0 + kk] * bv;
        }
        __syncthreads();
      }
      const int d = j0 + lane;
      if (d < D) {
#pragma unroll
        for (int i = 0; i < PPT; ++i) {
          const int p = warp + kWarps * i;
          const T z = Zs[p * D + d];
          Zs[p * D + d] = z + st[p] * (sw[p] * z - acc[i]);
        }
      }
    }
    __syncthreads();
    row_sums<T, P>(Zs, D, true, zn, red);
  }

  for (int i = tid; i < np * D; i += kThreads) out[p0 * D + i] = Zs[i];
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
    if (smem_elems(P, S, D) * static_cast<int64_t>(sizeof(T)) <= max_bytes) return P;
  }
  return 0;
}

template <typename T, int P>
cudaError_t launch(const T* Z0, const T* B, const T* targets, const T* lr, T* out, int64_t b,
                   int64_t S, int64_t D, T gamma, int64_t steps, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(smem_elems(P, S, D)) * sizeof(T);
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
