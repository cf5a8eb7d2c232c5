#include "train/trainer.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "tensor/ops.h"
#include "train/step_loop.h"

namespace memscope {
namespace {

// The state dict's tensors in torch.save's order: model.state_dict()
// (parameters and buffers), then the optimizer's state.
std::vector<Tensor> StateDictTensors(Model& model, const Optimizer& optimizer) {
  std::vector<Tensor> out;
  for (Tensor* p : model.Parameters()) out.push_back(*p);
  for (Tensor* b : model.Buffers()) out.push_back(*b);
  for (const Tensor& t : optimizer.StateTensors()) out.push_back(t);
  return out;
}

// The state dict's bytes once the optimizer has stepped, from the model
// alone (for a rank that fails before its checkpoint): parameters and
// buffers, then Adam's exp_avg and exp_avg_sq (+ fused Adam's float32 `step`)
// or SGD's momentum_buffer per parameter that requires grad.
std::uint64_t ExpectedStateBytes(Model& model, const OptimizerOptions& o) {
  std::uint64_t bytes = 0;
  for (Tensor* p : model.Parameters()) {
    bytes += p->nbytes();
    if (!p->requires_grad()) continue;
    if (o.kind == OptimizerKind::kSgd) {
      bytes += o.momentum != 0 ? p->nbytes() : 0;
    } else {
      bytes += 2 * p->nbytes() + (o.impl == OptimizerImpl::kFused ? 4 : 0);
    }
  }
  for (Tensor* b : model.Buffers()) bytes += b->nbytes();
  return bytes;
}

// The checkpoint phase of TrainOptions::checkpoint's step (trainer.h says what it does).
void RunCheckpoint(const CheckpointOptions& c, Model& model, Optimizer& optimizer, reducer::Communicator* comm,
                   CheckpointResult& result) {
  const std::vector<Tensor> saved = StateDictTensors(model, optimizer);
  result.state_bytes = 0;
  for (const Tensor& t : saved) result.state_bytes += t.nbytes();
  result.saved = c.save;  // torch.save copies each tensor to the host: no device memory
  if (!c.load) return;
  result.loading = true;
  if (comm != nullptr) comm->Barrier();
  std::vector<Tensor> loaded;  // sd = torch.load(f, map_location=...)
  // The model's tensors are OTHER ("checkpoint:NAME") until del sd; the
  // optimizer's become its state when already on the parameter's device.
  const std::size_t model_tensors = model.Parameters().size() + model.Buffers().size();
  for (std::size_t i = 0; i < saved.size(); ++i) {
    if (c.load_ctx == nullptr) {
      loaded.emplace_back();  // on the host
      continue;
    }
    const Tensor& t = saved[i];
    const std::string owner = absl::StrCat("checkpoint:", t.name());
    ScopedTag tag(i < model_tensors ? Category::kOther : Category::kOptimizerState, owner);
    loaded.push_back(Tensor::Empty(*c.load_ctx, t.sizes(), t.dtype()));
  }
  if (comm != nullptr) comm->Barrier();
  if (c.measure) c.measure();
  if (comm != nullptr) comm->Barrier();
  // model.load_state_dict: copy_ in place. optimizer.load_state_dict: the state's cast.
  optimizer.LoadStateTensors(
      std::vector<Tensor>(loaded.begin() + static_cast<std::ptrdiff_t>(model_tensors), loaded.end()));
  loaded.clear();  // del sd
  result.loading = false;
  result.loaded = true;
}

}  // namespace

absl::StatusOr<TrainResult> Train(const TrainOptions& options, DeviceContext& ctx, Recorder* recorder,
                                  reducer::Communicator* comm) {
  if (options.steps < 1) return absl::InvalidArgumentError("--steps must be at least 1");
  if (options.grad_accum < 1) return absl::InvalidArgumentError("--grad-accum must be at least 1");
  absl::StatusOr<std::unique_ptr<Model>> created = CreateModel(options.model, options.model_options);
  if (!created.ok()) return created.status();
  Model& model = **created;
  if (ctx.computes()) {
    bool cpu = false;
    for (const ModelInfo& m : ListModels()) cpu = cpu || (m.name == options.model && m.cpu);
    if (!cpu)
      return absl::InvalidArgumentError(
          absl::StrCat("--exec cpu runs mlp and cifar-net; ", options.model, " needs --exec meta"));
    if (options.amp) return absl::InvalidArgumentError("--amp needs --exec meta (the CPU kernels compute float32)");
  }
  if (options.ddp && comm == nullptr) return absl::InvalidArgumentError("DDP needs a communicator");
  if (options.zero && !options.ddp) return absl::InvalidArgumentError("--zero needs DDP (--ddp copy or view)");
  if (options.zero && options.checkpoint.step >= 0) {
    return absl::InvalidArgumentError(
        "checkpoints with --zero: ZeroRedundancyOptimizer.consolidate_state_dict() is not modelled");
  }
  if (options.record_values && !ctx.computes()) return absl::InvalidArgumentError("recording values needs --exec cpu");
  if (options.checkpoint.step >= options.steps) {
    return absl::InvalidArgumentError(absl::StrCat("--checkpoint-step ", options.checkpoint.step, ": the run has ",
                                                   options.steps, " steps (0 to ", options.steps - 1, ")"));
  }
  if (options.checkpoint.step >= 0 && ctx.computes()) {
    return absl::InvalidArgumentError("checkpoints need --exec meta (the state dict's values are not modelled)");
  }
  if (comm != nullptr) model.set_data_shard(comm->rank(), comm->world_size());
  const std::vector<Recorder*> recorders = {recorder};
  TrainResult result;
  result.parameters = model.NumParameters();
  try {
    {
      PhaseScope phase(recorders, Phase::kModel, kNoStep);
      model.Materialize(ctx);
    }
    const std::vector<Tensor*> params = model.Parameters();
    if (options.checkpoint.step >= 0) result.checkpoint.state_bytes = ExpectedStateBytes(model, options.optimizer);
    std::unique_ptr<reducer::DistributedDataParallel> ddp;
    std::optional<StepLoop> built;
    if (options.ddp) {
      PhaseScope phase(recorders, Phase::kDdp, kNoStep);
      ddp = std::make_unique<reducer::DistributedDataParallel>(params, model.Buffers(), *comm, *options.ddp);
      result.initial_buckets = ddp->initial_buckets();
      // optimizer = ZeroRedundancyOptimizer(model.parameters(), ...): right after DDP.
      if (options.zero) built.emplace(options, model, ctx, comm);
    }
    if (!built) built.emplace(options, model, ctx);
    StepLoop& loop = *built;
    if (const ZeroRedundancy* zero = loop.zero()) {
      result.zero_partition = zero->PartitionNames();
      result.zero_buckets = zero->BucketBytes();
    }
    StepLoopParts parts;
    parts.recorders = recorders;
    parts.hook = &options.phase_hook;
    parts.forward = [&](const Batch& batch, std::int64_t micro, Tensor& output) {
      ScopedTag tag(Category::kActivation, "");  // what a module does not tag itself
      if (!ddp) {
        output = model.Forward(batch);
        return;
      }
      ddp->set_require_backward_grad_sync(micro == options.grad_accum - 1);  // no_sync() before the last
      ddp->PreForward();
      if (!ddp->rebuilt_buckets().empty() && result.rebuilt_buckets.empty()) {
        result.rebuilt_buckets = ddp->rebuilt_buckets();
      }
      output = ddp->PostForward(model.Forward(batch));
    };
    parts.after_step = [&](std::int64_t step) {
      if (step != options.checkpoint.step) return;
      PhaseScope phase(recorders, Phase::kUser, step, nullptr, kNoMicroBatch, "checkpoint");
      RunCheckpoint(options.checkpoint, model, loop.optimizer(), comm, result.checkpoint);
    };
    loop.Run(parts, result);
    if (comm != nullptr) comm->Barrier();  // dist.barrier() before destroy_process_group()
  } catch (const TensorError& e) {
    result.oom = e.out_of_memory();
    result.error = e.what();
  } catch (const reducer::CommError& e) {
    result.comm_error = true;
    result.error = e.what();
  } catch (const TrainStopped& e) {
    result.interrupted = e.signal;
    result.error = e.error;
  }
  return result;
}

}  // namespace memscope
