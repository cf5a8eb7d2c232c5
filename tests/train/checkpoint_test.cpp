// Checkpoints in the training loop (train/trainer.h, CheckpointOptions):
// what torch.load and load_state_dict allocate, by map_location.
//
// The model: mlp (256 -> 512 -> 512 -> 512 -> 10, 662,026 parameters) with
// Adam: the state dict is the parameters, exp_avg and exp_avg_sq, 3 x 4 B x
// 662,026 = 7,944,312 B. Every tensor is a multiple of 512 B but the 40 B
// output bias, whose block is 512 B: 472 B more per set of tensors.
#include <catch2/catch.hpp>

#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"
#include "tests/train/train_test_util.h"

namespace memscope {
namespace {

constexpr std::uint64_t kParams = 662'026;
constexpr std::uint64_t kState = 3 * 4 * kParams;
constexpr std::uint64_t kBiasPad = 512 - 40;

struct Run {
  TrainResult result;
  RankReport report;
};

// mlp, Adam, 2 steps, the checkpoint after step 0 loaded onto `load_ctx`
// (own: the rank's own device; null: the host).
Run Checkpointed(bool own, DeviceContext* other, OptimizerOptions optimizer = {}) {
  RankSessionOptions gpu;
  RankSession session(gpu);
  REQUIRE(session.Start().ok());
  TrainOptions o;
  o.model = "mlp";
  o.steps = 2;
  o.optimizer = optimizer;
  o.checkpoint.step = 0;
  o.checkpoint.save = true;
  o.checkpoint.load = true;
  o.checkpoint.load_ctx = own ? &session.context() : other;
  absl::StatusOr<TrainResult> r = Train(o, session.context(), &session.recorder());
  REQUIRE(r.ok());
  REQUIRE(r->error.empty());
  REQUIRE(session.Finish().ok());
  absl::StatusOr<RankReport> report = AnalyzeRank(session.timeline());
  REQUIRE(report.ok());
  return {*r, *report};
}

const PhaseRow& CheckpointRow(const RankReport& r) {
  for (const PhaseRow& row : r.phases) {
    if (row.phase == Phase::kUser && row.label == "checkpoint" && row.step == 0) return row;
  }
  FAIL("no checkpoint phase");
  return r.phases.front();
}

TEST_CASE("checkpoint loaded onto the rank's own GPU: the state dict at the peak, the optimizer keeps its state") {
  const Run run = Checkpointed(true, nullptr);
  CHECK(run.result.checkpoint.state_bytes == kState);
  CHECK(run.result.checkpoint.saved);
  CHECK(run.result.checkpoint.loaded);
  const PhaseRow& row = CheckpointRow(run.report);
  // torch.load allocates every tensor; the optimizer keeps the loaded exp_avg and exp_avg_sq (already on the
  // parameter's device) and frees its old ones; del sd frees the loaded parameters: back where step 0 ended.
  CHECK(row.peak_allocated_in_phase - row.allocated == kState + 3 * kBiasPad);
  CHECK(row.allocated == Row(run.report, Phase::kStep, 0).allocated);
}

TEST_CASE("checkpoint loaded to the host (map_location='cpu'): only the optimizer state is copied to the GPU") {
  const Run run = Checkpointed(false, nullptr);
  const PhaseRow& row = CheckpointRow(run.report);
  // Parameters: copy_ in place. exp_avg and exp_avg_sq: .to(param.device), beside the old state until replaced.
  CHECK(row.peak_allocated_in_phase - row.allocated == 2 * 4 * kParams + 2 * kBiasPad);
  CHECK(row.allocated == Row(run.report, Phase::kStep, 0).allocated);
}

TEST_CASE("checkpoint loaded onto another GPU: the whole state dict there, the optimizer state copied home") {
  SimDevice cuda0({.capacity = 80 * kGiB, .index = 0});
  CachingAllocator allocator0(cuda0);
  DeviceContext ctx0(allocator0, ExecMode::kMeta);
  const Run run = Checkpointed(false, &ctx0);
  CHECK(static_cast<std::uint64_t>(All(allocator0.GetStats().allocated_bytes).peak) == kState + 3 * kBiasPad);
  CHECK(All(allocator0.GetStats().allocated_bytes).current == 0);  // del sd
  const PhaseRow& row = CheckpointRow(run.report);
  CHECK(row.peak_allocated_in_phase - row.allocated == 2 * 4 * kParams + 2 * kBiasPad);
}

TEST_CASE("SGD without momentum: a state dict of parameters only, nothing on the GPU from a host load") {
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::kSgd;
  const Run run = Checkpointed(false, nullptr, sgd);
  CHECK(run.result.checkpoint.state_bytes == 4 * kParams);
  const PhaseRow& row = CheckpointRow(run.report);
  CHECK(row.peak_allocated_in_phase == row.allocated);
}

TEST_CASE("checkpoint options are checked") {
  RankSession session(RankSessionOptions{});
  TrainOptions o;
  o.model = "mlp";
  o.steps = 2;
  o.checkpoint.step = 2;
  absl::StatusOr<TrainResult> r = Train(o, session.context(), nullptr);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "--checkpoint-step 2: the run has 2 steps (0 to 1)");
}

}  // namespace
}  // namespace memscope
