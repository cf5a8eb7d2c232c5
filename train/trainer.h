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
// parameters + gradients + the output, as users print it.
#ifndef MEMSCOPE_TRAIN_TRAINER_H_
#define MEMSCOPE_TRAIN_TRAINER_H_

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

namespace memscope {

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
  // Called as each phase of a step begins (end = false), and once more when
  // the step ends (kStep, end = true): fault injection in tests (a rank
  // killing itself, a rank skipping a barrier).
  std::function<void(Phase phase, std::int64_t step, bool end)> phase_hook;
  bool record_values = false;  // fill TrainResult::step_params/step_grads (--exec cpu)
};

struct TrainResult {
  std::int64_t parameters = 0;
  std::int64_t steps_done = 0;
  std::vector<float> losses;  // per step (--exec cpu), the last micro-batch's
  bool oom = false;
  std::string error;        // the OOM (or other tensor error) message
  bool comm_error = false;  // a collective failed (CommError): `error` says which
  std::vector<reducer::BucketInfo> initial_buckets, rebuilt_buckets;  // DDP
  // After each step (--exec cpu): the parameters, concatenated; and the
  // gradients the optimizer stepped with.
  std::vector<std::vector<float>> step_params, step_grads;
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
