// Host emulation of the CUDA subset csrc/cuda/*.cu use, so their kernels can be run and tested on
// a machine without a GPU (tests/geomkern/test_cuda_emulated.py). Force-included (g++ -include) ahead of
// a .cu compiled as C++; the real toolkit header cuda_runtime_api.h supplies the types (dim3,
// cudaError_t, cudaLaunchConfig_t), and crt/host_defines.h already turns __global__, __device__,
// __host__ and __shared__ into nothing for a non-CUDA compiler.
//
// A launch runs the grid's blocks one after another. The threads of a block are fibers
// (ucontext) that run until their next __syncthreads(); each barrier phase resumes them in a
// fresh random order, so a thread that reads what another thread wrote in the same phase (a
// missing __syncthreads) gives order-dependent results that the tests catch. Also checked:
// __syncthreads() reached by only some threads of a block, dynamic shared memory above the
// amount the kernel was granted (cudaFuncSetAttribute) or the device has, and reads of shared
// memory never written (it is filled with NaN bytes before every block).
//
// What it cannot check: warp-level timing, memory-model subtleties, register/occupancy limits,
// and CUDA's own math-library rounding (expf here is glibc's).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <tuple>
#include <utility>

#define __launch_bounds__(...)

inline uint3 threadIdx;
inline uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

namespace gkemu {
constexpr size_t kSmemCapacity = 256 * 1024;
// Runs `body` for every thread of every block; returns cudaSuccess or gkemu::kEmulationError.
cudaError_t run(dim3 grid, dim3 block, size_t smem_bytes, const void* func, unsigned char* smem,
                const std::function<void()>& body);
void sync_threads();
constexpr cudaError_t kEmulationError = static_cast<cudaError_t>(999);
}  // namespace gkemu

inline void __syncthreads() { gkemu::sync_threads(); }

// The kernels' `extern __shared__ unsigned char gk_smem[]` (declared inside functions of this
// unnamed namespace) refer to this array: one per translation unit, blocks run one at a time.
namespace geomkern {
namespace cuda {
namespace {
alignas(16) unsigned char gk_smem[gkemu::kSmemCapacity];
}  // namespace
}  // namespace cuda
}  // namespace geomkern

template <typename... ExpTypes, typename... ActTypes>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(ExpTypes...),
                               ActTypes&&... args) {
  std::tuple<ExpTypes...> coerced(std::forward<ActTypes>(args)...);
  return gkemu::run(config->gridDim, config->blockDim, config->dynamicSmemBytes,
                    reinterpret_cast<const void*>(kernel), geomkern::cuda::gk_smem,
                    [&] { std::apply(kernel, coerced); });
}
