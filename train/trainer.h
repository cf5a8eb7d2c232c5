// The reference training loop (single rank), phase by phase as people write
// it in Python:
//
//   model = Model().cuda()                       # phase "model"
//   model = DDP(model, ...)                      # phase "ddp" (with a communicator)
//   for step, batch in enumerate(data):          # the batch is made first
//       optimizer.zero_grad()                    # phase "zero_grad"
//       for micro in range(grad_accum):
//           with autocast(): out = model(batch)  # phase "forward"
//           loss = criterion(out) / grad_accum   # phase "loss"
//           scaler.scale(loss).backward()        # phase "backward"
//       scaler.step(optimizer)                   # phase "step"
//
// `out` and `loss` stay referenced until the next iteration reassigns them,
// as Python variables do: that is why allocated memory after backward is
// parameters + gradients + the output, as users print it. The steps are
// train/step_loop.h's StepLoop, which DataParallel (train/data_parallel.h) runs too.
#ifndef MEMSCOPE_TRAIN_TRAINER_H_
#define MEMSCOPE_TRAIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recording/recorder.h"
#include "reducer/communicator.h"
#include "reducer/ddp.h"
#include "tensor/tensor.h"
#include "train/models.h"
#include "train/optimizer.h"
#include "train/zero.h"

namespace memscope {

// torch.save / torch.load of {"model": model.state_dict(), "optimizer":
// optimizer.state_dict()} at the end of a step (after optimizer.step()),
// in a phase "checkpoint" of that step:
//
//   if save and (rank == 0 or save_all): torch.save(sd, f)   # tensors copied to the host: no device memory
//   if load:
//       dist.barrier()                          # with a communicator: the file is complete
//       sd = torch.load(f, map_location=...)   # every tensor on load_ctx (null: the host)
//       dist.barrier(); measure(); dist.barrier()   # memscope's: every rank's copy exists (no data moves)
//       model.load_state_dict(sd["model"])      # param.copy_(v) in place: no new memory
//       optimizer.load_state_dict(sd["optimizer"])
//       del sd
struct CheckpointOptions {
  std::int64_t step = -1;  // -1: no checkpoint
  bool save = false;       // this rank calls torch.save
  bool load = false;
  // Where torch.load puts the tensors: a device context (the rank's own, or
  // another GPU's in the same process), or null for map_location='cpu'.
  DeviceContext* load_ctx = nullptr;
  // Called once every rank's torch.load is done, before any load_state_dict
  // (between two barriers with a communicator): what the GPUs hold then.
  std::function<void()> measure;
};

struct TrainOptions {
  std::string model = "gpt2";
  ModelOptions model_options;
  std::int64_t steps = 3;
  OptimizerOptions optimizer;
  bool zero_grad_set_to_none = true;  // --zero-grad none|zeros
  std::optional<DType> amp;           // --amp fp16|bf16
  std::int64_t grad_accum = 1;
  // DDP (needs a communicator): micro-batches before the last run under
  // no_sync(); each rank trains on its shard of the global batch.
  std::optional<reducer::DdpOptions> ddp;
  // ZeroRedundancyOptimizer around the optimizer (train/zero.h; needs ddp).
  std::optional<ZeroOptions> zero;
  // Called as each phase of a step begins (end = false), and once more when
  // the step ends (kStep, end = true): fault injection in tests (a rank
  // killing itself, a rank skipping a barrier).
  std::function<void(Phase phase, std::int64_t step, bool end)> phase_hook;
  bool record_values = false;  // fill TrainResult::step_params/step_grads (--exec cpu)
  CheckpointOptions checkpoint;
  // Non-zero asks the loop to stop before its next phase: the number of the
  // signal that asked (memscope run's Ctrl-C or SIGTERM, run/interrupt.h).
  // TrainResult::interrupted says it stopped so.
  const std::atomic<int>* interrupt = nullptr;
};

// What a checkpoint cost: the state dict's tensor bytes (parameters, buffers
// and the optimizer's device state: what torch.save writes, pickling aside).
struct CheckpointResult {
  std::uint64_t state_bytes = 0;
  bool saved = false;
  bool loaded = false;
  bool loading = false;  // the run ended (an OOM) inside torch.load or load_state_dict
};

struct TrainResult {
  std::int64_t parameters = 0;
  std::int64_t steps_done = 0;
  std::vector<float> losses;  // per step (--exec cpu), the last micro-batch's
  bool oom = false;
  std::string error;        // the OOM (or other tensor error) message
  bool comm_error = false;  // a collective failed (CommError): `error` says which
  // The signal that stopped the loop before its end (TrainOptions::interrupt), else 0.
  int interrupted = 0;
  std::vector<reducer::BucketInfo> initial_buckets, rebuilt_buckets;  // DDP
  // ZeroRedundancyOptimizer: every rank's parameters by name; the flat
  // buckets' bytes per rank (parameters_as_bucket_view).
  std::vector<std::vector<std::string>> zero_partition;
  std::vector<std::uint64_t> zero_buckets;
  // After each step (--exec cpu): the parameters, concatenated; and the
  // gradients the optimizer stepped with.
  std::vector<std::vector<float>> step_params, step_grads;
  CheckpointResult checkpoint;
};

// Runs the loop on `ctx`, marking phases on `recorder` (may be null).
// Invalid options are an error; an OOM or tensor error during training ends
// the run and is reported in the result.
// With `comm`, the model is wrapped in DDP when options.ddp is set (else the
// ranks train independently on their shards).
absl::StatusOr<TrainResult> Train(const TrainOptions& options, DeviceContext& ctx, Recorder* recorder,
                                  reducer::Communicator* comm = nullptr);

}  // namespace memscope

#endif  // MEMSCOPE_TRAIN_TRAINER_H_
