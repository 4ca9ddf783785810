// eagle_serve::int4_linear: a linear layer over a weight held two ways, chosen by the number of
// input rows (worker/int4_linear.py has the contract and why).
//
//   x             [N, in]  bfloat16, contiguous
//   packed        the int4 weight packed by aten::_convert_weight_to_int4pack_for_cpu
//   scale_zeros   [in / group, out, 2] bfloat16: w = (q - 8) * scale + zero per group of `group`
//   dense         [out, in] bfloat16: the same weights dequantized (or oneDNN-packed when
//                 `dense_packed`, by mkldnn::_reorder_linear_weight)
//   returns       [N, out] bfloat16
//
// N <= row_limit reads the 4-bit weight (aten's weight-only kernel, bound by memory traffic);
// larger N runs the dense weight through oneDNN, which is compute-bound there and much faster
// than the int4 kernel (that kernel's time grows about linearly with N).
// Written as a C++ operator so that a compiled graph calls it without returning to Python.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace {

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale_zeros,
                       const at::Tensor& dense, bool dense_packed, int64_t group, int64_t row_limit) {
  if (x.size(0) <= row_limit) {
    return at::_weight_int4pack_mm_for_cpu(x, packed, group, scale_zeros);
  }
  if (!dense_packed) {
    return at::linear(x, dense);
  }
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                         c10::string_view, c10::List<std::optional<at::Scalar>>,
                                         std::optional<c10::string_view>)>();
  return op.call(x, dense, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eagle_serve, m) {
  m.def("int4_linear(Tensor x, Tensor packed, Tensor scale_zeros, Tensor dense, bool dense_packed, "
        "int group, int row_limit) -> Tensor");
}

TORCH_LIBRARY_IMPL(eagle_serve, CPU, m) { m.impl("int4_linear", &int4_linear); }

// A packed `dense` is an opaque oneDNN tensor, which dispatches to this key.
TORCH_LIBRARY_IMPL(eagle_serve, MkldnnCPU, m) { m.impl("int4_linear", &int4_linear); }
