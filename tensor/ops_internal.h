// Helpers shared by the op files (not part of tensor/'s interface).
#ifndef MEMSCOPE_TENSOR_OPS_INTERNAL_H_
#define MEMSCOPE_TENSOR_OPS_INTERNAL_H_

#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/ops.h"

namespace memscope::ops::internal {

int WrapDim(int dim, int ndim);
Shape BroadcastShape(const Shape& a, const Shape& b);
DType PromoteTypes(DType a, DType b);
// Strides of `t` seen as `shape` (broadcast dims get stride 0).
Shape BroadcastStrides(const Tensor& t, const Shape& shape);

// Throws unless the op can compute here (kCpu, float32 where `floats`).
void RequireCpuKernel(std::string_view op, std::initializer_list<const Tensor*> tensors);

// Calls f(offsets) for every index of `shape` in row-major order, where
// offsets[k] is the element offset into operand k (given its strides).
template <int N, class F>
void ForEachIndex(const Shape& shape, const std::array<Shape, N>& strides, F&& f) {
  const std::size_t nd = shape.size();
  const std::int64_t total = NumElements(shape);
  std::array<std::int64_t, N> off{};
  Shape idx(nd, 0);
  for (std::int64_t n = 0; n < total; ++n) {
    f(off);
    for (std::size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        for (int k = 0; k < N; ++k) off[k] += strides[k][d];
        break;
      }
      for (int k = 0; k < N; ++k) off[k] -= strides[k][d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

// Autocast: the tensor an op of the lower-precision list uses for `t`. An op
// casts its arguments last first: autocast's wrapper expands
// cached_cast(args)... in a call's arguments, which GCC (the compiler of
// PyTorch's Linux builds) evaluates right to left; torch 1.13 on CPU casts
// F.linear's bias, then its weight, then its input (tests/oracle/).
Tensor AutocastLower(const Tensor& t);
// ...and an op of the fp32 list.
Tensor AutocastFp32(const Tensor& t);

}  // namespace memscope::ops::internal

#endif  // MEMSCOPE_TENSOR_OPS_INTERNAL_H_
