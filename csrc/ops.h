#pragma once
// torch's stable ABI only (stable.h): the kernel sources include this, each compiled once per
// instruction-set variant (bindings: geomkern.cpp).
#include "stable.h"

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace geomkern {
// csrc/cpu/isa.cpp: the instruction-set variant of the hot kernels below that runs (picked at
// load: the widest this CPU supports): "avx512f", "avx2+fma" or "baseline" (x86-64); a build
// with GEOMKERN_NATIVE_ARCH=1 or for another architecture has one variant, named after its
// compile-time target: "avx512f", "avx2+fma", "avx", "sse2" or "generic".
std::string cpu_isa();
// The variants in this library, widest first; runnable_only: those this CPU supports.
std::vector<std::string> cpu_isas(bool runnable_only);
// Runs the variant named isa from now on; an error naming the ones this CPU runs when it is not
// one of them (the Python loader checks the name first and raises ValueError).
void select_cpu_isa(const std::string& isa);

// The hot kernels, one per line of csrc/ops.def: geomkern::<name>_cpu calls its copy in the
// selected variant (isa.cpp), which the kernel source named there defines with this signature in
// namespace geomkern::<variant>.
#define GEOMKERN_OP(name, params, args, schema, ...) __VA_ARGS__ name##_cpu params;
#include "ops.def"
#undef GEOMKERN_OP
}  // namespace geomkern
