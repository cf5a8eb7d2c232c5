// memscope plan (run/plan.h): each row's batch fits and the next one does
// not; a batch that fits with the defaults fits with checkpointing.
#include <catch2/catch.hpp>
#include <memory>

#include "reducer/communicator.h"
#include "run/plan.h"
#include "run/rank_session.h"

namespace memscope {
namespace {

// One simulated run of `micro` x `accum` under `s` on a GPU of `device` bytes: did it fit?
// Under a DDP mode the run is DDP's on `comm` (with o.zero, ZeroRedundancyOptimizer).
bool Fits(const PlanOptions& o, const PlanStrategy& s, std::int64_t micro, std::int64_t accum, std::uint64_t device,
          reducer::Communicator* comm = nullptr) {
  TrainOptions t;
  t.model = o.model;
  t.model_options = o.model_options;
  t.model_options.batch_size = micro;
  t.model_options.checkpoint_activations = s.checkpoint;
  t.amp = s.amp;
  t.steps = o.steps;
  t.grad_accum = accum;
  if (s.ddp != "off") {
    t.ddp = reducer::DdpOptions{};
    t.ddp->gradient_as_bucket_view = s.ddp == "view";
    t.zero = o.zero;
  }
  RankSessionOptions so;
  so.device_memory = device;
  so.config = *AllocatorConfig::Parse(s.expandable ? "expandable_segments:True" : "");
  RankSession session(so);
  absl::StatusOr<TrainResult> r = Train(t, session.context(), nullptr, comm);
  REQUIRE(r.ok());
  return !r->oom;
}

TEST_CASE("plan: every row's largest batch fits and one more does not, checkpointing never fits less") {
  PlanOptions o;
  o.model = "gpt2";
  o.model_options.seq_len = 64;
  o.device_memory = 3ULL << 30;
  o.batch_size = 16;
  absl::StatusOr<PlanResult> plan = MakePlan(o);
  REQUIRE(plan.ok());
  CHECK(plan->parameters == 124'439'808);
  // 124,439,808 float32 parameters, gradients and Adam's two states: 16 B each.
  CHECK(plan->model_state_bytes == 124'439'808ULL * 16);
  REQUIRE(plan->rows.size() == 12);  // {none, fp16, bf16} x {-, ckpt} x {-, expandable}
  for (const PlanRow& row : plan->rows) {
    INFO(StrategyName(row.strategy));
    REQUIRE(row.max_batch > 0);
    CHECK(Fits(o, row.strategy, row.max_batch, 1, o.device_memory));
    CHECK_FALSE(Fits(o, row.strategy, row.max_batch + 1, 1, o.device_memory));
    // The peaks of that run are under the GPU, and the lower bound is under both.
    CHECK(row.peak_reserved <= o.device_memory);
    CHECK(row.lower_bound <= row.peak_allocated);
    CHECK(row.peak_allocated <= row.peak_reserved);
    // The target batch on this GPU, and the smallest GPU for it in one step: it fits there, not 1/256 below.
    CHECK(row.micro_batch * row.grad_accum == 16);
    CHECK(Fits(o, row.strategy, row.micro_batch, row.grad_accum, o.device_memory));
    REQUIRE(row.min_device_memory > 0);
    CHECK(Fits(o, row.strategy, 16, 1, row.min_device_memory));
    CHECK_FALSE(Fits(o, row.strategy, 16, 1, row.min_device_memory - row.min_device_memory / 256 - (1 << 20)));
  }
  // Monotonicity: with the same AMP and allocator setting, checkpointing fits at least the defaults' batch.
  for (const PlanRow& a : plan->rows) {
    if (a.strategy.checkpoint) continue;
    for (const PlanRow& b : plan->rows) {
      if (!b.strategy.checkpoint || b.strategy.amp != a.strategy.amp || b.strategy.expandable != a.strategy.expandable)
        continue;
      INFO(StrategyName(a.strategy) << " vs " << StrategyName(b.strategy));
      CHECK(b.max_batch >= a.max_batch);
      CHECK(Fits(o, b.strategy, a.max_batch, 1, o.device_memory));
    }
  }
}

TEST_CASE("plan: world size > 1 adds the DDP modes, a global batch not divisible by it is an error") {
  PlanOptions o;
  o.model = "mlp";
  o.device_memory = 64ULL << 20;
  o.world_size = 2;
  o.global_batch = 128;
  absl::StatusOr<PlanResult> plan = MakePlan(o);
  REQUIRE(plan.ok());
  CHECK(plan->target_batch == 64);
  CHECK(plan->rows.size() == 24);
  CHECK(StrategyName(plan->rows[0].strategy) == "copy");
  CHECK(StrategyName(plan->rows[3].strategy) == "view exp");
  CHECK(StrategyName(plan->rows[23].strategy) == "bf16 ckpt view exp");
  // The MLP checkpoints each layer with reentrant checkpointing, whose input needs no gradient: under DDP
  // its parameters receive none and DDP stops, as PyTorch's does. Those rows say so; the others are planned.
  for (const PlanRow& row : plan->rows) {
    INFO(StrategyName(row.strategy));
    CHECK(row.error.empty() == !row.strategy.checkpoint);
    CHECK((row.max_batch > 0) == !row.strategy.checkpoint);
  }
  o.global_batch = 127;
  CHECK(MakePlan(o).status().message() == "--global-batch 127 is not a multiple of --world-size 2");
  o.global_batch = 128;
  o.model = "nope";
  CHECK(MakePlan(o).status().message() == "unknown model 'nope' (memscope models lists them)");
}

// --zero: mlp's trainable parameters by size are 262,144 (layers.1 and .2
// weights), 131,072 (layers.0.weight), 5,120 (head.weight), 512 x 3 (the
// hidden biases), 10 (head.bias). ZeroRedundancyOptimizer's greedy partition
// over 2 ranks: 262,144 to rank 0, 262,144 to rank 1, 131,072 to rank 0
// (both hold 262,144: the first), then the rest to rank 1 (268,810 in all):
// rank 0 steps the most, 393,216. Its rows are rank 0 alone with its
// collectives simulated: each row's batch fits such a run, one more does not.
TEST_CASE("plan --zero: the rank that steps the most parameters is planned, and each row's batch fits it") {
  PlanOptions o;
  o.model = "mlp";
  o.device_memory = 64ULL << 20;
  o.world_size = 2;
  o.global_batch = 128;
  o.zero = ZeroOptions{};
  absl::StatusOr<PlanResult> plan = MakePlan(o);
  REQUIRE(plan.ok());
  CHECK(plan->zero_rank == 0);
  CHECK(plan->zero_rank_elements == 393'216);
  std::unique_ptr<reducer::Communicator> rank0 = reducer::CreateSimulatedCommunicator(0, 2);
  const auto fits = [&](const PlanStrategy& s, std::int64_t batch) {
    return Fits(o, s, batch, 1, o.device_memory, rank0.get());
  };
  std::int64_t planned = 0;
  for (const PlanRow& row : plan->rows) {
    if (row.strategy.checkpoint) continue;  // mlp's reentrant checkpointing stops DDP (the test above)
    INFO(StrategyName(row.strategy));
    REQUIRE(row.max_batch > 0);
    CHECK(fits(row.strategy, row.max_batch));
    CHECK_FALSE(fits(row.strategy, row.max_batch + 1));
    ++planned;
  }
  CHECK(planned == 12);
  o.world_size = 1;
  o.global_batch = 0;
  CHECK(MakePlan(o).status().message() == "--zero needs --world-size > 1 (it shards over DDP's ranks)");
}

}  // namespace
}  // namespace memscope
