// geomkern._C's operators, registered with torch through its stable ABI (csrc/stable.h) in the
// namespace torch.ops.geomkern_native; geomkern/backends/native loads the library and calls
// them. Kernels live in csrc/cpu/ (the CUDA ones, geomkern._C_cuda, in csrc/cuda/ with their
// bindings in csrc/cuda_bindings/); this file only registers them: the kernel ops from the list
// in csrc/ops.def, the three variant ops below by hand. No Python C API: the library is the same
// for every Python >= 3.10 and every torch >= 2.10.
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ops.h"

namespace {

// Boxed<F>::call: the kernel F with every argument taken by value. TORCH_BOX unboxes the stack into
// a tuple of its function's parameter types, which must own their tensors (torch 2.14's
// stable/library.h strips const and references itself; by value, no version depends on that).
template <auto F>
struct Boxed;
template <class R, class... A, R (*F)(A...)>
struct Boxed<F> {
  static R call(std::remove_cv_t<std::remove_reference_t<A>>... args) { return F(args...); }
};

// no tensor arguments: by value by hand
std::string cpu_isa() { return geomkern::cpu_isa(); }
std::vector<std::string> cpu_isas(bool runnable_only) { return geomkern::cpu_isas(runnable_only); }
void select_cpu_isa(std::string isa) { geomkern::select_cpu_isa(isa); }

}  // namespace

STABLE_TORCH_LIBRARY(geomkern_native, m) {
  // the instruction-set variant of the CPU kernels that runs: 'avx512f', 'avx2+fma' or 'baseline'
  m.def("cpu_isa() -> str");
  // the variants in this library, widest first (runnable_only: those this CPU supports)
  m.def("cpu_isas(bool runnable_only=True) -> str[]");
  // run the named variant from now on (the loader calls it for GEOMKERN_CPU_ISA)
  m.def("select_cpu_isa(str isa) -> ()");
  // the kernels (csrc/ops.def says what each computes)
#define GEOMKERN_OP(name, params, args, schema, ...) m.def(#name schema);
#include "ops.def"
#undef GEOMKERN_OP
}

STABLE_TORCH_LIBRARY_IMPL(geomkern_native, CPU, m) {
#define GEOMKERN_OP(name, params, args, schema, ...) \
  m.impl(#name, TORCH_BOX(&Boxed<&geomkern::name##_cpu>::call));
#include "ops.def"
#undef GEOMKERN_OP
}

// no tensor arguments: no device to dispatch on
STABLE_TORCH_LIBRARY_IMPL(geomkern_native, CompositeExplicitAutograd, m) {
  m.impl("cpu_isa", TORCH_BOX(&cpu_isa));
  m.impl("cpu_isas", TORCH_BOX(&cpu_isas));
  m.impl("select_cpu_isa", TORCH_BOX(&select_cpu_isa));
}
