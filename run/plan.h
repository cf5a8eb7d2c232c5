// memscope plan: the largest per-rank batch that trains without OOM on a GPU
// of a given size, for each combination of memory strategies, found by
// bisection over real simulated runs (--exec meta, in this process).
//
//   PlanOptions o;
//   o.model = "gpt2";                   // a zoo name, file:MODEL.json or hf:CONFIG.json
//   o.device_memory = 24ULL << 30;
//   absl::StatusOr<PlanResult> plan = MakePlan(o);
//
// A probe trains `steps` steps (default 2: the second step holds the
// optimizer state and, under DDP, the rebuilt buckets) at one batch size and
// fits when no allocation fails. Under DDP a rank's memory does not depend
// on the other ranks in meta mode, so DDP probes run one rank on a local
// communicator with the DDP options of the row.
#ifndef MEMSCOPE_RUN_PLAN_H_
#define MEMSCOPE_RUN_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "tensor/blas_workspace.h"
#include "train/trainer.h"

namespace memscope {

// The largest values of plan's options (docs/plan.md): a batch (per rank),
// a sequence length, the steps of each simulated run. --global-batch may be
// kMaxPlanBatch per rank.
inline constexpr std::int64_t kMaxPlanBatch = std::int64_t{1} << 24;
inline constexpr std::int64_t kMaxPlanSteps = 1000;

struct PlanOptions {
  std::string model = "gpt2";
  ModelOptions model_options;  // seq_len, attention; the batch is what plan searches
  std::uint64_t device_memory = 0;
  int world_size = 1;
  // The batch to reach: a global batch (world_size x micro-batch x
  // accumulation steps) when > 0, else a per-rank batch (0: the model's default).
  std::int64_t global_batch = 0;
  std::int64_t batch_size = 0;
  OptimizerOptions optimizer;
  BlasWorkspaceSizes blas_workspaces;  // cuBLAS/cuBLASLt (tensor/blas_workspace.h)
  AllocatorConfig config;              // the base settings; rows with expandable segments add expandable_segments:True
  std::int64_t steps = 2;
  std::int64_t max_batch = 1 << 16;  // the search stops here
  int threads = 2;                   // rows searched at once
  // ZeroRedundancyOptimizer around the optimizer in every DDP row (needs
  // world_size > 1): plan runs the rank with the most optimizer state.
  std::optional<ZeroOptions> zero;
};

struct PlanStrategy {
  std::optional<DType> amp;  // --amp fp16|bf16
  bool checkpoint = false;   // --checkpoint-activations
  std::string ddp = "off";   // off (one rank), copy or view (world size > 1)
  bool expandable = false;   // expandable_segments:True
};
std::string StrategyName(const PlanStrategy& s);  // "bf16 ckpt view exp", "defaults"

struct PlanRow {
  PlanStrategy strategy;
  std::int64_t max_batch = 0;  // the largest per-rank batch that fits (0: not even 1)
  bool capped = false;         // max_batch reached PlanOptions::max_batch
  // A run at max_batch (absent when it is 0):
  std::uint64_t peak_allocated = 0, peak_reserved = 0, lower_bound = 0;
  double fragmentation = 0;  // at the peak of allocated
  // The target batch on this GPU: micro-batches of `micro_batch` x
  // `grad_accum` per rank (the fewest accumulation steps that run; 0 when
  // none does), and the smallest GPU that runs the target batch in one step
  // (within 1/256, whole MiB; 0 when no size would).
  std::int64_t micro_batch = 0, grad_accum = 0;
  std::uint64_t min_device_memory = 0;
  std::int64_t probes = 0;  // simulated runs this row took
  // Set when the strategy fails for another reason than memory (e.g. DDP
  // with reentrant checkpointing whose input needs no gradient); the rest is 0.
  std::string error;
};

struct PlanResult {
  std::string model;
  std::int64_t parameters = 0, trainable_parameters = 0;
  std::int64_t target_batch = 0;  // per rank
  // The usual rule of thumb: parameters + gradients + optimizer state, in
  // bytes (float32 parameters, Adam 2 states, SGD with momentum 1).
  std::uint64_t model_state_bytes = 0;
  std::vector<PlanRow> rows;
  double seconds = 0;
  // With PlanOptions::zero: the rank planned (the first of those holding
  // the most trainable elements in ZeroRedundancyOptimizer's partition) and
  // its elements; -1 without.
  int zero_rank = -1;
  std::int64_t zero_rank_elements = 0;
};

// Runs the search for every strategy combination the model offers
// (checkpointing only when it has checkpoint units; DDP modes only with
// world_size > 1). Errors: invalid options or model, named.
absl::StatusOr<PlanResult> MakePlan(const PlanOptions& options);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_PLAN_H_
