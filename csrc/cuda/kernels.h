// Torch-free launchers for geomkern's CUDA kernels (csrc/cuda/*.cu).
//
// Raw device pointers, sizes and a cudaStream_t in; a cudaError_t out (launch or configuration
// errors; kernels run asynchronously on `stream`). The torch-facing glue that checks tensors and
// passes the current stream is csrc/cuda_bindings/cuda_ops.cpp. Every launcher is instantiated
// for float and double. All arrays are dense row-major and must not overlap.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace geomkern {
namespace cuda {

// ---------------------------------------------------------------- eigh.cu
//
// Batched symmetric eigen-decomposition by parallel-order (round-robin) cyclic Jacobi, one
// thread block per matrix. A sweep is m-1 rounds of m/2 disjoint rotations applied together
// (m = n rounded up to even; an odd n gets a virtual index whose rotations are the identity), so
// every pair (p, q) is rotated once per sweep. A matrix is converged when its off-diagonal
// Frobenius norm is <= tol * ||A||_F; it stops after max_sweeps otherwise.
//
// Arithmetic is in double for float input too (the reason is in eigh.cu). Where the
// matrix lives: when the double working copy of A and the accumulated V^T (16 n^2 bytes) plus
// O(n) scratch fit in the device's opt-in shared memory per block
// (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB on H100/H200, i.e. n <= 119), everything
// stays in shared memory; otherwise both live in a caller-provided global workspace
// (eigh_workspace_size) and only the O(n) scratch is in shared memory.
// n <= kJacobiMaxN (the O(n) scratch stays within 48 KiB), but one block per matrix is meant for
// many small matrices: a sweep costs ~n^3 / blockDim per thread, and a batch smaller than the
// number of SMs leaves the rest of the GPU idle.
constexpr int kJacobiMaxN = 2048;

// Bytes of global workspace eigh needs for `batch` matrices of size n on the current
// device: 0 when they fit in shared memory.
template <typename T>
cudaError_t eigh_workspace_size(int64_t batch, int n, size_t* bytes);

// A: (batch, n, n) symmetric (only exactly symmetric input is meaningful: both triangles are read).
// eigenvalues: (batch, n), descending. eigenvectors: (batch, n, n), column j is the unit
// eigenvector of eigenvalue j (signs as they come out of the rotations).
// info: (batch,) int, the number of sweeps used, or -1 when off(A) > tol ||A||_F after
// max_sweeps (the outputs are then the last iterate: not converged, or NaN/Inf in A).
// tol: relative off-diagonal tolerance; eps / sqrt(n) (eps of T) bounds off(A) by eps ||A||_2,
// backward-stable accuracy (geomkern.backends.native.cuda.eigh_tol). max_sweeps >= 0.
template <typename T>
cudaError_t eigh(const T* A, T* eigenvalues, T* eigenvectors, int* info, int64_t batch,
                        int n, T tol, int max_sweeps, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream);

// ---------------------------------------------------------------- preimage.cu
//
// Fused gradient-descent pre-image loop, same math as geomkern.ops.preimage.gd_reference:
// for each point, `steps` times
//   k_s = exp(-gamma max(|z|^2 + |b_s|^2 - 2 <z, b_s>, 0)),  w_s = (k_s - T_s) k_s,
//   z  <- z + 4 gamma lr ((sum_s w_s) z - sum_s w_s b_s).
// One block per tile of P points (P = 32, 16 or 8, the largest whose iterate (P x D) and weights
// (P x S) fit in shared memory); every step of the tile runs in that block with the iterate kept
// in shared memory, B streamed through shared memory in (4096 / P) x P tiles, both products
// register-blocked 4 x 4 per thread with 16-byte shared loads (1 LDS.128 per 8 FFMA). Tested
// under host emulation (tests/geomkern/test_cuda_emulated.py; tests/geomkern/test_cuda_native.py is the on-GPU
// check); its speed has not been measured yet (a model: docs/history.md §12).

// Points per block preimage_gd would use for this S, D on the current device; 0 when even 8
// points do not fit (8 (S + D) + S elements plus a 512 x 8 tile of B must fit in the opt-in
// shared memory: on H100, S + D <= ~6,000 in float, ~2,700 in double).
template <typename T>
cudaError_t preimage_gd_tile_points(int64_t S, int64_t D, int* points);

// Z0: (b, D) starting points; B: (S, D) basis; targets: (b, S); lr: (b,) per-point step;
// out: (b, D). steps >= 0 (0 copies Z0). cudaErrorInvalidValue when S, D do not fit (see above).
template <typename T>
cudaError_t preimage_gd(const T* Z0, const T* B, const T* targets, const T* lr, T* out, int64_t b,
                        int64_t S, int64_t D, T gamma, int64_t steps, cudaStream_t stream);

}  // namespace cuda
}  // namespace geomkern
