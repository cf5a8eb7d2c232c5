// OpenRecording: each input's kind is decided once per load, and each
// recording's allocator settings are parsed once, by its reader; nothing
// after the load (the analyses, the two walks of the outputs, the snapshot
// export) parses them again.
#include "load/recording.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "allocator/config.h"
#include "analysis/analysis.h"
#include "importers/request_trace.h"
#include "load/record_replay.h"
#include "recording/timeline.h"
#include "run/run.h"

namespace memscope {
namespace {

namespace fs = std::filesystem;

std::string Data(const std::string& name) { return std::string(MEMSCOPE_SOURCE_DIR) + "/tests/cli/data/" + name; }

// A fresh scratch directory for one test.
fs::path Scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("memscope-load-test-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A run directory of one rank, recorded from tests/cli/data/phases.jsonl
// under expandable segments: rank-0.timeline, no run.json.
fs::path RecordedRun(const std::string& name) {
  const fs::path dir = Scratch(name);
  absl::StatusOr<RequestTrace> trace = ReadJsonlTraceFile(Data("phases.jsonl"));
  REQUIRE(trace.ok());
  absl::StatusOr<AllocatorConfig> config = AllocatorConfig::Parse("expandable_segments:True");
  REQUIRE(config.ok());
  absl::StatusOr<Timeline> t = RecordReplay(*trace, *config, 1ULL << 30, 0);
  REQUIRE(t.ok());
  REQUIRE(WriteTimelineFile((dir / "rank-0.timeline").string(), *t).ok());
  return dir;
}

// The detections and settings parses that `load` makes.
struct Counts {
  std::uint64_t detections;
  std::uint64_t parses;
};
template <typename F>
Counts Count(F&& load) {
  const std::uint64_t d0 = DetectCount();
  const std::uint64_t p0 = AllocatorConfig::ParseCount();
  load();
  return {DetectCount() - d0, AllocatorConfig::ParseCount() - p0};
}

}  // namespace

TEST_CASE("each input is detected as its kind: directory, timeline, snapshot, JSON lines, RMM log, report") {
  const fs::path run = RecordedRun("kinds");
  const fs::path dir = Scratch("kinds-files");
  std::ofstream(dir / "one-line.json") << R"({"schema":"memscope.report/1","ranks":[]})" << "\n";
  std::ofstream(dir / "pretty.json") << "{\n  \"schema\": \"memscope.report/1\"\n}\n";
  std::ofstream(dir / "requests.jsonl") << R"({"action":"alloc","id":"a","size":512})" << "\n";
  std::ofstream(dir / "empty");
  const std::pair<std::string, RecordingKind> cases[] = {
      {run.string(), RecordingKind::kRunDirectory},
      {(run / "rank-0.timeline").string(), RecordingKind::kTimeline},
      {Data("golden/imported.pickle"), RecordingKind::kSnapshot},
      {Data("phases.jsonl"), RecordingKind::kJsonLines},  // starts with a '#' comment
      {(dir / "requests.jsonl").string(), RecordingKind::kJsonLines},
      {Data("rmm.csv"), RecordingKind::kRmmLog},
      {(dir / "one-line.json").string(), RecordingKind::kReport},
      {(dir / "pretty.json").string(), RecordingKind::kReport},
      {(dir / "empty").string(), RecordingKind::kUnknown},
  };
  for (const auto& [path, kind] : cases) {
    INFO(path);
    absl::StatusOr<RecordingKind> detected = DetectRecording(path);
    REQUIRE(detected.ok());
    CHECK(*detected == kind);
  }
  CHECK(DetectRecording((dir / "missing").string()).status().message() ==
        "'" + (dir / "missing").string() + "' does not exist");
}

TEST_CASE("a load of a run directory detects it once and parses its settings once, outputs included") {
  const fs::path run = RecordedRun("run-once");
  std::vector<Timeline> timelines;
  const Counts load = Count([&] {
    absl::StatusOr<std::vector<Timeline>> t = LoadTimelines(run.string());
    REQUIRE(t.ok());
    timelines = *std::move(t);
  });
  CHECK(load.detections == 1);
  CHECK(load.parses == 1);  // the timeline reader's
  REQUIRE(timelines.size() == 1);
  CHECK(timelines[0].settings.expandable_segments);
  // The analyses and every output (two walks, the snapshot's settings) read the parsed value.
  const Counts outputs = Count([&] { REQUIRE(WriteRunOutputs(run.string(), timelines).ok()); });
  CHECK(outputs.detections == 0);
  CHECK(outputs.parses == 0);
}

TEST_CASE("a load of a PyTorch snapshot detects it once and parses its settings once, for the report too") {
  const Counts report = Count([&] {
    absl::StatusOr<LoadedReport> loaded = LoadReport(Data("golden/imported.pickle"));
    REQUIRE(loaded.ok());
    REQUIRE(loaded->timelines.size() == 1);
    CHECK(loaded->timelines[0].notes.front().find("replayed under its own allocator settings (defaults)") !=
          std::string::npos);
  });
  CHECK(report.detections == 1);
  CHECK(report.parses == 1);  // the snapshot reader's, of its PYTORCH_CUDA_ALLOC_CONF ""
}

TEST_CASE("replay's source of a timeline is detected once, its settings parsed once and carried as a value") {
  const fs::path run = RecordedRun("replay-once");
  absl::StatusOr<ReplaySource> source;
  const Counts c = Count([&] { source = OpenReplaySource((run / "rank-0.timeline").string(), 0); });
  REQUIRE(source.ok());
  CHECK(c.detections == 1);
  CHECK(c.parses == 1);
  REQUIRE(source->settings);
  CHECK(source->settings->text == "expandable_segments:True");
  CHECK(source->device_memory == (1ULL << 30));  // the recording's own GPU
  CHECK(!source->snapshot);
  CHECK(OpenReplaySource(run.string(), 3).status().message() == "'" + run.string() + "' has no rank 3");
}

TEST_CASE("a snapshot's replay source carries the capacity its OOM implies only when it has one") {
  absl::StatusOr<ReplaySource> source = OpenReplaySource(Data("golden/imported.pickle"), 0);
  REQUIRE(source.ok());
  REQUIRE(source->snapshot);
  CHECK(source->device_memory == source->snapshot->device_capacity);
  CHECK(SnapshotDeviceMemory(*source->snapshot, std::nullopt) ==
        (source->snapshot->device_capacity != 0 ? source->snapshot->device_capacity : kDefaultReplayDeviceMemory));
  CHECK(SnapshotDeviceMemory(*source->snapshot, 5ULL << 30) == 5ULL << 30);
}

TEST_CASE("a request trace is not a recording, and a report is not a request trace: one line each") {
  const std::string jsonl = Data("phases.jsonl");
  CHECK(LoadTimelines(jsonl).status().message() ==
        "'" + jsonl + "' is a request trace, not a recording: record it with memscope replay " + jsonl + " --out RUN");
  const fs::path dir = Scratch("not-a");
  const std::string report = (dir / "report.json").string();
  std::ofstream(report) << "{\n}\n";
  CHECK(OpenReplaySource(report, 0).status().message() == "'" + report + "' is a report.json, not a request trace");
  CHECK(LoadTimelines(report).status().message() == "'" + report + "' has no \"schema\" (expected memscope.report/1)");
}

}  // namespace memscope
