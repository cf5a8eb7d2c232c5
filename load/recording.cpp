#include "load/recording.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "allocator/sizes.h"
#include "analysis/analysis.h"
#include "base/input_file.h"
#include "importers/timeline_requests.h"
#include "load/record_replay.h"
#include "load/run_directory.h"
#include "nlohmann/json.hpp"
#include "recording/timeline.h"

namespace memscope {
namespace fs = std::filesystem;

namespace {

std::atomic<std::uint64_t> detect_count{0};

// A file whose first non-blank byte is '{': JSON lines when its first line
// is a whole JSON object that is not a report (no "schema": a report.json
// written on one line has one), else a JSON document (a report.json, or a
// file meant as one, whose errors then say so).
RecordingKind JsonKind(std::ifstream& in) {
  in.clear();
  in.seekg(0);
  std::string line;
  // A first line longer than a trace's may be is not one (a report.json on one line).
  if (ReadBoundedLine(in, line, kMaxTraceLineBytes) == LineRead::kTooLong) return RecordingKind::kReport;
  const nlohmann::json first = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (first.is_object() && !first.contains("schema")) return RecordingKind::kJsonLines;
  return RecordingKind::kReport;
}

// DetectRecording's work, and the run.json it read to tell a capture (so
// that OpenRecording reads it once).
absl::StatusOr<RecordingKind> Detect(const std::string& path, std::optional<RunManifest>* manifest) {
  detect_count.fetch_add(1, std::memory_order_relaxed);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
  if (fs::is_directory(status)) {
    // A run's run.json names its timelines (and says when the run is a capture).
    absl::StatusOr<RunManifest> m = RunManifest::Read(RunDirectory(path).Manifest());
    const bool capture = m.ok() && m->command == "capture";
    if (m.ok() && manifest != nullptr) *manifest = *std::move(m);
    return capture ? RecordingKind::kCapture : RecordingKind::kRunDirectory;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  char head[40] = {};
  in.read(head, sizeof head);
  const std::string_view bytes(head, static_cast<std::size_t>(in.gcount()));
  if (!bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80) return RecordingKind::kSnapshot;
  // Protocols 0 and 1 have no PROTO opcode: a snapshot (a dict, or the 1.13
  // list) starts with MARK then DICT/LIST (protocol 0) or EMPTY_DICT /
  // EMPTY_LIST then a memo PUT or MARK (protocol 1).
  if (bytes.size() >= 2 && (bytes.substr(0, 2) == "(d" || bytes.substr(0, 2) == "(l")) return RecordingKind::kSnapshot;
  if (bytes.size() >= 2 && (bytes[0] == '}' || bytes[0] == ']') &&
      (bytes[1] == '(' || bytes[1] == 'q' || bytes[1] == 'r' || bytes[1] == '.')) {
    return RecordingKind::kSnapshot;
  }
  if (bytes.size() >= 8 && bytes.substr(0, 8) == std::string_view(kTimelineMagic, 8)) return RecordingKind::kTimeline;
  if (bytes.rfind("Thread,Time,Action", 0) == 0) return RecordingKind::kRmmLog;
  const std::size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && bytes[first] == '#') return RecordingKind::kJsonLines;
  if (first != std::string_view::npos && bytes[first] == '{') return JsonKind(in);
  return RecordingKind::kUnknown;
}

// The timelines of a PyTorch snapshot pickle, one per device: each device's
// trace replayed under the snapshot's own settings (parsed by the reader),
// or, without a trace, the state at the snapshot.
absl::StatusOr<std::vector<Timeline>> SnapshotTimelines(const std::string& path,
                                                        std::optional<std::uint64_t> device_memory) {
  absl::StatusOr<std::vector<ImportedTrace>> imported = ReadPytorchSnapshot(path);
  if (absl::IsFailedPrecondition(imported.status())) {
    // No trace (1.13, or history not recorded): the state at the snapshot.
    absl::StatusOr<std::vector<Timeline>> state = ReadPytorchSnapshotState(path);
    if (state.ok()) {
      for (Timeline& t : *state) t.device_capacity = device_memory.value_or(kDefaultReplayDeviceMemory);
    }
    return state;
  }
  if (!imported.ok()) return imported.status();
  std::vector<Timeline> timelines;
  for (ImportedTrace& trace : *imported) {
    const std::uint64_t memory = SnapshotDeviceMemory(trace, device_memory);
    const std::string frees = ResolveMallocFrees(trace.requests, trace.malloc_frees, memory,
                                                 device_memory.has_value() || trace.device_capacity != 0);
    if (!frees.empty()) trace.notes.push_back(absl::StrCat("device ", trace.device, ": ", frees));
    ReplayResult replayed;
    // The trace is not needed after its replay: its stacks move into the timeline.
    absl::StatusOr<Timeline> t =
        RecordReplayTakingStacks(trace.requests, trace.settings, memory, trace.device, &replayed);
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
absl::StatusOr<std::vector<Timeline>> CaptureTimelines(const std::string& path, const RunManifest& manifest,
                                                       std::optional<std::uint64_t> device_memory) {
  std::vector<Timeline> timelines;
  std::error_code ec;
  for (const ManifestRank& r : manifest.ranks) {
    if (r.timeline.empty()) continue;
    const fs::path file = fs::path(path) / fs::path(r.timeline).filename();
    if (!RunDirectory::IsRankFile(file.filename().string()) || !fs::is_regular_file(file, ec)) continue;
    absl::StatusOr<std::vector<Timeline>> devices = SnapshotTimelines(file.string(), device_memory);
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

// The rank-R.timeline files of a run directory: those its run.json names
// (a file of the user's named like one, or a rank of an earlier, larger run,
// is not read), or every one when it has none.
absl::StatusOr<std::vector<Timeline>> DirectoryTimelines(const std::string& path,
                                                         const std::optional<RunManifest>& manifest) {
  std::error_code ec;
  std::vector<std::pair<int, std::string>> files;
  if (manifest && !manifest->ranks.empty()) {
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
  std::vector<Timeline> timelines;
  for (const auto& [rank, file] : files) {
    absl::StatusOr<Timeline> t = ReadTimelineFile(file);
    if (!t.ok()) return t.status();
    timelines.push_back(std::move(*t));
  }
  // A run that did not end as planned: what it recorded is shown, and said to be partial.
  std::vector<std::string>& notes = timelines.front().notes;
  if (manifest && manifest->interrupted) {
    const std::optional<TrainingManifest>& t = manifest->training;
    notes.push_back(absl::StrCat("the run in '", path, "' was interrupted by ", *manifest->interrupted,
                                 t ? absl::StrCat(" after ", t->steps_done, " of ", t->steps, " steps") : "",
                                 ": what it recorded until then is shown"));
  } else if (!manifest && RunDirectory(path).WrittenByMemscope()) {
    notes.push_back(absl::StrCat("'", path, "' has no run.json: its run did not finish (it was killed, or is still "
                                 "running); what its timelines recorded is shown"));
  }
  return timelines;
}

// A report.json file, validated.
absl::StatusOr<Report> ReadReportFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadInputFile(path, "report.json", kMaxReportJsonBytes);
  if (!text.ok()) return text.status();
  const nlohmann::json json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not valid JSON"));
  absl::StatusOr<Report> report = ReportFromJson(json);
  if (!report.ok()) return absl::InvalidArgumentError(absl::StrCat("'", path, "' ", report.status().message()));
  return report;
}

absl::Status NotARecording(const std::string& path, RecordingKind kind) {
  if (kind == RecordingKind::kReport) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is a report.json, not a recording"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", path, "' is a request trace, not a recording: record it with memscope replay ", path, " --out RUN"));
}

}  // namespace

std::string_view RecordingKindName(RecordingKind kind) {
  switch (kind) {
    case RecordingKind::kRunDirectory: return "run directory";
    case RecordingKind::kCapture: return "capture";
    case RecordingKind::kTimeline: return "timeline";
    case RecordingKind::kSnapshot: return "PyTorch snapshot";
    case RecordingKind::kJsonLines: return "JSON-lines request trace";
    case RecordingKind::kRmmLog: return "RMM log";
    case RecordingKind::kReport: return "report.json";
    case RecordingKind::kUnknown: break;
  }
  return "unknown";
}

absl::StatusOr<RecordingKind> DetectRecording(const std::string& path) { return Detect(path, nullptr); }

std::uint64_t DetectCount() { return detect_count.load(std::memory_order_relaxed); }

std::uint64_t SnapshotDeviceMemory(const ImportedTrace& trace, std::optional<std::uint64_t> asked) {
  if (asked) return *asked;
  return trace.device_capacity != 0 ? trace.device_capacity : kDefaultReplayDeviceMemory;
}

absl::StatusOr<Recording> OpenRecording(const std::string& path, const OpenOptions& options) {
  Recording r;
  r.path = path;
  absl::StatusOr<RecordingKind> kind = Detect(path, &r.manifest);
  if (!kind.ok()) return kind.status();
  r.kind = *kind;
  const bool want_requests = options.want == OpenOptions::Want::kRequests;
  switch (r.kind) {
    case RecordingKind::kRunDirectory: {
      absl::StatusOr<std::vector<Timeline>> t = DirectoryTimelines(path, r.manifest);
      if (!t.ok()) return t.status();
      r.timelines = *std::move(t);
      return r;
    }
    case RecordingKind::kCapture: {
      absl::StatusOr<std::vector<Timeline>> t = CaptureTimelines(path, *r.manifest, options.device_memory);
      if (!t.ok()) return t.status();
      r.timelines = *std::move(t);
      return r;
    }
    case RecordingKind::kSnapshot: {
      if (want_requests) {
        absl::StatusOr<std::vector<ImportedTrace>> traces = ReadPytorchSnapshot(path);
        if (!traces.ok()) return traces.status();
        r.traces = *std::move(traces);
        return r;
      }
      absl::StatusOr<std::vector<Timeline>> t = SnapshotTimelines(path, options.device_memory);
      if (!t.ok()) return t.status();
      r.timelines = *std::move(t);
      return r;
    }
    case RecordingKind::kJsonLines:
    case RecordingKind::kRmmLog: {
      if (!want_requests) return NotARecording(path, r.kind);
      absl::StatusOr<RequestTrace> trace = [&]() -> absl::StatusOr<RequestTrace> {
        if (r.kind == RecordingKind::kJsonLines) return ReadJsonlTraceFile(path);
        if (absl::Status s = CheckInputFileSize(path, "request trace", kMaxTraceFileBytes); !s.ok()) return s;
        std::ifstream in(path);
        return ReadRmmCsv(in, path);
      }();
      if (!trace.ok()) return trace.status();
      r.requests = *std::move(trace);
      return r;
    }
    case RecordingKind::kReport: {
      if (want_requests) {
        return absl::InvalidArgumentError(absl::StrCat("'", path, "' is a report.json, not a request trace"));
      }
      absl::StatusOr<Report> report = ReadReportFile(path);
      if (!report.ok()) return report.status();
      r.report = *std::move(report);
      return r;
    }
    case RecordingKind::kTimeline:
    case RecordingKind::kUnknown:
      break;
  }
  if (r.kind == RecordingKind::kUnknown && want_requests) {
    // An unknown or empty file gets the JSON-lines reader's own error.
    absl::StatusOr<RequestTrace> trace = ReadJsonlTraceFile(path);
    if (!trace.ok()) return trace.status();
    r.kind = RecordingKind::kJsonLines;
    r.requests = *std::move(trace);
    return r;
  }
  // A timeline, or what the timeline reader then names as not one.
  absl::StatusOr<Timeline> t = ReadTimelineFile(path);
  if (!t.ok()) return t.status();
  r.kind = RecordingKind::kTimeline;
  r.timelines.push_back(*std::move(t));
  return r;
}

absl::StatusOr<std::vector<Timeline>> LoadTimelines(const std::string& path, const OpenOptions& options) {
  absl::StatusOr<Recording> r = OpenRecording(path, options);
  if (!r.ok()) return r.status();
  if (r->kind == RecordingKind::kReport) return NotARecording(path, r->kind);
  return std::move(r->timelines);
}

absl::StatusOr<LoadedReport> LoadReport(const std::string& path) {
  absl::StatusOr<Recording> r = OpenRecording(path);
  if (!r.ok()) return r.status();
  LoadedReport loaded;
  if (r->report) {
    loaded.report = *std::move(r->report);
    return loaded;
  }
  loaded.timelines = std::move(r->timelines);
  std::vector<RankReport> reports;
  for (const Timeline& t : loaded.timelines) {
    absl::StatusOr<RankReport> report = AnalyzeRank(t);
    if (!report.ok()) return report.status();
    reports.push_back(*std::move(report));
  }
  loaded.report = MakeReport(loaded.timelines.empty() ? 0 : loaded.timelines.front().world_size, std::move(reports));
  return loaded;
}

absl::StatusOr<ReplaySource> OpenReplaySource(const std::string& path, int rank) {
  absl::StatusOr<Recording> r = OpenRecording(path, {.want = OpenOptions::Want::kRequests, .device_memory = std::nullopt});
  if (!r.ok()) return r.status();
  ReplaySource out;
  if (r->requests) {
    out.trace = *std::move(r->requests);
    return out;
  }
  if (!r->traces.empty()) {
    out.snapshot = std::move(r->traces.front());
    if (r->traces.size() > 1) {
      out.snapshot->notes.push_back(absl::StrCat("the snapshot has traces for ", r->traces.size(),
                                                 " devices; replaying device ", out.snapshot->device));
    }
    out.notes = out.snapshot->notes;
    out.trace = std::move(out.snapshot->requests);  // (`snapshot` keeps what --verify reads)
    out.settings = out.snapshot->settings;
    out.device_memory = out.snapshot->device_capacity;  // the capacity its OOM implies (0: none)
    return out;
  }
  // A recording: the whole request stream of one rank, from its first event to its last.
  for (const Timeline& t : r->timelines) out.notes.insert(out.notes.end(), t.notes.begin(), t.notes.end());
  const auto t = std::find_if(r->timelines.begin(), r->timelines.end(),
                              [rank](const Timeline& each) { return each.rank == rank; });
  if (t == r->timelines.end()) return absl::NotFoundError(absl::StrCat("'", path, "' has no rank ", rank));
  const std::string source = r->kind == RecordingKind::kTimeline ? path : absl::StrCat(path, " rank ", t->rank);
  TimelineRequests requests = RequestsFromTimeline(*t, source);
  if (r->timelines.size() > 1) {
    out.notes.push_back(
        absl::StrCat("the run has ", r->timelines.size(), " ranks; replaying rank ", t->rank, " (choose with --rank)"));
  }
  if (requests.delayed_frees > 0) {
    out.notes.push_back(absl::StrCat(Counted(requests.delayed_frees, "free"),
                                     " waited on a stream in the recording; a timeline does not hold record_stream, "
                                     "so the replay completes them at once"));
  }
  if (t->settings.text != t->alloc_conf) {
    // Settings text memscope cannot parse (Timeline::SetAllocConf kept the
    // defaults): a replay "under its own settings" would not be; say why.
    return AllocatorConfig::Parse(t->alloc_conf).status();
  }
  out.trace = std::move(requests.trace);
  out.settings = t->settings;
  out.device_memory = t->device_capacity;
  return out;
}

}  // namespace memscope
