// The emulated CUDA runtime behind cuda_emu.h, and a C interface to csrc/cuda's launchers for
// ctypes (tests/geomkern/test_cuda_emulated.py). "Device" pointers are host pointers here.
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "kernels.h"

namespace gkemu {
namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kDefaultSmem = 48 * 1024;  // what a kernel gets without cudaFuncSetAttribute

struct Scheduler {
  ucontext_t main_ctx;
  std::vector<ucontext_t> ctx;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<char> done, at_barrier;
  unsigned cur = 0;
  const std::function<void()>* body = nullptr;
};

Scheduler g_sched;
size_t g_device_smem = 227 * 1024;  // cudaDevAttrMaxSharedMemoryPerBlockOptin (H100/H200)
std::map<const void*, size_t> g_func_smem;
std::mt19937_64 g_rng(0);
std::string g_error;

void fiber_entry() {
  (*g_sched.body)();
  g_sched.done[g_sched.cur] = 1;
  // returning resumes main_ctx through uc_link
}

}  // namespace

void sync_threads() {
  Scheduler& s = g_sched;
  s.at_barrier[s.cur] = 1;
  swapcontext(&s.ctx[s.cur], &s.main_ctx);
}

cudaError_t run(dim3 grid, dim3 block, size_t smem_bytes, const void* func, unsigned char* smem,
                const std::function<void()>& body) {
  const unsigned nt = block.x * block.y * block.z;
  if (block.y != 1 || block.z != 1 || grid.y != 1 || grid.z != 1 || nt == 0 || nt > 1024) {
    g_error = "emulator: only 1-D grids and blocks of 1..1024 threads";
    return kEmulationError;
  }
  auto it = g_func_smem.find(func);
  const size_t granted = it == g_func_smem.end() ? kDefaultSmem : it->second;
  if (smem_bytes > granted || smem_bytes > g_device_smem || smem_bytes > kSmemCapacity) {
    g_error = "emulator: launch asks for " + std::to_string(smem_bytes) +
              " bytes of dynamic shared memory; granted " + std::to_string(granted) + ", device " +
              std::to_string(g_device_smem);
    return kEmulationError;
  }
  Scheduler& s = g_sched;
  s.body = &body;
  if (s.ctx.size() < nt) {
    s.ctx.resize(nt);
    while (s.stacks.size() < nt) s.stacks.emplace_back(new char[kStackBytes]);
  }
  s.done.assign(nt, 0);
  s.at_barrier.assign(nt, 0);
  gridDim = grid;
  blockDim = block;
  std::vector<unsigned> order(nt);
  for (unsigned bx = 0; bx < grid.x; ++bx) {
    blockIdx = uint3{bx, 0, 0};
    std::memset(smem, 0xff, smem_bytes);  // NaN in every float/double: unwritten reads show up
    for (unsigned t = 0; t < nt; ++t) {
      getcontext(&s.ctx[t]);
      s.ctx[t].uc_stack.ss_sp = s.stacks[t].get();
      s.ctx[t].uc_stack.ss_size = kStackBytes;
      s.ctx[t].uc_link = &s.main_ctx;
      makecontext(&s.ctx[t], fiber_entry, 0);
    }
    std::fill(s.done.begin(), s.done.end(), 0);
    for (;;) {
      order.clear();
      for (unsigned t = 0; t < nt; ++t)
        if (!s.done[t]) order.push_back(t);
      if (order.empty()) break;
      std::shuffle(order.begin(), order.end(), g_rng);
      for (unsigned t : order) {
        s.at_barrier[t] = 0;
        s.cur = t;
        threadIdx = uint3{t, 0, 0};
        swapcontext(&s.main_ctx, &s.ctx[t]);
      }
      unsigned waiting = 0, finished = 0;
      for (unsigned t = 0; t < nt; ++t) {
        waiting += s.at_barrier[t] && !s.done[t];
        finished += s.done[t];
      }
      if (waiting != 0 && finished != 0) {
        g_error = "emulator: block " + std::to_string(bx) + ": " + std::to_string(waiting) +
                  " thread(s) wait at __syncthreads() while " + std::to_string(finished) +
                  " have returned (divergent barrier)";
        return kEmulationError;
      }
    }
  }
  return cudaSuccess;
}

}  // namespace gkemu

// ---- the CUDA runtime calls the launchers make
extern "C" {
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (device != 0 || attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return cudaErrorInvalidValue;
  *value = static_cast<int>(gkemu::g_device_smem);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<size_t>(value) > gkemu::g_device_smem)
    return cudaErrorInvalidValue;
  gkemu::g_func_smem[func] = static_cast<size_t>(value);
  return cudaSuccess;
}
}

// ---- C interface for ctypes
extern "C" {
// Device shared memory the launchers see; seed of the per-phase thread order.
void emu_configure(int64_t device_smem_bytes, uint64_t seed) {
  gkemu::g_device_smem = static_cast<size_t>(device_smem_bytes);
  gkemu::g_rng.seed(seed);
}

const char* emu_last_error() { return gkemu::g_error.c_str(); }

#define GK_EMU_JACOBI(SUFFIX, T)                                                                    \
  int emu_eigh_##SUFFIX(const T* A, T* w, T* V, int* info, int64_t batch, int n, T tol,      \
                               int max_sweeps, int64_t* workspace_bytes) {                          \
    size_t ws = 0;                                                                                  \
    cudaError_t err = geomkern::cuda::eigh_workspace_size<T>(batch, n, &ws);                \
    if (err != cudaSuccess) return err;                                                             \
    *workspace_bytes = static_cast<int64_t>(ws);                                                    \
    std::vector<unsigned char> work(ws, 0xff);                                                      \
    return geomkern::cuda::eigh<T>(A, w, V, info, batch, n, tol, max_sweeps,                \
                                          ws ? work.data() : nullptr, ws, nullptr);                 \
  }
GK_EMU_JACOBI(f32, float)
GK_EMU_JACOBI(f64, double)

#define GK_EMU_PREIMAGE(SUFFIX, T)                                                                  \
  int emu_preimage_gd_##SUFFIX(const T* Z0, const T* B, const T* targets, const T* lr, T* out,      \
                               int64_t b, int64_t S, int64_t D, T gamma, int64_t steps,             \
                               int* points) {                                                       \
    cudaError_t err = geomkern::cuda::preimage_gd_tile_points<T>(S, D, points);                    \
    if (err != cudaSuccess) return err;                                                             \
    return geomkern::cuda::preimage_gd<T>(Z0, B, targets, lr, out, b, S, D, gamma, steps, nullptr); \
  }
GK_EMU_PREIMAGE(f32, float)
GK_EMU_PREIMAGE(f64, double)
}
