// rbf_matmul on the CPU: out = K(X, Y) V with K_ij = exp(-gamma max(|x_i|^2 + |y_j|^2 - 2<x_i, y_j>, 0)),
// tiled so K is never stored: threads take blocks of kRows rows of X; for each block of kCols
// rows of Y a thread forms the kRows x kCols tile of dots (one GEMM), turns it into kernel
// values in place (simd::vexp) and accumulates tile x V into its rows of out (a second GEMM).
// Memory: out and the norms, O((n + m) p), plus one kRows x kCols tile per thread. Each row of
// out is summed over the column blocks in one order, so the result does not depend on the
// thread count.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "ops.h"
#include "simd.h"

namespace geomkern {
namespace GEOMKERN_ISA_NS {
namespace {

using namespace simd;

// 128 x 1024 float32 tiles (512 KiB): the dot GEMM stays efficient (k = D) and the tile stays
// in L2 between the exp pass and the second GEMM.
constexpr int64_t kRows = 128;
constexpr int64_t kCols = 1024;

template <typename T>
std::vector<T> row_norms(const T* A, int64_t n, int64_t D) {
  std::vector<T> out(static_cast<size_t>(n));
  st::parallel_for(0, n, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* r = A + i * D;
      double acc = 0;  // once per call: accumulate in double
      for (int64_t d = 0; d < D; ++d) acc += double(r[d]) * double(r[d]);
      out[i] = T(acc);
    }
  });
  return out;
}

template <typename T>
void kernel_tile(T* tile, int64_t rows, int64_t cols, int64_t ld, const T* xx, const T* yy, T gamma) {
  using V = vec_t<T>;
  constexpr int L = kVecBytes / sizeof(T);
  const V neg_gamma = splat<V>(-gamma);
  for (int64_t i = 0; i < rows; ++i) {
    T* r = tile + i * ld;  // ld: the row stride (cols for a tile buffer, m for a view of the output)
    const V xi = splat<V>(xx[i]);
    int64_t j = 0;
    for (; j + L <= cols; j += L) {
      V dot, y;
      __builtin_memcpy(&dot, r + j, sizeof(V));
      __builtin_memcpy(&y, yy + j, sizeof(V));
      V d2 = (xi + y) - T(2) * dot;
      d2 = d2 < V{} ? V{} : d2;
      const V k = vexp(neg_gamma * d2);
      __builtin_memcpy(r + j, &k, sizeof(V));
    }
    if (j < cols) {  // the ragged end through one zero-padded vector
      V dot{}, y{};
      const int64_t left = cols - j;
      __builtin_memcpy(&dot, r + j, left * sizeof(T));
      __builtin_memcpy(&y, yy + j, left * sizeof(T));
      V d2 = (xi + y) - T(2) * dot;
      d2 = d2 < V{} ? V{} : d2;
      const V k = vexp(neg_gamma * d2);
      __builtin_memcpy(r + j, &k, left * sizeof(T));
    }
  }
}

}  // namespace

Tensor rbf_matmul_cpu(const Tensor& X_, const Tensor& Y_, const Tensor& V_, double gamma) {
  GK_CHECK_VALUE(X_.is_cpu() && Y_.is_cpu() && V_.is_cpu(),
           "rbf_matmul: the native CPU kernel takes CPU tensors (X, Y, V)");
  GK_CHECK_TYPE(st::is_floating(X_), "rbf_matmul: X must be float32 or float64");
  GK_CHECK_TYPE(Y_.scalar_type() == X_.scalar_type() && V_.scalar_type() == X_.scalar_type(),
           "rbf_matmul: X, Y and V must share one dtype");
  GK_CHECK_VALUE(X_.dim() == 2 && Y_.dim() == 2 && V_.dim() == 2, "rbf_matmul: X, Y and V must be 2-D");
  GK_CHECK_VALUE(Y_.size(1) == X_.size(1), "rbf_matmul: Y has D=", Y_.size(1), " but X has D=", X_.size(1));
  GK_CHECK_VALUE(V_.size(0) == Y_.size(0), "rbf_matmul: V must have one row per row of Y (", Y_.size(0),
           "), got ", V_.size(0));
  GK_CHECK_VALUE(gamma > 0, "rbf_matmul: gamma must be > 0, got ", gamma);
  auto X = st::contiguous(X_), Y = st::contiguous(Y_), V = st::contiguous(V_);
  const int64_t n = X.size(0), m = Y.size(0), D = X.size(1), p = V.size(1);
  auto out = st::zeros(X, {n, p});
  if (n == 0 || m == 0 || p == 0) return out;
  st::dispatch_floating(X, [&](auto tag) {
    using T = decltype(tag);
    const auto xx = row_norms(X.const_data_ptr<T>(), n, D);
    const auto yy = row_norms(Y.const_data_ptr<T>(), m, D);
    const int64_t nblk = (n + kRows - 1) / kRows;
    const T g = static_cast<T>(gamma);
    st::parallel_for(0, nblk, 1, [&](int64_t lo, int64_t hi) {
      auto tile = st::empty(X, {kRows, std::min(kCols, m)});
      for (int64_t blk = lo; blk < hi; ++blk) {
        const int64_t r0 = blk * kRows, rows = std::min(kRows, n - r0);
        auto Xb = st::narrow(X, 0, r0, rows);
        auto ob = st::narrow(out, 0, r0, rows);
        for (int64_t c0 = 0; c0 < m; c0 += kCols) {
          const int64_t cols = std::min(kCols, m - c0);
          Tensor Kt = cols == tile.size(1) ? st::narrow(tile, 0, 0, rows)  // contiguous rows
                                           : st::empty(X, {rows, cols});
          st::mm_out(Kt, Xb, st::transpose(st::narrow(Y, 0, c0, cols)));
          kernel_tile<T>(Kt.mutable_data_ptr<T>(), rows, cols, cols, xx.data() + r0, yy.data() + c0, g);
          st::addmm_(ob, Kt, st::narrow(V, 0, c0, cols));
        }
      }
    });
  });
  return out;
}

// rbf_gram on the CPU: K = exp(-gamma max(|x_i|^2 + |y_j|^2 - 2<x_i, y_j>, 0)) in kRows x kCols
// tiles, one parallel region for the whole matrix (a tile's dot GEMM, its kernel values and its
// store run on one thread: no barrier per step, so a loaded machine costs little, and the bits do
// not depend on the thread count). The cross Gram computes each tile in place in K; Y empty: the
// symmetric Gram, only the tiles on and above the diagonal, in a tile buffer, copied up and
// mirrored below it: exactly symmetric with a unit diagonal.
Tensor rbf_gram_cpu(const Tensor& X_, const std::optional<Tensor>& Y_opt, double gamma) {
  GK_CHECK_VALUE(X_.is_cpu() && (!Y_opt.has_value() || Y_opt->is_cpu()),
           "rbf_gram: the native CPU kernel takes CPU tensors");
  GK_CHECK_TYPE(st::is_floating(X_), "rbf_gram: X must be float32 or float64");
  GK_CHECK_VALUE(X_.dim() == 2, "rbf_gram: X must be 2-D");
  GK_CHECK_VALUE(gamma > 0, "rbf_gram: gamma must be > 0, got ", gamma);
  const bool sym = !Y_opt.has_value();
  auto X = st::contiguous(X_);
  Tensor Y = sym ? X : st::contiguous(*Y_opt);
  GK_CHECK_TYPE(Y.scalar_type() == X.scalar_type(), "rbf_gram: X and Y must share one dtype");
  GK_CHECK_VALUE(Y.dim() == 2 && Y.size(1) == X.size(1), "rbf_gram: Y must be (m, D) with X's D");
  const int64_t n = X.size(0), m = Y.size(0), D = X.size(1);
  auto K = st::empty(X, {n, m});
  if (n == 0 || m == 0) return K;
  const int64_t rb = (n + kRows - 1) / kRows, cb = (m + kCols - 1) / kCols;
  // the tiles to compute: (row block, column block) with, when symmetric, columns from the row
  // block's first row on (tile widths differ from heights, so a column block may straddle it)
  std::vector<std::pair<int64_t, int64_t>> tiles;
  for (int64_t i = 0; i < rb; ++i)
    for (int64_t j = 0; j < cb; ++j)
      if (!sym || (j + 1) * kCols > i * kRows) tiles.emplace_back(i, j);
  st::dispatch_floating(X, [&](auto tag) {
    using T = decltype(tag);
    const auto xx = row_norms(X.const_data_ptr<T>(), n, D);
    const auto yy = sym ? xx : row_norms(Y.const_data_ptr<T>(), m, D);
    const T g = static_cast<T>(gamma);
    T* k = K.mutable_data_ptr<T>();
    st::parallel_for(0, static_cast<int64_t>(tiles.size()), 1, [&](int64_t lo, int64_t hi) {
      // the symmetric Gram's tile buffer (the cross Gram's tiles are in K)
      std::optional<Tensor> tile;
      if (sym) tile = st::empty(X, {kRows, kCols});
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t r0 = tiles[t].first * kRows, rows = std::min(kRows, n - r0);
        const int64_t c0 = tiles[t].second * kCols, cols = std::min(kCols, m - c0);
        if (!sym) {  // straight into the output: its rows are the tile's, stride m
          Tensor Kt = st::narrow(st::narrow(K, 0, r0, rows), 1, c0, cols);
          st::mm_out(Kt, st::narrow(X, 0, r0, rows), st::transpose(st::narrow(Y, 0, c0, cols)));
          kernel_tile<T>(Kt.mutable_data_ptr<T>(), rows, cols, Kt.stride(0), xx.data() + r0,
                         yy.data() + c0, g);
          continue;
        }
        Tensor Kt = cols == kCols ? st::narrow(*tile, 0, 0, rows) : st::empty(X, {rows, cols});
        st::mm_out(Kt, st::narrow(X, 0, r0, rows), st::transpose(st::narrow(Y, 0, c0, cols)));
        kernel_tile<T>(Kt.mutable_data_ptr<T>(), rows, cols, cols, xx.data() + r0, yy.data() + c0, g);
        T* src = Kt.mutable_data_ptr<T>();
        for (int64_t i = 0; i < rows; ++i) {  // the tile's part on and above the diagonal
          const int64_t gi = r0 + i;
          if (gi >= c0 && gi < c0 + cols) src[i * cols + (gi - c0)] = T(1);  // exp(0) exactly
          const int64_t j0 = std::max<int64_t>(0, gi - c0);
          if (j0 < cols) std::copy(src + i * cols + j0, src + (i + 1) * cols, k + gi * m + c0 + j0);
        }
        for (int64_t j = 0; j < cols; ++j) {  // and its mirror below the diagonal, row by row
          const int64_t gj = c0 + j;
          for (int64_t i = 0; i < rows && r0 + i < gj; ++i) k[gj * m + r0 + i] = src[i * cols + j];
        }
      }
    });
  });
  return K;
}

}  // namespace GEOMKERN_ISA_NS
}  // namespace geomkern
