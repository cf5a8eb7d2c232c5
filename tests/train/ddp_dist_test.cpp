// DDP over Gloo with real float math (--exec cpu), ranks as threads: every
// rank ends each step with bit-identical parameters, and the averaged
// gradient equals one process's gradient on the concatenated batch (seed
// 001's equivalence: N ranks at batch B see what one process sees at N x B).
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <string>
#include <thread>

#include <unistd.h>

#include "allocator/caching_allocator.h"
#include "reducer/communicator.h"
#include "train/trainer.h"

namespace memscope {
namespace {

constexpr std::uint64_t kGiB64 = 1ull << 30;

TrainOptions CpuOptions(const std::string& model, std::int64_t batch) {
  TrainOptions o;
  o.model = model;
  o.steps = 3;
  o.model_options.batch_size = batch;
  o.optimizer.kind = OptimizerKind::kSgd;
  o.optimizer.lr = 0.01f;
  o.optimizer.momentum = 0.9f;
  o.record_values = true;
  return o;
}

TrainResult TrainOn(const TrainOptions& o, reducer::Communicator* comm) {
  SimDevice gpu({.capacity = 4 * kGiB64, .index = comm ? comm->rank() : 0, .host_backed = true});
  CachingAllocator allocator(gpu);
  DeviceContext ctx(allocator, ExecMode::kCpu, &gpu);
  absl::StatusOr<TrainResult> r = Train(o, ctx, nullptr, comm);
  if (!r.ok()) {
    TrainResult failed;
    failed.error = std::string(r.status().message());
    return failed;
  }
  return *r;
}

// Each rank of `world_size` over Gloo, as a thread: train(o, comm).
template <class Result, class TrainFn>
std::vector<Result> RanksOverGloo(const TrainOptions& o, int world_size, TrainFn train) {
  static std::atomic<int> run{0};
  const std::filesystem::path store = std::filesystem::temp_directory_path() /
                                      ("memscope-ddp-test-" + std::to_string(::getpid()) + "-" + std::to_string(run++));
  std::vector<Result> results(static_cast<std::size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        reducer::GlooOptions g;
        g.rank = r;
        g.world_size = world_size;
        g.store_dir = store.string();
        g.timeout = std::chrono::milliseconds(30000);
        std::unique_ptr<reducer::Communicator> comm = reducer::CreateGlooCommunicator(g);
        results[static_cast<std::size_t>(r)] = train(o, comm.get());
      } catch (const std::exception& e) {
        results[static_cast<std::size_t>(r)].error = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::filesystem::remove_all(store);
  return results;
}

std::vector<TrainResult> TrainRanks(const TrainOptions& o, int world_size) {
  return RanksOverGloo<TrainResult>(o, world_size, TrainOn);
}

// A meta-mode run (shapes, no bytes) and its allocator's statistics at the end.
struct MetaRun {
  std::string error;
  DeviceStats stats;
};
MetaRun TrainMeta(const TrainOptions& o, reducer::Communicator* comm) {
  SimDevice gpu({.capacity = 4 * kGiB64, .index = comm ? comm->rank() : 0});
  CachingAllocator allocator(gpu);
  DeviceContext ctx(allocator, ExecMode::kMeta, &gpu);
  absl::StatusOr<TrainResult> r = Train(o, ctx, nullptr, comm);
  return {r.ok() ? r->error : std::string(r.status().message()), allocator.GetStats()};
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

void CheckEquivalence(const std::string& model, int world_size, bool view) {
  constexpr std::int64_t kBatch = 4;
  TrainOptions o = CpuOptions(model, kBatch);
  o.ddp = reducer::DdpOptions{};
  o.ddp->gradient_as_bucket_view = view;
  o.ddp->bucket_cap_mb = 0.05;  // several buckets (and a rebuild) even for these small models
  std::vector<TrainResult> ranks = TrainRanks(o, world_size);
  TrainResult single = TrainOn(CpuOptions(model, kBatch * world_size), nullptr);
  REQUIRE(single.error.empty());
  for (const TrainResult& r : ranks) {
    INFO(r.error);
    REQUIRE(r.error.empty());
    REQUIRE(r.step_params.size() == 3);
    REQUIRE(r.step_grads.size() == 3);
  }
  CHECK(ranks[0].rebuilt_buckets.size() > 1);
  for (std::size_t step = 0; step < 3; ++step) {
    // Bit-identical parameters on every rank after every step.
    for (const TrainResult& r : ranks) CHECK(r.step_params[step] == ranks[0].step_params[step]);
    // The averaged gradient is the whole batch's gradient.
    CHECK(MaxAbsDiff(ranks[0].step_grads[step], single.step_grads[step]) < 1e-5f);
  }
}

TEST_CASE("DDP world size 2 and 4, --exec cpu: mlp ranks stay identical and average to the single-process gradient") {
  CheckEquivalence("mlp", 2, false);
  CheckEquivalence("mlp", 4, false);
  CheckEquivalence("mlp", 2, true);
}

TEST_CASE(
    "DDP world size 2 and 4, --exec cpu: cifar-net ranks stay identical and average to the single-process gradient") {
  CheckEquivalence("cifar-net", 2, false);
  CheckEquivalence("cifar-net", 4, true);
}

// ZeroRedundancyOptimizer steps each parameter on its owner and broadcasts
// it: every rank ends each step with DDP's parameters, bit for bit.
TEST_CASE("ZeRO world size 3, --exec cpu: every rank's parameters after every step are plain DDP's") {
  TrainOptions o = CpuOptions("mlp", 4);
  o.optimizer.kind = OptimizerKind::kAdam;
  o.ddp = reducer::DdpOptions{};
  const std::vector<TrainResult> ddp = TrainRanks(o, 3);
  REQUIRE(ddp[0].error.empty());
  for (const bool bucket_view : {false, true}) {
    o.zero = ZeroOptions{bucket_view};
    for (const TrainResult& r : TrainRanks(o, 3)) {
      INFO(r.error);
      REQUIRE(r.error.empty());
      CHECK(r.step_params == ddp[0].step_params);
      CHECK(r.zero_partition.size() == 3);
      CHECK(r.zero_buckets.size() == (bucket_view ? 3u : 0u));
    }
  }
}

// A rank of `world_size` that trains alone on its shard of the batch (no
// DDP: the loop calls nothing but the final barrier).
class ShardOnly final : public reducer::Communicator {
 public:
  ShardOnly(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "shard-only"; }
  void AllreduceSum(void*, std::size_t, DType) override { FAIL("no collective expected"); }
  void Broadcast(void*, std::size_t, DType, int) override { FAIL("no collective expected"); }
  void Allgather(const void*, void*, std::size_t, DType) override { FAIL("no collective expected"); }
  void Barrier() override {}

 private:
  int rank_, world_size_;
};

TEST_CASE("DDP world size 2, --exec cpu: each rank's loss is its shard's, and their mean is the whole batch's") {
  constexpr std::int64_t kBatch = 4;
  TrainOptions o = CpuOptions("mlp", kBatch);
  o.ddp = reducer::DdpOptions{};
  std::vector<TrainResult> ranks = TrainRanks(o, 2);
  TrainResult single = TrainOn(CpuOptions("mlp", 2 * kBatch), nullptr);
  REQUIRE(single.error.empty());
  for (int r = 0; r < 2; ++r) {
    const TrainResult& rank = ranks[static_cast<std::size_t>(r)];
    INFO(rank.error);
    REQUIRE(rank.losses.size() == 3);
    // Step 0, before any update: the same parameters on its shard alone give the same loss, bit for bit.
    ShardOnly shard(r, 2);
    TrainResult alone = TrainOn(CpuOptions("mlp", kBatch), &shard);
    REQUIRE(alone.error.empty());
    CHECK(rank.losses[0] == alone.losses[0]);
  }
  // The shards are different samples: different losses.
  CHECK(ranks[0].losses[0] != ranks[1].losses[0]);
  // Every step: the mean of the ranks' mean-reduced losses is the loss of
  // one process on the whole batch (same parameters, DDP's equivalence).
  for (std::size_t step = 0; step < 3; ++step) {
    const double mean = (static_cast<double>(ranks[0].losses[step]) + ranks[1].losses[step]) / 2;
    CHECK(mean == Approx(single.losses[step]).epsilon(0).margin(1e-6));
  }
}

// Item 5 of issue 32: one rank of a job, alone (its collectives simulated,
// reducer::CreateSimulatedCommunicator), allocates exactly what it does among
// its peers over Gloo: DDP with ZeroRedundancyOptimizer (each rank a
// different share of the optimizer state) on 3 ranks, in meta mode.
TEST_CASE("a rank simulated alone allocates what it allocates among real peers: DDP + ZeRO on 3 ranks, meta") {
  TrainOptions o;
  o.model = "mlp";
  o.steps = 2;
  o.model_options.batch_size = 8;
  o.optimizer.kind = OptimizerKind::kAdam;
  o.ddp = reducer::DdpOptions{};
  for (const bool bucket_view : {false, true}) {
    o.zero = ZeroOptions{bucket_view};
    const std::vector<MetaRun> real = RanksOverGloo<MetaRun>(o, 3, TrainMeta);
    for (int r = 0; r < 3; ++r) {
      INFO("rank " << r << (bucket_view ? ", bucket view" : ""));
      const MetaRun& peer = real[static_cast<std::size_t>(r)];
      REQUIRE(peer.error.empty());
      std::unique_ptr<reducer::Communicator> alone = reducer::CreateSimulatedCommunicator(r, 3);
      const MetaRun sim = TrainMeta(o, alone.get());
      REQUIRE(sim.error.empty());
      CHECK(sim.stats.allocated_bytes[0].peak == peer.stats.allocated_bytes[0].peak);
      CHECK(sim.stats.allocated_bytes[0].allocated == peer.stats.allocated_bytes[0].allocated);
      CHECK(sim.stats.reserved_bytes[0].peak == peer.stats.reserved_bytes[0].peak);
      CHECK(sim.stats.allocation[0].allocated == peer.stats.allocation[0].allocated);
      CHECK(sim.stats.num_device_alloc == peer.stats.num_device_alloc);
    }
    // The ranks differ (their shares of Adam's state): the test tells them apart.
    CHECK(real[0].stats.allocated_bytes[0].allocated != real[2].stats.allocated_bytes[0].allocated);
  }
}

}  // namespace
}  // namespace memscope
