// Shared by the train tests: one recorded training run on a simulated GPU,
// and its phase rows.
#ifndef MEMSCOPE_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
#define MEMSCOPE_TESTS_TRAIN_TRAIN_TEST_UTIL_H_

#include <catch2/catch.hpp>

#include <cstdint>

#include "allocator/caching_allocator.h"
#include "analysis/analysis.h"
#include "recording/recorder.h"
#include "recording/timeline.h"
#include "reducer/communicator.h"
#include "train/trainer.h"

namespace memscope {

inline constexpr std::uint64_t kTestMiB = 1 << 20;

struct Recorded {
  TrainResult result;
  RankReport report;
  Timeline timeline;
};

// Trains on an 80 GiB simulated GPU (host-backed with `cpu`), recording every
// allocation; `comm` is passed to Train (DDP needs one).
inline Recorded RunTraining(const TrainOptions& options, bool cpu = false, reducer::Communicator* comm = nullptr) {
  SimDevice gpu({.capacity = 80 * kGiB, .index = 0, .host_backed = cpu});
  CachingAllocator allocator(gpu);
  Timeline timeline;
  timeline.device_capacity = 80 * kGiB;
  MemorySink sink(timeline);
  Recorded out;
  {
    Recorder recorder(sink);
    allocator.SetObserver(&recorder);
    DeviceContext ctx(allocator, cpu ? ExecMode::kCpu : ExecMode::kMeta, cpu ? &gpu : nullptr);
    absl::StatusOr<TrainResult> r = Train(options, ctx, &recorder, comm);
    REQUIRE(r.ok());
    out.result = *r;
    allocator.SetObserver(nullptr);
  }
  absl::StatusOr<RankReport> report = AnalyzeRank(timeline);
  REQUIRE(report.ok());
  out.report = *report;
  out.timeline = std::move(timeline);
  return out;
}

inline const PhaseRow& Row(const RankReport& r, Phase phase, std::int64_t step) {
  for (const PhaseRow& row : r.phases) {
    if (row.phase == phase && row.step == step) return row;
  }
  FAIL("no phase row");
  return r.phases.front();
}

}  // namespace memscope

#endif  // MEMSCOPE_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
