// geomkern._C_cuda: the torch-facing side of csrc/cuda/, registered with torch through its stable
// ABI (csrc/stable.h) as the operators torch.ops.geomkern_cuda.*; geomkern/backends/native loads
// the library and calls them. Checks devices, dtypes, shapes and contiguity, allocates outputs and
// workspace with torch's allocator, and calls the torch-free launchers of csrc/cuda/kernels.h on
// the current CUDA stream of the input's device. No pybind11 and no Python C API: like
// geomkern._C, one build loads into every torch from 2.10 on and every Python from 3.10 on
// (TORCH_TARGET_VERSION, setup.py), provided torch's CUDA major version is the one this was built
// with (cuda_version() below; the loader checks it).
//
// Its own namespace, geomkern_cuda, rather than CUDA kernels in a fragment of geomkern_native:
// the two libraries then load (or fail) independently, as gk.why_not reports them per device
// type: this one needs no geomkern._C loaded first, and loads beside a _C of another build.
//
// The current stream: torch::stable::accelerator::Stream::nativeHandle() needs torch 2.13's
// stable ABI; the AOTInductor C shim's aoti_torch_get_current_cuda_stream (in libtorch_cuda)
// gives the same cudaStream_t and is in every torch this library targets.
#ifndef USE_CUDA
#define USE_CUDA  // the shim declares its CUDA entry points only for CUDA builds, as this is
#endif
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include "../stable.h"  // csrc/stable.h: the helpers and checks _C uses

#include <cuda_runtime_api.h>

#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels.h"

namespace {

using geomkern::ScalarType;
using geomkern::Tensor;

// A launcher's error: not an argument the caller could fix, so an untagged RuntimeError.
void check_launch(cudaError_t err, const char* what) {
  STD_TORCH_CHECK(err == cudaSuccess, "geomkern._C_cuda.", what, ": ", cudaGetErrorString(err));
}

std::string device_str(const Tensor& t) {
  if (t.is_cuda()) return "cuda:" + std::to_string(t.get_device_index());
  if (t.is_cpu()) return "cpu";
  return "a non-CUDA device";
}

const char* dtype_str(ScalarType s) {
  switch (s) {
    case ScalarType::Float: return "torch.float32";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Bool: return "torch.bool";
    default: return "a non-floating dtype";
  }
}

std::string shape_str(const Tensor& t) {
  std::ostringstream s;
  s << "[";
  for (int64_t i = 0; i < t.dim(); ++i) s << (i ? ", " : "") << t.size(i);
  s << "]";
  return s.str();
}

void check_input(const Tensor& t, const char* name, const Tensor& like) {
  GK_CHECK_VALUE(t.is_cuda(), name, " must be a CUDA tensor, got one on ", device_str(t));
  GK_CHECK_VALUE(t.get_device_index() == like.get_device_index(), name, " is on ", device_str(t),
                 " but the first input is on ", device_str(like));
  GK_CHECK_TYPE(t.scalar_type() == like.scalar_type(), name, " has dtype ", dtype_str(t.scalar_type()),
                " but the first input has ", dtype_str(like.scalar_type()));
  GK_CHECK_TYPE(geomkern::st::is_floating(t), name, " must be float32 or float64, got ",
                dtype_str(t.scalar_type()));
  GK_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous (call .contiguous() first)");
}

cudaStream_t current_stream(int32_t device) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  return static_cast<cudaStream_t>(stream);
}

template <class F>
void dispatch_floating(const Tensor& t, F&& f) {
  if (t.scalar_type() == ScalarType::Double)
    f(double{});
  else
    f(float{});
}

// A: (..., n, n) symmetric. Returns eigenvalues (..., n) descending, eigenvectors (..., n, n)
// (columns) and info (...) int32: sweeps used, or -1 where a matrix did not converge.
std::tuple<Tensor, Tensor, Tensor> eigh(Tensor A, double tol, int64_t max_sweeps) {
  check_input(A, "A", A);
  GK_CHECK_VALUE(A.dim() >= 2 && A.size(-1) == A.size(-2), "A must have shape (..., n, n), got ",
                 shape_str(A));
  const int64_t n = A.size(-1);
  GK_CHECK_VALUE(n >= 1 && n <= geomkern::cuda::kJacobiMaxN, "the CUDA Jacobi solver takes 1 <= n <= ",
                 geomkern::cuda::kJacobiMaxN, ", got n = ", n);
  GK_CHECK_VALUE(tol >= 0, "tol must be >= 0, got ", tol);
  GK_CHECK_VALUE(max_sweeps >= 0 && max_sweeps <= 1000000, "max_sweeps must be in [0, 1e6], got ",
                 max_sweeps);
  const int64_t batch = A.numel() / (n * n);
  std::vector<int64_t> batch_shape;
  for (int64_t i = 0; i < A.dim() - 2; ++i) batch_shape.push_back(A.size(i));
  std::vector<int64_t> w_shape = batch_shape;
  w_shape.push_back(n);
  std::vector<int64_t> a_shape = w_shape;
  a_shape.push_back(n);
  Tensor w = geomkern::st::empty(A, w_shape);
  Tensor V = geomkern::st::empty(A, a_shape);
  Tensor info = geomkern::st::empty(A, batch_shape, ScalarType::Int);
  if (batch == 0) return {w, V, info};

  const torch::stable::accelerator::DeviceGuard guard(A.get_device_index());
  const cudaStream_t stream = current_stream(A.get_device_index());
  dispatch_floating(A, [&](auto zero) {
    using scalar_t = decltype(zero);
    size_t ws_bytes = 0;
    check_launch(geomkern::cuda::eigh_workspace_size<scalar_t>(batch, static_cast<int>(n), &ws_bytes),
                 "eigh_workspace_size");
    // Freed when this scope ends: the caching allocator only hands it out again to work that is
    // ordered after this kernel on the same stream.
    std::optional<Tensor> work;
    if (ws_bytes > 0) work = geomkern::st::empty(A, {static_cast<int64_t>(ws_bytes)}, ScalarType::Byte);
    check_launch(geomkern::cuda::eigh<scalar_t>(
                     static_cast<const scalar_t*>(A.data_ptr()), static_cast<scalar_t*>(w.data_ptr()),
                     static_cast<scalar_t*>(V.data_ptr()), static_cast<int*>(info.data_ptr()), batch,
                     static_cast<int>(n), static_cast<scalar_t>(tol), static_cast<int>(max_sweeps),
                     work ? work->data_ptr() : nullptr, ws_bytes, stream),
                 "eigh");
  });
  return {w, V, info};
}

// Points per block the pre-image kernel takes for (S, D) in float32 or float64 on CUDA device
// ``device``: 32, 16 or 8, 0 where even 8 do not fit its shared memory, -1 if the device could
// not be queried (no such device, no driver). Never throws.
int64_t preimage_gd_points(int64_t S, int64_t D, bool is_double, int64_t device) {
  if (S < 1 || D < 1 || device < 0) return -1;
  try {
    const torch::stable::accelerator::DeviceGuard guard(static_cast<int32_t>(device));
    int points = -1;
    const cudaError_t err = is_double ? geomkern::cuda::preimage_gd_tile_points<double>(S, D, &points)
                                      : geomkern::cuda::preimage_gd_tile_points<float>(S, D, &points);
    return err == cudaSuccess ? points : -1;
  } catch (const std::exception&) {  // the guard: no CUDA device of that index
    return -1;
  }
}

// Same signature and math as geomkern.ops.preimage.gd_reference.
Tensor preimage_gd(Tensor Z0, Tensor B, Tensor T, double gamma, int64_t steps, Tensor lr) {
  check_input(Z0, "Z0", Z0);
  check_input(B, "B", Z0);
  check_input(T, "T", Z0);
  check_input(lr, "lr", Z0);
  GK_CHECK_VALUE(Z0.dim() == 2 && B.dim() == 2 && B.size(1) == Z0.size(1),
                 "Z0 (b, D) and B (S, D) must share D, got ", shape_str(Z0), " and ", shape_str(B));
  const int64_t b = Z0.size(0), D = Z0.size(1), S = B.size(0);
  GK_CHECK_VALUE(S >= 1 && D >= 1, "B must be non-empty, got ", shape_str(B));
  GK_CHECK_VALUE(T.dim() == 2 && T.size(0) == b && T.size(1) == S, "T must have shape (", b, ", ", S,
                 "), got ", shape_str(T));
  GK_CHECK_VALUE(lr.dim() == 1 && lr.size(0) == b, "lr must have shape (", b, "), got ", shape_str(lr));
  GK_CHECK_VALUE(gamma > 0, "gamma must be > 0, got ", gamma);
  GK_CHECK_VALUE(steps >= 0, "steps must be >= 0, got ", steps);
  // Whether the problem fits shared memory, before anything is allocated or launched. The Python
  // wrapper asks preimage_gd_points first (geomkern/backends/native), so through gk.preimage this
  // throw is not reached; it is a limit of this device, not a bad argument: an untagged
  // RuntimeError. (On the GPU image every refusal with a number in its message crashed: its
  // compiler linked libstdc++ statically; setup.py's SHARED_LIBSTDCXX, studies/preimage-throw.)
  const int64_t points = preimage_gd_points(S, D, Z0.scalar_type() == ScalarType::Double,
                                            Z0.get_device_index());
  STD_TORCH_CHECK(points >= 0, "geomkern._C_cuda.preimage_gd: could not query the device's shared memory");
  STD_TORCH_CHECK(points > 0, "the CUDA pre-image kernel keeps 8 points' iterate and weights (8 (S + D) "
                  "elements) in shared memory, which S = ", S, ", D = ", D, " in ",
                  dtype_str(Z0.scalar_type()),
                  " exceed on this device; use backend 'triton' or 'reference' for this problem");
  Tensor out = geomkern::st::empty(Z0, {b, D});
  if (b == 0) return out;

  const torch::stable::accelerator::DeviceGuard guard(Z0.get_device_index());
  const cudaStream_t stream = current_stream(Z0.get_device_index());
  dispatch_floating(Z0, [&](auto zero) {
    using scalar_t = decltype(zero);
    check_launch(geomkern::cuda::preimage_gd<scalar_t>(
                     static_cast<const scalar_t*>(Z0.data_ptr()), static_cast<const scalar_t*>(B.data_ptr()),
                     static_cast<const scalar_t*>(T.data_ptr()), static_cast<const scalar_t*>(lr.data_ptr()),
                     static_cast<scalar_t*>(out.data_ptr()), b, S, D, static_cast<scalar_t>(gamma), steps,
                     stream),
                 "preimage_gd");
  });
  return out;
}

// The CUDA runtime this library was compiled and (statically) linked with, as CUDART_VERSION:
// 1000 major + 10 minor (13000 = CUDA 13.0). The loader compares its major with torch.version.cuda.
int64_t cuda_version() { return CUDART_VERSION; }

}  // namespace

STABLE_TORCH_LIBRARY(geomkern_cuda, m) {
  // batched symmetric eigen-decomposition (parallel Jacobi, one block per matrix): eigenvalues
  // descending, eigenvectors, info (sweeps used, -1 = not converged)
  m.def("eigh(Tensor A, float tol, int max_sweeps) -> (Tensor, Tensor, Tensor)");
  // points per block of the CUDA pre-image kernel for (S, D): 32, 16 or 8; 0 when none fits
  // shared memory; -1 when the device cannot be queried
  m.def("preimage_gd_points(int S, int D, bool is_double, int device) -> int");
  // fused gradient-descent pre-image loop (all steps in one launch)
  m.def("preimage_gd(Tensor Z0, Tensor B, Tensor T, float gamma, int steps, Tensor lr) -> Tensor");
  // CUDART_VERSION of the build (13000 = CUDA 13.0)
  m.def("cuda_version() -> int");
}

STABLE_TORCH_LIBRARY_IMPL(geomkern_cuda, CUDA, m) {
  m.impl("eigh", TORCH_BOX(&eigh));
  m.impl("preimage_gd", TORCH_BOX(&preimage_gd));
}

// CPU tensors reach the same functions, whose first check refuses them by name ("A must be a
// CUDA tensor, got one on cpu") instead of the dispatcher's "Could not run ... 'CPU' backend"
STABLE_TORCH_LIBRARY_IMPL(geomkern_cuda, CPU, m) {
  m.impl("eigh", TORCH_BOX(&eigh));
  m.impl("preimage_gd", TORCH_BOX(&preimage_gd));
}

// no tensor arguments: no device to dispatch on
STABLE_TORCH_LIBRARY_IMPL(geomkern_cuda, CompositeExplicitAutograd, m) {
  m.impl("preimage_gd_points", TORCH_BOX(&preimage_gd_points));
  m.impl("cuda_version", TORCH_BOX(&cuda_version));
}
