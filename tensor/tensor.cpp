#include "tensor/tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "allocator/alloc_tag.h"

namespace memscope {

std::size_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt64: return 8;
    case DType::kInt32: return 4;
    case DType::kBool: return 1;
    case DType::kUInt8: return 1;
  }
  return 1;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt64: return "int64";
    case DType::kInt32: return "int32";
    case DType::kBool: return "bool";
    case DType::kUInt8: return "uint8";
  }
  return "?";
}

bool IsFloating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

DeviceContext::DeviceContext(CachingAllocator& allocator, ExecMode mode, SimDevice* host)
    : allocator_(allocator), mode_(mode), host_(host) {
  if (mode == ExecMode::kCpu && host == nullptr) throw TensorError("cpu execution needs a host-backed SimDevice");
}

DeviceContext::~DeviceContext() = default;

void DeviceContext::UseBlas(bool lt) {
  if (!cublas_ready_) {
    ScopedTag tag(Category::kOther, "cublas_workspace");
    cublas_workspace_ = std::make_unique<Storage>(*this, blas_sizes_.cublas);
    cublas_ready_ = true;
  }
  if (lt && !cublaslt_ready_) {
    ScopedTag tag(Category::kOther, "cublaslt_workspace");
    cublaslt_workspace_ = std::make_unique<Storage>(*this, blas_sizes_.cublaslt);
    cublaslt_ready_ = true;
  }
}

void* DeviceContext::HostPointer(DevicePtr ptr) const { return host_ ? host_->HostPointer(ptr) : nullptr; }

Storage::Storage(DeviceContext& ctx, std::size_t nbytes) : ctx_(ctx), nbytes_(nbytes) {
  if (nbytes == 0) return;
  absl::StatusOr<DevicePtr> p = ctx.allocator().Malloc(nbytes);
  if (!p.ok()) {
    throw TensorError(std::string(p.status().message()), absl::IsResourceExhausted(p.status()));
  }
  ptr_ = *p;
  if (ctx.computes()) data_ = static_cast<std::byte*>(ctx.HostPointer(ptr_));
}

Storage::~Storage() {
  if (ptr_ != 0) (void)ctx_.allocator().Free(ptr_);
}

std::int64_t NumElements(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  return n;
}

Shape ContiguousStrides(const Shape& shape) {
  Shape strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(shape[i], 1);
  }
  return strides;
}

std::string ShapeText(const Shape& shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

Tensor Tensor::Empty(DeviceContext& ctx, const Shape& sizes, DType dtype) {
  for (std::int64_t s : sizes) {
    if (s < 0) throw TensorError(absl::StrCat("negative dimension in shape ", ShapeText(sizes)));
  }
  // PyTorch's check (c10::computeStorageNbytes): the byte count must fit in 64 bits.
  std::int64_t bytes = static_cast<std::int64_t>(ElementSize(dtype));
  for (std::int64_t s : sizes) {
    if (__builtin_mul_overflow(bytes, s, &bytes)) {
      throw TensorError(absl::StrCat("Storage size calculation overflowed with sizes=", ShapeText(sizes)));
    }
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(ctx, static_cast<std::size_t>(bytes));
  impl->sizes = sizes;
  impl->strides = ContiguousStrides(sizes);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::Zeros(DeviceContext& ctx, const Shape& sizes, DType dtype) {
  Tensor t = Empty(ctx, sizes, dtype);
  if (ctx.computes() && t.nbytes() > 0) std::memset(t.storage()->data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::Full(DeviceContext& ctx, const Shape& sizes, double value, DType dtype) {
  Tensor t = Empty(ctx, sizes, dtype);
  if (ctx.computes()) {
    const std::int64_t n = t.numel();
    switch (dtype) {
      case DType::kFloat32:
        for (std::int64_t i = 0; i < n; ++i) t.data()[i] = static_cast<float>(value);
        break;
      case DType::kInt64:
        for (std::int64_t i = 0; i < n; ++i) t.data_i64()[i] = static_cast<std::int64_t>(value);
        break;
      case DType::kBool:
      case DType::kUInt8:
        for (std::int64_t i = 0; i < n; ++i) t.data_u8()[i] = value != 0 ? 1 : 0;
        break;
      default: throw TensorError(absl::StrCat("Full: no CPU kernel for ", std::string(DTypeName(dtype))));
    }
  }
  return t;
}

std::int64_t Tensor::size(int d) const {
  const int n = dim();
  const int i = d < 0 ? d + n : d;
  if (i < 0 || i >= n) throw TensorError(absl::StrCat("dimension ", d, " out of range for a ", n, "-d tensor"));
  return impl_->sizes[static_cast<std::size_t>(i)];
}

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t i = impl_->sizes.size(); i-- > 0;) {
    if (impl_->sizes[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->sizes[i];
  }
  return true;
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  impl_->requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::Detach() const { return AsStrided(impl_->sizes, impl_->strides, impl_->offset); }

Tensor Tensor::AsStrided(const Shape& sizes, const Shape& strides, std::int64_t offset) const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->sizes = sizes;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

float* Tensor::data() const {
  std::byte* base = impl_->storage->data();
  if (base == nullptr) throw TensorError("tensor data read outside --exec cpu");
  return reinterpret_cast<float*>(base) + impl_->offset;
}

std::int64_t* Tensor::data_i64() const {
  std::byte* base = impl_->storage->data();
  if (base == nullptr) throw TensorError("tensor data read outside --exec cpu");
  return reinterpret_cast<std::int64_t*>(base) + impl_->offset;
}

std::uint8_t* Tensor::data_u8() const {
  std::byte* base = impl_->storage->data();
  if (base == nullptr) throw TensorError("tensor data read outside --exec cpu");
  return reinterpret_cast<std::uint8_t*>(base) + impl_->offset;
}

void* Tensor::raw_data() const {
  std::byte* base = impl_->storage->data();
  if (base == nullptr) return nullptr;
  return base + impl_->offset * static_cast<std::int64_t>(ElementSize(impl_->dtype));
}

float Tensor::At(std::initializer_list<std::int64_t> index) const {
  std::int64_t off = 0;
  std::size_t d = 0;
  for (std::int64_t i : index) off += i * impl_->strides[d++];
  return data()[off];
}

namespace {
thread_local bool grad_mode_enabled = true;
}  // namespace

bool GradMode::enabled() { return grad_mode_enabled; }
void GradMode::set_enabled(bool enabled) { grad_mode_enabled = enabled; }

}  // namespace memscope
