// The step loop of trainer.h (zero_grad, forward, loss, backward, step; the
// optimizer, the GradScaler under fp16 AMP, autocast, the Python variables
// batch/output/loss), shared by Train and TrainDataParallel. What differs is
// a StepLoopParts: the recorders the phases are marked on (one rank's, or
// every device's), the phase hook, how forward runs (the model, under DDP or
// not, or DataParallel over replicas), a check of each step's batch and what
// follows a step (the trainer's checkpoint).
#ifndef MEMSCOPE_TRAIN_STEP_LOOP_H_
#define MEMSCOPE_TRAIN_STEP_LOOP_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "recording/recorder.h"
#include "tensor/tensor.h"
#include "train/models.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "train/zero.h"

namespace memscope {

using PhaseHook = std::function<void(Phase phase, std::int64_t step, bool end)>;

// Phase marks around a scope on every recorder (entries may be null), and the
// hook (may be null or empty) called as the phase begins.
class PhaseScope {
 public:
  PhaseScope(const std::vector<Recorder*>& recorders, Phase phase, std::int64_t step, const PhaseHook* hook = nullptr,
             std::int64_t micro_batch = kNoMicroBatch, std::string_view label = {});
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  const std::vector<Recorder*>& recorders_;
  Phase phase_;
  std::int64_t step_;
  std::int64_t micro_batch_;  // under gradient accumulation, else kNoMicroBatch
  std::string_view label_;    // of a kUser phase
};

// Thrown by the step loop before a phase begins when the training must
// stop: the user asked (TrainOptions::interrupt: `signal`), or a recorder's
// timeline can no longer be written (`error`: a full disk). Train and
// TrainDataParallel catch it into their result.
struct TrainStopped {
  int signal = 0;
  std::string error;
};

struct StepLoopParts {
  std::vector<Recorder*> recorders;  // the phases are marked on each (entries may be null)
  const PhaseHook* hook = nullptr;   // TrainOptions::phase_hook, or null
  // The forward phase's body: `output = model(batch)` for micro-batch `micro`
  // (the assignment releases the previous output).
  std::function<void(const Batch& batch, std::int64_t micro, Tensor& output)> forward;
  // Called with each step's batch after zero_grad (may throw TensorError); may be empty.
  std::function<void(const Batch& batch)> check_batch;
  // Called after the step phase, before the values are recorded; may be empty.
  std::function<void(std::int64_t step)> after_step;
};

// Holds what lives across steps, in the order Python creates it (the
// optimizer, the scaler, then batch, output and loss: alive until
// reassigned, and released in reverse when the loop is destroyed).
class StepLoop {
 public:
  // The optimizer over model.Parameters(), and the GradScaler under fp16 AMP.
  // With options.zero (and `comm`): ZeroRedundancyOptimizer, whose local
  // optimizer holds this rank's share of the parameters.
  StepLoop(const TrainOptions& options, Model& model, DeviceContext& ctx, reducer::Communicator* comm = nullptr);
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;

  // options.steps steps (options.grad_accum micro-batches each); fills
  // result's losses, step_grads/step_params (record_values) and steps_done.
  void Run(const StepLoopParts& parts, TrainResult& result);

  Optimizer& optimizer() { return optimizer_; }
  const ZeroRedundancy* zero() const { return zero_.get(); }

 private:
  // Throws TrainStopped when the loop must stop before the next phase.
  void StopIfAsked(const StepLoopParts& parts) const;
  void MicroBatch(const StepLoopParts& parts, std::int64_t step, std::int64_t micro, TrainResult& result);

  const TrainOptions& options_;
  Model& model_;
  DeviceContext& ctx_;
  const std::vector<Tensor*> params_;
  std::unique_ptr<ZeroRedundancy> zero_;  // before optimizer_: it decides the local optimizer's parameters
  Optimizer optimizer_;
  std::optional<GradScaler> scaler_;
  Batch batch_;
  Tensor output_, loss_;  // Python variables: alive until reassigned
};

}  // namespace memscope

#endif  // MEMSCOPE_TRAIN_STEP_LOOP_H_
