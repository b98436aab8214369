#pragma once
#include <torch/extension.h>

namespace geomkern {
int num_threads();
}  // namespace geomkern
