#include "train/trainer.h"

#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

// Phase marks around a scope, when recording.
class PhaseScope {
 public:
  PhaseScope(Recorder* recorder, Phase phase, std::int64_t step) : recorder_(recorder), phase_(phase), step_(step) {
    if (recorder_) recorder_->PhaseBegin(phase_, step_);
  }
  ~PhaseScope() {
    if (recorder_) recorder_->PhaseEnd(phase_, step_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Recorder* recorder_;
  Phase phase_;
  std::int64_t step_;
};

}  // namespace

absl::StatusOr<TrainResult> Train(const TrainOptions& options, DeviceContext& ctx, Recorder* recorder) {
  if (options.steps < 1) return absl::InvalidArgumentError("--steps must be at least 1");
  if (options.grad_accum < 1) return absl::InvalidArgumentError("--grad-accum must be at least 1");
  absl::StatusOr<std::unique_ptr<Model>> created = CreateModel(options.model, options.model_options);
  if (!created.ok()) return created.status();
  Model& model = **created;
  if (ctx.computes()) {
    bool cpu = false;
    for (const ModelInfo& m : ListModels()) cpu = cpu || (m.name == options.model && m.cpu);
    if (!cpu) return absl::InvalidArgumentError(absl::StrCat("--exec cpu runs mlp and cifar-net; ", options.model, " needs --exec meta"));
    if (options.amp) return absl::InvalidArgumentError("--amp needs --exec meta (the CPU kernels compute float32)");
  }
  TrainResult result;
  result.parameters = model.NumParameters();
  try {
    {
      PhaseScope phase(recorder, Phase::kModel, kNoStep);
      model.Materialize(ctx);
    }
    const std::vector<Tensor*> params = model.Parameters();
    Optimizer optimizer(params, options.optimizer);
    std::optional<GradScaler> scaler;
    if (options.amp == DType::kFloat16) scaler.emplace();
    Batch batch;
    Tensor output, loss;  // Python variables: alive until reassigned
    for (std::int64_t step = 0; step < options.steps; ++step) {
      {
        PhaseScope phase(recorder, Phase::kZeroGrad, step);
        batch = model.MakeBatch(ctx, step);
        optimizer.ZeroGrad(options.zero_grad_set_to_none);
      }
      for (std::int64_t micro = 0; micro < options.grad_accum; ++micro) {
        if (micro > 0) batch = model.MakeBatch(ctx, step * options.grad_accum + micro);
        std::optional<AutocastGuard> autocast;
        if (options.amp) autocast.emplace(*options.amp);
        {
          PhaseScope phase(recorder, Phase::kForward, step);
          ScopedTag tag(Category::kActivation, "");  // what a module does not tag itself
          output = model.Forward(batch);
        }
        {
          PhaseScope phase(recorder, Phase::kLoss, step);
          ScopedTag tag(Category::kActivation, "loss");
          loss = model.Loss(output, batch);
          if (options.grad_accum > 1) loss = ops::DivScalar(loss, static_cast<float>(options.grad_accum));
        }
        autocast.reset();  // leaving `with autocast():` frees the cast cache
        {
          PhaseScope phase(recorder, Phase::kBackward, step);
          if (scaler) {
            Backward({scaler->Scale(loss)});
          } else {
            Backward({loss});
          }
        }
        if (ctx.computes()) result.losses.push_back(loss.data()[0] * static_cast<float>(options.grad_accum));
      }
      {
        PhaseScope phase(recorder, Phase::kStep, step);
        if (scaler) {
          scaler->Step(optimizer, params);
        } else {
          optimizer.Step();
        }
      }
      result.steps_done = step + 1;
    }
  } catch (const TensorError& e) {
    result.oom = e.out_of_memory();
    result.error = e.what();
  }
  return result;
}

}  // namespace memscope
