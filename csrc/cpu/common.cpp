#include <omp.h>

#include "ops.h"

namespace geomkern {
int num_threads() { return omp_get_max_threads(); }
}  // namespace geomkern
