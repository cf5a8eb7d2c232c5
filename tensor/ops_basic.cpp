// Creation, views, elementwise ops and reductions.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "tensor/ops.h"
#include "tensor/ops_internal.h"

namespace memscope {
namespace {

struct AutocastState {
  std::optional<DType> dtype;
  int depth = 0;
  // Casts of parameters, alive until the outermost autocast exits.
  absl::flat_hash_map<const TensorImpl*, Tensor> cache;
  // The casts in the order they were made: the cache is released in this
  // order, so that a run's frees do not depend on host pointer hashes.
  std::vector<Tensor> order;
};
thread_local AutocastState autocast;

}  // namespace

AutocastGuard::AutocastGuard(DType dtype) : prev_(autocast.dtype) {
  autocast.dtype = dtype;
  ++autocast.depth;
}

AutocastGuard::~AutocastGuard() {
  autocast.dtype = prev_;
  if (--autocast.depth == 0) {
    autocast.cache.clear();
    autocast.order.clear();
  }
}

std::optional<DType> AutocastGuard::current() { return autocast.dtype; }

namespace ops {
namespace internal {

int WrapDim(int dim, int ndim) {
  const int d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= std::max(ndim, 1))
    throw TensorError(absl::StrCat("dimension ", dim, " out of range for ", ndim, "-d"));
  return d;
}

Shape BroadcastShape(const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1) {
      throw TensorError(absl::StrCat("shapes ", ShapeText(a), " and ", ShapeText(b), " do not broadcast"));
    }
    out[i] = x == 1 ? y : x;
  }
  return out;
}

DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  const bool fa = IsFloating(a), fb = IsFloating(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (fa && fb) return DType::kFloat32;  // fp16 with bf16 or fp32
  return ElementSize(a) >= ElementSize(b) ? a : b;
}

Shape BroadcastStrides(const Tensor& t, const Shape& shape) {
  Shape strides(shape.size(), 0);
  const std::size_t lead = shape.size() - t.sizes().size();
  for (std::size_t i = 0; i < t.sizes().size(); ++i) {
    strides[lead + i] = t.sizes()[i] == 1 ? 0 : t.strides()[i];
  }
  return strides;
}

void RequireCpuKernel(std::string_view op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t && t->defined() && IsFloating(t->dtype()) && t->dtype() != DType::kFloat32) {
      throw TensorError(absl::StrCat(std::string(op), ": --exec cpu computes float32 only, got ",
                                     std::string(DTypeName(t->dtype()))));
    }
  }
}

Tensor AutocastLower(const Tensor& t) {
  if (!autocast.dtype || !t.defined() || !IsFloating(t.dtype()) || t.dtype() == *autocast.dtype) return t;
  const bool cacheable = t.is_leaf() && t.requires_grad();
  if (cacheable) {
    auto it = autocast.cache.find(t.impl());
    if (it != autocast.cache.end()) return it->second;
  }
  Tensor cast = To(t, *autocast.dtype);
  if (cacheable) {
    autocast.cache.emplace(t.impl(), cast);
    autocast.order.push_back(cast);
  }
  return cast;
}

Tensor AutocastFp32(const Tensor& t) {
  if (!autocast.dtype || !t.defined() || !IsFloating(t.dtype()) || t.dtype() == DType::kFloat32) return t;
  return To(t, DType::kFloat32);
}

}  // namespace internal

using internal::BroadcastShape;
using internal::BroadcastStrides;
using internal::ForEachIndex;
using internal::PromoteTypes;
using internal::RequireCpuKernel;
using internal::WrapDim;

namespace {

// Out-of-place elementwise op over broadcast inputs; `f` computes one float.
template <class F>
Tensor Binary(const Tensor& a, const Tensor& b, DType dtype, std::string_view name, F f) {
  const Shape shape = BroadcastShape(a.sizes(), b.sizes());
  Tensor out = Tensor::Empty(a.ctx(), shape, dtype);
  if (a.ctx().computes()) {
    RequireCpuKernel(name, {&a, &b});
    const float* pa = a.data();
    const float* pb = b.data();
    float* po = out.data();
    ForEachIndex<3>(shape, {BroadcastStrides(a, shape), BroadcastStrides(b, shape), out.strides()},
                    [&](const std::array<std::int64_t, 3>& o) { po[o[2]] = f(pa[o[0]], pb[o[1]]); });
  }
  return out;
}

template <class F>
Tensor Unary(const Tensor& a, std::string_view name, F f, std::optional<DType> dtype = std::nullopt) {
  Tensor out = Tensor::Empty(a.ctx(), a.sizes(), dtype.value_or(a.dtype()));
  if (a.ctx().computes()) {
    RequireCpuKernel(name, {&a});
    const float* pa = a.data();
    float* po = out.data();
    ForEachIndex<2>(a.sizes(), {a.strides(), out.strides()},
                    [&](const std::array<std::int64_t, 2>& o) { po[o[1]] = f(pa[o[0]]); });
  }
  return out;
}

// In place: x[i] = f(x[i], y[i]) with y broadcast to x.
template <class F>
void InPlace(Tensor& x, const Tensor* y, std::string_view name, F f) {
  if (!x.ctx().computes()) return;
  RequireCpuKernel(name, {&x, y});
  float* px = x.data();
  if (y == nullptr) {
    ForEachIndex<1>(x.sizes(), {x.strides()},
                    [&](const std::array<std::int64_t, 1>& o) { px[o[0]] = f(px[o[0]], 0.f); });
    return;
  }
  (void)BroadcastShape(x.sizes(), y->sizes());
  const float* py = y->data();
  ForEachIndex<2>(x.sizes(), {x.strides(), BroadcastStrides(*y, x.sizes())},
                  [&](const std::array<std::int64_t, 2>& o) { px[o[0]] = f(px[o[0]], py[o[1]]); });
}

// PyTorch's computeStride: strides for viewing (sizes, strides) as `shape`
// without copying, or nothing when the memory layout does not allow it.
std::optional<Shape> ViewStrides(const Shape& old_sizes, const Shape& old_strides, const Shape& shape) {
  if (old_sizes.empty()) return ContiguousStrides(shape);
  if (NumElements(old_sizes) == 0) return ContiguousStrides(shape);
  Shape new_strides(shape.size());
  std::int64_t view_d = static_cast<std::int64_t>(shape.size()) - 1;
  std::int64_t chunk_base_stride = old_strides.back();
  std::int64_t tensor_numel = 1;
  std::int64_t view_numel = 1;
  for (std::int64_t tensor_d = static_cast<std::int64_t>(old_sizes.size()) - 1; tensor_d >= 0; tensor_d--) {
    tensor_numel *= old_sizes[tensor_d];
    if (tensor_d == 0 ||
        (old_sizes[tensor_d - 1] != 1 && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

Shape InferSize(const Tensor& t, Shape sizes) {
  std::int64_t known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) {
      if (infer >= 0) throw TensorError("only one dimension can be inferred");
      infer = static_cast<int>(i);
    } else {
      known *= sizes[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || t.numel() % known != 0) {
      throw TensorError(absl::StrCat("shape ", ShapeText(sizes), " is invalid for input of size ", t.numel()));
    }
    sizes[static_cast<std::size_t>(infer)] = t.numel() / known;
  }
  if (NumElements(sizes) != t.numel()) {
    throw TensorError(absl::StrCat("shape ", ShapeText(sizes), " is invalid for input of size ", t.numel()));
  }
  return sizes;
}

// Records a view op whose backward maps the gradient back to the input shape.
Tensor ViewWithGrad(const Tensor& t, Tensor view, std::string_view name) {
  if (NeedsGrad({&t})) {
    RecordOp(name, {&t}, {&view},
             [sizes = t.sizes()](Node&, TensorList& g) { return TensorList{Reshape(g[0], sizes)}; });
  }
  return view;
}

}  // namespace

// ---------------------------------------------------------------- creation

Tensor EmptyLike(const Tensor& t, std::optional<DType> dtype) {
  return Tensor::Empty(t.ctx(), t.sizes(), dtype.value_or(t.dtype()));
}

Tensor ZerosLike(const Tensor& t) { return Tensor::Zeros(t.ctx(), t.sizes(), t.dtype()); }

Tensor OnesLike(const Tensor& t) { return Tensor::Full(t.ctx(), t.sizes(), 1.0, t.dtype()); }

namespace {
Tensor CopyTo(const Tensor& t, DType dtype) {
  Tensor out = Tensor::Empty(t.ctx(), t.sizes(), dtype);
  if (t.ctx().computes() && t.numel() > 0) {
    const std::size_t es = ElementSize(t.dtype());
    if (t.dtype() != dtype)
      throw TensorError(absl::StrCat("--exec cpu cannot convert to ", std::string(DTypeName(dtype))));
    const std::byte* src = t.storage()->data() + t.impl()->offset * static_cast<std::int64_t>(es);
    std::byte* dst = out.storage()->data();
    ForEachIndex<2>(t.sizes(), {t.strides(), out.strides()}, [&](const std::array<std::int64_t, 2>& o) {
      std::memcpy(dst + o[1] * static_cast<std::int64_t>(es), src + o[0] * static_cast<std::int64_t>(es), es);
    });
  }
  return out;
}
}  // namespace

Tensor Clone(const Tensor& t) {
  Tensor out = CopyTo(t, t.dtype());
  if (NeedsGrad({&t})) RecordOp("CloneBackward0", {&t}, {&out}, [](Node&, TensorList& g) { return TensorList{g[0]}; });
  return out;
}

Tensor Contiguous(const Tensor& t) { return t.is_contiguous() ? t : Clone(t); }

Tensor To(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = CopyTo(t, dtype);
  if (NeedsGrad({&t}) && IsFloating(dtype)) {
    RecordOp("ToCopyBackward0", {&t}, {&out}, [from = t.dtype()](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      return TensorList{To(g[0], from)};
    });
  }
  return out;
}

void UniformInPlace(Tensor& t, float bound) {
  if (!t.ctx().computes()) return;
  std::mt19937_64 rng(t.ctx().next_seed());
  std::uniform_real_distribution<float> u(-bound, bound);
  float* p = t.data();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
}

void FillInPlace(Tensor& t, float value) {
  InPlace(t, nullptr, "fill_", [value](float, float) { return value; });
}

// ---------------------------------------------------------------- views

Tensor View(const Tensor& t, const Shape& sizes_in) {
  const Shape sizes = InferSize(t, sizes_in);
  std::optional<Shape> strides = ViewStrides(t.sizes(), t.strides(), sizes);
  if (!strides) {
    throw TensorError(
        absl::StrCat("view size ", ShapeText(sizes), " is not compatible with the input's strides; use reshape"));
  }
  return ViewWithGrad(t, t.AsStrided(sizes, *strides, t.impl()->offset), "ViewBackward0");
}

Tensor Reshape(const Tensor& t, const Shape& sizes_in) {
  const Shape sizes = InferSize(t, sizes_in);
  if (ViewStrides(t.sizes(), t.strides(), sizes)) return View(t, sizes);
  return View(Clone(t), sizes);  // _unsafe_view(clone(self))
}

Tensor Transpose(const Tensor& t, int dim0, int dim1) {
  const int a = WrapDim(dim0, t.dim()), b = WrapDim(dim1, t.dim());
  Shape sizes = t.sizes(), strides = t.strides();
  std::swap(sizes[a], sizes[b]);
  std::swap(strides[a], strides[b]);
  Tensor out = t.AsStrided(sizes, strides, t.impl()->offset);
  if (NeedsGrad({&t})) {
    RecordOp("TransposeBackward0", {&t}, {&out},
             [a, b](Node&, TensorList& g) { return TensorList{Transpose(g[0], a, b)}; });
  }
  return out;
}

Tensor T(const Tensor& t) { return Transpose(t, 0, 1); }

Tensor Permute(const Tensor& t, const std::vector<int>& dims) {
  if (static_cast<int>(dims.size()) != t.dim()) throw TensorError("permute: wrong number of dims");
  Shape sizes(dims.size()), strides(dims.size());
  std::vector<int> inverse(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const int d = WrapDim(dims[i], t.dim());
    sizes[i] = t.sizes()[d];
    strides[i] = t.strides()[d];
    inverse[d] = static_cast<int>(i);
  }
  Tensor out = t.AsStrided(sizes, strides, t.impl()->offset);
  if (NeedsGrad({&t})) {
    RecordOp("PermuteBackward0", {&t}, {&out},
             [inverse](Node&, TensorList& g) { return TensorList{Permute(g[0], inverse)}; });
  }
  return out;
}

Tensor Unsqueeze(const Tensor& t, int dim) {
  const int d = WrapDim(dim, t.dim() + 1);
  Shape sizes = t.sizes(), strides = t.strides();
  const std::int64_t stride = d < t.dim() ? t.strides()[d] * t.sizes()[d] : 1;
  sizes.insert(sizes.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return ViewWithGrad(t, t.AsStrided(sizes, strides, t.impl()->offset), "UnsqueezeBackward0");
}

Tensor Squeeze(const Tensor& t, int dim) {
  const int d = WrapDim(dim, t.dim());
  if (t.sizes()[d] != 1) return t;
  Shape sizes = t.sizes(), strides = t.strides();
  sizes.erase(sizes.begin() + d);
  strides.erase(strides.begin() + d);
  return ViewWithGrad(t, t.AsStrided(sizes, strides, t.impl()->offset), "SqueezeBackward1");
}

Tensor Expand(const Tensor& t, const Shape& sizes) {
  const Shape strides = BroadcastStrides(t, BroadcastShape(t.sizes(), sizes));
  Tensor out = t.AsStrided(sizes, strides, t.impl()->offset);
  if (NeedsGrad({&t})) {
    RecordOp("ExpandBackward0", {&t}, {&out}, [in = t.sizes()](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      return TensorList{SumTo(g[0], in)};
    });
  }
  return out;
}

Tensor Narrow(const Tensor& t, int dim, std::int64_t start, std::int64_t length) {
  const int d = WrapDim(dim, t.dim());
  if (start < 0 || length < 0 || start + length > t.sizes()[d]) throw TensorError("narrow: out of range");
  Shape sizes = t.sizes();
  sizes[d] = length;
  Tensor out = t.AsStrided(sizes, t.strides(), t.impl()->offset + start * t.strides()[d]);
  if (NeedsGrad({&t})) {
    // slice_backward: a zero tensor of the input's size with the gradient copied in.
    RecordOp("SliceBackward0", {&t}, {&out}, [in = t.sizes(), d, start, length](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      Tensor full = Tensor::Zeros(g[0].ctx(), in, g[0].dtype());
      Tensor part = full.AsStrided(g[0].sizes(), full.strides(), start * full.strides()[d]);
      (void)length;
      CopyInPlace(part, g[0]);
      return TensorList{full};
    });
  }
  return out;
}

Tensor Select(const Tensor& t, int dim, std::int64_t index) {
  const int d = WrapDim(dim, t.dim());
  if (index < 0) index += t.sizes()[d];
  if (index < 0 || index >= t.sizes()[d]) throw TensorError("select: index out of range");
  Shape sizes = t.sizes(), strides = t.strides();
  sizes.erase(sizes.begin() + d);
  strides.erase(strides.begin() + d);
  Tensor out = t.AsStrided(sizes, strides, t.impl()->offset + index * t.strides()[d]);
  if (NeedsGrad({&t})) {
    RecordOp("SelectBackward0", {&t}, {&out}, [in = t.sizes(), d, index](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      Tensor full = Tensor::Zeros(g[0].ctx(), in, g[0].dtype());
      Shape sizes2 = full.sizes(), strides2 = full.strides();
      sizes2.erase(sizes2.begin() + d);
      strides2.erase(strides2.begin() + d);
      Tensor part = full.AsStrided(sizes2, strides2, index * full.strides()[d]);
      CopyInPlace(part, g[0]);
      return TensorList{full};
    });
  }
  return out;
}

TensorList SplitWithSizes(const Tensor& t, const std::vector<std::int64_t>& split_sizes, int dim) {
  const int d = WrapDim(dim, t.dim());
  TensorList outs;
  std::int64_t start = 0;
  for (std::int64_t len : split_sizes) {
    Shape sizes = t.sizes();
    sizes[d] = len;
    outs.push_back(t.AsStrided(sizes, t.strides(), t.impl()->offset + start * t.strides()[d]));
    start += len;
  }
  if (start != t.sizes()[d]) throw TensorError("split sizes do not add up to the dimension");
  if (NeedsGrad({&t})) {
    std::vector<Tensor*> out_ptrs;
    for (Tensor& o : outs) out_ptrs.push_back(&o);
    // split_backward: undefined gradients become zeros, then one cat.
    RecordOp("SplitBackward0", {&t}, out_ptrs, [split_sizes, d, in = t.sizes()](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      TensorList parts;
      const Tensor* any = nullptr;
      for (const Tensor& x : g) {
        if (x.defined()) any = &x;
      }
      for (std::size_t i = 0; i < g.size(); ++i) {
        if (g[i].defined()) {
          parts.push_back(g[i]);
        } else {
          Shape sizes = in;
          sizes[d] = split_sizes[i];
          parts.push_back(Tensor::Zeros(any->ctx(), sizes, any->dtype()));
        }
      }
      return TensorList{Cat(parts, d)};
    });
  }
  return outs;
}

TensorList Split(const Tensor& t, std::int64_t split_size, int dim) {
  const int d = WrapDim(dim, t.dim());
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = 0; s < t.sizes()[d]; s += split_size) sizes.push_back(std::min(split_size, t.sizes()[d] - s));
  return SplitWithSizes(t, sizes, d);
}

Tensor Flatten(const Tensor& t, int start_dim, int end_dim) {
  const int s = WrapDim(start_dim, t.dim()), e = WrapDim(end_dim, t.dim());
  Shape sizes;
  for (int i = 0; i < s; ++i) sizes.push_back(t.sizes()[i]);
  std::int64_t m = 1;
  for (int i = s; i <= e; ++i) m *= t.sizes()[i];
  sizes.push_back(m);
  for (int i = e + 1; i < t.dim(); ++i) sizes.push_back(t.sizes()[i]);
  return Reshape(t, sizes);
}

// ---------------------------------------------------------------- advanced indexing

namespace {
// The element offsets, in row-major order of `shape`, of a tensor whose
// leading dims are `shape` with `strides` (the rest of its dims left out).
std::vector<std::int64_t> LeadingOffsets(const Shape& shape, const Shape& strides, std::int64_t base) {
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(NumElements(shape)));
  ForEachIndex<1>(shape, {Shape(strides.begin(), strides.begin() + static_cast<std::ptrdiff_t>(shape.size()))},
                  [&](const std::array<std::int64_t, 1>& o) { out.push_back(base + o[0]); });
  return out;
}

// The element offset into a tensor of `sizes` and `strides` (from `base`)
// that each index position selects: sum over j of indices[j][n] * strides[j].
std::vector<std::int64_t> IndexedOffsets(const Shape& sizes, const Shape& strides, std::int64_t base,
                                         const TensorList& indices) {
  const Shape& shape = indices[0].sizes();
  std::vector<std::int64_t> out(static_cast<std::size_t>(NumElements(shape)), base);
  for (std::size_t j = 0; j < indices.size(); ++j) {
    const std::int64_t* p = indices[j].data_i64();
    const std::vector<std::int64_t> at = LeadingOffsets(shape, indices[j].strides(), 0);
    for (std::size_t n = 0; n < at.size(); ++n) {
      std::int64_t i = p[at[n]];
      if (i < 0) i += sizes[j];
      if (i < 0 || i >= sizes[j]) {
        throw TensorError(absl::StrCat("index ", p[at[n]], " is out of bounds for dimension ", j, " with size ",
                                       sizes[j]));
      }
      out[n] += i * strides[j];
    }
  }
  return out;
}
}  // namespace

Tensor Index(const Tensor& x, const TensorList& indices) {
  if (indices.empty() || indices.size() > static_cast<std::size_t>(x.dim()))
    throw TensorError(absl::StrCat("index: ", indices.size(), " indices for a ", x.dim(), "-d tensor"));
  const Shape& shape = indices[0].sizes();
  for (const Tensor& i : indices) {
    if (i.dtype() != DType::kInt64 || i.sizes() != shape)
      throw TensorError("index: int64 index tensors of one shape");
  }
  const auto k = static_cast<std::ptrdiff_t>(indices.size());
  const Shape rest(x.sizes().begin() + k, x.sizes().end());
  Shape sizes = shape;
  sizes.insert(sizes.end(), rest.begin(), rest.end());
  // TensorIterator's output; make_info's index checks and restrides are views.
  Tensor out = Tensor::Empty(x.ctx(), sizes, x.dtype());
  if (x.ctx().computes()) {
    RequireCpuKernel("index", {&x});
    const float* src = reinterpret_cast<const float*>(x.storage()->data());
    float* dst = out.data();
    const Shape rest_strides(x.strides().begin() + k, x.strides().end());
    const Shape out_strides(out.strides().begin() + static_cast<std::ptrdiff_t>(shape.size()), out.strides().end());
    const std::int64_t inner = NumElements(rest);
    const std::vector<std::int64_t> from = IndexedOffsets(x.sizes(), x.strides(), x.impl()->offset, indices);
    for (std::size_t n = 0; n < from.size(); ++n) {
      float* row = dst + static_cast<std::int64_t>(n) * inner;
      ForEachIndex<2>(rest, {rest_strides, out_strides},
                      [&](const std::array<std::int64_t, 2>& o) { row[o[1]] = src[from[n] + o[0]]; });
    }
  }
  if (NeedsGrad({&x})) {
    TensorList saved;
    for (const Tensor& i : indices) saved.push_back(i.Detach());
    RecordOp("IndexBackward0", {&x}, {&out}, [saved, in = x.sizes(), k](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      // index_backward: grad.new_zeros(self's sizes), then _index_put_impl_
      // (accumulate): on CPU a TensorIterator over the zeros, nothing more.
      // CUDA's sort-based accumulate (index_put_with_sort_kernel) adds a few
      // index-sized int64 temporaries and cub's sort workspace: not modelled.
      Tensor full = Tensor::Zeros(g[0].ctx(), in, g[0].dtype());
      if (g[0].ctx().computes()) {
        const Shape rest_sizes(in.begin() + k, in.end());
        const Shape full_rest(full.strides().begin() + k, full.strides().end());
        const std::size_t lead = saved[0].sizes().size();
        const Shape g_rest(g[0].strides().begin() + static_cast<std::ptrdiff_t>(lead), g[0].strides().end());
        const std::vector<std::int64_t> to = IndexedOffsets(in, full.strides(), 0, saved);
        const std::vector<std::int64_t> from = LeadingOffsets(saved[0].sizes(), g[0].strides(), g[0].impl()->offset);
        float* dst = full.data();
        const float* src = reinterpret_cast<const float*>(g[0].storage()->data());
        for (std::size_t i = 0; i < to.size(); ++i) {
          ForEachIndex<2>(rest_sizes, {g_rest, full_rest},
                          [&](const std::array<std::int64_t, 2>& o) { dst[to[i] + o[1]] += src[from[i] + o[0]]; });
        }
      }
      return TensorList{full};
    });
  }
  return out;
}

// ---------------------------------------------------------------- elementwise

Tensor SumTo(const Tensor& grad, const Shape& sizes) {
  if (grad.sizes() == sizes) return grad;
  std::vector<int> dims;
  const int lead = grad.dim() - static_cast<int>(sizes.size());
  for (int i = 0; i < grad.dim(); ++i) {
    if (i < lead || (sizes[i - lead] == 1 && grad.sizes()[i] != 1)) dims.push_back(i);
  }
  Tensor r = SumDims(grad, dims, true);
  return View(r, sizes);
}

Tensor Add(const Tensor& a, const Tensor& b, float alpha) {
  Tensor out =
      Binary(a, b, PromoteTypes(a.dtype(), b.dtype()), "add", [alpha](float x, float y) { return x + alpha * y; });
  if (NeedsGrad({&a, &b})) {
    // Only the inputs that need a gradient get one (task_should_compute_output):
    // an additive mask that does not require grad is not summed back to its shape.
    RecordOp("AddBackward0", {&a, &b}, {&out}, [sa = a.sizes(), sb = b.sizes(), alpha](Node& n, TensorList& g) {
      TensorList r(2);
      if (n.next_edges[0].fn) {
        GradTag tag(n, 0);
        r[0] = SumTo(g[0], sa);
      }
      if (n.next_edges[1].fn) {
        GradTag tag(n, 1);
        r[1] = SumTo(alpha == 1 ? g[0] : MulScalar(g[0], alpha), sb);
      }
      return r;
    });
  }
  return out;
}

Tensor Sub(const Tensor& a, const Tensor& b) {
  Tensor out = Binary(a, b, PromoteTypes(a.dtype(), b.dtype()), "sub", [](float x, float y) { return x - y; });
  if (NeedsGrad({&a, &b})) {
    RecordOp("SubBackward0", {&a, &b}, {&out}, [sa = a.sizes(), sb = b.sizes()](Node& n, TensorList& g) {
      TensorList r(2);
      if (n.next_edges[0].fn) {
        GradTag tag(n, 0);
        r[0] = SumTo(g[0], sa);
      }
      if (n.next_edges[1].fn) {
        GradTag tag(n, 1);
        r[1] = SumTo(MulScalar(g[0], -1), sb);
      }
      return r;
    });
  }
  return out;
}

Tensor Mul(const Tensor& a, const Tensor& b) {
  Tensor out = Binary(a, b, PromoteTypes(a.dtype(), b.dtype()), "mul", [](float x, float y) { return x * y; });
  if (NeedsGrad({&a, &b})) {
    // Saves other for self's gradient and self for other's.
    Tensor saved_a = b.requires_grad() ? a.Detach() : Tensor();
    Tensor saved_b = a.requires_grad() ? b.Detach() : Tensor();
    RecordOp("MulBackward0", {&a, &b}, {&out},
             [saved_a, saved_b, sa = a.sizes(), sb = b.sizes()](Node& n, TensorList& g) {
               TensorList r(2);
               if (saved_b.defined()) {
                 GradTag tag(n, 0);
                 r[0] = SumTo(Mul(g[0], saved_b), sa);
               }
               if (saved_a.defined()) {
                 GradTag tag(n, 1);
                 r[1] = SumTo(Mul(g[0], saved_a), sb);
               }
               return r;
             });
  }
  return out;
}

Tensor Div(const Tensor& a, const Tensor& b) {
  Tensor out = Binary(a, b, PromoteTypes(a.dtype(), b.dtype()), "div", [](float x, float y) { return x / y; });
  if (NeedsGrad({&a, &b})) {
    Tensor saved_a = b.requires_grad() ? a.Detach() : Tensor();
    RecordOp("DivBackward0", {&a, &b}, {&out},
             [saved_a, saved_b = b.Detach(), sa = a.sizes(), sb = b.sizes()](Node& n, TensorList& g) {
               TensorList r(2);
               if (n.next_edges[0].fn) {
                 GradTag tag(n, 0);
                 r[0] = SumTo(Div(g[0], saved_b), sa);
               }
               if (saved_a.defined()) {
                 GradTag tag(n, 1);  // -grad * a / b^2
                 r[1] = SumTo(MulScalar(Div(Mul(g[0], saved_a), Mul(saved_b, saved_b)), -1), sb);
               }
               return r;
             });
  }
  return out;
}

Tensor AddScalar(const Tensor& a, float s) {
  Tensor out = Unary(a, "add", [s](float x) { return x + s; });
  if (NeedsGrad({&a})) RecordOp("AddBackward1", {&a}, {&out}, [](Node&, TensorList& g) { return TensorList{g[0]}; });
  return out;
}

Tensor MulScalar(const Tensor& a, float s) {
  Tensor out = Unary(a, "mul", [s](float x) { return x * s; });
  if (NeedsGrad({&a})) {
    RecordOp("MulBackward1", {&a}, {&out}, [s](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      return TensorList{MulScalar(g[0], s)};
    });
  }
  return out;
}

Tensor DivScalar(const Tensor& a, float s) {
  Tensor out = Unary(a, "div", [s](float x) { return x / s; });
  if (NeedsGrad({&a})) {
    RecordOp("DivBackward1", {&a}, {&out}, [s](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      return TensorList{DivScalar(g[0], s)};
    });
  }
  return out;
}

Tensor PowScalar(const Tensor& a, float e) {
  Tensor out = Unary(a, "pow", [e](float x) { return std::pow(x, e); });
  if (NeedsGrad({&a})) {
    RecordOp("PowBackward0", {&a}, {&out}, [self = a.Detach(), e](Node& n, TensorList& g) {
      GradTag tag(n, 0);  // grad * (e * self.pow(e - 1))
      return TensorList{Mul(g[0], MulScalar(PowScalar(self, e - 1), e))};
    });
  }
  return out;
}

namespace {
Tensor ThresholdBackward(const Tensor& grad, const Tensor& result) {
  return Binary(grad, result, grad.dtype(), "threshold_backward", [](float g, float r) { return r > 0 ? g : 0.f; });
}
}  // namespace

Tensor Relu(const Tensor& x) {
  Tensor out = Unary(x, "relu", [](float v) { return v > 0 ? v : 0.f; });
  if (NeedsGrad({&x})) {
    RecordOp("ReluBackward0", {&x}, {&out}, [result = out.Detach()](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      return TensorList{ThresholdBackward(g[0], result)};
    });
  }
  return out;
}

Tensor& ReluInPlace(Tensor& x) {
  InPlace(x, nullptr, "relu_", [](float v, float) { return v > 0 ? v : 0.f; });
  if (NeedsGrad({&x})) {
    RecordOp("ReluBackward0", {&x}, {&x}, [result = x.Detach()](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      return TensorList{ThresholdBackward(g[0], result)};
    });
  }
  return x;
}

namespace {
float GeluValue(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float k = 0.7978845608028654f;
    return 0.5f * x * (1.f + std::tanh(k * (x + 0.044715f * x * x * x)));
  }
  return 0.5f * x * (1.f + std::erf(x / std::sqrt(2.f)));
}
float GeluDerivative(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float k = 0.7978845608028654f;
    const float inner = k * (x + 0.044715f * x * x * x);
    const float t = std::tanh(inner);
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * k * (1.f + 3.f * 0.044715f * x * x);
  }
  const float cdf = 0.5f * (1.f + std::erf(x / std::sqrt(2.f)));
  const float pdf = std::exp(-0.5f * x * x) / std::sqrt(2.f * 3.14159265358979f);
  return cdf + x * pdf;
}
}  // namespace

Tensor Gelu(const Tensor& x, bool tanh_approximation) {
  Tensor out = Unary(x, "gelu", [tanh_approximation](float v) { return GeluValue(v, tanh_approximation); });
  if (NeedsGrad({&x})) {
    RecordOp("GeluBackward0", {&x}, {&out}, [self = x.Detach(), tanh_approximation](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      return TensorList{Binary(g[0], self, g[0].dtype(), "gelu_backward", [tanh_approximation](float gr, float v) {
        return gr * GeluDerivative(v, tanh_approximation);
      })};
    });
  }
  return out;
}

Tensor GeluNew(const Tensor& x) {
  // 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
  // in Python's order, left to right, each temporary freed once used.
  Tensor half = MulScalar(x, 0.5f);
  Tensor inner = MulScalar(PowScalar(x, 3.f), 0.044715f);
  inner = Add(x, inner);
  inner = MulScalar(inner, 0.7978845608028654f);
  Tensor t = Tanh(inner);
  inner = Tensor();
  t = AddScalar(t, 1.f);
  return Mul(half, t);
}

Tensor Tanh(const Tensor& x) {
  Tensor out = Unary(x, "tanh", [](float v) { return std::tanh(v); });
  if (NeedsGrad({&x})) {
    RecordOp("TanhBackward0", {&x}, {&out}, [result = out.Detach()](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      return TensorList{
          Binary(g[0], result, g[0].dtype(), "tanh_backward", [](float gr, float y) { return gr * (1 - y * y); })};
    });
  }
  return out;
}

Tensor Sigmoid(const Tensor& x) {
  Tensor out = Unary(x, "sigmoid", [](float v) { return 1.f / (1.f + std::exp(-v)); });
  if (NeedsGrad({&x})) {
    RecordOp("SigmoidBackward0", {&x}, {&out}, [result = out.Detach()](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      return TensorList{
          Binary(g[0], result, g[0].dtype(), "sigmoid_backward", [](float gr, float y) { return gr * y * (1 - y); })};
    });
  }
  return out;
}

Tensor Silu(const Tensor& x) {
  Tensor out = Unary(x, "silu", [](float v) { return v / (1.f + std::exp(-v)); });
  if (NeedsGrad({&x})) {
    RecordOp("SiluBackward0", {&x}, {&out}, [self = x.Detach()](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      return TensorList{Binary(g[0], self, g[0].dtype(), "silu_backward", [](float gr, float v) {
        const float s = 1.f / (1.f + std::exp(-v));
        return gr * s * (1 + v * (1 - s));
      })};
    });
  }
  return out;
}

Tensor Rsqrt(const Tensor& x) {
  Tensor out = Unary(x, "rsqrt", [](float v) { return 1.f / std::sqrt(v); });
  if (NeedsGrad({&x})) {
    RecordOp("RsqrtBackward0", {&x}, {&out}, [result = out.Detach()](Node& n, TensorList& g) {
      GradTag tag(n, 0);  // -0.5 * grad * result^3
      return TensorList{Binary(g[0], result, g[0].dtype(), "rsqrt_backward",
                               [](float gr, float y) { return -0.5f * gr * y * y * y; })};
    });
  }
  return out;
}

Tensor Where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  const Shape shape = BroadcastShape(condition.sizes(), BroadcastShape(a.sizes(), b.sizes()));
  Tensor out = Tensor::Empty(a.ctx(), shape, PromoteTypes(a.dtype(), b.dtype()));
  if (a.ctx().computes()) {
    RequireCpuKernel("where", {&a, &b});
    const std::uint8_t* pc = condition.data_u8();
    const float* pa = a.data();
    const float* pb = b.data();
    float* po = out.data();
    ForEachIndex<4>(
        shape,
        {BroadcastStrides(condition, shape), BroadcastStrides(a, shape), BroadcastStrides(b, shape), out.strides()},
        [&](const std::array<std::int64_t, 4>& o) { po[o[3]] = pc[o[0]] ? pa[o[1]] : pb[o[2]]; });
  }
  if (NeedsGrad({&a, &b})) {
    RecordOp("WhereBackward0", {&a, &b}, {&out},
             [cond = condition.Detach(), sa = a.sizes(), sb = b.sizes()](Node& n, TensorList& g) {
               TensorList r(2);
               Tensor zero = Tensor::Zeros(g[0].ctx(), {}, g[0].dtype());
               if (n.next_edges[0].fn) {
                 GradTag tag(n, 0);
                 r[0] = SumTo(Where(cond, g[0], zero), sa);
               }
               if (n.next_edges[1].fn) {
                 GradTag tag(n, 1);
                 r[1] = SumTo(Where(cond, zero, g[0]), sb);
               }
               return r;
             });
  }
  return out;
}

Tensor Eq(const Tensor& a, float value) {
  Tensor out = Tensor::Empty(a.ctx(), a.sizes(), DType::kBool);
  if (a.ctx().computes()) {
    std::uint8_t* po = out.data_u8();
    if (a.dtype() == DType::kInt64) {
      const std::int64_t* pa = a.data_i64();
      ForEachIndex<2>(a.sizes(), {a.strides(), out.strides()}, [&](const std::array<std::int64_t, 2>& o) {
        po[o[1]] = pa[o[0]] == static_cast<std::int64_t>(value);
      });
    } else {
      const float* pa = a.data();
      ForEachIndex<2>(a.sizes(), {a.strides(), out.strides()},
                      [&](const std::array<std::int64_t, 2>& o) { po[o[1]] = pa[o[0]] == value; });
    }
  }
  return out;
}

Tensor ClampInt(const Tensor& x, std::int64_t lo, std::int64_t hi) {
  if (x.dtype() != DType::kInt64) throw TensorError("clamp: int64 ids only");
  Tensor out = Tensor::Empty(x.ctx(), x.sizes(), DType::kInt64);
  if (x.ctx().computes()) {
    const std::int64_t* px = x.data_i64();
    std::int64_t* po = out.data_i64();
    ForEachIndex<2>(x.sizes(), {x.strides(), out.strides()},
                    [&](const std::array<std::int64_t, 2>& o) { po[o[1]] = std::clamp(px[o[0]], lo, hi); });
  }
  return out;
}

Tensor& AddInPlaceTracked(Tensor& x, const Tensor& y) {
  InPlace(x, &y, "add_", [](float a, float b) { return a + b; });
  if (NeedsGrad({&x, &y})) {
    RecordOp("AddBackward0", {&x, &y}, {&x}, [sy = y.sizes()](Node& n, TensorList& g) {
      GradTag tag(n, 1);
      return TensorList{g[0], n.next_edges[1].fn ? SumTo(g[0], sy) : Tensor()};
    });
  }
  return x;
}

// ---------------------------------------------------------------- in place, no autograd

void AddInPlace(Tensor& x, const Tensor& y, float alpha) {
  InPlace(x, &y, "add_", [alpha](float a, float b) { return a + alpha * b; });
}
void MulInPlace(Tensor& x, float s) {
  InPlace(x, nullptr, "mul_", [s](float a, float) { return a * s; });
}
void AddScalarInPlace(Tensor& x, float s) {
  InPlace(x, nullptr, "add_", [s](float a, float) { return a + s; });
}
void DivInPlace(Tensor& x, float s) {
  InPlace(x, nullptr, "div_", [s](float a, float) { return a / s; });
}
void AddcmulInPlace(Tensor& x, const Tensor& a, const Tensor& b, float value) {
  if (!x.ctx().computes()) return;
  RequireCpuKernel("addcmul_", {&x, &a, &b});
  float* px = x.data();
  const float* pa = a.data();
  const float* pb = b.data();
  ForEachIndex<3>(x.sizes(), {x.strides(), BroadcastStrides(a, x.sizes()), BroadcastStrides(b, x.sizes())},
                  [&](const std::array<std::int64_t, 3>& o) { px[o[0]] += value * pa[o[1]] * pb[o[2]]; });
}
void AddcdivInPlace(Tensor& x, const Tensor& a, const Tensor& b, float value) {
  if (!x.ctx().computes()) return;
  RequireCpuKernel("addcdiv_", {&x, &a, &b});
  float* px = x.data();
  const float* pa = a.data();
  const float* pb = b.data();
  ForEachIndex<3>(x.sizes(), {x.strides(), BroadcastStrides(a, x.sizes()), BroadcastStrides(b, x.sizes())},
                  [&](const std::array<std::int64_t, 3>& o) { px[o[0]] += value * pa[o[1]] / pb[o[2]]; });
}
void LerpInPlace(Tensor& x, const Tensor& end, float weight) {
  InPlace(x, &end, "lerp_", [weight](float a, float b) { return a + weight * (b - a); });
}
void ZeroInPlace(Tensor& x) {
  InPlace(x, nullptr, "zero_", [](float, float) { return 0.f; });
}
void CopyInPlace(Tensor& dst, const Tensor& src) {
  if (!dst.ctx().computes()) return;
  if (dst.dtype() != src.dtype()) throw TensorError("copy_: --exec cpu copies between equal dtypes only");
  if (dst.dtype() == DType::kInt64) {
    std::int64_t* pd = dst.data_i64();
    const std::int64_t* ps = src.data_i64();
    ForEachIndex<2>(dst.sizes(), {dst.strides(), BroadcastStrides(src, dst.sizes())},
                    [&](const std::array<std::int64_t, 2>& o) { pd[o[0]] = ps[o[1]]; });
    return;
  }
  InPlace(dst, &src, "copy_", [](float, float b) { return b; });
}
void MaskedFillInPlace(Tensor& x, const Tensor& mask, float value) {
  if (!x.ctx().computes()) return;
  RequireCpuKernel("masked_fill_", {&x});
  float* px = x.data();
  const std::uint8_t* pm = mask.data_u8();
  ForEachIndex<2>(x.sizes(), {x.strides(), BroadcastStrides(mask, x.sizes())},
                  [&](const std::array<std::int64_t, 2>& o) {
                    if (pm[o[1]]) px[o[0]] = value;
                  });
}
Tensor Sqrt(const Tensor& x) {
  return Unary(x, "sqrt", [](float v) { return std::sqrt(v); });
}

// ---------------------------------------------------------------- reductions

Tensor SumDims(const Tensor& x, const std::vector<int>& dims_in, bool keepdim) {
  std::vector<bool> reduce(static_cast<std::size_t>(x.dim()), false);
  for (int d : dims_in) reduce[static_cast<std::size_t>(WrapDim(d, x.dim()))] = true;
  Shape kept, out_sizes;
  for (int i = 0; i < x.dim(); ++i) {
    kept.push_back(reduce[i] ? 1 : x.sizes()[i]);
    if (!reduce[i] || keepdim) out_sizes.push_back(reduce[i] ? 1 : x.sizes()[i]);
  }
  // sum is on autocast's fp32 list: a float32 result, no input copy.
  const bool to_float = AutocastGuard::current().has_value() && IsFloating(x.dtype());
  Tensor out = Tensor::Zeros(x.ctx(), out_sizes, to_float ? DType::kFloat32 : x.dtype());
  if (x.ctx().computes()) {
    RequireCpuKernel("sum", {&x});
    const float* px = x.data();
    float* po = out.data();
    Shape out_strides = ContiguousStrides(kept);
    for (int i = 0; i < x.dim(); ++i) {
      if (reduce[i]) out_strides[i] = 0;
    }
    ForEachIndex<2>(x.sizes(), {x.strides(), out_strides},
                    [&](const std::array<std::int64_t, 2>& o) { po[o[1]] += px[o[0]]; });
  }
  if (NeedsGrad({&x})) {
    RecordOp("SumBackward1", {&x}, {&out},
             [in = x.sizes(), kept](Node&, TensorList& g) { return TensorList{Expand(View(g[0], kept), in)}; });
  }
  return out;
}

Tensor Sum(const Tensor& x) {
  std::vector<int> all(static_cast<std::size_t>(x.dim()));
  std::iota(all.begin(), all.end(), 0);
  return SumDims(x, all, false);
}

Tensor Mean(const Tensor& x) {
  Tensor s;
  {
    NoGradGuard no_grad;
    s = Sum(x);
    DivInPlace(s, static_cast<float>(x.numel()));
  }
  if (NeedsGrad({&x})) {
    RecordOp("MeanBackward0", {&x}, {&s}, [in = x.sizes(), n = x.numel()](Node& node, TensorList& g) {
      GradTag tag(node, 0);  // grad.expand(sizes) / numel: one full-size tensor
      Shape ones(in.size(), 1);
      return TensorList{DivScalar(Expand(View(g[0], ones), in), static_cast<float>(n))};
    });
  }
  return s;
}

Tensor MeanDims(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  Tensor s;
  std::int64_t n = 1;
  for (int d : dims) n *= x.sizes()[static_cast<std::size_t>(WrapDim(d, x.dim()))];
  {
    NoGradGuard no_grad;
    s = SumDims(x, dims, keepdim);
    DivInPlace(s, static_cast<float>(n));
  }
  if (NeedsGrad({&x})) {
    Shape kept = x.sizes();
    for (int d : dims) kept[static_cast<std::size_t>(WrapDim(d, x.dim()))] = 1;
    Tensor saved = CurrentTorchBehaviour().mean_dim_saves_input ? x.Detach() : Tensor();
    RecordOp("MeanBackward1", {&x}, {&s}, [in = x.sizes(), kept, n, saved](Node& node, TensorList& g) {
      GradTag tag(node, 0);
      return TensorList{DivScalar(Expand(View(g[0], kept), in), static_cast<float>(n))};
    });
  }
  return s;
}

}  // namespace ops
}  // namespace memscope
