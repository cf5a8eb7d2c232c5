// DataParallel (train/data_parallel.h): what each device holds, from the
// model's shapes; its numerics against one device; the OOM on device 0
// where DDP at the same global batch fits.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "allocator/sizes.h"
#include "reducer/communicator.h"
#include "run/rank_session.h"
#include "tests/train/train_test_util.h"
#include "train/data_parallel.h"
#include "train/trainer.h"

namespace memscope {
namespace {

struct DpRecorded {
  DataParallelResult result;
  std::vector<Timeline> timelines;  // one per device
};

DpRecorded RunDp(const TrainOptions& options, int devices, std::uint64_t memory = 80 * kGiB, bool cpu = false) {
  std::vector<std::unique_ptr<RankSession>> sessions;
  std::vector<DeviceContext*> contexts;
  std::vector<Recorder*> recorders;
  for (int d = 0; d < devices; ++d) {
    RankSessionOptions o;
    o.rank = d;
    o.world_size = devices;
    o.device_index = d;
    o.device_memory = memory;
    o.exec = cpu ? ExecMode::kCpu : ExecMode::kMeta;
    sessions.push_back(std::make_unique<RankSession>(o));
    REQUIRE(sessions.back()->Start().ok());
    contexts.push_back(&sessions.back()->context());
    recorders.push_back(&sessions.back()->recorder());
  }
  absl::StatusOr<DataParallelResult> r = TrainDataParallel(options, contexts, recorders);
  REQUIRE(r.ok());
  DpRecorded out;
  out.result = *r;
  for (std::unique_ptr<RankSession>& s : sessions) {
    REQUIRE(s->Finish().ok());
    out.timelines.push_back(std::move(s->timeline()));
  }
  return out;
}

// The requested sizes of the allocations of `category` whose owner is `owner`, in order.
std::vector<std::uint64_t> Allocs(const Timeline& t, Category category, const std::string& owner) {
  std::vector<std::uint64_t> out;
  for (const Event& e : t.events) {
    if (e.type == EventType::kAlloc && e.category == category && t.str(e.name) == owner) {
      out.push_back(e.requested_size);
    }
  }
  return out;
}

std::size_t CountCategory(const Timeline& t, Category category) {
  std::size_t n = 0;
  for (const Event& e : t.events) n += e.type == EventType::kAlloc && e.category == category ? 1 : 0;
  return n;
}

TrainOptions Mlp(std::int64_t steps, std::int64_t batch = 0) {
  TrainOptions o;
  o.model = "mlp";
  o.steps = steps;
  o.model_options.batch_size = batch;
  return o;
}

// mlp: 256 -> 512 x 3 -> 10, 662,026 float32 parameters.
constexpr std::uint64_t kMlpParamBytes = 662026 * 4;

}  // namespace

TEST_CASE("DataParallel: torch.chunk sizes of the scattered batch") {
  CHECK(ChunkSizes(64, 2) == std::vector<std::int64_t>{32, 32});
  CHECK(ChunkSizes(64, 3) == std::vector<std::int64_t>{22, 22, 20});
  CHECK(ChunkSizes(10, 4) == std::vector<std::int64_t>{3, 3, 3, 1});
  CHECK(ChunkSizes(4, 3) == std::vector<std::int64_t>{2, 2});  // torch.chunk(4 rows, 3): two chunks
  CHECK(ChunkSizes(1, 2) == std::vector<std::int64_t>{1});
}

TEST_CASE("DataParallel: device 0 holds the gathered output and the reduced gradients, the others no optimizer state") {
  const DpRecorded r = RunDp(Mlp(2), 2);
  REQUIRE(r.result.train.steps_done == 2);
  REQUIRE_FALSE(r.result.train.oom);
  CHECK(r.result.chunk_sizes == std::vector<std::int64_t>{32, 32});
  const Timeline& d0 = r.timelines[0];
  const Timeline& d1 = r.timelines[1];
  // Gather: the (64, 10) float32 logits, once per step, on device 0 only.
  CHECK(Allocs(d0, Category::kActivation, "DataParallel.gather") == std::vector<std::uint64_t>{2560, 2560});
  CHECK(Allocs(d1, Category::kActivation, "DataParallel.gather").empty());
  // ReduceAddCoalesced: one coalesced buffer (all 8 parameters are under
  // 10 MiB) of exactly the parameter bytes per step, on device 0 only.
  CHECK(Allocs(d0, Category::kGradient, "DataParallel.reduce_add") ==
        std::vector<std::uint64_t>{kMlpParamBytes, kMlpParamBytes});
  CHECK(Allocs(d1, Category::kGradient, "DataParallel.reduce_add").empty());
  // Each device flattens its gradients for the reduction.
  CHECK(Allocs(d0, Category::kCommTemp, "DataParallel.reduce_add") ==
        std::vector<std::uint64_t>{kMlpParamBytes, kMlpParamBytes});
  CHECK(Allocs(d1, Category::kCommTemp, "DataParallel.reduce_add") ==
        std::vector<std::uint64_t>{kMlpParamBytes, kMlpParamBytes});
  // Optimizer state (Adam) exists on device 0 only.
  CHECK(CountCategory(d0, Category::kOptimizerState) > 0);
  CHECK(CountCategory(d1, Category::kOptimizerState) == 0);
  // The replica on device 1: one broadcast buffer of the parameters per
  // step; device 0's replica is the module itself (no copy), and its
  // parameters are the module's 8 tensors, made once.
  CHECK(Allocs(d1, Category::kParameter, "DataParallel.replicate") ==
        std::vector<std::uint64_t>{kMlpParamBytes, kMlpParamBytes});
  CHECK(Allocs(d0, Category::kParameter, "DataParallel.replicate").empty());
  CHECK(CountCategory(d0, Category::kParameter) == 8);
  // Scatter: device 1's half of the (64, 256) input is copied there; device 0's is a view.
  CHECK(Allocs(d1, Category::kInput, "DataParallel.scatter") == std::vector<std::uint64_t>{32768, 32768});
  CHECK(Allocs(d0, Category::kInput, "DataParallel.scatter").empty());
  // Device 1 ends each step with nothing allocated: its replica, its
  // activations and its gradients are gone.
  absl::StatusOr<RankReport> rep1 = AnalyzeRank(d1);
  REQUIRE(rep1.ok());
  CHECK(Row(*rep1, Phase::kStep, 1).allocated == 0);
}

TEST_CASE("DataParallel: replicate() coalesces parameters into take_tensors groups of 10 MiB") {
  // mlp --width 2048: layers.0 (2,097,152 + 8,192 B), layers.1 and .2
  // (16,777,216 + 8,192 B), head (81,920 + 40 B). A group closes once it
  // reaches 10,485,760 B: {layers.0.weight, layers.0.bias, layers.1.weight},
  // {layers.1.bias, layers.2.weight}, and the rest stays open to the end.
  TrainOptions o = Mlp(1);
  o.model_options.width = 2048;
  const DpRecorded r = RunDp(o, 3);
  const std::vector<std::uint64_t> groups = {2097152 + 8192 + 16777216, 8192 + 16777216, 8192 + 81920 + 40};
  CHECK(Allocs(r.timelines[1], Category::kParameter, "DataParallel.replicate") == groups);
  CHECK(Allocs(r.timelines[2], Category::kParameter, "DataParallel.replicate") == groups);
  // flatten_dense_tensors of each group on device 0 first (a temporary).
  CHECK(Allocs(r.timelines[0], Category::kCommTemp, "DataParallel.replicate") == groups);
}

TEST_CASE("DataParallel: --exec cpu losses equal one device's on the same batch") {
  TrainOptions o = Mlp(3);
  const Recorded single = RunTraining(o, /*cpu=*/true);
  for (int devices : {2, 3}) {
    const DpRecorded r = RunDp(o, devices, 80 * kGiB, /*cpu=*/true);
    REQUIRE(r.result.train.losses.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(std::abs(r.result.train.losses[i] - single.result.losses[i]) < 1e-5f);
    }
  }
}

TEST_CASE("DataParallel: device 0 runs out of memory where DDP with the same global batch fits") {
  // GPT-2 (124M), global batch 8 of 1024 tokens, on 16 GiB GPUs.
  TrainOptions dp;
  dp.model = "gpt2";
  dp.steps = 2;
  dp.model_options.batch_size = 8;
  const DpRecorded r = RunDp(dp, 2, 16 * kGiB);
  CHECK(r.result.train.oom);
  CHECK(r.result.oom_device == 0);
  CHECK(r.result.train.steps_done == 0);  // step 0: the keys and values of use_cache
  CHECK(r.result.train.error.find("GPU 0 has a total capacity of 16.00 GiB") != std::string::npos);

  // DDP: each rank takes 4 of the 8 samples (meta: a rank's memory does not
  // depend on its peers, so one rank on a local communicator shows it).
  TrainOptions ddp = dp;
  ddp.model_options.batch_size = 4;
  ddp.ddp = reducer::DdpOptions{};
  RankSessionOptions gpu;
  gpu.device_memory = 16 * kGiB;
  RankSession session(gpu);
  REQUIRE(session.Start().ok());
  std::unique_ptr<reducer::Communicator> comm = reducer::CreateLocalCommunicator();
  absl::StatusOr<TrainResult> fits = Train(ddp, session.context(), &session.recorder(), comm.get());
  REQUIRE(fits.ok());
  CHECK_FALSE(fits->oom);
  CHECK(fits->steps_done == 2);
}

TEST_CASE("DataParallel: options it does not model are refused") {
  std::vector<std::unique_ptr<RankSession>> sessions;
  std::vector<DeviceContext*> contexts;
  std::vector<Recorder*> recorders;
  for (int d = 0; d < 2; ++d) {
    RankSessionOptions o;
    o.rank = d;
    o.device_index = d;
    sessions.push_back(std::make_unique<RankSession>(o));
    contexts.push_back(&sessions.back()->context());
    recorders.push_back(nullptr);
  }
  TrainOptions rnn;
  rnn.model = "bilstm";
  absl::StatusOr<DataParallelResult> r = TrainDataParallel(rnn, contexts, recorders);
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()).find("cuDNN RNN") != std::string::npos);
  TrainOptions accum = Mlp(1);
  accum.grad_accum = 2;
  CHECK_FALSE(TrainDataParallel(accum, contexts, recorders).ok());
  TrainOptions checkpoint = Mlp(1);
  checkpoint.model_options.checkpoint_activations = true;
  CHECK_FALSE(TrainDataParallel(checkpoint, contexts, recorders).ok());
  CHECK_FALSE(TrainDataParallel(Mlp(1), {contexts[0]}, {nullptr}).ok());
}

}  // namespace memscope
