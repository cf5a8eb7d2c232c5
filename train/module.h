// nn.Module for the model zoo: a tree of modules with named parameters and
// buffers. Shapes are declared at construction (so parameter counts need no
// device); Materialize() allocates them on a device in the order
// `model.cuda()` does (Module._apply: children first, then the module's own
// parameters, then its buffers), each tagged PARAMETER (or OTHER for
// buffers) with its full name. Parameters() lists them in
// named_parameters() order (own first, then children), the order optimizers
// and DDP see.
#ifndef MEMSCOPE_TRAIN_MODULE_H_
#define MEMSCOPE_TRAIN_MODULE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace memscope {

class Module {
 public:
  explicit Module(std::string path) : path_(std::move(path)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Full dotted path ("decoder.cell0"; "" for the root).
  const std::string& path() const { return path_; }
  void Materialize(DeviceContext& ctx);
  // Trainable parameters (requires_grad) in named_parameters() order: what
  // the optimizer and DDP see. NumParameters counts frozen ones too.
  std::vector<Tensor*> Parameters();
  // Buffers in named_buffers() order (running stats, ...).
  std::vector<Tensor*> Buffers();
  // Every parameter slot, frozen ones too, in named_parameters() order
  // (module.parameters(): what DataParallel's replicate() broadcasts).
  std::vector<Tensor*> AllParameters();
  // Whether this subtree holds a cuDNN RNN (its flattened weights are not
  // modelled under DataParallel's replicate()).
  bool ContainsCudnnRnn() const;
  std::int64_t NumParameters() const;
  std::int64_t NumParameterTensors() const;
  std::int64_t NumTrainableParameters() const;
  // The element count of each trainable parameter, in Parameters() order
  // (known before Materialize).
  std::vector<std::int64_t> TrainableNumels() const;
  // Before Materialize: requires_grad of every parameter of this subtree
  // (false: frozen, as in fine-tuning), and the dtype of its parameters.
  void SetRequiresGrad(bool requires_grad);
  void SetParameterDType(DType dtype);
  // The parameter slot with this full name ("transformer.wte.weight") in
  // this subtree, or null; its tensor is defined after Materialize.
  Tensor* FindParameter(const std::string& full_name);
  // The direct child of this name ("h", "0"), or null.
  Module* FindChild(const std::string& name);
  // Every full parameter name of this subtree, in named_parameters() order.
  std::vector<std::string> ParameterNames() const;
  template <class M, class... Args>
  M& Add(const std::string& name, Args&&... args) {  // registers a child module
    auto m = std::make_unique<M>(Child(name), std::forward<Args>(args)...);
    M& ref = *m;
    children_.push_back(std::move(m));
    return ref;
  }

  // Registers a child at this module's own path (a layer without a name of
  // its own in a model file: its parameters are "<path>.weight").
  template <class M, class... Args>
  M& AddInline(Args&&... args) {
    auto m = std::make_unique<M>(path_, std::forward<Args>(args)...);
    M& ref = *m;
    children_.push_back(std::move(m));
    return ref;
  }

  // How a parameter is initialised in --exec cpu (meta mode skips it).
  struct Init {
    float uniform_bound = 0;  // U(-b, b) when > 0
    float fill = 0;           // else this constant
  };

 protected:
  Tensor& Param(const std::string& name, const Shape& shape, Init init);
  Tensor& Buffer(const std::string& name, const Shape& shape, DType dtype, float fill = 0);
  std::string Child(const std::string& name) const { return path_.empty() ? name : path_ + "." + name; }
  // Runs after this module's tensors are allocated (cuDNN RNN flattening).
  virtual void OnMaterialized(DeviceContext&) {}

 private:
  struct Slot {
    std::string name;  // full name, e.g. "encoder.rnn.weight_ih_l0"
    Shape shape;
    DType dtype = DType::kFloat32;
    bool parameter = true;
    bool requires_grad = true;
    Init init;
    Tensor tensor;
  };
  std::string path_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<Module>> children_;
};

// Common layers. Each Forward tags its allocations ACTIVATION with its path.
class Linear : public Module {
 public:
  Linear(std::string path, std::int64_t in, std::int64_t out, bool bias = true);
  Tensor Forward(const Tensor& x) const;
  Tensor& weight() { return weight_; }

 private:
  Tensor& weight_;
  Tensor* bias_;
};

// HF's Conv1D: weight (in, out), y = addmm(bias, x.view(-1, in), weight).
class Conv1D : public Module {
 public:
  Conv1D(std::string path, std::int64_t in, std::int64_t out);
  Tensor Forward(const Tensor& x) const;

 private:
  Tensor& weight_;
  Tensor& bias_;
};

class Conv2dLayer : public Module {
 public:
  Conv2dLayer(std::string path, std::int64_t in, std::int64_t out, int kernel, int stride = 1, int padding = 0,
              bool bias = true);
  Tensor Forward(const Tensor& x) const;

 private:
  Tensor& weight_;
  Tensor* bias_;
  int stride_, padding_;
};

class BatchNorm2dLayer : public Module {
 public:
  BatchNorm2dLayer(std::string path, std::int64_t channels);
  Tensor Forward(const Tensor& x);

 private:
  Tensor& weight_;
  Tensor& bias_;
  Tensor& running_mean_;
  Tensor& running_var_;
};

class LayerNormLayer : public Module {
 public:
  LayerNormLayer(std::string path, std::int64_t dim, float eps = 1e-5f);
  Tensor Forward(const Tensor& x) const;

 private:
  Tensor& weight_;
  Tensor& bias_;
  float eps_;
};

class EmbeddingLayer : public Module {
 public:
  EmbeddingLayer(std::string path, std::int64_t num, std::int64_t dim, std::int64_t padding_idx = -1);
  Tensor Forward(const Tensor& indices) const;
  Tensor& weight() { return weight_; }

 private:
  Tensor& weight_;
  std::int64_t padding_idx_;
};

class GRUCellLayer : public Module {
 public:
  GRUCellLayer(std::string path, std::int64_t input, std::int64_t hidden);
  Tensor Forward(const Tensor& x, const Tensor& h) const;

 private:
  Tensor& w_ih_;
  Tensor& w_hh_;
  Tensor& b_ih_;
  Tensor& b_hh_;
};

// nn.GRU / nn.LSTM on cuDNN: after .cuda() the parameters are flattened into
// one buffer (flatten_parameters) and become views of it.
class CudnnRnnLayer : public Module {
 public:
  CudnnRnnLayer(std::string path, bool lstm, std::int64_t input, std::int64_t hidden, std::int64_t layers,
                bool bidirectional);
  // input: (rows, input) packed or (T*B, input); returns output and h_n.
  ops::RnnResult Forward(const Tensor& packed, std::int64_t batch) const;

 protected:
  void OnMaterialized(DeviceContext& ctx) override;

 private:
  bool lstm_;
  std::int64_t hidden_, layers_;
  bool bidirectional_;
  std::vector<Tensor*> weights_;
  Tensor flat_;
};

}  // namespace memscope

#endif  // MEMSCOPE_TRAIN_MODULE_H_
