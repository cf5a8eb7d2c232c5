// Shared by the train tests: one recorded training run on a simulated GPU,
// and its phase rows.
#ifndef MEMSCOPE_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
#define MEMSCOPE_TESTS_TRAIN_TRAIN_TEST_UTIL_H_

#include <catch2/catch.hpp>

#include <cstdint>

#include "analysis/analysis.h"
#include "reducer/communicator.h"
#include "run/rank_session.h"
#include "train/trainer.h"

namespace memscope {

inline constexpr std::uint64_t kTestMiB = 1 << 20;

struct Recorded {
  TrainResult result;
  RankReport report;
  Timeline timeline;
};

// Trains on an 80 GiB simulated GPU (host-backed with `cpu`) of a RankSession,
// recording every allocation in memory; `comm` is passed to Train (DDP needs one).
inline Recorded RunTraining(const TrainOptions& options, bool cpu = false, reducer::Communicator* comm = nullptr) {
  RankSessionOptions gpu;
  gpu.device_memory = 80 * kGiB;
  gpu.exec = cpu ? ExecMode::kCpu : ExecMode::kMeta;
  RankSession session(gpu);
  REQUIRE(session.Start().ok());
  Recorded out;
  absl::StatusOr<TrainResult> r = Train(options, session.context(), &session.recorder(), comm);
  REQUIRE(r.ok());
  out.result = *r;
  REQUIRE(session.Finish().ok());
  absl::StatusOr<RankReport> report = AnalyzeRank(session.timeline());
  REQUIRE(report.ok());
  out.report = *report;
  out.timeline = std::move(session.timeline());
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
