// Host-only check of csrc/cuda/kernels.h: calls every launcher, for float and double, the way
// csrc/cuda_bindings/cuda_ops.cpp does (device buffers, workspace query, a stream).
// tests/geomkern/test_nvcc_compile.py compiles it and links it against the objects of csrc/cuda/*.cu, so
// a declaration that does not match its definition (or a missing instantiation) fails there
// without a GPU. Run on a GPU machine it also checks that the launches succeed on zeroed input.
#include <cstdio>

#include "kernels.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    const cudaError_t err_ = (call);                                                     \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                  \
                   cudaGetErrorString(err_));                                            \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

template <typename T>
int check(cudaStream_t stream) {
  namespace gk = geomkern::cuda;
  for (int n : {7, 100, 512}) {  // 512: beyond shared memory, the global-workspace path
    const int64_t batch = 3;
    T *A = nullptr, *w = nullptr, *V = nullptr;
    int* info = nullptr;
    CHECK(cudaMalloc(&A, sizeof(T) * batch * n * n));
    CHECK(cudaMemset(A, 0, sizeof(T) * batch * n * n));
    CHECK(cudaMalloc(&w, sizeof(T) * batch * n));
    CHECK(cudaMalloc(&V, sizeof(T) * batch * n * n));
    CHECK(cudaMalloc(&info, sizeof(int) * batch));
    size_t ws = 0;
    CHECK(gk::eigh_workspace_size<T>(batch, n, &ws));
    void* work = nullptr;
    if (ws > 0) CHECK(cudaMalloc(&work, ws));
    CHECK(gk::eigh<T>(A, w, V, info, batch, n, T(1e-7), 30, work, ws, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaFree(A));
    CHECK(cudaFree(w));
    CHECK(cudaFree(V));
    CHECK(cudaFree(info));
    if (work != nullptr) CHECK(cudaFree(work));
  }
  const int64_t b = 100, S = 512, D = 512;
  int points = 0;
  CHECK(gk::preimage_gd_tile_points<T>(S, D, &points));
  if (points == 0) return 1;
  T *Z0 = nullptr, *B = nullptr, *targets = nullptr, *lr = nullptr, *out = nullptr;
  CHECK(cudaMalloc(&Z0, sizeof(T) * b * D));
  CHECK(cudaMalloc(&B, sizeof(T) * S * D));
  CHECK(cudaMalloc(&targets, sizeof(T) * b * S));
  CHECK(cudaMalloc(&lr, sizeof(T) * b));
  CHECK(cudaMalloc(&out, sizeof(T) * b * D));
  CHECK(cudaMemset(Z0, 0, sizeof(T) * b * D));
  CHECK(cudaMemset(B, 0, sizeof(T) * S * D));
  CHECK(cudaMemset(targets, 0, sizeof(T) * b * S));
  CHECK(cudaMemset(lr, 0, sizeof(T) * b));
  CHECK(gk::preimage_gd<T>(Z0, B, targets, lr, out, b, S, D, T(0.5), 10, stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaFree(Z0));
  CHECK(cudaFree(B));
  CHECK(cudaFree(targets));
  CHECK(cudaFree(lr));
  CHECK(cudaFree(out));
  return 0;
}

int main() {
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  const int failed = check<float>(stream) | check<double>(stream);
  CHECK(cudaStreamDestroy(stream));
  std::printf(failed ? "launch_check: FAILED\n" : "launch_check: ok\n");
  return failed;
}
