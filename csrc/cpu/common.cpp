#include <omp.h>

#include "ops.h"

namespace geomkern {
int num_threads() { return omp_get_max_threads(); }

std::string cpu_isa() {
#if defined(__AVX512F__)
  return "avx512f";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2+fma";
#elif defined(__AVX__)
  return "avx";
#elif defined(__SSE2__)
  return "sse2";
#else
  return "generic";  // not x86: 16-byte vectors where the compiler has them
#endif
}
}  // namespace geomkern
