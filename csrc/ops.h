#pragma once
#include <torch/extension.h>

namespace geomkern {
int num_threads();
// Widest x86 vector extension the CPU kernels were compiled for (setup.py: -march=native unless
// GEOMKERN_PORTABLE=1): "avx512f", "avx2+fma", "avx", "sse2" or "generic".
std::string cpu_isa();

// csrc/cpu/preimage.cpp: fused pre-image loops, same math as geomkern/ops/preimage.py
at::Tensor preimage_gd_cpu(const at::Tensor& Z0, const at::Tensor& B, const at::Tensor& T,
                           double gamma, int64_t steps, const at::Tensor& lr);
at::Tensor preimage_fixed_point_cpu(const at::Tensor& Z0, const at::Tensor& B, const at::Tensor& A,
                                    double gamma, int64_t steps);
}  // namespace geomkern
