// The reference training loop: the zoo's parameter counts, the seq2seq phase
// table, optimizer state, zero_grad, and the memory strategies (AMP, checkpointing).
#include <catch2/catch.hpp>

#include <atomic>
#include <csignal>
#include <map>
#include <string>

#include "tests/train/train_test_util.h"

namespace memscope {
namespace {

constexpr std::uint64_t kMiB = kTestMiB;

std::int64_t ParamCount(const std::string& name) {
  absl::StatusOr<std::unique_ptr<Model>> m = CreateModel(name, {});
  REQUIRE(m.ok());
  return (*m)->NumParameters();
}

TEST_CASE("zoo parameter counts equal PyTorch, torchvision and Hugging Face") {
  CHECK(ParamCount("resnet50") == 25'557'032);
  CHECK(ParamCount("resnet101") == 44'549'160);
  CHECK(ParamCount("gpt2") == 124'439'808);
  CHECK(ParamCount("gpt2-medium") == 354'823'168);
  CHECK(ParamCount("gpt2-large") == 774'030'080);
  CHECK(ParamCount("gpt2-xl") == 1'557'611'200);
  CHECK(ParamCount("cifar-net") == 62'006);
  CHECK(ParamCount("seq2seq-attn") == 73'308'501);  // counted by PyTorch 1.13
  // "1140.xx" MiB of float32 parameters
  CHECK(ParamCount("bilstm") * 4 / static_cast<std::int64_t>(kMiB) == 1140);
  // mlp: 256 -> 512 -> 512 -> 512 -> 10
  CHECK(ParamCount("mlp") == (256 * 512 + 512) + 2 * (512 * 512 + 512) + (512 * 10 + 10));
}

TEST_CASE("seq2seq-attn with its arguments and Adam has the shape of the user's phase table") {
  TrainOptions o;
  o.model = "seq2seq-attn";
  o.steps = 2;
  o.zero_grad_set_to_none = false;  // the user's PyTorch zeroed gradients in place
  const Recorded run = RunTraining(o);
  const RankReport& r = run.report;
  const auto alloc = [&](Phase p, std::int64_t s) { return static_cast<std::uint64_t>(Row(r, p, s).allocated); };
  const auto peak_in = [&](Phase p, std::int64_t s) {
    return static_cast<std::uint64_t>(Row(r, p, s).peak_allocated_in_phase);
  };
  // Allocated rises through forward and loss.
  CHECK(alloc(Phase::kForward, 0) > alloc(Phase::kZeroGrad, 0));
  CHECK(alloc(Phase::kLoss, 0) > alloc(Phase::kForward, 0));
  // The loss keeps log_softmax of the (4000, 30000) logits: 480,000,000 B (the user's +458M);
  // the block may carry an unsplit remainder of at most 1 MiB, as in PyTorch.
  const std::uint64_t loss_added = alloc(Phase::kLoss, 0) - alloc(Phase::kForward, 0);
  CHECK(loss_added >= 480'000'000);
  CHECK(loss_added < 480'000'000 + kMiB);
  // The step's maximum is reached inside backward.
  CHECK(peak_in(Phase::kBackward, 0) > alloc(Phase::kLoss, 0));
  CHECK(peak_in(Phase::kBackward, 0) == static_cast<std::uint64_t>(Row(r, Phase::kStep, 0).max_allocated));
  // Backward ends at params + grads + the logits the Python variable `logit`
  // keeps (480,000,000 B). Blocks differ from tensor bytes by unsplit
  // remainders, so the sums agree to 1%.
  const double tensor_bytes = 73'308'501.0 * 4;
  CHECK(static_cast<double>(alloc(Phase::kBackward, 0)) == Approx(2 * tensor_bytes + 480e6).epsilon(0.01));
  // The first step adds Adam's exp_avg and exp_avg_sq: 2x parameter bytes (the user's 2 x 281M).
  CHECK(static_cast<double>(alloc(Phase::kStep, 0) - alloc(Phase::kBackward, 0)) ==
        Approx(2 * tensor_bytes).epsilon(0.01));
  CHECK(static_cast<double>(Row(r, Phase::kStep, 0).by_category[static_cast<int>(Category::kOptimizerState)]) ==
        Approx(2 * tensor_bytes).epsilon(0.01));
  // Step 1 reaches a higher maximum than step 0 (gradients and Adam state are already there).
  CHECK(Row(r, Phase::kStep, 1).max_allocated > Row(r, Phase::kStep, 0).max_allocated);
  // From step 1 on, backward ends where the step ends: the same blocks, reused.
  CHECK(alloc(Phase::kBackward, 1) == alloc(Phase::kStep, 1));
}

TEST_CASE("Adam state is 2x parameter bytes and momentum SGD 1x, created at the first step only") {
  for (const auto& [kind, factor] : std::vector<std::pair<OptimizerKind, std::uint64_t>>{
           {OptimizerKind::kAdam, 2}, {OptimizerKind::kAdamW, 2}, {OptimizerKind::kSgd, 1}}) {
    TrainOptions o;
    o.model = "mlp";
    o.steps = 3;
    o.optimizer.kind = kind;
    o.optimizer.momentum = kind == OptimizerKind::kSgd ? 0.9f : 0.f;
    const Recorded run = RunTraining(o);
    const RankReport& r = run.report;
    const std::uint64_t params = static_cast<std::uint64_t>(Row(r, Phase::kModel, kNoStep).allocated);
    INFO(OptimizerName(kind));
    // zero_grad(set_to_none) at step 1 frees the gradients; what stays after step 0 is params + state.
    CHECK(static_cast<std::uint64_t>(
              Row(r, Phase::kZeroGrad, 1).by_category[static_cast<int>(Category::kOptimizerState)]) == factor * params);
    // No state is created after step 0.
    CHECK(Row(r, Phase::kStep, 2).by_category[static_cast<int>(Category::kOptimizerState)] ==
          Row(r, Phase::kStep, 0).by_category[static_cast<int>(Category::kOptimizerState)]);
  }
}

TEST_CASE("zero_grad(set_to_none=True) frees the gradients and zeros keeps them") {
  for (const bool to_none : {true, false}) {
    TrainOptions o;
    o.model = "mlp";
    o.steps = 2;
    o.zero_grad_set_to_none = to_none;
    const RankReport r = RunTraining(o).report;
    const std::int64_t grads_after = Row(r, Phase::kZeroGrad, 1).by_category[static_cast<int>(Category::kGradient)];
    const auto params = static_cast<std::int64_t>(Row(r, Phase::kModel, kNoStep).allocated);
    CHECK(grads_after == (to_none ? 0 : params));
  }
}

TEST_CASE("in cpu execution mlp and cifar-net losses decrease over 20 steps") {
  for (const std::string model : {"mlp", "cifar-net"}) {
    TrainOptions o;
    o.model = model;
    o.steps = 20;
    o.optimizer.kind = OptimizerKind::kSgd;
    o.optimizer.lr = model == "mlp" ? 0.1f : 0.05f;
    o.optimizer.momentum = 0.9f;
    const Recorded run = RunTraining(o, /*cpu=*/true);
    REQUIRE(run.result.losses.size() == 20);
    INFO(model);
    // Randomly initialised 10-class models start near ln 10 = 2.3026.
    CHECK(run.result.losses.front() == Approx(2.3026).margin(0.05));
    const float first = (run.result.losses[0] + run.result.losses[1]) / 2;
    const float last = (run.result.losses[18] + run.result.losses[19]) / 2;
    CHECK(last < first - 0.05f);
  }
}

TEST_CASE("checkpointing activations lowers the forward peak") {
  TrainOptions o;
  o.model = "gpt2";
  o.steps = 1;
  o.model_options.batch_size = 2;
  const std::uint64_t plain = Row(RunTraining(o).report, Phase::kForward, 0).peak_allocated_in_phase;
  o.model_options.checkpoint_activations = true;
  const RankReport ckpt = RunTraining(o).report;
  CHECK(Row(ckpt, Phase::kForward, 0).peak_allocated_in_phase * 3 < plain);
  // The recompute happens in backward, whose peak stays above the forward's.
  CHECK(Row(ckpt, Phase::kBackward, 0).peak_allocated_in_phase > Row(ckpt, Phase::kForward, 0).peak_allocated_in_phase);
}

TEST_CASE("amp halves the activation bytes of autocast ops") {
  // mlp: every hidden activation comes from linear (autocast to fp16) and relu on its output.
  TrainOptions o;
  o.model = "mlp";
  o.steps = 1;
  o.model_options.batch_size = 4096;
  const auto activation = [](const RankReport& r) {
    return Row(r, Phase::kForward, 0).by_category[static_cast<int>(Category::kActivation)];
  };
  const std::int64_t fp32 = activation(RunTraining(o).report);
  o.amp = DType::kFloat16;
  const std::int64_t fp16 = activation(RunTraining(o).report);
  o.amp = DType::kBFloat16;
  const std::int64_t bf16 = activation(RunTraining(o).report);
  // Saved at the forward's end: 3 relu outputs of 4096x512 and the head's
  // 4096x10 output, half the bytes in fp16. On top, under autocast: the fp16
  // casts of the parameters (cached until autocast exits) and of the input
  // batch (saved by the first addmm), as in PyTorch.
  const std::int64_t params_fp16 = ((256 * 512 + 512) + 2 * (512 * 512 + 512) + (512 * 10 + 10)) * 2;
  const std::int64_t input_fp16 = 4096 * 256 * 2;
  CHECK(fp32 == Approx(3 * 4096 * 512 * 4 + 4096 * 10 * 4).margin(4096));
  CHECK(fp16 == bf16);
  CHECK(fp16 - params_fp16 - input_fp16 == Approx(fp32 / 2).margin(4096));
}

TEST_CASE("gradient accumulation keeps one set of gradients") {
  TrainOptions o;
  o.model = "mlp";
  o.steps = 1;
  o.grad_accum = 4;
  o.optimizer.kind = OptimizerKind::kSgd;
  const RankReport r = RunTraining(o).report;
  const auto params = static_cast<std::int64_t>(Row(r, Phase::kModel, kNoStep).allocated);
  // Four micro-batches, each a forward/loss/backward; the gradients stay one set.
  int backwards = 0;
  for (const PhaseRow& row : r.phases) {
    if (row.phase != Phase::kBackward) continue;
    ++backwards;
    CHECK(row.by_category[static_cast<int>(Category::kGradient)] == params);
  }
  CHECK(backwards == 4);
}

TEST_CASE("an OOM during training is reported, not thrown") {
  SimDevice gpu({.capacity = 64 * kMiB});
  CachingAllocator allocator(gpu);
  DeviceContext ctx(allocator, ExecMode::kMeta);
  TrainOptions o;
  o.model = "gpt2";
  o.steps = 1;
  absl::StatusOr<TrainResult> r = Train(o, ctx, nullptr);
  REQUIRE(r.ok());
  CHECK(r->oom);
  CHECK(r->steps_done == 0);
  CHECK(r->error.find("CUDA out of memory") != std::string::npos);
  CHECK(allocator.memory_allocated() == 0);  // every tensor of the unwound step was released
}

TEST_CASE("an interrupt stops the training before its next phase, and every tensor is released") {
  SimDevice gpu;
  CachingAllocator allocator(gpu);
  DeviceContext ctx(allocator, ExecMode::kMeta);
  std::atomic<int> interrupt{0};
  TrainOptions o;
  o.model = "mlp";
  o.steps = 1000;
  o.interrupt = &interrupt;
  // Ctrl-C as step 2's backward begins: the loop stops before step 2's step phase.
  o.phase_hook = [&interrupt](Phase phase, std::int64_t step, bool end) {
    if (!end && phase == Phase::kBackward && step == 2) interrupt.store(SIGINT);
  };
  absl::StatusOr<TrainResult> r = Train(o, ctx, nullptr);
  REQUIRE(r.ok());
  CHECK(r->interrupted == SIGINT);
  CHECK(r->steps_done == 2);
  CHECK(r->error.empty());
  CHECK_FALSE(r->oom);
  CHECK(allocator.memory_allocated() == 0);
}

TEST_CASE("invalid training options are errors that name the option") {
  SimDevice gpu;
  CachingAllocator allocator(gpu);
  DeviceContext ctx(allocator, ExecMode::kMeta);
  TrainOptions o;
  o.model = "nope";
  CHECK(Train(o, ctx, nullptr).status().message() == "unknown model 'nope' (memscope models lists them)");
  o.model = "seq2seq-attn";
  o.model_options.checkpoint_activations = true;
  CHECK(!Train(o, ctx, nullptr).ok());
  o = {};
  o.steps = 0;
  CHECK(Train(o, ctx, nullptr).status().message() == "--steps must be at least 1");
}

}  // namespace
}  // namespace memscope
