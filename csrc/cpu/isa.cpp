// Picks the instruction-set variant of the hot CPU kernels (csrc/cpu/isa.h) and routes ops.h's
// entry points to it. Compiled for the baseline target only: it must run on every CPU to find out
// what the CPU runs.
#include <atomic>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa.h"
#include "ops.h"

// The entry points a variant defines in its namespace, with ops.h's signatures (one that a kernel
// source defined with another signature would be an undefined symbol: the import fails).
#define GEOMKERN_DECLARE_VARIANT(ns)                                                             \
  namespace geomkern {                                                                           \
  namespace ns {                                                                                 \
  decltype(geomkern::preimage_gd_cpu) preimage_gd_cpu;                                           \
  decltype(geomkern::preimage_fixed_point_cpu) preimage_fixed_point_cpu;                         \
  decltype(geomkern::preimage_gd_span_cpu) preimage_gd_span_cpu;                                 \
  decltype(geomkern::preimage_fixed_point_span_cpu) preimage_fixed_point_span_cpu;               \
  decltype(geomkern::rbf_matmul_cpu) rbf_matmul_cpu;                                             \
  decltype(geomkern::rbf_gram_cpu) rbf_gram_cpu;                                                 \
  decltype(geomkern::kmeanspp_cpu) kmeanspp_cpu;                                                 \
  decltype(geomkern::kmeans_lloyd_cpu) kmeans_lloyd_cpu;                                         \
  }                                                                                              \
  }
#define GEOMKERN_VARIANT(ns, name, runs_here)                                                    \
  Variant {                                                                                      \
    name, runs_here, &ns::preimage_gd_cpu, &ns::preimage_fixed_point_cpu,                        \
        &ns::preimage_gd_span_cpu, &ns::preimage_fixed_point_span_cpu, &ns::rbf_matmul_cpu,      \
        &ns::rbf_gram_cpu, &ns::kmeanspp_cpu, &ns::kmeans_lloyd_cpu                              \
  }

GEOMKERN_DECLARE_VARIANT(isa_base)
#if GEOMKERN_ISA_VARIANTS
GEOMKERN_DECLARE_VARIANT(isa_avx2)
GEOMKERN_DECLARE_VARIANT(isa_avx512f)
#endif

namespace geomkern {
namespace {

// One compiled copy of the hot kernels: the name cpu_isa() reports, whether this CPU runs it, and
// its entry points.
struct Variant {
  const char* name;
  bool (*runs_here)();
  decltype(&preimage_gd_cpu) preimage_gd;
  decltype(&preimage_fixed_point_cpu) preimage_fixed_point;
  decltype(&preimage_gd_span_cpu) preimage_gd_span;
  decltype(&preimage_fixed_point_span_cpu) preimage_fixed_point_span;
  decltype(&rbf_matmul_cpu) rbf_matmul;
  decltype(&rbf_gram_cpu) rbf_gram;
  decltype(&kmeanspp_cpu) kmeanspp;
  decltype(&kmeans_lloyd_cpu) kmeans_lloyd;
};

bool always() { return true; }

#if GEOMKERN_ISA_VARIANTS
// __builtin_cpu_supports also asks whether the OS saves the registers (XGETBV), as it must for
// AVX and AVX-512 code to run.
bool has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool has_avx512f() { return has_avx2_fma() && __builtin_cpu_supports("avx512f"); }

// widest first: the first one the CPU runs is the default
const Variant kVariants[] = {
    GEOMKERN_VARIANT(isa_avx512f, "avx512f", has_avx512f),
    GEOMKERN_VARIANT(isa_avx2, "avx2+fma", has_avx2_fma),
    GEOMKERN_VARIANT(isa_base, "baseline", always),
};
#else
// One variant, built for the compiler's target (-march=native, or not x86): named after it.
constexpr const char* kTargetName =
#if defined(__AVX512F__)
    "avx512f";
#elif defined(__AVX2__) && defined(__FMA__)
    "avx2+fma";
#elif defined(__AVX__)
    "avx";
#elif defined(__SSE2__)
    "sse2";
#else
    "generic";  // not x86: 16-byte vectors where the compiler has them
#endif
const Variant kVariants[] = {GEOMKERN_VARIANT(isa_base, kTargetName, always)};
#endif

const Variant* widest() {
  for (const Variant& v : kVariants)
    if (v.runs_here()) return &v;
  return &kVariants[std::size(kVariants) - 1];
}

std::atomic<const Variant*> selected{widest()};

const Variant& active() { return *selected.load(std::memory_order_relaxed); }

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::string cpu_isa() { return active().name; }

std::vector<std::string> cpu_isas(bool runnable_only) {
  std::vector<std::string> out;
  for (const Variant& v : kVariants)
    if (!runnable_only || v.runs_here()) out.push_back(v.name);
  return out;
}

void select_cpu_isa(const std::string& isa) {
  for (const Variant& v : kVariants) {
    if (isa != v.name) continue;
    if (!v.runs_here())
      throw std::invalid_argument("'" + isa + "' needs instructions this CPU does not have (it runs: " +
                                  joined(cpu_isas(true)) + ")");
    selected.store(&v, std::memory_order_relaxed);
    return;
  }
  throw std::invalid_argument("'" + isa + "' is not a variant of this build of geomkern._C (it has: " +
                              joined(cpu_isas(false)) + "; this CPU runs: " + joined(cpu_isas(true)) + ")");
}

Tensor preimage_gd_cpu(const Tensor& Z0, const Tensor& B, const Tensor& T,
                           double gamma, int64_t steps, const Tensor& lr) {
  return active().preimage_gd(Z0, B, T, gamma, steps, lr);
}
Tensor preimage_fixed_point_cpu(const Tensor& Z0, const Tensor& B, const Tensor& A,
                                    double gamma, int64_t steps) {
  return active().preimage_fixed_point(Z0, B, A, gamma, steps);
}
Tensor preimage_gd_span_cpu(const Tensor& Z0, const Tensor& B, const Tensor& T,
                                double gamma, int64_t steps, const Tensor& lr) {
  return active().preimage_gd_span(Z0, B, T, gamma, steps, lr);
}
Tensor preimage_fixed_point_span_cpu(const Tensor& Z0, const Tensor& B,
                                         const Tensor& A, double gamma, int64_t steps) {
  return active().preimage_fixed_point_span(Z0, B, A, gamma, steps);
}
Tensor rbf_matmul_cpu(const Tensor& X, const Tensor& Y, const Tensor& V, double gamma) {
  return active().rbf_matmul(X, Y, V, gamma);
}
Tensor rbf_gram_cpu(const Tensor& X, const std::optional<Tensor>& Y, double gamma) {
  return active().rbf_gram(X, Y, gamma);
}
Tensor kmeanspp_cpu(const Tensor& X, const Tensor& offsets, int64_t k, int64_t seed) {
  return active().kmeanspp(X, offsets, k, seed);
}
std::tuple<Tensor, Tensor, Tensor, Tensor> kmeans_lloyd_cpu(const Tensor& X, const Tensor& offsets,
                                         const Tensor& centers, int64_t iters) {
  return active().kmeans_lloyd(X, offsets, centers, iters);
}

}  // namespace geomkern
