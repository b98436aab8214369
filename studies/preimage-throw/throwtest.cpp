// Which C++ throws cross into Python cleanly in an extension built on the GPU image?
// (studies/preimage-throw/probe2.sh builds it with torch.utils.cpp_extension, the same
// compiler and flags setup.py uses for geomkern._C_cuda's bindings, and calls each in a child.)
#include <torch/extension.h>

#include <sstream>
#include <stdexcept>
#include <string>

namespace {
void check_str() { TORCH_CHECK(false, "plain ", "text"); }
void check_int() { TORCH_CHECK(false, "n = ", static_cast<int64_t>(5)); }
void check_dbl() { TORCH_CHECK(false, "g = ", -1.0); }
void std_throw() { throw std::runtime_error("std runtime_error"); }
std::string format_dbl() { std::ostringstream ss; ss << 1.5 << " " << static_cast<int64_t>(7); return ss.str(); }
std::string format_str() { return c10::str("n = ", static_cast<int64_t>(5), ", g = ", -1.0); }
void check_tensor(const at::Tensor& t, double g) { TORCH_CHECK(g > 0, "g = ", g, " for ", t.sizes()); }
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("check_str", &check_str);
  m.def("check_int", &check_int);
  m.def("check_dbl", &check_dbl);
  m.def("std_throw", &std_throw);
  m.def("format_dbl", &format_dbl);
  m.def("format_str", &format_str);
  m.def("check_dbl_nogil", &check_dbl, py::call_guard<py::gil_scoped_release>());
  m.def("check_tensor", &check_tensor, py::call_guard<py::gil_scoped_release>());
}
