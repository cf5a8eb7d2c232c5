#include <catch2/catch.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "exporters/report.h"
#include "run/aggregate.h"
#include "run/rank_session.h"

namespace memscope {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

// A run directory with `world_size` recorded ranks (a few allocations each)
// and the statuses given (nullopt: that rank wrote none).
struct FakeRun {
  FakeRun(const std::string& name, const std::vector<std::optional<RankStatus>>& statuses)
      : root(std::filesystem::temp_directory_path() / name), dir(root.string()) {
    std::filesystem::remove_all(root);
    REQUIRE(dir.Create().ok());
    for (int r = 0; r < static_cast<int>(statuses.size()); ++r) {
      RankSessionOptions options;
      options.rank = r;
      options.world_size = static_cast<int>(statuses.size());
      options.device_memory = 256 * kMiB;
      options.timeline_path = dir.Timeline(r);
      RankSession session(options);
      REQUIRE(session.Start().ok());
      absl::StatusOr<DevicePtr> p = session.allocator().Malloc((r + 1) * kMiB, 0);
      REQUIRE(p.ok());
      REQUIRE(session.allocator().Free(*p).ok());
      REQUIRE(session.Finish().ok());
      if (statuses[static_cast<std::size_t>(r)])
        REQUIRE(statuses[static_cast<std::size_t>(r)]->Write(dir.RankStatus(r)).ok());
    }
    record.dir = dir;
    record.world_size = static_cast<int>(statuses.size());
    record.device_memory = 256 * kMiB;
    record.training.model = "mlp";
    record.training.steps = 3;
  }
  ~FakeRun() { std::filesystem::remove_all(root); }
  std::filesystem::path root;
  RunDirectory dir;
  RunRecord record;
};

RankStatus Status(int rank, const std::string& status, int exit_code, const std::string& error = "") {
  RankStatus s;
  s.rank = rank;
  s.status = status;
  s.exit_code = exit_code;
  s.error = error;
  s.parameters = 100;
  s.steps_done = status == "ok" ? 3 : 1;
  s.seconds = 0.5 + rank;
  s.losses = {1.0f + static_cast<float>(rank)};
  return s;
}

TEST_CASE("AggregateRun: every rank ok is exit 0, run.json and report.json written") {
  FakeRun run("memscope-aggregate-ok", {Status(0, "ok", 0), Status(1, "ok", 0)});
  absl::StatusOr<RunOutcome> out = AggregateRun(run.record);
  REQUIRE(out.ok());
  CHECK(out->exit_code == 0);
  CHECK(out->diagnostics.empty());
  CHECK(out->reports.size() == 2);
  CHECK(out->timelines.size() == 2);
  const TrainingManifest& t = *out->manifest.training;
  CHECK(t.parameters == 100);
  CHECK(t.steps_done == 3);
  CHECK(t.seconds == 1.5);
  CHECK(t.losses == std::vector<float>{1.0f});  // rank 0's
  absl::StatusOr<RunManifest> read = RunManifest::Read(run.dir.Manifest());
  REQUIRE(read.ok());
  CHECK(*read == out->manifest);
  CHECK(read->ranks[1].timeline == "rank-1.timeline");
  CHECK(std::filesystem::exists(run.dir.Report()));
  CHECK(std::filesystem::exists(run.dir.Snapshot(1)));
}

TEST_CASE("AggregateRun: an OOM is exit 3 with the rank's message") {
  FakeRun run("memscope-aggregate-oom",
              {Status(0, "oom", kExitOutOfMemory, "CUDA out of memory."), Status(1, "ok", 0)});
  absl::StatusOr<RunOutcome> out = AggregateRun(run.record);
  REQUIRE(out.ok());
  CHECK(out->exit_code == kExitOutOfMemory);
  CHECK(out->diagnostics.starts_with("memscope run: rank 0 out of memory in step 1:\nCUDA out of memory.\n"));
  CHECK(out->manifest.training->steps_done == 1);
  CHECK(out->manifest.ranks[0].status == "oom");
}

TEST_CASE("AggregateRun: a rank without a status is exit 4, named") {
  FakeRun run("memscope-aggregate-missing", {Status(0, "ok", 0), std::nullopt});
  absl::StatusOr<RunOutcome> out = AggregateRun(run.record);
  REQUIRE(out.ok());
  CHECK(out->exit_code == kExitRankFailed);
  CHECK(out->diagnostics == "memscope run: rank 1 failed: it wrote no status (killed, or it never started)\n");
  CHECK(out->manifest.ranks[1].status == "failed");
  CHECK_FALSE(out->manifest.ranks[1].exit_code);
}

TEST_CASE("AggregateRun: the launcher's first failure is the run's, the others follow") {
  FakeRun run("memscope-aggregate-killed",
              {Status(0, "comm_error", kExitRankFailed, "rank 0: the peer rank 1 is gone"), std::nullopt});
  RankExit r0{.rank = 0, .exit_code = kExitRankFailed, .signal = 0, .stopped_by_launcher = false, .seconds = 2, .message = ""};
  RankExit r1{.rank = 1, .exit_code = 0, .signal = 9, .stopped_by_launcher = false, .seconds = 1, .message = ""};
  run.record.exits = {r0, r1};
  run.record.first_failure = 1;
  absl::StatusOr<RunOutcome> out = AggregateRun(run.record);
  REQUIRE(out.ok());
  CHECK(out->exit_code == kExitRankFailed);
  REQUIRE(out->manifest.failure);
  CHECK(out->manifest.failure->message == "rank 1 was killed by signal 9 (SIGKILL)");
  CHECK(out->diagnostics ==
        "memscope run: rank 1 was killed by signal 9 (SIGKILL)\n"
        "memscope run: rank 0 exited with status 4: the peer rank 1 is gone\n");
  CHECK(out->manifest.ranks[1].status == "killed");
  CHECK(out->manifest.ranks[0].error == "the peer rank 1 is gone");
}

TEST_CASE("AggregateRun: a run stopped by Ctrl-C reports what it recorded, says so in one line and exits 130") {
  FakeRun run("memscope-aggregate-interrupted", {Status(0, "interrupted", 130), Status(1, "interrupted", 130)});
  RankExit r0{.rank = 0, .exit_code = 130, .signal = 0, .stopped_by_launcher = false, .seconds = 2, .message = ""};
  RankExit r1{.rank = 1, .exit_code = 130, .signal = 0, .stopped_by_launcher = false, .seconds = 2, .message = ""};
  run.record.exits = {r0, r1};
  run.record.interrupted = SIGINT;
  absl::StatusOr<RunOutcome> out = AggregateRun(run.record);
  REQUIRE(out.ok());
  CHECK(out->exit_code == 130);
  CHECK(out->interrupted == SIGINT);
  CHECK(out->diagnostics == "memscope run: interrupted by SIGINT after 1 of 3 steps; what was recorded is in " +
                                run.dir.root() +
                                "/ (run.json, rank-{0..1}.timeline, report.json, report.html, summary.txt, "
                                "trace.json, snapshot-rank-{0..1}.pickle)\n");
  CHECK_FALSE(out->manifest.failure);
  CHECK(out->manifest.ranks[0].status == "interrupted");
  CHECK(out->manifest.ranks[1].how == "exited with status 130");
  absl::StatusOr<RunManifest> written = RunManifest::Read(run.dir.Manifest());
  REQUIRE(written.ok());
  CHECK(written->interrupted == "SIGINT");
  CHECK(std::filesystem::exists(run.dir.Report()));
}

TEST_CASE("AggregateRun: a rank the launcher stopped, which stopped as asked, is 'stopped'") {
  FakeRun run("memscope-aggregate-stopped",
              {Status(0, "interrupted", 143), Status(1, "error", kExitRankFailed, "cannot write timeline 'x'")});
  RankExit r0{.rank = 0, .exit_code = 143, .signal = 0, .stopped_by_launcher = true, .seconds = 2, .message = ""};
  RankExit r1{.rank = 1, .exit_code = 4, .signal = 0, .stopped_by_launcher = false, .seconds = 1, .message = ""};
  run.record.exits = {r0, r1};
  run.record.first_failure = 1;
  absl::StatusOr<RunOutcome> out = AggregateRun(run.record);
  REQUIRE(out.ok());
  CHECK(out->exit_code == kExitRankFailed);
  CHECK(out->diagnostics ==
        "memscope run: rank 1 exited with status 4: cannot write timeline 'x'\n"
        "memscope run: rank 0 was stopped by signal 15 (SIGTERM)\n");
  CHECK(out->manifest.ranks[0].status == "stopped");
}

TEST_CASE("AggregateRun: report.json keeps the run's failure when the rank that failed first recorded nothing") {
  FakeRun run("memscope-aggregate-no-timeline",
              {Status(0, "comm_error", kExitRankFailed, "rank 0: the peer rank 1 is gone"), std::nullopt});
  std::filesystem::remove(run.dir.Timeline(1));  // killed before its timeline existed
  RankExit r0{
      .rank = 0, .exit_code = kExitRankFailed, .signal = 0, .stopped_by_launcher = false, .seconds = 2, .message = ""};
  RankExit r1{.rank = 1, .exit_code = 0, .signal = 9, .stopped_by_launcher = false, .seconds = 1, .message = ""};
  run.record.exits = {r0, r1};
  run.record.first_failure = 1;
  absl::StatusOr<RunOutcome> out = AggregateRun(run.record);
  REQUIRE(out.ok());
  CHECK(out->exit_code == kExitRankFailed);
  REQUIRE(out->reports.size() == 1);  // rank 0 only
  std::ifstream in(run.dir.Report());
  const nlohmann::json report = nlohmann::json::parse(in);
  CHECK(report["world_size"] == 2);
  CHECK(report["ranks"].size() == 1);
  CHECK(report["failure"] == nlohmann::json{{"rank", 1}, {"message", "rank 1 was killed by signal 9 (SIGKILL)"}});
  absl::StatusOr<Report> read = ReportFromJson(report);
  REQUIRE(read.ok());
  CHECK(read->failure == ReportFailure{1, "rank 1 was killed by signal 9 (SIGKILL)"});
}

}  // namespace
}  // namespace memscope
