// DDP in the training loop on one rank (LocalCommunicator): the BiLSTM's
// doubling, copy vs bucket-view steady state, the rebuild, no_sync,
// find_unused_parameters and the compression hook's temporaries.
#include <catch2/catch.hpp>

#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "tests/train/train_test_util.h"

namespace memscope {
namespace {

constexpr std::uint64_t kMiB = kTestMiB;

// The caching allocator rounds every request up to a multiple of 512 bytes.
std::uint64_t RoundSize(std::uint64_t bytes) { return bytes < 512 ? 512 : (bytes + 511) / 512 * 512; }

// The most bytes of `category` alive at once, and the most allocated bytes
// overall, inside the first (phase, step) slice (or the whole run).
struct Maxima {
  std::int64_t category = 0;
  std::int64_t allocated = 0;
};
Maxima MaxIn(const Timeline& t, Category category, std::optional<std::pair<Phase, std::int64_t>> slice = {}) {
  std::map<std::uint64_t, std::pair<Category, std::int64_t>> live;
  std::int64_t cat = 0, total = 0;
  bool inside = !slice, done = false;
  Maxima m;
  for (const Event& e : t.events) {
    if (slice && e.phase == slice->first && e.step() == slice->second) {
      if (e.type == EventType::kPhaseBegin && !done) inside = true;
      if (e.type == EventType::kPhaseEnd && inside) {
        inside = false;
        done = true;
      }
    }
    if (e.type == EventType::kAlloc) {
      live[e.addr] = {e.category, static_cast<std::int64_t>(e.size)};
      total += static_cast<std::int64_t>(e.size);
      if (e.category == category) cat += static_cast<std::int64_t>(e.size);
    } else if (e.type == EventType::kFreeRequested || e.type == EventType::kFreeCompleted) {
      auto it = live.find(e.addr);
      if (it == live.end()) continue;
      total -= it->second.second;
      if (it->second.first == category) cat -= it->second.second;
      live.erase(it);
    }
    if (inside) {
      m.category = std::max(m.category, cat);
      m.allocated = std::max(m.allocated, total);
    }
  }
  return m;
}

// One rank that counts its allreduces.
class CountingCommunicator final : public reducer::Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "counting"; }
  void AllreduceSum(void*, std::size_t, DType) override { ++allreduces; }
  void Broadcast(void*, std::size_t, DType, int) override {}
  void Allgather(const void* in, void* out, std::size_t count, DType dtype) override {
    if (in != nullptr && out != nullptr && in != out) std::memcpy(out, in, count * ElementSize(dtype));
  }
  void Barrier() override {}
  int allreduces = 0;
};

// A run under DDP on one rank (a local communicator unless `comm` is given).
Recorded RunDdp(const TrainOptions& options, bool cpu = false, reducer::Communicator* comm = nullptr) {
  std::unique_ptr<reducer::Communicator> local = reducer::CreateLocalCommunicator();
  Recorded out = RunTraining(options, cpu, comm != nullptr ? comm : local.get());
  INFO(out.result.error);
  REQUIRE(out.result.error.empty());
  return out;
}

std::int64_t Cat(const PhaseRow& row, Category c) { return row.by_category[static_cast<int>(c)]; }

// Requested bytes (tensor bytes, before the allocator's rounding) alive at
// the end of (phase, step): total and per category.
struct Live {
  std::int64_t total = 0;
  std::array<std::int64_t, kNumCategories> by_category{};
};
Live LiveAtEnd(const Timeline& t, Phase phase, std::int64_t step) {
  std::map<std::uint64_t, std::pair<Category, std::int64_t>> live;
  Live out;
  for (const Event& e : t.events) {
    if (e.type == EventType::kAlloc) {
      live[e.addr] = {e.category, static_cast<std::int64_t>(e.requested_size)};
    } else if (e.type == EventType::kFreeRequested || e.type == EventType::kFreeCompleted) {
      live.erase(e.addr);
    } else if (e.type == EventType::kPhaseEnd && e.phase == phase && e.step() == step) {
      for (const auto& [addr, v] : live) {
        out.total += v.second;
        out.by_category[static_cast<int>(v.first)] += v.second;
      }
      return out;
    }
  }
  FAIL("no such phase end");
  return out;
}

std::uint64_t BucketBytes(const std::vector<reducer::BucketInfo>& buckets) {
  std::uint64_t total = 0;
  for (const auto& b : buckets) total += b.bytes;
  return total;
}

TrainOptions Options(const std::string& model, bool view) {
  TrainOptions o;
  o.model = model;
  o.steps = 2;
  o.ddp = reducer::DdpOptions{};
  o.ddp->gradient_as_bucket_view = view;
  return o;
}

TEST_CASE("wrapping the 1140 MiB bilstm in DDP allocates one bucket copy: 2281 MiB, in both modes") {
  for (bool view : {false, true}) {
    Recorded r = RunDdp(Options("bilstm", view));
    const PhaseRow& model = Row(r.report, Phase::kModel, kNoStep);
    const PhaseRow& ddp = Row(r.report, Phase::kDdp, kNoStep);
    // The user's "sum([p.numel()*4 for p in model.parameters()])/1024/1024":
    // the one bucket holds exactly those bytes.
    REQUIRE(r.result.initial_buckets.size() == 1);
    CHECK(r.result.initial_buckets[0].bytes / kMiB == 1140);
    CHECK(ddp.allocated / kMiB == 2281);
    // The difference is exactly the bucket (one, the default first-iteration
    // bucket), rounded to the allocator's 512 bytes; the broadcast
    // temporaries are gone.
    CHECK(ddp.allocated - model.allocated == RoundSize(r.result.initial_buckets[0].bytes));
    CHECK(Cat(ddp, Category::kDdpBucket) == static_cast<std::int64_t>(RoundSize(r.result.initial_buckets[0].bytes)));
    CHECK(Cat(ddp, Category::kCommTemp) == 0);
    // ...but they were there while broadcasting (250 MiB groups, two in flight).
    CHECK(MaxIn(r.timeline, Category::kCommTemp, std::pair{Phase::kDdp, kNoStep}).category > 250 * 1000 * 1000);
  }
}

TEST_CASE("after the first step, bucket view's steady state is lower than copy's by the gradient bytes") {
  Recorded copy = RunDdp(Options("bilstm", false));
  Recorded view = RunDdp(Options("bilstm", true));
  const auto params = static_cast<std::int64_t>(BucketBytes(copy.result.initial_buckets));
  for (std::int64_t step : {0, 1}) {
    // In tensor bytes: copy mode holds one gradient per parameter, bucket
    // view none of its own (every .grad is a view of its bucket slot).
    const Live c = LiveAtEnd(copy.timeline, Phase::kStep, step);
    const Live v = LiveAtEnd(view.timeline, Phase::kStep, step);
    CHECK(c.by_category[static_cast<int>(Category::kGradient)] == params);
    CHECK(v.by_category[static_cast<int>(Category::kGradient)] == 0);
    CHECK(c.total - v.total == params);
    // In allocated blocks, within the unsplit remainders (< 1 MiB) blocks carry.
    const PhaseRow& cr = Row(copy.report, Phase::kStep, step);
    const PhaseRow& vr = Row(view.report, Phase::kStep, step);
    CHECK(std::abs(static_cast<std::int64_t>(cr.allocated - vr.allocated) - params) < static_cast<std::int64_t>(kMiB));
  }
}

TEST_CASE("the buckets are rebuilt once, in gradient-ready order, at the second forward") {
  TrainOptions o = Options("gpt2", false);
  o.steps = 3;
  Recorded r = RunDdp(o);
  REQUIRE(r.result.initial_buckets.size() == 1);  // [sys.maxsize]: everything in one bucket
  REQUIRE(r.result.rebuilt_buckets.size() > 1);
  // The first bucket closed at 1 MiB, the others at 25 MiB (a bucket may pass
  // its limit by one tensor); the first ready gradients are the last layer's.
  CHECK(r.result.rebuilt_buckets[0].bytes >= kMiB);
  CHECK(BucketBytes(r.result.rebuilt_buckets) == BucketBytes(r.result.initial_buckets));
  CHECK(r.result.rebuilt_buckets[0].params.front() == "transformer.ln_f.weight");
  // Copy mode: old bucket freed before the new ones: the forward of step 1
  // holds the same bucket bytes as step 0 (up to rounding of the new blocks).
  const PhaseRow& z1 = Row(r.report, Phase::kZeroGrad, 1);
  const PhaseRow& z2 = Row(r.report, Phase::kZeroGrad, 2);
  CHECK(Cat(z1, Category::kDdpBucket) == static_cast<std::int64_t>(RoundSize(r.result.initial_buckets[0].bytes)));
  std::int64_t rebuilt = 0;
  for (const auto& b : r.result.rebuilt_buckets) rebuilt += static_cast<std::int64_t>(RoundSize(b.bytes));
  CHECK(Cat(z2, Category::kDdpBucket) == rebuilt);
}

TEST_CASE("static_graph: the rebuild uses the second backward's ready order, so it comes before step 2") {
  TrainOptions o = Options("gpt2", false);
  o.steps = 3;
  o.ddp->static_graph = true;
  Recorded r = RunDdp(o);
  REQUIRE(r.result.initial_buckets.size() == 1);
  REQUIRE(r.result.rebuilt_buckets.size() > 1);
  const auto first = static_cast<std::int64_t>(RoundSize(r.result.initial_buckets[0].bytes));
  CHECK(Cat(Row(r.report, Phase::kZeroGrad, 1), Category::kDdpBucket) == first);
  // Bucket allocations per forward: none in step 1's, the rebuilt ones in step 2's.
  auto buckets_allocated_in = [&](std::int64_t step) {
    int n = 0;
    bool inside = false;
    for (const Event& e : r.timeline.events) {
      if ((e.type == EventType::kPhaseBegin || e.type == EventType::kPhaseEnd) && e.phase == Phase::kForward &&
          e.step() == step) {
        inside = e.type == EventType::kPhaseBegin;
      }
      if (inside && e.type == EventType::kAlloc && e.category == Category::kDdpBucket) ++n;
    }
    return n;
  };
  CHECK(buckets_allocated_in(1) == 0);
  CHECK(buckets_allocated_in(2) == static_cast<int>(r.result.rebuilt_buckets.size()));
}

TEST_CASE("bucket view with zero_grad(set_to_none=False): the rebuild holds old and new buckets at once") {
  TrainOptions o = Options("gpt2", true);
  o.zero_grad_set_to_none = false;
  Recorded keep = RunDdp(o);
  o.zero_grad_set_to_none = true;
  Recorded none = RunDdp(o);
  // The gradients are views of the old bucket and keep it alive while they
  // are copied into the new one: old and new buckets at once. With
  // set_to_none the old bucket goes first.
  std::int64_t rebuilt = 0;
  for (const auto& b : keep.result.rebuilt_buckets) rebuilt += static_cast<std::int64_t>(RoundSize(b.bytes));
  const std::int64_t old = static_cast<std::int64_t>(RoundSize(BucketBytes(keep.result.initial_buckets)));
  CHECK(MaxIn(keep.timeline, Category::kDdpBucket, std::pair{Phase::kForward, 1}).category == old + rebuilt);
  CHECK(MaxIn(none.timeline, Category::kDdpBucket, std::pair{Phase::kForward, 1}).category == rebuilt);
}

TEST_CASE("no_sync: gradient accumulation reduces once, and keeps one set of gradients") {
  TrainOptions o = Options("mlp", false);
  o.grad_accum = 4;
  CountingCommunicator counting;
  Recorded r = RunDdp(o, false, &counting);
  TrainOptions one = Options("mlp", false);
  Recorded single = RunDdp(one);
  CHECK(Cat(Row(r.report, Phase::kStep, 1), Category::kGradient) ==
        Cat(Row(single.report, Phase::kStep, 1), Category::kGradient));
  // One allreduce per bucket per optimizer step, none in the no_sync
  // micro-batches: step 0's single bucket, then the rebuilt buckets.
  REQUIRE(r.result.rebuilt_buckets.size() == 2);
  CHECK(counting.allreduces == 1 + 2);
}

TEST_CASE("find_unused_parameters: a used map, the output cloned, 1 MiB then 25 MiB buckets, no rebuild") {
  TrainOptions o = Options("gpt2", false);
  o.ddp->find_unused_parameters = true;
  Recorded r = RunDdp(o);
  CHECK(r.result.rebuilt_buckets.empty());
  REQUIRE(r.result.initial_buckets.size() > 2);
  // Bucket order is reversed: the last bucket holds the first parameters.
  CHECK(r.result.initial_buckets.back().params.front() == "transformer.wte.weight");
  const PhaseRow& ddp = Row(r.report, Phase::kDdp, kNoStep);
  std::int64_t buckets = 0;
  for (const auto& b : r.result.initial_buckets) buckets += static_cast<std::int64_t>(RoundSize(b.bytes));
  // The used map: one int32 per parameter tensor (GPT-2 has 148).
  std::uint64_t tensors = 0;
  for (const auto& b : r.result.initial_buckets) tensors += b.params.size();
  CHECK(tensors == 148);
  CHECK(Cat(ddp, Category::kDdpBucket) == buckets + static_cast<std::int64_t>(RoundSize(4 * tensors)));
}

TEST_CASE("fp16 compression hook: a half-size COMM_TEMP copy of each bucket during backward") {
  TrainOptions o = Options("mlp", false);
  o.ddp->comm_hook = reducer::CommHook::kFp16;
  Recorded r = RunDdp(o);
  CHECK(Cat(Row(r.report, Phase::kBackward, 0), Category::kCommTemp) == 0);  // freed after decompression
  // Step 0: the one first-iteration bucket, compressed.
  CHECK(MaxIn(r.timeline, Category::kCommTemp, std::pair{Phase::kBackward, 0}).category ==
        static_cast<std::int64_t>(RoundSize(r.result.initial_buckets[0].bytes / 2)));
  // Step 1: one rebuilt bucket at a time, the largest one's copy at most.
  std::uint64_t largest = 0;
  for (const auto& b : r.result.rebuilt_buckets) largest = std::max(largest, RoundSize(b.bytes / 2));
  CHECK(MaxIn(r.timeline, Category::kCommTemp, std::pair{Phase::kBackward, 1}).category ==
        static_cast<std::int64_t>(largest));
}

TEST_CASE("broadcast_coalesced: 250 MiB groups per dtype, a lone tensor in place, two groups in flight") {
  SimDevice gpu({.capacity = 80 * kGiB, .index = 0, .host_backed = false});
  CachingAllocator allocator(gpu);
  DeviceContext ctx(allocator, ExecMode::kMeta, nullptr);
  std::unique_ptr<reducer::Communicator> comm = reducer::CreateLocalCommunicator();
  auto run = [&](std::initializer_list<std::int64_t> mib) {
    std::vector<Tensor> tensors;
    for (std::int64_t m : mib) tensors.push_back(Tensor::Empty(ctx, {m * 256 * 1024}));  // float32
    std::vector<Tensor*> ptrs;
    for (Tensor& t : tensors) ptrs.push_back(&t);
    allocator.ResetPeakStats();
    const std::int64_t before = All(allocator.GetStats().allocated_bytes).current;
    std::vector<std::uint64_t> groups = reducer::BroadcastCoalesced(ptrs, *comm, 0);
    CHECK(All(allocator.GetStats().allocated_bytes).current == before);
    return std::pair{groups, static_cast<std::uint64_t>(All(allocator.GetStats().allocated_bytes).peak - before)};
  };
  {
    // [200, 60] reaches 250 and closes; [250] alone is broadcast in place; [10, 5] is left over.
    auto [groups, peak] = run({200, 60, 250, 10, 5});
    CHECK(groups == std::vector<std::uint64_t>{260 * kMiB, 250 * kMiB, 15 * kMiB});
    CHECK(peak == 260 * kMiB);  // the 260 MiB flat copy is freed before the 15 MiB one is made
  }
  {
    // Three 260 MiB groups: never more than two flat copies at once.
    auto [groups, peak] = run({130, 130, 130, 130, 130, 130});
    CHECK(groups.size() == 3);
    CHECK(peak == 520 * kMiB);
  }
}

TEST_CASE("DDP on one rank in --exec cpu trains exactly like no DDP") {
  TrainOptions o = Options("mlp", false);
  o.steps = 3;
  o.record_values = true;
  Recorded ddp = RunDdp(o, true);
  o.ddp.reset();
  Recorded plain = RunDdp(o, true);
  REQUIRE(ddp.result.step_params.size() == 3);
  CHECK(ddp.result.step_params == plain.result.step_params);
  CHECK(ddp.result.losses == plain.result.losses);
}

}  // namespace
}  // namespace memscope
