// Tensors whose memory comes from the CachingAllocator, with PyTorch's
// lifetime rules: a Tensor is a reference-counted handle to a TensorImpl
// (shape, strides, dtype, autograd metadata), which holds a reference to a
// Storage (one allocation). Views share the storage. The allocation is freed
// exactly when the last tensor viewing it is dropped, as in PyTorch, because
// that timing is what shapes the allocator's cache and its fragmentation.
//
//   DeviceContext gpu(allocator, ExecMode::kMeta);
//   Tensor w = Tensor::Empty(gpu, {1000, 500});   // 2,000,000 B through the allocator
//   Tensor v = w.View({500, 1000});                 // no allocation
//   w = Tensor();  v = Tensor();                    // freed here
//
// In ExecMode::kMeta nothing is computed: ops allocate their outputs and
// temporaries and run no arithmetic, so any model size simulates in seconds.
// In ExecMode::kCpu the device is host-backed and kernels do real float math.
//
// Errors (out of memory, shape mismatch, an op without a CPU kernel) throw
// TensorError, as PyTorch raises: a training step unwinds, every tensor it
// held is released, and the caller (the Trainer) reports what happened.
#ifndef MEMSCOPE_TENSOR_TENSOR_H_
#define MEMSCOPE_TENSOR_TENSOR_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"
#include "tensor/blas_workspace.h"

namespace memscope {

enum class DType : std::uint8_t { kFloat32, kFloat16, kBFloat16, kInt64, kInt32, kBool, kUInt8 };
std::size_t ElementSize(DType dtype);
std::string_view DTypeName(DType dtype);  // "float32", "float16", ...
bool IsFloating(DType dtype);

enum class ExecMode : std::uint8_t { kMeta, kCpu };

// What went wrong in a tensor operation. `out_of_memory` marks the
// allocator's OOM (the run reports it with its fragmentation diagnosis).
class TensorError : public std::runtime_error {
 public:
  explicit TensorError(const std::string& what, bool out_of_memory = false)
      : std::runtime_error(what), out_of_memory_(out_of_memory) {}
  bool out_of_memory() const { return out_of_memory_; }

 private:
  bool out_of_memory_;
};

class Storage;

// One device: the allocator that serves its tensors and how ops execute.
class DeviceContext {
 public:
  // `host` must be the host-backed SimDevice under `allocator` for kCpu.
  DeviceContext(CachingAllocator& allocator, ExecMode mode, SimDevice* host = nullptr);
  ~DeviceContext();  // frees the BLAS workspaces
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  // The cuBLAS/cuBLASLt workspaces the matmuls of this device allocate
  // (tensor/blas_workspace.h); none by default. Set before the first matmul.
  void set_blas_workspaces(const BlasWorkspaceSizes& sizes) { blas_sizes_ = sizes; }
  const BlasWorkspaceSizes& blas_workspaces() const { return blas_sizes_; }
  // Called by a matmul after its output is allocated: the first cuBLAS call
  // (and, with `lt`, the first cuBLASLt call) on this device allocates its
  // workspace, category OTHER, owner "cublas_workspace" /
  // "cublaslt_workspace", kept until the context dies. Throws TensorError.
  void UseBlas(bool lt);

  CachingAllocator& allocator() const { return allocator_; }
  ExecMode mode() const { return mode_; }
  bool computes() const { return mode_ == ExecMode::kCpu; }
  // Host memory behind a device address (kCpu only).
  void* HostPointer(DevicePtr ptr) const;
  std::uint64_t next_seed() { return seed_++; }  // dropout masks, init
  std::uint64_t seed() const { return seed_; }
  void set_seed(std::uint64_t seed) { seed_ = seed; }

 private:
  CachingAllocator& allocator_;
  ExecMode mode_;
  SimDevice* host_;
  std::uint64_t seed_ = 0x5eed;
  BlasWorkspaceSizes blas_sizes_;
  std::unique_ptr<Storage> cublas_workspace_, cublaslt_workspace_;
  bool cublas_ready_ = false, cublaslt_ready_ = false;
};

// One allocation. Freed through the allocator when the last reference goes.
class Storage {
 public:
  // Allocates `nbytes` (0 allocates nothing, like PyTorch). Throws TensorError.
  Storage(DeviceContext& ctx, std::size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  DeviceContext& ctx() const { return ctx_; }
  DevicePtr ptr() const { return ptr_; }
  std::size_t nbytes() const { return nbytes_; }
  // Host bytes (kCpu), else nullptr.
  std::byte* data() const { return data_; }

 private:
  DeviceContext& ctx_;
  DevicePtr ptr_ = 0;
  std::size_t nbytes_;
  std::byte* data_ = nullptr;
};

using Shape = absl::InlinedVector<std::int64_t, 5>;
std::int64_t NumElements(const Shape& shape);
Shape ContiguousStrides(const Shape& shape);
std::string ShapeText(const Shape& shape);  // "[80, 50, 1000]"

class Node;
class Tensor;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape sizes;
  Shape strides;
  std::int64_t offset = 0;  // in elements
  DType dtype = DType::kFloat32;
  // Autograd: a leaf that requires grad has no grad_fn; a result of a
  // differentiable op has grad_fn and output_nr.
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;
  std::uint32_t output_nr = 0;
  std::shared_ptr<TensorImpl> grad;      // .grad of a leaf
  std::weak_ptr<Node> grad_accumulator;  // AccumulateGrad of a leaf (it owns the leaf)
  std::string name;                      // parameter name ("" otherwise)
};

// A handle to a TensorImpl; copies share it (like at::Tensor).
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // A new contiguous tensor; its bytes are uninitialised (zeros in kCpu,
  // where the host backing starts zeroed, but do not rely on it).
  static Tensor Empty(DeviceContext& ctx, const Shape& sizes, DType dtype = DType::kFloat32);
  static Tensor Zeros(DeviceContext& ctx, const Shape& sizes, DType dtype = DType::kFloat32);
  static Tensor Full(DeviceContext& ctx, const Shape& sizes, double value, DType dtype = DType::kFloat32);

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  long use_count() const { return impl_.use_count(); }

  const Shape& sizes() const { return impl_->sizes; }
  const Shape& strides() const { return impl_->strides; }
  std::int64_t size(int dim) const;  // negative dims count from the end
  int dim() const { return static_cast<int>(impl_->sizes.size()); }
  std::int64_t numel() const { return NumElements(impl_->sizes); }
  DType dtype() const { return impl_->dtype; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * ElementSize(dtype()); }
  DeviceContext& ctx() const { return impl_->storage->ctx(); }
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  bool is_contiguous() const;

  bool requires_grad() const { return impl_->requires_grad; }
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  const std::shared_ptr<Node>& grad_fn() const { return impl_->grad_fn; }
  Tensor grad() const { return Tensor(impl_->grad); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  const std::string& name() const { return impl_->name; }
  // Makes this a leaf that requires grad (nn.Parameter).
  Tensor& set_requires_grad(bool requires_grad);

  // A new handle to the same storage and shape without autograd history
  // (Tensor.detach()).
  Tensor Detach() const;
  // Views of the same storage (no allocation).
  Tensor AsStrided(const Shape& sizes, const Shape& strides, std::int64_t offset) const;

  // Element access for kCpu (float32 tensors; int64 for Index).
  float* data() const;
  std::int64_t* data_i64() const;
  std::uint8_t* data_u8() const;
  // The first byte of any dtype, or null in kMeta (no bytes).
  void* raw_data() const;
  float At(std::initializer_list<std::int64_t> index) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Whether ops record autograd history on this thread (torch.no_grad()).
class GradMode {
 public:
  static bool enabled();
  static void set_enabled(bool enabled);
};
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace memscope

#endif  // MEMSCOPE_TENSOR_TENSOR_H_
