// Batched symmetric eigen-solver for many small matrices: parallel-order cyclic Jacobi, one
// thread block per matrix (declared in kernels.h).
//
// Why Jacobi: for hundreds of n ~ 100 matrices (kernel PCA on K-Means patches, GGEUR class
// covariances) a whole matrix fits in one SM's shared memory and a Jacobi sweep is nothing but
// independent 2x2 rotations, so one block solves one matrix without leaving the SM, where
// tridiagonalisation-based solvers launch several kernels per matrix or serialise on panels.
//
// Round-robin ordering (Brent & Luk): with m = n rounded up to even, indices 0..m-1 are paired
// as in a chess tournament (index 0 fixed, 1..m-1 rotating), giving m/2 disjoint pairs per round
// and every pair exactly once in m-1 rounds. Per round:
//   phase 1  one thread per pair (p, q) computes the rotation that zeroes a_pq (Rutishauser's
//            formulas: t = sgn(theta) / (|theta| + sqrt(theta^2 + 1)),
//            theta = (a_qq - a_pp) / (2 a_pq), c = 1 / sqrt(t^2 + 1), s = t c), or none where
//            |a_pq| <= tol ||A||_F / n (see `skip` in the kernel);
//   phase 2  A <- J^T A J as independent 2x2 blocks, one work item per pair of pairs
//            (k1 <= k2): the (k1, k2) block is computed once and written with its transpose,
//            so A stays exactly symmetric; diagonal blocks use a_pp - t a_pq, a_qq + t a_pq and
//            an exact 0 off the diagonal. The rotations are also applied to the rows of V^T
//            (eigenvectors kept as rows, so the update reads contiguous memory).
// Off-diagonal entries are only ever combined with other off-diagonal entries (the pairs of a
// round are disjoint), so off(A) keeps decreasing quadratically far below eps ||A||: any tol down
// to the working precision's eps is reachable. The convergence test
// (off(A)^2 <= tol^2 ||A||_F^2) runs once per sweep.
//
// Precision: all arithmetic and the working copies of A and V are double, for float input too.
// With float storage the rounding of ~sweeps x n significant rotations per row is what limits
// the result: a float-only version of this kernel measured (host emulation, random symmetric
// n = 257) orthogonality ||V^T V - I||_F / sqrt(n) = 5e-5 and residual 5.6e-6, versus ~1e-6
// for LAPACK's float32 ssyevd; in double the float results are limited by their final rounding.
// The price is shared memory (16 n^2 bytes: on H100/H200 n <= 119 stays on chip) and FP64
// throughput, which matters little next to the kernel's two barriers per round (not yet measured:
// benchmarks/test_eigh_gpu.py).
//
// Output: eigenvalues sorted descending (ties by index), eigenvector columns permuted to match.
#include <cmath>
#include <cstdint>

#include "kernels.h"

namespace geomkern {
namespace cuda {
namespace {

constexpr int kMaxThreads = 1024;

using W = double;  // working precision (see the top of the file)
constexpr W kEps = 2.220446049250313e-16;

constexpr int kRedSlots = 128;  // block_sum's shared buffer (doubles), whatever the block size

__host__ __device__ inline int red_slots(int nt) { return nt < kRedSlots ? nt : kRedSlots; }

// Sum of one value per thread; every thread gets the same total (so branches on it are uniform).
// `red` holds red_slots(blockDim.x) elements: threads beyond the slots fold into them group by
// group (a fixed order: deterministic), then a tree. Any block size works.
__device__ W block_sum(W v, W* red) {
  const int tid = threadIdx.x, nt = blockDim.x, slots = red_slots(nt);
  if (tid < slots) red[tid] = v;
  __syncthreads();
  for (int g = 1; g * slots < nt; ++g) {
    if (tid / slots == g) red[tid - g * slots] += v;
    __syncthreads();
  }
  for (int width = slots; width > 1;) {
    const int half = (width + 1) / 2;
    if (tid < width - half) red[tid] += red[tid + half];
    __syncthreads();
    width = half;
  }
  const W total = red[0];
  __syncthreads();  // red is reused by the next call
  return total;
}

// Pair k (0 <= k < m/2) of round r (0 <= r < m-1) of the round-robin ordering of 0..m-1.
__device__ __forceinline__ void round_robin_pair(int m, int r, int k, int* p, int* q) {
  const int a = (k == 0) ? 0 : (k - 1 + r) % (m - 1) + 1;
  const int b = (m - 2 - k + r) % (m - 1) + 1;
  *p = a < b ? a : b;
  *q = a < b ? b : a;
}

// Working arrays of one block: A and V^T (n x n each, in shared memory or a global workspace),
// then scratch that is always in shared memory.
struct Layout {
  int n, m, h, nt;
  __host__ __device__ Layout(int n_, int nt_) : n(n_), m(n_ + (n_ & 1)), h(m / 2), nt(nt_) {}
  __host__ __device__ size_t matrix_elems() const { return 2 * static_cast<size_t>(n) * n; }
  __host__ __device__ size_t matrix_bytes() const { return matrix_elems() * sizeof(W); }
  // c, s, t per pair and the reduction buffer (W), then p, q per pair and the sort permutation.
  __host__ __device__ size_t scratch_bytes() const {
    return (3 * static_cast<size_t>(h) + red_slots(nt)) * sizeof(W) +
           (2 * static_cast<size_t>(h) + n) * sizeof(int);
  }
};

template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
eigh_kernel(const T* __restrict__ A, T* __restrict__ w_out, T* __restrict__ v_out,
                   int* __restrict__ info, int n, W tol, int max_sweeps, W* __restrict__ gwork) {
  extern __shared__ __align__(16) unsigned char gk_smem[];
  const Layout L(n, blockDim.x);
  const int tid = threadIdx.x, nt = blockDim.x, m = L.m, h = L.h;
  const int64_t mat = blockIdx.x;
  const int nn = n * n;

  W* smem = reinterpret_cast<W*>(gk_smem);
  W* a;  // working copy of A, n x n
  W* scratch;
  if (gwork != nullptr) {
    a = gwork + mat * static_cast<int64_t>(L.matrix_elems());
    scratch = smem;
  } else {
    a = smem;
    scratch = smem + L.matrix_elems();
  }
  W* vt = a + nn;  // V^T: row i is the i-th eigenvector
  W* cs = scratch;
  W* sn = cs + h;
  W* tn = sn + h;
  W* red = tn + h;
  int* pp = reinterpret_cast<int*>(red + red_slots(nt));
  int* qq = pp + h;
  int* perm = qq + h;

  const T* Ab = A + mat * nn;
  W local = 0;
  for (int i = tid; i < nn; i += nt) {
    const W x = Ab[i];
    a[i] = x;
    local += x * x;
    vt[i] = (i / n == i % n) ? W(1) : W(0);
  }
  const W thresh = tol * tol * block_sum(local, red);  // (tol ||A||_F)^2; block_sum syncs
  // Rotations for |a_pq| <= tol ||A||_F / n are skipped: all of them together stay under the
  // convergence threshold, and rotating them is worse than useless where eigenvalues repeat
  // (a_pp ~ a_qq makes the rotation ~45 degrees, which moves mass the previous rotations took
  // off the diagonal back onto it: an exactly repeated eigenvalue then stalled convergence).
  const W skip = sqrt(thresh) / n;

  int sweep = 0;
  bool converged = false;
  const int nblocks = h * (h + 1) / 2;  // pairs of pairs k1 <= k2
  for (;;) {
    local = 0;
    for (int i = tid; i < nn; i += nt) {
      if (i / n != i % n) local += a[i] * a[i];
    }
    const W off2 = block_sum(local, red);
    if (off2 <= thresh) {  // false for NaN: such a matrix runs to max_sweeps and reports -1
      converged = true;
      break;
    }
    if (sweep == max_sweeps) break;
    ++sweep;
    for (int r = 0; r < m - 1; ++r) {
      // ---- phase 1: one rotation per pair
      for (int k = tid; k < h; k += nt) {
        int p, q;
        round_robin_pair(m, r, k, &p, &q);
        W c = W(1), s = W(0), t = W(0);
        if (q < n) {  // q == n is the virtual index of an odd n: identity
          const W apq = a[p * n + q];
          if (fabs(apq) > skip) {
            const W theta = (a[q * n + q] - a[p * n + p]) / (W(2) * apq);
            const W at = fabs(theta);
            // beyond 1/eps, sqrt(theta^2 + 1) == |theta| and theta^2 may overflow
            t = at > W(1) / kEps ? W(0.5) / theta
                                 : (theta < W(0) ? W(-1) : W(1)) / (at + sqrt(at * at + W(1)));
            c = W(1) / sqrt(t * t + W(1));
            s = t * c;
          }
        }
        cs[k] = c;
        sn[k] = s;
        tn[k] = t;
        pp[k] = p;
        qq[k] = q;
      }
      __syncthreads();
      // ---- phase 2: A <- J^T A J in 2x2 blocks (k1 <= k2), V^T <- J^T V^T
      for (int idx = tid; idx < nblocks; idx += nt) {
        // idx = k2 (k2 + 1) / 2 + k1 with k1 <= k2
        int k2 = static_cast<int>((sqrt(W(8) * W(idx) + W(1)) - W(1)) * W(0.5));
        while (k2 * (k2 + 1) / 2 > idx) --k2;
        while ((k2 + 1) * (k2 + 2) / 2 <= idx) ++k2;
        const int k1 = idx - k2 * (k2 + 1) / 2;
        const int p1 = pp[k1], q1 = qq[k1];
        if (k1 == k2) {
          if (tn[k1] != W(0)) {  // a rotation (t == 0: skipped, or the virtual index)
            const W apq = a[p1 * n + q1], t = tn[k1];
            a[p1 * n + p1] -= t * apq;
            a[q1 * n + q1] += t * apq;
            a[p1 * n + q1] = W(0);
            a[q1 * n + p1] = W(0);
          }
          continue;
        }
        const int p2 = pp[k2], q2 = qq[k2];
        const bool q1ok = q1 < n, q2ok = q2 < n;  // p < q, so only q can be the virtual index
        const W c1 = cs[k1], s1 = sn[k1], c2 = cs[k2], s2 = sn[k2];
        const W x00 = a[p1 * n + p2];
        const W x01 = q2ok ? a[p1 * n + q2] : W(0);
        const W x10 = q1ok ? a[q1 * n + p2] : W(0);
        const W x11 = (q1ok && q2ok) ? a[q1 * n + q2] : W(0);
        // rows (p1, q1) by J1^T, then columns (p2, q2) by J2
        const W u00 = c1 * x00 - s1 * x10, u01 = c1 * x01 - s1 * x11;
        const W u10 = s1 * x00 + c1 * x10, u11 = s1 * x01 + c1 * x11;
        const W y00 = c2 * u00 - s2 * u01, y01 = s2 * u00 + c2 * u01;
        const W y10 = c2 * u10 - s2 * u11, y11 = s2 * u10 + c2 * u11;
        a[p1 * n + p2] = y00;
        a[p2 * n + p1] = y00;
        if (q2ok) {
          a[p1 * n + q2] = y01;
          a[q2 * n + p1] = y01;
        }
        if (q1ok) {
          a[q1 * n + p2] = y10;
          a[p2 * n + q1] = y10;
        }
        if (q1ok && q2ok) {
          a[q1 * n + q2] = y11;
          a[q2 * n + q1] = y11;
        }
      }
      for (int idx = tid; idx < h * n; idx += nt) {
        const int k = idx / n, j = idx - k * n;
        if (tn[k] == W(0)) continue;
        const int p = pp[k], q = qq[k];
        const W c = cs[k], s = sn[k];
        const W x = vt[p * n + j], y = vt[q * n + j];
        vt[p * n + j] = c * x - s * y;
        vt[q * n + j] = s * x + c * y;
      }
      __syncthreads();
    }
  }

  // ---- sort descending (ties by index) and write out. perm starts as the identity so that
  // even NaN eigenvalues (whose ranks can collide) leave only in-range indices in it.
  for (int i = tid; i < n; i += nt) perm[i] = i;
  __syncthreads();
  for (int i = tid; i < n; i += nt) {
    const W wi = a[i * n + i];
    int rank = 0;
    for (int j = 0; j < n; ++j) {
      const W wj = a[j * n + j];
      rank += (wj > wi || (wj == wi && j < i)) ? 1 : 0;
    }
    perm[rank] = i;
  }
  __syncthreads();
  T* w_b = w_out + mat * n;
  T* v_b = v_out + mat * nn;
  for (int c = tid; c < n; c += nt) w_b[c] = static_cast<T>(a[perm[c] * n + perm[c]]);
  for (int i = tid; i < nn; i += nt) {
    const int r = i / n, c = i - r * n;
    v_b[i] = static_cast<T>(vt[perm[c] * n + r]);
  }
  if (tid == 0) info[mat] = converged ? sweep : -1;
}

int threads_for(int n) {
  // Work per round is ~n^2/8 block updates + n^2/2 eigenvector updates. Sized so that an H100 SM
  // holds >= 32 warps for every n <= 128 (issue 13; 64 registers per thread, 228 KiB of shared
  // memory per SM): n <= 16 32 blocks x 2 warps; <= 32 12 x 4; <= 48 5 x 8; <= 64 2 x 16
  // (register-bound); above, one block of 32 warps (16 n^2 bytes leave room for one block, and
  // past n = 119 the register file does).
  if (n <= 16) return 64;
  if (n <= 32) return 128;
  if (n <= 48) return 256;
  if (n <= 64) return 512;
  return kMaxThreads;
}

int max_shared_bytes(cudaError_t* err) {
  int dev = 0, bytes = 0;
  *err = cudaGetDevice(&dev);
  if (*err == cudaSuccess)
    *err = cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  return bytes;
}

bool fits_in_shared(const Layout& L, size_t max_bytes) {
  return L.matrix_bytes() + L.scratch_bytes() <= max_bytes;
}

}  // namespace

template <typename T>
cudaError_t eigh_workspace_size(int64_t batch, int n, size_t* bytes) {
  if (bytes == nullptr || batch < 0 || n < 1 || n > kJacobiMaxN) return cudaErrorInvalidValue;
  cudaError_t err;
  const size_t max_bytes = static_cast<size_t>(max_shared_bytes(&err));
  if (err != cudaSuccess) return err;
  const Layout L(n, threads_for(n));
  *bytes = fits_in_shared(L, max_bytes) ? 0 : static_cast<size_t>(batch) * L.matrix_bytes();
  return cudaSuccess;
}

template <typename T>
cudaError_t eigh(const T* A, T* eigenvalues, T* eigenvectors, int* info, int64_t batch,
                        int n, T tol, int max_sweeps, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  if (batch < 0 || batch > 0x7fffffff || n < 1 || n > kJacobiMaxN || max_sweeps < 0 || !(tol >= T(0)))
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  cudaError_t err;
  const size_t max_bytes = static_cast<size_t>(max_shared_bytes(&err));
  if (err != cudaSuccess) return err;
  const Layout L(n, threads_for(n));
  W* gwork = nullptr;
  size_t smem = L.scratch_bytes();
  if (fits_in_shared(L, max_bytes)) {
    smem += L.matrix_bytes();
  } else {
    if (workspace == nullptr || workspace_bytes < static_cast<size_t>(batch) * L.matrix_bytes())
      return cudaErrorInvalidValue;
    gwork = static_cast<W*>(workspace);
  }
  if (smem > max_bytes) return cudaErrorInvalidValue;
  auto kernel = eigh_kernel<T>;
  err = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(batch));
  cfg.blockDim = dim3(static_cast<unsigned>(L.nt));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  return cudaLaunchKernelEx(&cfg, kernel, A, eigenvalues, eigenvectors, info, n, static_cast<W>(tol),
                            max_sweeps, gwork);
}

template cudaError_t eigh_workspace_size<float>(int64_t, int, size_t*);
template cudaError_t eigh_workspace_size<double>(int64_t, int, size_t*);
template cudaError_t eigh<float>(const float*, float*, float*, int*, int64_t, int, float, int,
                                        void*, size_t, cudaStream_t);
template cudaError_t eigh<double>(const double*, double*, double*, int*, int64_t, int, double,
                                         int, void*, size_t, cudaStream_t);

}  // namespace cuda
}  // namespace geomkern
