// Python bindings for geomkern._C_cuda: the torch-facing side of csrc/cuda/ (built by setup.py
// only with a CUDA build of torch and a CUDA toolkit). Checks devices, dtypes, shapes and
// contiguity, allocates outputs and workspace with torch's allocator, and calls the torch-free
// launchers of csrc/cuda/kernels.h on the current CUDA stream of the input's device.
//
// c10::cuda::getCurrentCUDAStream is what at::cuda::getCurrentCUDAStream names; the c10 header is
// used so this file does not pull in ATen/cuda/CUDAContext.h (cuBLAS/cuSPARSE headers).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <string>
#include <vector>

#include "kernels.h"

namespace {

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "geomkern._C_cuda.", what, ": ", cudaGetErrorString(err));
}

void check_input(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got one on ", t.device());
  TORCH_CHECK(t.device() == like.device(), name, " is on ", t.device(), " but the first input is on ",
              like.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, " has dtype ", t.scalar_type(),
              " but the first input has ", like.scalar_type());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, name,
              " must be float32 or float64, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous (call .contiguous() first)");
}

// A: (..., n, n) symmetric. Returns eigenvalues (..., n) descending, eigenvectors (..., n, n)
// (columns) and info (...) int32: sweeps used, or -1 where a matrix did not converge.
std::vector<at::Tensor> eigh(const at::Tensor& A, double tol, int64_t max_sweeps) {
  check_input(A, "A", A);
  TORCH_CHECK(A.dim() >= 2 && A.size(-1) == A.size(-2), "A must have shape (..., n, n), got ",
              A.sizes());
  const int64_t n = A.size(-1);
  TORCH_CHECK(n >= 1 && n <= geomkern::cuda::kJacobiMaxN, "the CUDA Jacobi solver takes 1 <= n <= ",
              geomkern::cuda::kJacobiMaxN, ", got n = ", n);
  TORCH_CHECK(tol >= 0, "tol must be >= 0, got ", tol);
  TORCH_CHECK(max_sweeps >= 0 && max_sweeps <= 1000000, "max_sweeps must be in [0, 1e6], got ",
              max_sweeps);
  const int64_t batch = A.numel() / (n * n);
  const auto batch_shape = A.sizes().slice(0, A.dim() - 2);
  std::vector<int64_t> w_shape(batch_shape.begin(), batch_shape.end());
  w_shape.push_back(n);
  at::Tensor w = at::empty(w_shape, A.options());
  at::Tensor V = at::empty_like(A);
  at::Tensor info = at::empty(batch_shape, A.options().dtype(at::kInt));
  if (batch == 0) return {w, V, info};

  const c10::cuda::CUDAGuard guard(A.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(A.device().index()).stream();
  AT_DISPATCH_FLOATING_TYPES(A.scalar_type(), "eigh", [&] {
    size_t ws_bytes = 0;
    check_launch(geomkern::cuda::eigh_workspace_size<scalar_t>(batch, static_cast<int>(n), &ws_bytes),
                 "eigh_workspace_size");
    // Freed when this scope ends: the caching allocator only hands it out again to work that is
    // ordered after this kernel on the same stream.
    at::Tensor work;
    if (ws_bytes > 0) work = at::empty({static_cast<int64_t>(ws_bytes)}, A.options().dtype(at::kByte));
    check_launch(geomkern::cuda::eigh<scalar_t>(
                     A.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), V.data_ptr<scalar_t>(),
                     info.data_ptr<int>(), batch, static_cast<int>(n), static_cast<scalar_t>(tol),
                     static_cast<int>(max_sweeps), ws_bytes ? work.data_ptr() : nullptr, ws_bytes, stream),
                 "eigh");
  });
  return {w, V, info};
}

// Points per block the pre-image kernel takes for (S, D) in float32 or float64 on CUDA device
// ``device``: 32, 16 or 8, 0 where even 8 do not fit its shared memory, -1 if the device could
// not be queried. Never throws.
int64_t preimage_gd_points(int64_t S, int64_t D, bool is_double, int64_t device) {
  if (S < 1 || D < 1) return -1;
  int points = -1;
  const c10::cuda::OptionalCUDAGuard guard(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  const cudaError_t err = is_double ? geomkern::cuda::preimage_gd_tile_points<double>(S, D, &points)
                                    : geomkern::cuda::preimage_gd_tile_points<float>(S, D, &points);
  return err == cudaSuccess ? points : -1;
}

// Same signature and math as geomkern.ops.preimage.gd_reference.
at::Tensor preimage_gd(const at::Tensor& Z0, const at::Tensor& B, const at::Tensor& T, double gamma,
                       int64_t steps, const at::Tensor& lr) {
  check_input(Z0, "Z0", Z0);
  check_input(B, "B", Z0);
  check_input(T, "T", Z0);
  check_input(lr, "lr", Z0);
  TORCH_CHECK(Z0.dim() == 2 && B.dim() == 2 && B.size(1) == Z0.size(1),
              "Z0 (b, D) and B (S, D) must share D, got ", Z0.sizes(), " and ", B.sizes());
  const int64_t b = Z0.size(0), D = Z0.size(1), S = B.size(0);
  TORCH_CHECK(S >= 1 && D >= 1, "B must be non-empty, got ", B.sizes());
  TORCH_CHECK(T.dim() == 2 && T.size(0) == b && T.size(1) == S, "T must have shape (", b, ", ", S,
              "), got ", T.sizes());
  TORCH_CHECK(lr.dim() == 1 && lr.size(0) == b, "lr must have shape (", b, "), got ", lr.sizes());
  TORCH_CHECK(gamma > 0, "gamma must be > 0, got ", gamma);
  TORCH_CHECK(steps >= 0, "steps must be >= 0, got ", steps);
  // Whether the problem fits shared memory, before anything is allocated or launched. The Python
  // wrapper asks preimage_gd_points first (geomkern/backends/native), so through gk.preimage this
  // throw is not reached. (On the GPU image every refusal with a number in its message crashed:
  // its compiler linked libstdc++ statically; setup.py's SHARED_LIBSTDCXX, studies/preimage-throw.)
  const int points = preimage_gd_points(S, D, Z0.scalar_type() == at::kDouble, Z0.device().index());
  TORCH_CHECK(points >= 0, "geomkern._C_cuda.preimage_gd: could not query the device's shared memory");
  TORCH_CHECK(points > 0, "the CUDA pre-image kernel keeps 8 points' iterate and weights (8 (S + D) "
              "elements) in shared memory, which S = ", S, ", D = ", D, " in ", Z0.scalar_type(),
              " exceed on this device; use backend 'triton' or 'reference' for this problem");
  at::Tensor out = at::empty_like(Z0);
  if (b == 0) return out;

  const c10::cuda::CUDAGuard guard(Z0.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(Z0.device().index()).stream();
  AT_DISPATCH_FLOATING_TYPES(Z0.scalar_type(), "preimage_gd", [&] {
    check_launch(geomkern::cuda::preimage_gd<scalar_t>(
                     Z0.data_ptr<scalar_t>(), B.data_ptr<scalar_t>(), T.data_ptr<scalar_t>(),
                     lr.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), b, S, D,
                     static_cast<scalar_t>(gamma), steps, stream),
                 "preimage_gd");
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "geomkern native kernels (CUDA C++)";
  m.def("eigh", &eigh,
        "batched symmetric eigen-decomposition (parallel Jacobi, one block per matrix): "
        "eigenvalues descending, eigenvectors, info (sweeps used, -1 = not converged)",
        py::arg("A"), py::arg("tol"), py::arg("max_sweeps"), py::call_guard<py::gil_scoped_release>());
  m.def("preimage_gd_points", &preimage_gd_points,
        "points per block of the CUDA pre-image kernel for (S, D): 32, 16 or 8; 0 when none fits "
        "shared memory; -1 when the device cannot be queried", py::arg("S"), py::arg("D"),
        py::arg("is_double"), py::arg("device"));
  m.def("preimage_gd", &preimage_gd,
        "fused gradient-descent pre-image loop (all steps in one launch)", py::arg("Z0"), py::arg("B"),
        py::arg("T"), py::arg("gamma"), py::arg("steps"), py::arg("lr"),
        py::call_guard<py::gil_scoped_release>());
}
