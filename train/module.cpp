#include "train/module.h"

#include <cmath>

#include "allocator/alloc_tag.h"

namespace memscope {

Tensor& Module::Param(const std::string& name, const Shape& shape, Init init) {
  auto slot = std::make_unique<Slot>();
  slot->name = Child(name);
  slot->shape = shape;
  slot->init = init;
  slots_.push_back(std::move(slot));
  return slots_.back()->tensor;
}

Tensor& Module::Buffer(const std::string& name, const Shape& shape, DType dtype, float fill) {
  auto slot = std::make_unique<Slot>();
  slot->name = Child(name);
  slot->shape = shape;
  slot->dtype = dtype;
  slot->parameter = false;
  slot->init.fill = fill;
  slots_.push_back(std::move(slot));
  return slots_.back()->tensor;
}

void Module::Materialize(DeviceContext& ctx) {
  for (auto& child : children_) child->Materialize(ctx);
  for (const bool parameters : {true, false}) {
    for (auto& slot : slots_) {
      if (slot->parameter != parameters) continue;
      ScopedTag tag(parameters ? Category::kParameter : Category::kOther, slot->name);
      slot->tensor = Tensor::Empty(ctx, slot->shape, slot->dtype);
      slot->tensor.impl()->name = slot->name;
      if (slot->init.uniform_bound > 0) {
        ops::UniformInPlace(slot->tensor, slot->init.uniform_bound);
      } else if (ctx.computes() && IsFloating(slot->dtype)) {
        ops::FillInPlace(slot->tensor, slot->init.fill);
      }
      if (parameters && slot->requires_grad) slot->tensor.set_requires_grad(true);
    }
  }
  OnMaterialized(ctx);
}

std::vector<Tensor*> Module::Parameters() {
  std::vector<Tensor*> out;
  for (auto& slot : slots_) {
    if (slot->parameter && slot->requires_grad) out.push_back(&slot->tensor);
  }
  for (auto& child : children_) {
    for (Tensor* p : child->Parameters()) out.push_back(p);
  }
  return out;
}

std::vector<Tensor*> Module::Buffers() {
  std::vector<Tensor*> out;
  for (auto& slot : slots_) {
    if (!slot->parameter) out.push_back(&slot->tensor);
  }
  for (auto& child : children_) {
    for (Tensor* b : child->Buffers()) out.push_back(b);
  }
  return out;
}

std::vector<Tensor*> Module::AllParameters() {
  std::vector<Tensor*> out;
  for (auto& slot : slots_) {
    if (slot->parameter) out.push_back(&slot->tensor);
  }
  for (auto& child : children_) {
    for (Tensor* p : child->AllParameters()) out.push_back(p);
  }
  return out;
}

bool Module::ContainsCudnnRnn() const {
  if (dynamic_cast<const CudnnRnnLayer*>(this) != nullptr) return true;
  for (const auto& child : children_) {
    if (child->ContainsCudnnRnn()) return true;
  }
  return false;
}

std::int64_t Module::NumParameters() const {
  std::int64_t n = 0;
  for (const auto& slot : slots_) n += slot->parameter ? NumElements(slot->shape) : 0;
  for (const auto& child : children_) n += child->NumParameters();
  return n;
}

std::int64_t Module::NumParameterTensors() const {
  std::int64_t n = 0;
  for (const auto& slot : slots_) n += slot->parameter ? 1 : 0;
  for (const auto& child : children_) n += child->NumParameterTensors();
  return n;
}

std::int64_t Module::NumTrainableParameters() const {
  std::int64_t n = 0;
  for (const auto& slot : slots_) n += slot->parameter && slot->requires_grad ? NumElements(slot->shape) : 0;
  for (const auto& child : children_) n += child->NumTrainableParameters();
  return n;
}

std::vector<std::int64_t> Module::TrainableNumels() const {
  std::vector<std::int64_t> out;
  for (const auto& slot : slots_) {
    if (slot->parameter && slot->requires_grad) out.push_back(NumElements(slot->shape));
  }
  for (const auto& child : children_) {
    for (std::int64_t n : child->TrainableNumels()) out.push_back(n);
  }
  return out;
}

void Module::SetRequiresGrad(bool requires_grad) {
  for (auto& slot : slots_) slot->requires_grad = requires_grad;
  for (auto& child : children_) child->SetRequiresGrad(requires_grad);
}

void Module::SetParameterDType(DType dtype) {
  for (auto& slot : slots_) {
    if (slot->parameter) slot->dtype = dtype;
  }
  for (auto& child : children_) child->SetParameterDType(dtype);
}

Tensor* Module::FindParameter(const std::string& full_name) {
  for (auto& slot : slots_) {
    if (slot->parameter && slot->name == full_name) return &slot->tensor;
  }
  for (auto& child : children_) {
    if (Tensor* t = child->FindParameter(full_name)) return t;
  }
  return nullptr;
}

Module* Module::FindChild(const std::string& name) {
  const std::string full = Child(name);
  for (auto& child : children_) {
    if (child->path() == full) return child.get();
  }
  return nullptr;
}

std::vector<std::string> Module::ParameterNames() const {
  std::vector<std::string> out;
  for (const auto& slot : slots_) {
    if (slot->parameter) out.push_back(slot->name);
  }
  for (const auto& child : children_) {
    for (std::string& n : child->ParameterNames()) out.push_back(std::move(n));
  }
  return out;
}

namespace {
Module::Init Uniform(double fan_in) { return {static_cast<float>(1.0 / std::sqrt(fan_in)), 0}; }
}  // namespace

// The layers' defaults follow torch.nn: kaiming_uniform(a=sqrt(5)) weights
// and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) biases, which both come to a bound
// of 1/sqrt(fan_in).
Linear::Linear(std::string path, std::int64_t in, std::int64_t out, bool bias)
    : Module(std::move(path)),
      weight_(Param("weight", {out, in}, Uniform(static_cast<double>(in)))),
      bias_(bias ? &Param("bias", {out}, Uniform(static_cast<double>(in))) : nullptr) {}

Tensor Linear::Forward(const Tensor& x) const {
  ScopedTag tag(Category::kActivation, path());
  return ops::Linear(x, weight_, bias_ ? *bias_ : Tensor());
}

Conv1D::Conv1D(std::string path, std::int64_t in, std::int64_t out)
    : Module(std::move(path)), weight_(Param("weight", {in, out}, {0.02f, 0})), bias_(Param("bias", {out}, {0, 0})) {}

Tensor Conv1D::Forward(const Tensor& x) const {
  ScopedTag tag(Category::kActivation, path());
  Shape out_sizes = x.sizes();
  out_sizes.back() = weight_.sizes()[1];
  return ops::View(ops::Addmm(bias_, ops::View(x, {-1, x.sizes().back()}), weight_), out_sizes);
}

Conv2dLayer::Conv2dLayer(std::string path, std::int64_t in, std::int64_t out, int kernel, int stride, int padding,
                         bool bias)
    : Module(std::move(path)),
      weight_(Param("weight", {out, in, kernel, kernel}, Uniform(static_cast<double>(in * kernel * kernel)))),
      bias_(bias ? &Param("bias", {out}, Uniform(static_cast<double>(in * kernel * kernel))) : nullptr),
      stride_(stride),
      padding_(padding) {}

Tensor Conv2dLayer::Forward(const Tensor& x) const {
  ScopedTag tag(Category::kActivation, path());
  return ops::Conv2d(x, weight_, bias_ ? *bias_ : Tensor(), stride_, padding_);
}

BatchNorm2dLayer::BatchNorm2dLayer(std::string path, std::int64_t channels)
    : Module(std::move(path)),
      weight_(Param("weight", {channels}, {0, 1})),
      bias_(Param("bias", {channels}, {0, 0})),
      running_mean_(Buffer("running_mean", {channels}, DType::kFloat32, 0)),
      running_var_(Buffer("running_var", {channels}, DType::kFloat32, 1)) {
  Buffer("num_batches_tracked", {}, DType::kInt64);
}

Tensor BatchNorm2dLayer::Forward(const Tensor& x) {
  ScopedTag tag(Category::kActivation, path());
  return ops::BatchNorm2d(x, weight_, bias_, running_mean_, running_var_);
}

LayerNormLayer::LayerNormLayer(std::string path, std::int64_t dim, float eps)
    : Module(std::move(path)),
      weight_(Param("weight", {dim}, {0, 1})),
      bias_(Param("bias", {dim}, {0, 0})),
      eps_(eps) {}

Tensor LayerNormLayer::Forward(const Tensor& x) const {
  ScopedTag tag(Category::kActivation, path());
  return ops::LayerNorm(x, weight_, bias_, eps_);
}

EmbeddingLayer::EmbeddingLayer(std::string path, std::int64_t num, std::int64_t dim, std::int64_t padding_idx)
    : Module(std::move(path)), weight_(Param("weight", {num, dim}, {1, 0})), padding_idx_(padding_idx) {}

Tensor EmbeddingLayer::Forward(const Tensor& indices) const {
  ScopedTag tag(Category::kActivation, path());
  return ops::Embedding(weight_, indices, padding_idx_);
}

GRUCellLayer::GRUCellLayer(std::string path, std::int64_t input, std::int64_t hidden)
    : Module(std::move(path)),
      w_ih_(Param("weight_ih", {3 * hidden, input}, Uniform(static_cast<double>(hidden)))),
      w_hh_(Param("weight_hh", {3 * hidden, hidden}, Uniform(static_cast<double>(hidden)))),
      b_ih_(Param("bias_ih", {3 * hidden}, Uniform(static_cast<double>(hidden)))),
      b_hh_(Param("bias_hh", {3 * hidden}, Uniform(static_cast<double>(hidden)))) {}

Tensor GRUCellLayer::Forward(const Tensor& x, const Tensor& h) const {
  ScopedTag tag(Category::kActivation, path());
  return ops::GruCell(x, h, w_ih_, w_hh_, b_ih_, b_hh_);
}

CudnnRnnLayer::CudnnRnnLayer(std::string path, bool lstm, std::int64_t input, std::int64_t hidden, std::int64_t layers,
                             bool bidirectional)
    : Module(std::move(path)), lstm_(lstm), hidden_(hidden), layers_(layers), bidirectional_(bidirectional) {
  const std::int64_t gates = (lstm ? 4 : 3) * hidden;
  const Init init = Uniform(static_cast<double>(hidden));
  for (std::int64_t l = 0; l < layers; ++l) {
    const std::int64_t in = l == 0 ? input : hidden * (bidirectional ? 2 : 1);
    for (const char* suffix : {"", "_reverse"}) {
      if (*suffix != 0 && !bidirectional) continue;
      const std::string s = "_l" + std::to_string(l) + suffix;
      weights_.push_back(&Param("weight_ih" + s, {gates, in}, init));
      weights_.push_back(&Param("weight_hh" + s, {gates, hidden}, init));
      weights_.push_back(&Param("bias_ih" + s, {gates}, init));
      weights_.push_back(&Param("bias_hh" + s, {gates}, init));
    }
  }
}

void CudnnRnnLayer::OnMaterialized(DeviceContext& ctx) {
  // flatten_parameters(): one new buffer; the parameters become views of it
  // and their own allocations are freed.
  std::int64_t total = 0;
  for (const Tensor* w : weights_) total += w->numel();
  {
    ScopedTag tag(Category::kParameter, path());
    flat_ = Tensor::Empty(ctx, {total}, weights_.front()->dtype());  // the parameters' dtype
  }
  std::int64_t offset = 0;
  for (Tensor* w : weights_) {
    Tensor view = flat_.AsStrided(w->sizes(), ContiguousStrides(w->sizes()), offset);
    if (ctx.computes()) ops::CopyInPlace(view, *w);
    view.impl()->name = w->name();
    view.set_requires_grad(true);
    offset += w->numel();
    *w = view;
  }
}

ops::RnnResult CudnnRnnLayer::Forward(const Tensor& packed, std::int64_t batch) const {
  ScopedTag tag(Category::kActivation, path());
  TensorList views;
  for (const Tensor* w : weights_) views.push_back(*w);
  return ops::CudnnRnn(packed, flat_, views, lstm_, layers_, bidirectional_, hidden_, batch);
}

}  // namespace memscope
