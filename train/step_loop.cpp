#include "train/step_loop.h"

#include "allocator/alloc_tag.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace memscope {

PhaseScope::PhaseScope(const std::vector<Recorder*>& recorders, Phase phase, std::int64_t step, const PhaseHook* hook,
                       std::int64_t micro_batch, std::string_view label)
    : recorders_(recorders), phase_(phase), step_(step), micro_batch_(micro_batch), label_(label) {
  for (Recorder* r : recorders_) {
    if (r != nullptr) r->PhaseBegin(phase_, step_, label_, micro_batch_);
  }
  if (hook != nullptr && *hook) (*hook)(phase_, step_, false);
}

PhaseScope::~PhaseScope() {
  for (Recorder* r : recorders_) {
    if (r != nullptr) r->PhaseEnd(phase_, step_, label_, micro_batch_);
  }
}

namespace {

std::vector<float> Concat(const std::vector<Tensor*>& tensors, bool grads) {
  std::vector<float> out;
  for (Tensor* p : tensors) {
    Tensor t = grads ? p->grad() : *p;
    if (!t.defined()) continue;
    Tensor c = ops::Contiguous(t.Detach());
    out.insert(out.end(), c.data(), c.data() + c.numel());
  }
  return out;
}

}  // namespace

StepLoop::StepLoop(const TrainOptions& options, Model& model, DeviceContext& ctx, reducer::Communicator* comm)
    : options_(options),
      model_(model),
      ctx_(ctx),
      params_(model.Parameters()),
      zero_(options.zero && comm != nullptr ? std::make_unique<ZeroRedundancy>(params_, *comm, *options.zero)
                                            : nullptr),
      optimizer_(zero_ ? zero_->owned() : params_, options.optimizer) {
  if (options_.amp == DType::kFloat16) scaler_.emplace();
}

void StepLoop::StopIfAsked(const StepLoopParts& parts) const {
  if (options_.interrupt != nullptr) {
    if (const int signal = options_.interrupt->load(std::memory_order_relaxed); signal != 0) {
      throw TrainStopped{signal, ""};
    }
  }
  for (const Recorder* r : parts.recorders) {
    if (r != nullptr && !r->write_error().ok()) throw TrainStopped{0, std::string(r->write_error().message())};
  }
}

void StepLoop::Run(const StepLoopParts& parts, TrainResult& result) {
  for (std::int64_t step = 0; step < options_.steps; ++step) {
    StopIfAsked(parts);
    {
      PhaseScope phase(parts.recorders, Phase::kZeroGrad, step, parts.hook);
      batch_ = model_.MakeBatch(ctx_, step);
      // ZeroRedundancyOptimizer.zero_grad() covers every parameter, not only the local optimizer's.
      if (zero_) {
        ZeroGrads(params_, options_.zero_grad_set_to_none);
      } else {
        optimizer_.ZeroGrad(options_.zero_grad_set_to_none);
      }
    }
    if (parts.check_batch) parts.check_batch(batch_);
    for (std::int64_t micro = 0; micro < options_.grad_accum; ++micro) MicroBatch(parts, step, micro, result);
    StopIfAsked(parts);
    {
      PhaseScope phase(parts.recorders, Phase::kStep, step, parts.hook);
      if (options_.record_values) result.step_grads.push_back(Concat(params_, true));
      if (scaler_) {
        scaler_->Step(optimizer_, params_);
      } else {
        optimizer_.Step();
      }
      if (zero_) zero_->SyncParams();  // ZeroRedundancyOptimizer.step(): the local step, then _sync_params
    }
    if (parts.after_step) parts.after_step(step);
    if (options_.record_values) result.step_params.push_back(Concat(params_, false));
    if (parts.hook != nullptr && *parts.hook) (*parts.hook)(Phase::kStep, step, true);
    result.steps_done = step + 1;
  }
}

void StepLoop::MicroBatch(const StepLoopParts& parts, std::int64_t step, std::int64_t micro, TrainResult& result) {
  if (micro > 0) batch_ = model_.MakeBatch(ctx_, step * options_.grad_accum + micro);
  // The phases label their micro-batch only when there are several ("backward:0.1").
  const std::int64_t micro_label = options_.grad_accum > 1 ? micro : kNoMicroBatch;
  std::optional<AutocastGuard> autocast;
  if (options_.amp) autocast.emplace(*options_.amp);
  StopIfAsked(parts);
  {
    PhaseScope phase(parts.recorders, Phase::kForward, step, parts.hook, micro_label);
    parts.forward(batch_, micro, output_);
  }
  StopIfAsked(parts);
  {
    PhaseScope phase(parts.recorders, Phase::kLoss, step, parts.hook, micro_label);
    ScopedTag tag(Category::kActivation, "loss");
    loss_ = model_.Loss(output_, batch_);
    if (options_.grad_accum > 1) loss_ = ops::DivScalar(loss_, static_cast<float>(options_.grad_accum));
  }
  autocast.reset();  // leaving `with autocast():` frees the cast cache
  StopIfAsked(parts);
  {
    PhaseScope phase(parts.recorders, Phase::kBackward, step, parts.hook, micro_label);
    if (scaler_) {
      Backward({scaler_->Scale(loss_)});
    } else {
      Backward({loss_});
    }
  }
  if (ctx_.computes()) result.losses.push_back(loss_.data()[0] * static_cast<float>(options_.grad_accum));
}

}  // namespace memscope
