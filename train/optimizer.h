// torch.optim's SGD, Adam and AdamW (PyTorch 2.x), with their memory:
// state created lazily at the first step() (tagged OPTIMIZER_STATE with the
// parameter's name) and the temporaries of each implementation (TEMPORARY):
//
//  - foreach (the default on GPUs): list ops over all parameters at once.
//    Adam allocates exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs), one
//    parameter-sized list alive until the update (+1x params at the step's
//    peak); with weight_decay (Adam, not AdamW) also a copy of the grads.
//  - for-loop: one parameter at a time; Adam's denom of the previous
//    parameter lives until the next one's is computed.
//  - fused: one kernel; no parameter-sized temporaries, but `step` is a
//    float32 device scalar per parameter (one 512 B block each).
//
// zero_grad(set_to_none=True) (the default) frees the gradients;
// set_to_none=False zeroes them in place.
#ifndef MEMSCOPE_TRAIN_OPTIMIZER_H_
#define MEMSCOPE_TRAIN_OPTIMIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tensor/tensor.h"

namespace memscope {

enum class OptimizerKind { kSgd, kAdam, kAdamW };
enum class OptimizerImpl { kForeach, kForLoop, kFused };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdam;
  OptimizerImpl impl = OptimizerImpl::kForeach;
  float lr = 1e-3f;
  float momentum = 0;      // SGD
  float weight_decay = 0;  // AdamW's default 1e-2 is applied by ParseOptimizer
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

absl::StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name);  // sgd|adam|adamw
absl::StatusOr<OptimizerImpl> ParseOptimizerImpl(std::string_view name);  // foreach|for-loop|fused
std::string_view OptimizerName(OptimizerKind kind);

class Optimizer {
 public:
  Optimizer(std::vector<Tensor*> params, OptimizerOptions options);
  // optimizer.zero_grad(set_to_none)
  void ZeroGrad(bool set_to_none = true);
  // optimizer.step(): parameters without a gradient are skipped.
  void Step();
  const OptimizerOptions& options() const { return options_; }

  // The device tensors of optimizer.state_dict()["state"], in its order (per
  // parameter: fused Adam's `step`, exp_avg, exp_avg_sq; SGD's
  // momentum_buffer). Adam's `step` is a host scalar except when fused.
  std::vector<Tensor> StateTensors() const;
  // optimizer.load_state_dict(sd) of PyTorch 2.x (a shallow copy of the
  // dict): each of `loaded` (StateTensors() order; an undefined tensor is one
  // on the host, map_location='cpu') is cast by
  // `_process_value_according_to_param_policy`, value.to(dtype=param.dtype,
  // device=param.device): the same tensor when it is already on the
  // parameter's device, else a copy there (tagged OPTIMIZER_STATE). The old
  // state is freed once the whole new state exists (__setstate__).
  // `loaded` must match StateTensors() in count.
  void LoadStateTensors(const std::vector<Tensor>& loaded);

 private:
  struct State {
    Tensor step;  // device scalar (fused only); else a host counter
    double host_step = 0;
    Tensor exp_avg, exp_avg_sq, momentum_buffer;
    bool initialised = false;
  };
  void InitState(std::size_t i);
  void StepSgd(const std::vector<std::size_t>& active);
  void StepAdam(const std::vector<std::size_t>& active);

  std::vector<Tensor*> params_;
  OptimizerOptions options_;
  std::vector<State> state_;
};

// Optimizer.zero_grad over `params`, in their order.
void ZeroGrads(const std::vector<Tensor*>& params, bool set_to_none);

// torch.cuda.amp.GradScaler for fp16 training: scale() multiplies the loss
// by the scale (65536 at first), Unscale() divides the gradients in place
// and checks them for inf/NaN, Update() adjusts the scale. Its tensors are
// 0-d device tensors, created lazily like PyTorch's.
class GradScaler {
 public:
  Tensor Scale(const Tensor& loss);
  // unscale_ + step (skipped when a gradient is not finite) + update.
  void Step(Optimizer& optimizer, const std::vector<Tensor*>& params);
  float scale() const { return scale_value_; }

 private:
  Tensor scale_, growth_tracker_;
  float scale_value_ = 65536.f;
};

}  // namespace memscope

#endif  // MEMSCOPE_TRAIN_OPTIMIZER_H_
