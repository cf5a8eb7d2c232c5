#include "run/run.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "allocator/sizes.h"
#include "analysis/analysis.h"
#include "exporters/report.h"
#include "importers/replayer.h"
#include "importers/snapshot_import.h"
#include "recording/recorder.h"
#include "recording/timeline.h"
#include "run/manifest.h"
#include "run/rank_session.h"
#include "run/run_directory.h"

namespace memscope {
namespace fs = std::filesystem;

namespace {

// RecordReplay's body: `movable` (the trace itself, when the caller gives
// up its stacks) gets its stacks moved into the timeline.
absl::StatusOr<Timeline> RecordReplayImpl(const RequestTrace& trace, RequestTrace* movable,
                                          const AllocatorConfig& config, std::uint64_t device_memory, int rank,
                                          ReplayResult* result) {
  // In memory, on GPU 0 whatever device the trace came from (the timeline keeps `rank`).
  RankSessionOptions options;
  options.rank = rank;
  options.device_index = 0;
  options.device_memory = device_memory;
  options.config = config;
  options.clock = RecordClock::kTrace;  // the trace's own times, or 1 us a request (ReplayOn)
  RankSession session(options);
  if (absl::Status s = session.Start(); !s.ok()) return s;
  // Room for the events (an alloc, a free's two, segments): reserved address
  // space costs no memory until used, and millions of events grown by
  // doubling are copied (and faulted in) again at every step.
  session.timeline().events.reserve(session.timeline().events.size() + 2 * trace.requests.size() + 64);
  // (The recorder records into session.timeline(): the replay takes each
  // alloc's stack as its event is recorded.)
  absl::StatusOr<ReplayResult> r =
      ReplayOn(trace, session.allocator(), session.device(), &session.recorder(), &session.timeline().events);
  if (!r.ok()) return r.status();
  if (absl::Status s = session.Finish(); !s.ok()) return s;
  Timeline timeline = std::move(session.timeline());
  timeline.pools = r->pools;
  if (movable != nullptr) {
    AttachStacksMoving(*movable, *r, timeline);
  } else {
    AttachStacks(trace, *r, timeline);
  }
  r->alloc_stacks.clear();
  r->alloc_event_stacks.clear();
  if (result != nullptr) *result = std::move(*r);
  return timeline;
}

}  // namespace

absl::StatusOr<Timeline> RecordReplay(const RequestTrace& trace, const AllocatorConfig& config,
                                      std::uint64_t device_memory, int rank, ReplayResult* result) {
  return RecordReplayImpl(trace, nullptr, config, device_memory, rank, result);
}

absl::StatusOr<Timeline> RecordReplayTakingStacks(RequestTrace& trace, const AllocatorConfig& config,
                                                  std::uint64_t device_memory, int rank, ReplayResult* result) {
  return RecordReplayImpl(trace, &trace, config, device_memory, rank, result);
}

absl::StatusOr<RecordedReplay> RecordReplayRun(const std::string& dir, const RequestTrace& trace,
                                               const AllocatorConfig& config, std::uint64_t device_memory) {
  const RunDirectory run_dir(dir);
  if (absl::Status s = run_dir.Create(); !s.ok()) return s;
  // One run at a time per directory, as for memscope run.
  absl::StatusOr<RunDirectory::Lock> lock = run_dir.TakeLock(RunDirectory::ThisProcess());
  if (!lock.ok()) return lock.status();
  RecordedReplay out;
  {
    RankSessionOptions options;
    options.device_memory = device_memory;
    options.config = config;
    options.timeline_path = run_dir.Timeline(0);
    options.clock = RecordClock::kTrace;  // the trace's own times, or 1 us a request (ReplayOn)
    RankSession session(options);
    if (absl::Status s = session.Start(); !s.ok()) return s;
    absl::StatusOr<ReplayResult> r = ReplayOn(trace, session.allocator(), session.device(), &session.recorder());
    if (!r.ok()) return r.status();
    if (absl::Status s = session.Finish(); !s.ok()) return s;
    out.replay = std::move(*r);
  }
  RunManifest manifest;
  manifest.generator = kMemscopeVersion;
  manifest.command = "replay";
  manifest.source = trace.source;
  manifest.world_size = 1;
  manifest.alloc_conf = config.text;
  manifest.device_memory = device_memory;
  ManifestRank& rank = manifest.ranks.emplace_back();
  rank.timeline = RunDirectory::TimelineName(0);
  rank.status = out.replay.oom ? "oom" : "ok";
  rank.exit_code = 0;
  (void)manifest.Write(run_dir.Manifest());  // as before: the outputs below say whether the directory is writable
  absl::StatusOr<std::vector<Timeline>> recorded = LoadRun(dir);
  if (!recorded.ok()) return recorded.status();
  // A timeline file holds no stacks: the snapshot's are attached to what was
  // just recorded, so the outputs (top sites, summary, snapshot) carry them.
  if (recorded->size() == 1) AttachStacks(trace, out.replay, recorded->front());
  absl::StatusOr<std::vector<RankReport>> reports = WriteRunOutputs(dir, *recorded);
  if (!reports.ok()) return reports.status();
  out.reports = std::move(*reports);
  return out;
}

namespace {

// The timelines of a PyTorch snapshot pickle, one per device: each device's
// trace replayed under the snapshot's own settings, or, without a trace, the
// state at the snapshot.
absl::StatusOr<std::vector<Timeline>> LoadSnapshot(const std::string& path, std::uint64_t device_memory) {
  absl::StatusOr<std::vector<ImportedTrace>> imported = ReadPytorchSnapshot(path);
  if (absl::IsFailedPrecondition(imported.status())) {
    // No trace (1.13, or history not recorded): the state at the snapshot.
    absl::StatusOr<std::vector<Timeline>> state = ReadPytorchSnapshotState(path);
    if (state.ok()) {
      for (Timeline& t : *state) t.device_capacity = device_memory;
    }
    return state;
  }
  if (!imported.ok()) return imported.status();
  std::vector<Timeline> timelines;
  for (ImportedTrace& trace : *imported) {
    absl::StatusOr<AllocatorConfig> config = AllocatorConfig::Parse(trace.alloc_conf);
    if (!config.ok()) return config.status();
    // An OOM snapshot is replayed on the capacity its oom entry implies,
    // unless the caller asked for a size.
    const std::uint64_t memory = trace.device_capacity != 0 && device_memory == kDefaultReplayDeviceMemory
                                     ? trace.device_capacity
                                     : device_memory;
    ReplayResult replayed;
    // The trace is not needed after its replay: its stacks move into the timeline.
    absl::StatusOr<Timeline> t = RecordReplayTakingStacks(trace.requests, *config, memory, trace.device, &replayed);
    if (!t.ok()) return t.status();
    t->device_capacity = memory;
    // The snapshot's own clock: event times are its time_us (kept by the replay).
    if (trace.requests.time_origin_us >= 0) t->wall_start_us = trace.requests.time_origin_us;
    t->notes = trace.notes;
    t->notes.insert(t->notes.begin(), absl::StrCat("device ", trace.device, " of ", path,
                                                   ": its trace was replayed under its own "
                                                   "allocator settings (",
                                                   trace.alloc_conf.empty() ? "defaults" : trace.alloc_conf,
                                                   ") on a simulated GPU of ", FormatSize(memory)));
    if (replayed.planned_missed > 0) {
      t->notes.push_back(absl::StrCat(
          "device ", trace.device, ": ", replayed.planned_missed, " of the trace's ",
          trace.requests.planned_mallocs.size() + trace.requests.planned_reservations.size(),
          " segment addresses were not taken by the replay (its device calls differ from the trace's there): "
          "those segments have memscope's own addresses"));
    }
    timelines.push_back(std::move(*t));
  }
  return timelines;
}

// A `memscope capture` run directory: rank R is the snapshot its run.json
// names (snapshot-rank-R.pickle, written by the job's rank R). A rank's
// process normally uses one device; when its snapshot holds several, the
// one with the most events is that rank (a note names the others).
absl::StatusOr<std::vector<Timeline>> LoadCapture(const std::string& path, const RunManifest& manifest,
                                                  std::uint64_t device_memory) {
  std::vector<Timeline> timelines;
  std::error_code ec;
  for (const ManifestRank& r : manifest.ranks) {
    if (r.timeline.empty()) continue;
    const fs::path file = fs::path(path) / fs::path(r.timeline).filename();
    if (!RunDirectory::IsRankFile(file.filename().string()) || !fs::is_regular_file(file, ec)) continue;
    absl::StatusOr<std::vector<Timeline>> devices = LoadSnapshot(file.string(), device_memory);
    if (!devices.ok()) return devices.status();
    if (devices->empty()) continue;
    auto rank = std::max_element(devices->begin(), devices->end(), [](const Timeline& a, const Timeline& b) {
      return a.events.size() < b.events.size();
    });
    if (devices->size() > 1) {
      std::vector<int> others;
      for (const Timeline& t : *devices) {
        if (&t != &*rank) others.push_back(t.rank);  // a snapshot's timelines: rank = device
      }
      rank->notes.push_back(absl::StrCat("rank ", r.rank, "'s snapshot also holds device(s) ",
                                         absl::StrJoin(others, ", "), ": only device ", rank->rank,
                                         " (the one with the most events) is read as rank ", r.rank));
    }
    Timeline t = std::move(*rank);
    t.rank = r.rank;
    t.world_size = manifest.world_size;
    timelines.push_back(std::move(t));
  }
  if (timelines.empty()) {
    return absl::NotFoundError(absl::StrCat("'", path,
                                            "' is a capture whose job wrote no snapshot (no CUDA device, or it "
                                            "never imported torch): there is no memory to show"));
  }
  std::sort(timelines.begin(), timelines.end(), [](const Timeline& a, const Timeline& b) { return a.rank < b.rank; });
  return timelines;
}

}  // namespace

absl::StatusOr<std::vector<Timeline>> LoadRun(const std::string& path, std::uint64_t device_memory) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
  std::vector<Timeline> timelines;
  if (!fs::is_directory(status)) {
    absl::StatusOr<InputKind> kind = DetectInput(path);
    if (!kind.ok()) return kind.status();
    if (*kind == InputKind::kPickle) return LoadSnapshot(path, device_memory);
    if (*kind == InputKind::kJsonl || *kind == InputKind::kRmmCsv) {
      return absl::InvalidArgumentError(absl::StrCat("'", path,
                                                     "' is a request trace, not a recording: record it with "
                                                     "memscope replay ",
                                                     path, " --out RUN"));
    }
    absl::StatusOr<Timeline> t = ReadTimelineFile(path);
    if (!t.ok()) return t.status();
    timelines.push_back(std::move(*t));
    return timelines;
  }
  std::vector<std::pair<int, std::string>> files;
  // A run's run.json names its timelines: only those are read (a file of the
  // user's named like one, or a rank of an earlier, larger run, is not).
  absl::StatusOr<RunManifest> manifest = RunManifest::Read(RunDirectory(path).Manifest());
  if (manifest.ok() && manifest->command == "capture") return LoadCapture(path, *manifest, device_memory);
  if (manifest.ok() && !manifest->ranks.empty()) {
    for (const ManifestRank& r : manifest->ranks) {
      const fs::path file = fs::path(path) / fs::path(r.timeline).filename();
      if (RunDirectory::TimelineRank(file.filename().string()) && fs::is_regular_file(file, ec)) {
        files.emplace_back(r.rank, file.string());
      }
    }
  } else {
    for (const fs::directory_entry& entry : fs::directory_iterator(path, ec)) {
      if (std::optional<int> rank = RunDirectory::TimelineRank(entry.path().filename().string())) {
        files.emplace_back(*rank, entry.path().string());
      }
    }
    if (ec) return absl::InternalError(absl::StrCat("cannot list '", path, "': ", ec.message()));
  }
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat("'", path, "' has no rank-R.timeline files: not a memscope run directory"));
  }
  std::sort(files.begin(), files.end());
  for (const auto& [rank, file] : files) {
    absl::StatusOr<Timeline> t = ReadTimelineFile(file);
    if (!t.ok()) return t.status();
    timelines.push_back(std::move(*t));
  }
  return timelines;
}

absl::StatusOr<LoadedReport> LoadReport(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
  LoadedReport loaded;
  if (fs::is_regular_file(status)) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
    char first = 0;
    while (in.get(first) && absl::ascii_isspace(static_cast<unsigned char>(first))) {
    }
    if (in && first == '{') {
      in.seekg(0);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (json.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not valid JSON"));
      absl::StatusOr<Report> report = ReportFromJson(json);
      if (!report.ok()) return absl::InvalidArgumentError(absl::StrCat("'", path, "' ", report.status().message()));
      loaded.report = std::move(*report);
      return loaded;
    }
  }
  absl::StatusOr<std::vector<Timeline>> run = LoadRun(path);
  if (!run.ok()) return run.status();
  loaded.timelines = std::move(*run);
  std::vector<RankReport> reports;
  for (const Timeline& t : loaded.timelines) {
    absl::StatusOr<RankReport> r = AnalyzeRank(t);
    if (!r.ok()) return r.status();
    reports.push_back(std::move(*r));
  }
  loaded.report = MakeReport(loaded.timelines.empty() ? 0 : loaded.timelines.front().world_size, std::move(reports));
  return loaded;
}

absl::StatusOr<CompareInput> LoadCompareInput(const std::string& path, std::vector<std::string>* notes) {
  absl::StatusOr<LoadedReport> loaded = LoadReport(path);
  if (!loaded.ok()) return loaded.status();
  for (const Timeline& t : loaded->timelines) {
    if (notes != nullptr) notes->insert(notes->end(), t.notes.begin(), t.notes.end());
  }
  // The run's run.json: in the directory, or next to the file.
  nlohmann::json run_config = nullptr;
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  std::ifstream in(RunDirectory(dir.string()).Manifest(), std::ios::binary);
  if (in) {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    // Only a run's own description; anything else is not a config.
    if (config.is_object() && config.value("schema", nlohmann::json()).is_string() && config["schema"] == kRunSchema) {
      run_config = std::move(config);
    }
  }
  return MakeCompareInput(path, std::move(loaded->report), loaded->timelines, std::move(run_config));
}

}  // namespace memscope
