#pragma once
// The few tensor operations the CPU kernels need, on torch's stable ABI (torch/csrc/stable and the
// AOTInductor C shim): geomkern._C is compiled against no torch version's C++ ABI, only against
// this stable C interface as torch 2.10 defines it (TORCH_TARGET_VERSION, setup.py), so one build
// loads into every torch from 2.10 on (tests/test_packaging.py loads one wheel into two).
// Included by ops.h before any kernel code (csrc/cpu/isa.h: external headers come first).
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace geomkern {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;

// Argument checks. Through the stable ABI every C++ error reaches Python as a RuntimeError, so the
// message carries the Python type it stands for; geomkern/backends/native re-raises it as that
// type with the bare message (the public ops validate their arguments before they get here).
#define GK_CHECK_VALUE(cond, ...) STD_TORCH_CHECK(cond, "[geomkern ValueError] ", __VA_ARGS__)
#define GK_CHECK_TYPE(cond, ...) STD_TORCH_CHECK(cond, "[geomkern TypeError] ", __VA_ARGS__)

namespace st {

inline bool is_floating(const Tensor& t) {
  return t.scalar_type() == ScalarType::Float || t.scalar_type() == ScalarType::Double;
}

// f(float{}) or f(double{}) by t's dtype (the kernels' AT_DISPATCH_FLOATING_TYPES).
template <class F>
void dispatch_floating(const Tensor& t, F&& f) {
  GK_CHECK_TYPE(is_floating(t), "geomkern._C: float32 or float64 expected");
  if (t.scalar_type() == ScalarType::Double)
    f(double{});
  else
    f(float{});
}

// A new uninitialised (zeroed) CPU tensor of like's dtype (or dtype), contiguous.
inline Tensor empty(const Tensor& like, std::vector<int64_t> sizes,
                    std::optional<ScalarType> dtype = std::nullopt) {
  return torch::stable::new_empty(like, sizes, dtype);
}
inline Tensor zeros(const Tensor& like, std::vector<int64_t> sizes,
                    std::optional<ScalarType> dtype = std::nullopt) {
  return torch::stable::new_zeros(like, sizes, dtype);
}
inline Tensor contiguous(const Tensor& t) { return torch::stable::contiguous(t); }
inline Tensor clone(const Tensor& t) { return torch::stable::clone(t); }
inline Tensor transpose(const Tensor& t) { return torch::stable::transpose(t, 0, 1); }

// Rows (dim 0) or columns (dim 1) start .. start + length of t: a view.
inline Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  AtenTensorHandle out = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_aten_narrow(t.get(), dim, start, length, &out));
  return Tensor(out);
}

// out = a @ b (torch's CPU GEMM, as at::mm_out)
inline void mm_out(const Tensor& out, const Tensor& a, const Tensor& b) {
  TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_mm_out(out.get(), a.get(), b.get()));
}
// self += a @ b (as at::Tensor::addmm_: the same GEMM with beta = 1 into self)
inline void addmm_(const Tensor& self, const Tensor& a, const Tensor& b) {
  TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_addmm_out(self.get(), self.get(), a.get(), b.get(), 1.0, 1.0));
}

inline int num_threads() { return static_cast<int>(torch::stable::get_num_threads()); }

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  torch::stable::parallel_for(begin, end, grain, f);
}

}  // namespace st
}  // namespace geomkern
