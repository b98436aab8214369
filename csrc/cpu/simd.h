// SIMD building blocks shared by the CPU kernels (csrc/cpu/*.cpp): GCC/Clang vector types as
// wide as the instruction-set variant being compiled allows (csrc/cpu/isa.h), a broadcast, an exp
// accurate to ~1 ulp, and the register-blocked panel product every kernel's inner loop is.
// Include it after every external header: it opens the variant's target region.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "isa_target.h"

namespace geomkern {
namespace GEOMKERN_ISA_NS {
namespace simd {

constexpr int kVecBytes = GEOMKERN_VEC_BYTES;  // isa_target.h: 64 AVX-512, 32 AVX, else 16

typedef float vf_t __attribute__((vector_size(kVecBytes)));
typedef double vd_t __attribute__((vector_size(kVecBytes)));
typedef int32_t vi32_t __attribute__((vector_size(kVecBytes)));
typedef int64_t vi64_t __attribute__((vector_size(kVecBytes)));

template <typename T> struct VecOf;
template <> struct VecOf<float> { using type = vf_t; using itype = vi32_t; };
template <> struct VecOf<double> { using type = vd_t; using itype = vi64_t; };

template <typename T> using vec_t = typename VecOf<T>::type;

template <typename V, typename T>
inline V splat(T x) {
  return x - V{};  // a vector-scalar op broadcasts x; minus +0 is exact (keeps -0)
}

// exp(x) for x <= 0 (or NaN, which propagates), accurate to about 1 ulp down to the smallest
// subnormal: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, Taylor polynomial for e^r, and
// 2^n applied as two normal factors 2^(n>>1) 2^(n - n>>1) so subnormal results come out right.
inline vf_t vexp(vf_t x) {
  const vf_t lo = splat<vf_t>(-104.0f);  // e^-104 < half the smallest subnormal: rounds to 0
  x = x < lo ? lo : x;
  const vf_t magic = splat<vf_t>(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  vf_t t = x * 1.44269504088896341f + magic;
  vf_t n = t - magic;
  vf_t r = x - n * 0.693359375f;  // ln2 split: the high part has 9 bits, so n * hi is exact
  r = r - n * -2.12194440e-4f;
  vf_t p = splat<vf_t>(1.0f / 5040.0f);
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  vi32_t ni = (vi32_t)t - (vi32_t)magic;  // t stays in magic's binade, so the bits hold n
  vi32_t n1 = ni >> 1;
  vi32_t n2 = ni - n1;
  vf_t s1 = (vf_t)((n1 + 127) << 23);
  vf_t s2 = (vf_t)((n2 + 127) << 23);
  return p * s1 * s2;
}

inline vd_t vexp(vd_t x) {
  const vd_t lo = splat<vd_t>(-746.0);  // e^-746 < half the smallest subnormal
  x = x < lo ? lo : x;
  const vd_t magic = splat<vd_t>(6755399441055744.0);  // 1.5 * 2^52
  vd_t t = x * 1.44269504088896338700e+00 + magic;
  vd_t n = t - magic;
  vd_t r = x - n * 6.93147180369123816490e-01;  // fdlibm ln2 split, hi has 32 bits
  r = r - n * 1.90821492927058770002e-10;
  // Taylor to degree 13: remainder r^14/14! < 5e-18 for |r| <= ln2/2
  vd_t p = splat<vd_t>(1.0 / 6227020800.0);
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  vi64_t ni = (vi64_t)t - (vi64_t)magic;
  vi64_t n1 = ni >> 1;
  vi64_t n2 = ni - n1;
  vd_t s1 = (vd_t)((n1 + 1023) << 52);
  vd_t s2 = (vd_t)((n2 + 1023) << 52);
  return p * s1 * s2;
}

// acc[i][v] += sum_{r < n} pan[r * NB + i] * X[r * PV + v]: NB panel columns times PV vectors,
// r in increasing order (the order, hence the bits, does not depend on the caller's tiling).
template <typename T, int PV, int NB>
inline void panel_product(const T* __restrict pan, const vec_t<T>* __restrict X, int64_t n,
                          vec_t<T> (&acc)[NB][PV]) {
  using V = vec_t<T>;
  for (int64_t r = 0; r < n; ++r) {
    V x[PV];
#pragma GCC unroll 8
    for (int v = 0; v < PV; ++v) x[v] = X[r * PV + v];
#pragma GCC unroll 32
    for (int i = 0; i < NB; ++i) {
      const V bb = splat<V>(pan[r * NB + i]);
#pragma GCC unroll 8
      for (int v = 0; v < PV; ++v) acc[i][v] += bb * x[v];
    }
  }
}

// Register blocks of the pre-image kernels (preimage.cpp, preimage_span.cpp): kNB basis
// rows/columns x PV vectors of points. With AVX-512 (32 vector registers) the main block is
// 6 x 4 (24 accumulators); with 16 registers (AVX2/SSE) 6 x 2. Narrower tiles (PV = 2, 1) only
// serve to give every thread a tile when b is small: measured on one core (b=512, S=D=512,
// AVX-512) 6x4, 6x2 and 6x1 run within 3-7% of each other, and the wide tile reads B less often,
// which keeps it ahead when B is not cache-resident (S=D=2048: the 4-vector tile 1.2x faster than
// the 2-vector one). kNB is the same for every width, so the order of every sum, hence the
// result, does not depend on the tile width chosen, i.e. on the thread count.
constexpr int kNB = 6;
constexpr int kWide = kVecBytes == 64 ? 4 : 2;

// The tile width PV (kWide, 2 or 1) for b points of type T on nthreads threads: the cost of the
// slowest thread in point-lanes; a narrower tile must save over 10% to be used.
template <typename T>
inline int tile_width(int64_t b, int64_t nthreads) {
  constexpr int L = kVecBytes / sizeof(T);
  int best_pv = 1;
  int64_t best_cost = -1;
  for (int pv : {kWide, 2, 1}) {
    const int64_t tiles = (b + pv * L - 1) / (pv * L);
    const int64_t cost = (tiles + nthreads - 1) / nthreads * pv;
    if (best_cost < 0 || cost * 10 < best_cost * 9) best_cost = cost, best_pv = pv;
  }
  return best_pv;
}

// Calls f(std::integral_constant<int, PV>{}) with the tile width tile_width<T>(b, nthreads)
// picks, so a kernel templated on PV is instantiated for each width and run with the chosen one:
//   dispatch_width<T>(b, nt, [&](auto pv) { Kernel<T, decltype(pv)::value>::run(...); });
template <typename T, typename F>
inline void dispatch_width(int64_t b, int64_t nthreads, F&& f) {
  const int pv = tile_width<T>(b, nthreads);
  if (pv == kWide) {
    f(std::integral_constant<int, kWide>{});
  } else if (pv == 2) {
    f(std::integral_constant<int, 2>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

// n zeroed vectors, kVecBytes-aligned. Not std::vector<V>: its allocator is a template from outside
// the target region (isa.h), where g++ 12 takes V's alignment for 16 bytes and allocates with the
// plain operator new; the AVX kernels' aligned loads from such scratch fault.
struct AlignedDelete {
  void operator()(void* p) const { ::operator delete(p, std::align_val_t(kVecBytes)); }
};
template <typename V>
std::unique_ptr<V[], AlignedDelete> zeroed_vectors(size_t n) {
  std::unique_ptr<V[], AlignedDelete> out(
      static_cast<V*>(::operator new(n * sizeof(V), std::align_val_t(kVecBytes))));
  for (size_t i = 0; i < n; ++i) out[i] = V{};
  return out;
}

// The tile loop of the pre-image kernels: body(t, scratch) for every tile t < ntiles, tiles handed
// out one at a time (schedule(dynamic, 1)) to min(nt, ntiles) threads, each with its own
// per_thread vectors of zeroed scratch. Which thread runs a tile does not change its result.
template <typename V, typename Body>
inline void run_tiles(int64_t ntiles, int nt, int64_t per_thread, Body&& body) {
  const int nthreads = static_cast<int>(std::min<int64_t>(nt, ntiles));
  // Allocated here, not inside the parallel region, so a failed allocation throws normally.
  const auto scratch = zeroed_vectors<V>(static_cast<size_t>(per_thread * nthreads));
#pragma omp parallel num_threads(nthreads)
  {
    V* mine = scratch.get() + per_thread * omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < ntiles; ++t) body(t, mine);
  }
}

}  // namespace simd
}  // namespace GEOMKERN_ISA_NS
}  // namespace geomkern
