// K-Means for many small sets at once (the ``kmeans`` op's native CPU path): greedy k-means++
// (kmeanspp_cpu) and Lloyd iterations from given centres (kmeans_lloyd_cpu).
// Threads take whole sets (largest first), so each set runs its own loop and stops as soon as
// its own assignments are stable; a set of n points x D stays cache-resident over its
// iterations. The steps, per set, are those of geomkern.ops.kmeans.lloyd:
//   assign (nearest centre, |x|^2 + |c|^2 - 2<x, c> clamped at 0, first on ties); stop if no
//   label changed; centres <- means of their points (an emptied cluster keeps its centre);
// at most iters + 1 assignments. Centre sums are accumulated in double.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "ops.h"
#include "simd.h"

namespace geomkern {
namespace GEOMKERN_ISA_NS {
namespace {

using namespace simd;

// The sums below keep a fixed number of partial sums whatever the vector width (128 bytes of
// lanes for dot, 64 for sqdist: 1-8 vectors) and add them in one fixed order, so every
// instruction-set variant (csrc/cpu/isa.h) computes the same bits; with AVX-512 this is the
// order of one or two full-width accumulators.
template <typename T>
T dot(const T* __restrict x, const T* __restrict y, int64_t D) {
  using V = vec_t<T>;
  constexpr int L = kVecBytes / sizeof(T);
  constexpr int NV = 128 / kVecBytes;  // vectors of partial sums
  V acc[NV] = {};
  int64_t d = 0;
  for (; d + NV * L <= D; d += NV * L) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      V a, b;
      __builtin_memcpy(&a, x + d + v * L, sizeof(V));
      __builtin_memcpy(&b, y + d + v * L, sizeof(V));
      acc[v] += a * b;
    }
  }
  T out = 0;  // partial sum i plus partial sum i + NV L / 2, then those in the order of i
  for (int v = 0; v < NV / 2; ++v) {
    const V s = acc[v] + acc[v + NV / 2];
    for (int l = 0; l < L; ++l) out += s[l];
  }
  for (; d < D; ++d) out += x[d] * y[d];
  return out;
}

template <typename T>
double sqdist(const T* __restrict x, const T* __restrict y, int64_t D) {
  using V = vec_t<T>;
  constexpr int L = kVecBytes / sizeof(T);
  constexpr int NV = 64 / kVecBytes;
  V acc[NV] = {};
  int64_t d = 0;
  for (; d + NV * L <= D; d += NV * L) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      V a, b;
      __builtin_memcpy(&a, x + d + v * L, sizeof(V));
      __builtin_memcpy(&b, y + d + v * L, sizeof(V));
      const V e = a - b;
      acc[v] += e * e;
    }
  }
  double out = 0;
  for (int v = 0; v < NV; ++v)
    for (int l = 0; l < L; ++l) out += double(acc[v][l]);
  for (; d < D; ++d) out += double(x[d] - y[d]) * double(x[d] - y[d]);
  return out;
}

// splitmix64: a small counter-based generator, one stream per (seed, set), so the draws do not
// depend on which thread runs a set
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

// Greedy k-means++ on one set (2 + ln k candidates per centre, keep the one that lowers the
// potential most), as geomkern.ops.kmeans._kmeanspp, with exact |x - c|^2 in double.
template <typename T>
void kmeanspp_set(const T* x, int64_t n, int64_t D, int64_t k, uint64_t seed, T* c) {
  SplitMix rng{seed};
  std::vector<double> closest(n), trial(n), best_trial(n);
  const int64_t first = static_cast<int64_t>(rng.next() % uint64_t(n));
  std::copy(x + first * D, x + (first + 1) * D, c);
  for (int64_t i = 0; i < n; ++i) closest[i] = sqdist(x + i * D, c, D);
  const int n_local = 2 + static_cast<int>(std::log(double(k)));
  for (int64_t j = 1; j < k; ++j) {
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += closest[i];
    double best_pot = std::numeric_limits<double>::infinity();
    int64_t best = 0;
    for (int l = 0; l < n_local; ++l) {
      int64_t cand = n - 1;
      if (total > 0) {  // proportional to the distance to the nearest chosen centre
        const double u = rng.uniform() * total;
        double cum = 0;
        for (int64_t i = 0; i < n; ++i) {
          cum += closest[i];
          if (cum > u) { cand = i; break; }
        }
      } else {  // every point sits on a chosen centre: uniformly
        cand = static_cast<int64_t>(rng.next() % uint64_t(n));
      }
      double pot = 0;
      for (int64_t i = 0; i < n; ++i) {
        trial[i] = std::min(closest[i], sqdist(x + i * D, x + cand * D, D));
        pot += trial[i];
      }
      if (pot < best_pot) best_pot = pot, best = cand, best_trial.swap(trial);
    }
    closest.swap(best_trial);
    std::copy(x + best * D, x + (best + 1) * D, c + j * D);
  }
}

// One set: points x (n, D), centres c (k, D) in/out, labels (n,) out, *inertia out (the sum of
// exact squared distances, in double, of the points to the centres they are labelled with).
// Returns assignments made.
template <typename T>
int64_t lloyd_set(const T* x, int64_t n, int64_t D, int64_t k, int64_t iters, T* c, int64_t* labels,
                  double* inertia) {
  std::vector<T> xn(n), cn(k);
  std::vector<int64_t> fresh(n);
  std::vector<double> sums(static_cast<size_t>(k * D));
  std::vector<int64_t> cnt(k);
  for (int64_t i = 0; i < n; ++i) xn[i] = dot(x + i * D, x + i * D, D);
  int64_t passes = 0;
  bool have = false;
  for (int64_t it = 0; it <= iters; ++it) {
    for (int64_t j = 0; j < k; ++j) cn[j] = dot(c + j * D, c + j * D, D);
    for (int64_t i = 0; i < n; ++i) {
      T best = std::numeric_limits<T>::infinity();
      int64_t arg = 0;
      for (int64_t j = 0; j < k; ++j) {
        T d2 = (xn[i] + cn[j]) - T(2) * dot(x + i * D, c + j * D, D);
        d2 = d2 < T(0) ? T(0) : d2;
        if (d2 < best || (j == 0)) best = d2, arg = j;  // strict <: first centre on ties
      }
      fresh[i] = arg;
    }
    ++passes;
    if (have && std::equal(fresh.begin(), fresh.end(), labels)) break;  // stable: done
    std::copy(fresh.begin(), fresh.end(), labels);
    have = true;
    std::fill(sums.begin(), sums.end(), 0.0);
    std::fill(cnt.begin(), cnt.end(), 0);
    for (int64_t i = 0; i < n; ++i) {
      double* s = sums.data() + labels[i] * D;
      const T* xi = x + i * D;
      for (int64_t d = 0; d < D; ++d) s[d] += xi[d];
      ++cnt[labels[i]];
    }
    for (int64_t j = 0; j < k; ++j)
      if (cnt[j] > 0)
        for (int64_t d = 0; d < D; ++d) c[j * D + d] = T(sums[j * D + d] / double(cnt[j]));
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += sqdist(x + i * D, c + labels[i] * D, D);
  *inertia = total;
  return passes;
}

template <typename T>
void init_sets(const T* x, const int64_t* o, int64_t m, int64_t D, int64_t k, uint64_t seed, int nt,
               T* c) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t j = 0; j < m; ++j) {
    SplitMix mix{seed * 0x100000001B3ull + uint64_t(j)};  // set j's stream
    kmeanspp_set<T>(x + o[j] * D, o[j + 1] - o[j], D, k, mix.next(), c + j * k * D);
  }
}

// Every set, largest first (order), threads taking one set at a time.
template <typename T>
void all_sets(const T* x, const int64_t* o, const std::vector<int64_t>& order, int64_t D,
              int64_t k, int64_t iters, int nt, T* c, int64_t* labels, int64_t* passes,
              double* inertia) {
  const int64_t m = static_cast<int64_t>(order.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t t = 0; t < m; ++t) {
    const int64_t j = order[t];
    passes[j] = lloyd_set<T>(x + o[j] * D, o[j + 1] - o[j], D, k, iters, c + j * k * D, labels + o[j],
                             inertia + j);
  }
}

}  // namespace

Tensor kmeanspp_cpu(const Tensor& X_, const Tensor& offsets_, int64_t k, int64_t seed) {
  GK_CHECK_VALUE(X_.is_cpu() && offsets_.is_cpu(), "kmeanspp: the native CPU kernel takes CPU tensors (X, offsets)");
  GK_CHECK_TYPE(st::is_floating(X_), "kmeanspp: X must be float32 or float64");
  GK_CHECK_TYPE(offsets_.scalar_type() == ScalarType::Long, "kmeanspp: offsets must be int64");
  GK_CHECK_VALUE(X_.dim() == 2 && offsets_.dim() == 1 && offsets_.size(0) >= 1,
           "kmeanspp: X must be (N, D) and offsets (m+1,)");
  GK_CHECK_VALUE(k >= 1, "kmeanspp: k must be >= 1, got ", k);
  auto X = st::contiguous(X_), off = st::contiguous(offsets_);
  const int64_t m = off.size(0) - 1, D = X.size(1);
  const int64_t* o = off.const_data_ptr<int64_t>();
  GK_CHECK_VALUE(o[0] == 0 && o[m] == X.size(0), "kmeanspp: offsets must run from 0 to N = ", X.size(0));
  for (int64_t j = 0; j < m; ++j)
    GK_CHECK_VALUE(o[j + 1] - o[j] >= k, "kmeanspp: set ", j, " has ", o[j + 1] - o[j],
             " points, fewer than k = ", k);
  auto centers = st::empty(X, {m, k, D});
  const int nt = std::max(1, st::num_threads());
  st::dispatch_floating(X, [&](auto tag) {
    using scalar_t = decltype(tag);
    init_sets<scalar_t>(X.const_data_ptr<scalar_t>(), o, m, D, k, uint64_t(seed), nt,
                        centers.mutable_data_ptr<scalar_t>());
  });
  return centers;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> kmeans_lloyd_cpu(const Tensor& X_, const Tensor& offsets_,
                                                             const Tensor& centers_, int64_t iters) {
  GK_CHECK_VALUE(X_.is_cpu() && offsets_.is_cpu() && centers_.is_cpu(),
           "kmeans_lloyd: the native CPU kernel takes CPU tensors (X, offsets, centers)");
  GK_CHECK_TYPE(st::is_floating(X_), "kmeans_lloyd: X must be float32 or float64");
  GK_CHECK_TYPE(centers_.scalar_type() == X_.scalar_type(), "kmeans_lloyd: centers must have X's dtype");
  GK_CHECK_TYPE(offsets_.scalar_type() == ScalarType::Long, "kmeans_lloyd: offsets must be int64");
  GK_CHECK_VALUE(X_.dim() == 2 && offsets_.dim() == 1 && offsets_.size(0) >= 1 && centers_.dim() == 3,
           "kmeans_lloyd: X must be (N, D), offsets (m+1,), centers (m, k, D)");
  const int64_t m = offsets_.size(0) - 1, D = X_.size(1);
  GK_CHECK_VALUE(centers_.size(0) == m && centers_.size(2) == D,
           "kmeans_lloyd: centers must have shape (m, k, D) = (", m, ", k, ", D, ")");
  GK_CHECK_VALUE(iters >= 0, "kmeans_lloyd: iters must be >= 0, got ", iters);
  auto X = st::contiguous(X_), off = st::contiguous(offsets_);
  auto centers = st::clone(st::contiguous(centers_));
  const int64_t k = centers.size(1);
  GK_CHECK_VALUE(k >= 1, "kmeans_lloyd: centers must hold k >= 1 centres per set");
  const int64_t* o = off.const_data_ptr<int64_t>();
  GK_CHECK_VALUE(o[0] == 0 && o[m] == X.size(0), "kmeans_lloyd: offsets must run from 0 to N = ", X.size(0));
  for (int64_t j = 0; j < m; ++j)
    GK_CHECK_VALUE(o[j + 1] - o[j] >= k, "kmeans_lloyd: set ", j, " has ", o[j + 1] - o[j],
             " points, fewer than k = ", k);
  auto labels = st::empty(off, {X.size(0)});
  auto passes = st::empty(off, {m});
  auto inertia = st::empty(off, {m}, ScalarType::Double);
  std::vector<int64_t> order(m);  // largest sets first: dynamic scheduling balances the tail
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return o[a + 1] - o[a] > o[b + 1] - o[b]; });
  const int nt = std::max(1, st::num_threads());
  st::dispatch_floating(X, [&](auto tag) {
    using scalar_t = decltype(tag);
    all_sets<scalar_t>(X.const_data_ptr<scalar_t>(), o, order, D, k, iters, nt,
                       centers.mutable_data_ptr<scalar_t>(), labels.mutable_data_ptr<int64_t>(),
                       passes.mutable_data_ptr<int64_t>(), inertia.mutable_data_ptr<double>());
  });
  return {labels, centers, passes, inertia};
}

}  // namespace GEOMKERN_ISA_NS
}  // namespace geomkern
