#include "train/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "allocator/alloc_tag.h"
#include "tensor/ops.h"

namespace memscope {

absl::StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "adamw") return OptimizerKind::kAdamW;
  return absl::InvalidArgumentError(absl::StrCat("unknown optimizer '", std::string(name), "' (sgd, adam, adamw)"));
}

absl::StatusOr<OptimizerImpl> ParseOptimizerImpl(std::string_view name) {
  if (name == "foreach") return OptimizerImpl::kForeach;
  if (name == "for-loop") return OptimizerImpl::kForLoop;
  if (name == "fused") return OptimizerImpl::kFused;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer implementation '", std::string(name), "' (foreach, for-loop, fused)"));
}

std::string_view OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kAdamW: return "adamw";
  }
  return "?";
}

Optimizer::Optimizer(std::vector<Tensor*> params, OptimizerOptions options)
    : params_(std::move(params)), options_(options), state_(params_.size()) {}

void Optimizer::ZeroGrad(bool set_to_none) { ZeroGrads(params_, set_to_none); }

void ZeroGrads(const std::vector<Tensor*>& params, bool set_to_none) {
  for (Tensor* p : params) {
    if (!p->grad().defined()) continue;
    if (set_to_none) {
      p->set_grad(Tensor());
    } else {
      Tensor g = p->grad();
      ops::ZeroInPlace(g);
    }
  }
}

void Optimizer::InitState(std::size_t i) {
  State& s = state_[i];
  if (s.initialised) return;
  s.initialised = true;
  const Tensor& p = *params_[i];
  ScopedTag tag(Category::kOptimizerState, p.name());
  // _init_group: step, then exp_avg, then exp_avg_sq, one parameter at a time.
  if (options_.kind == OptimizerKind::kSgd) {
    return;  // momentum_buffer is cloned from the gradient at the first step
  }
  if (options_.impl == OptimizerImpl::kFused) s.step = Tensor::Zeros(p.ctx(), {}, DType::kFloat32);
  s.exp_avg = ops::ZerosLike(p);
  s.exp_avg_sq = ops::ZerosLike(p);
}

std::vector<Tensor> Optimizer::StateTensors() const {
  std::vector<Tensor> out;
  for (const State& s : state_) {
    for (const Tensor* t : {&s.step, &s.exp_avg, &s.exp_avg_sq, &s.momentum_buffer}) {
      if (t->defined()) out.push_back(*t);
    }
  }
  return out;
}

void Optimizer::LoadStateTensors(const std::vector<Tensor>& loaded) {
  std::vector<State> next = state_;
  std::size_t k = 0;
  for (std::size_t i = 0; i < next.size(); ++i) {
    const Tensor& p = *params_[i];
    ScopedTag tag(Category::kOptimizerState, p.name());
    for (Tensor* t : {&next[i].step, &next[i].exp_avg, &next[i].exp_avg_sq, &next[i].momentum_buffer}) {
      if (!t->defined()) continue;
      const Tensor& v = loaded.at(k++);
      // value.to(device=param.device): a no-op on the parameter's device, else a copy (the bytes are the
      // checkpoint's; in kMeta there are none).
      *t = v.defined() && &v.ctx() == &p.ctx() ? v : ops::EmptyLike(*t);
    }
  }
  state_ = std::move(next);  // the old state's tensors are freed here
}

void Optimizer::Step() {
  std::vector<std::size_t> active;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i]->grad().defined()) active.push_back(i);
  }
  if (active.empty()) return;
  NoGradGuard no_grad;
  for (std::size_t i : active) InitState(i);
  if (options_.kind == OptimizerKind::kSgd) {
    StepSgd(active);
  } else {
    StepAdam(active);
  }
}

void Optimizer::StepSgd(const std::vector<std::size_t>& active) {
  const OptimizerOptions& o = options_;
  ScopedTag tag(Category::kTemporary, "optimizer");
  // Weight decay makes new gradients (foreach: the whole list at once).
  std::vector<Tensor> grads;
  for (std::size_t i : active) {
    Tensor g = params_[i]->grad();
    if (o.weight_decay != 0 && o.impl != OptimizerImpl::kFused) {
      Tensor with_decay = ops::Clone(g);
      ops::AddInPlace(with_decay, *params_[i], o.weight_decay);
      g = with_decay;
    }
    grads.push_back(g);
  }
  for (std::size_t k = 0; k < active.size(); ++k) {
    State& s = state_[active[k]];
    Tensor& p = *params_[active[k]];
    Tensor update = grads[k];
    if (o.momentum != 0) {
      if (!s.momentum_buffer.defined()) {
        ScopedTag state_tag(Category::kOptimizerState, p.name());
        s.momentum_buffer = ops::Clone(grads[k]);  // torch.clone(grad).detach()
      } else {
        ops::MulInPlace(s.momentum_buffer, o.momentum);
        ops::AddInPlace(s.momentum_buffer, grads[k]);
      }
      update = s.momentum_buffer;
    }
    ops::AddInPlace(p, update, -o.lr);
  }
}

void Optimizer::StepAdam(const std::vector<std::size_t>& active) {
  const OptimizerOptions& o = options_;
  const bool adamw = o.kind == OptimizerKind::kAdamW;
  ScopedTag tag(Category::kTemporary, "optimizer");
  for (std::size_t i : active) state_[i].host_step += 1;
  auto step_size = [&](std::size_t i) { return o.lr / (1 - std::pow(o.beta1, state_[i].host_step)); };
  auto bias_correction2_sqrt = [&](std::size_t i) { return std::sqrt(1 - std::pow(o.beta2, state_[i].host_step)); };
  if (adamw) {
    for (std::size_t i : active) ops::MulInPlace(*params_[i], 1 - o.lr * o.weight_decay);
  }
  if (o.impl == OptimizerImpl::kFused) {
    // _fused_adam_: everything in one kernel, in place.
    for (std::size_t i : active) {
      State& s = state_[i];
      Tensor g = params_[i]->grad();
      if (!adamw && o.weight_decay != 0 && g.ctx().computes()) ops::AddInPlace(g, *params_[i], o.weight_decay);
      ops::LerpInPlace(s.exp_avg, g, 1 - o.beta1);
      ops::MulInPlace(s.exp_avg_sq, o.beta2);
      ops::AddcmulInPlace(s.exp_avg_sq, g, g, 1 - o.beta2);
      if (g.ctx().computes()) {
        Tensor denom = ops::Sqrt(s.exp_avg_sq);  // host math only: kCpu has no fused kernel
        ops::DivInPlace(denom, static_cast<float>(bias_correction2_sqrt(i)));
        ops::AddScalarInPlace(denom, o.eps);
        ops::AddcdivInPlace(*params_[i], s.exp_avg, denom, static_cast<float>(-step_size(i)));
      }
    }
    return;
  }
  if (o.impl == OptimizerImpl::kForeach) {
    std::vector<Tensor> grads;
    for (std::size_t i : active) grads.push_back(params_[i]->grad());
    if (!adamw && o.weight_decay != 0) {
      // device_grads = torch._foreach_add(device_grads, device_params, alpha=weight_decay)
      std::vector<Tensor> decayed;
      for (std::size_t k = 0; k < active.size(); ++k) {
        Tensor d = ops::Clone(grads[k]);
        ops::AddInPlace(d, *params_[active[k]], o.weight_decay);
        decayed.push_back(d);
      }
      grads = std::move(decayed);
    }
    for (std::size_t k = 0; k < active.size(); ++k) ops::LerpInPlace(state_[active[k]].exp_avg, grads[k], 1 - o.beta1);
    for (std::size_t k = 0; k < active.size(); ++k) ops::MulInPlace(state_[active[k]].exp_avg_sq, o.beta2);
    for (std::size_t k = 0; k < active.size(); ++k) {
      ops::AddcmulInPlace(state_[active[k]].exp_avg_sq, grads[k], grads[k], 1 - o.beta2);
    }
    grads.clear();  // del device_grads
    std::vector<Tensor> exp_avg_sq_sqrt;
    for (std::size_t i : active) exp_avg_sq_sqrt.push_back(ops::Sqrt(state_[i].exp_avg_sq));
    for (std::size_t k = 0; k < active.size(); ++k) {
      ops::DivInPlace(exp_avg_sq_sqrt[k], static_cast<float>(bias_correction2_sqrt(active[k])));
      ops::AddScalarInPlace(exp_avg_sq_sqrt[k], o.eps);
    }
    for (std::size_t k = 0; k < active.size(); ++k) {
      ops::AddcdivInPlace(*params_[active[k]], state_[active[k]].exp_avg, exp_avg_sq_sqrt[k],
                          static_cast<float>(-step_size(active[k])));
    }
    return;
  }
  // for-loop (_single_tensor_adam)
  Tensor denom;  // the previous parameter's, alive until reassigned
  for (std::size_t i : active) {
    State& s = state_[i];
    Tensor g = params_[i]->grad();
    if (!adamw && o.weight_decay != 0) {
      Tensor d = ops::Clone(g);  // grad = grad.add(param, alpha=weight_decay)
      ops::AddInPlace(d, *params_[i], o.weight_decay);
      g = d;
    }
    ops::LerpInPlace(s.exp_avg, g, 1 - o.beta1);
    ops::MulInPlace(s.exp_avg_sq, o.beta2);
    ops::AddcmulInPlace(s.exp_avg_sq, g, g, 1 - o.beta2);
    // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    Tensor root = ops::Sqrt(s.exp_avg_sq);
    Tensor next = ops::Clone(root);
    ops::DivInPlace(next, static_cast<float>(bias_correction2_sqrt(i)));
    root = Tensor();
    ops::AddScalarInPlace(next, o.eps);
    denom = next;
    ops::AddcdivInPlace(*params_[i], s.exp_avg, denom, static_cast<float>(-step_size(i)));
  }
}

Tensor GradScaler::Scale(const Tensor& loss) {
  if (!scale_.defined()) {
    ScopedTag tag(Category::kOther, "grad_scaler");
    scale_ = Tensor::Full(loss.ctx(), {}, scale_value_, DType::kFloat32);
    growth_tracker_ = Tensor::Zeros(loss.ctx(), {}, DType::kInt32);
  }
  ScopedTag tag(Category::kActivation, "loss");
  return ops::Mul(loss, scale_);
}

void GradScaler::Step(Optimizer& optimizer, const std::vector<Tensor*>& params) {
  NoGradGuard no_grad;
  ScopedTag tag(Category::kTemporary, "grad_scaler");
  Tensor found_inf, inv_scale;
  {
    // inv_scale = self._scale.double().reciprocal().float()
    Tensor as_double = Tensor::Empty(scale_.ctx(), {}, DType::kInt64);  // 8 bytes, like float64
    Tensor reciprocal = Tensor::Empty(scale_.ctx(), {}, DType::kInt64);
    as_double = Tensor();
    inv_scale = Tensor::Full(scale_.ctx(), {}, 1.0 / scale_value_, DType::kFloat32);
    found_inf = Tensor::Zeros(scale_.ctx(), {}, DType::kFloat32);
  }
  // _MultiDeviceReplicator copies both for the device.
  Tensor per_device_inv_scale = ops::Clone(inv_scale);
  Tensor per_device_found_inf = ops::Clone(found_inf);
  bool finite = true;
  for (Tensor* p : params) {
    Tensor g = p->grad();
    if (!g.defined()) continue;
    ops::MulInPlace(g, 1.f / scale_value_);
    if (g.ctx().computes()) {
      const float* d = g.data();
      for (std::int64_t i = 0; i < g.numel(); ++i) finite = finite && std::isfinite(d[i]);
    }
  }
  if (finite) optimizer.Step();
  // update(): _amp_update_scale_ in place; the found_inf copies go with it.
  if (!finite) scale_value_ *= 0.5f;
}

}  // namespace memscope
