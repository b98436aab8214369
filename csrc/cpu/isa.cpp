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

// Every variant's entry points, declared in its namespace with ops.h's signatures, one per op of
// csrc/ops.def (one that a kernel source defined with another signature would be an undefined
// symbol: the import fails).
#define GEOMKERN_OP(name, params, args, schema, ...) decltype(geomkern::name##_cpu) name##_cpu;
namespace geomkern::isa_base {
#include "../ops.def"
}
#if GEOMKERN_ISA_VARIANTS
namespace geomkern::isa_avx2 {
#include "../ops.def"
}
namespace geomkern::isa_avx512f {
#include "../ops.def"
}
#endif
#undef GEOMKERN_OP

namespace geomkern {
namespace {

// One compiled copy's entry points: a member per op of csrc/ops.def, in its order.
struct Kernels {
#define GEOMKERN_OP(name, params, args, schema, ...) decltype(&name##_cpu) name;
#include "../ops.def"
#undef GEOMKERN_OP
};

// The entry points of the variant in namespace GEOMKERN_VARIANT_NS (set before each include).
#define GEOMKERN_OP(name, params, args, schema, ...) &GEOMKERN_VARIANT_NS::name##_cpu,
#define GEOMKERN_VARIANT_NS isa_base
const Kernels kBase = {
#include "../ops.def"
};
#undef GEOMKERN_VARIANT_NS
#if GEOMKERN_ISA_VARIANTS
#define GEOMKERN_VARIANT_NS isa_avx2
const Kernels kAvx2 = {
#include "../ops.def"
};
#undef GEOMKERN_VARIANT_NS
#define GEOMKERN_VARIANT_NS isa_avx512f
const Kernels kAvx512f = {
#include "../ops.def"
};
#undef GEOMKERN_VARIANT_NS
#endif
#undef GEOMKERN_OP

// One compiled copy of the hot kernels: the name cpu_isa() reports, whether this CPU runs it, and
// its entry points.
struct Variant {
  const char* name;
  bool (*runs_here)();
  const Kernels* kernels;
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
    {"avx512f", has_avx512f, &kAvx512f},
    {"avx2+fma", has_avx2_fma, &kAvx2},
    {"baseline", always, &kBase},
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
const Variant kVariants[] = {{kTargetName, always, &kBase}};
#endif

const Variant* widest() {
  for (const Variant& v : kVariants)
    if (v.runs_here()) return &v;
  return &kVariants[std::size(kVariants) - 1];
}

std::atomic<const Variant*> selected{widest()};

const Variant& active_variant() { return *selected.load(std::memory_order_relaxed); }
const Kernels& active() { return *active_variant().kernels; }

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::string cpu_isa() { return active_variant().name; }

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

// ops.h's entry points: each calls the selected variant's
#define GEOMKERN_OP(name, params, args, schema, ...) \
  __VA_ARGS__ name##_cpu params { return active().name args; }
#include "../ops.def"
#undef GEOMKERN_OP

}  // namespace geomkern
