// Loading: what a user hands memscope, opened once. Every command that reads
// a path (summary, frag, trace, snapshot, report, check, compare, replay)
// goes through OpenRecording, which decides what the path is exactly once
// (DetectRecording) and returns it typed: a run directory's timelines, a
// capture's snapshots read as ranks, one timeline file, a PyTorch snapshot
// (replayed into timelines, or its request traces for `memscope replay`), a
// JSON-lines or RMM request trace, or a report.json. Each recording's
// allocator settings are parsed once, by its reader (Timeline::settings,
// ImportedTrace::settings); nothing after the load parses them again.
//
//   absl::StatusOr<Recording> r = OpenRecording("runs/a");
//   if (!r.ok()) return Fail(r.status().message());      // names the path
//   for (const Timeline& t : r->timelines) ...            // one per rank
//
// The run directory's files are named in load/run_directory.h, run.json is
// typed in load/manifest.h.
#ifndef MEMSCOPE_LOAD_RECORDING_H_
#define MEMSCOPE_LOAD_RECORDING_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "exporters/report.h"
#include "importers/request_trace.h"
#include "importers/snapshot_import.h"
#include "load/manifest.h"
#include "recording/event.h"

namespace memscope {

enum class RecordingKind {
  kRunDirectory,  // rank-R.timeline files (named by its run.json when it has one)
  kCapture,       // a `memscope capture` directory: snapshot-rank-R.pickle per rank
  kTimeline,      // one rank-R.timeline file
  kSnapshot,      // a PyTorch snapshot pickle (torch.cuda.memory._snapshot())
  kJsonLines,     // a request trace in JSON lines (docs/replay.md)
  kRmmLog,        // RMM's logging_resource_adaptor CSV
  kReport,        // a report.json (schema memscope.report/1), or a JSON document meant as one
  kUnknown,       // none of these (an empty file too)
};
std::string_view RecordingKindName(RecordingKind kind);

// What PATH is: a directory is a run (a capture when its run.json says so);
// a file is told by its first bytes: a pickle (protocols 2-5: 0x80; 0 and 1
// of a dict or list: "(d", "(l", "}(", "}q", "}r", "}.", "](", ...), a
// memscope timeline (its magic), RMM's CSV (its header), JSON lines (a first
// line that is a whole JSON object without a "schema", or '#'), or a JSON
// document (a report.json). Errors: the path does not exist or cannot be read.
absl::StatusOr<RecordingKind> DetectRecording(const std::string& path);
// How many times DetectRecording has run in this process: the tests prove
// with it that each load detects its input once.
std::uint64_t DetectCount();

// The size of the simulated GPU a PyTorch snapshot is replayed on when the
// user gives none: the capacity its OOM entry implies, else 80 GiB.
inline constexpr std::uint64_t kDefaultReplayDeviceMemory = 80ULL << 30;
std::uint64_t SnapshotDeviceMemory(const ImportedTrace& trace, std::optional<std::uint64_t> asked);

struct OpenOptions {
  // What the caller reads: recordings (timelines; a request trace is an
  // error), or requests to replay (a snapshot's traces are not replayed
  // here; an unknown file gets the JSON-lines reader's error).
  enum class Want { kTimelines, kRequests };
  Want want = Want::kTimelines;
  // The simulated GPU a snapshot's trace is replayed on (kTimelines);
  // nullopt: SnapshotDeviceMemory's default.
  std::optional<std::uint64_t> device_memory;
};

// One opened input. Which members are filled depends on `kind` (and on
// OpenOptions::want for a snapshot).
struct Recording {
  std::string path;
  RecordingKind kind = RecordingKind::kUnknown;
  std::optional<RunManifest> manifest;    // a run directory's run.json, when it has a valid one
  std::vector<Timeline> timelines;        // run directory, capture, timeline; a snapshot under kTimelines
  std::vector<ImportedTrace> traces;      // a snapshot under kRequests: one per device
  std::optional<RequestTrace> requests;   // JSON lines, RMM log
  std::optional<Report> report;           // report.json
};

// Opens PATH (see RecordingKind). Errors name the path and what is wrong: it
// does not exist, a directory without timelines, a capture with no
// snapshot, a reader's own error, a request trace where recordings are
// wanted, a report where requests are wanted.
absl::StatusOr<Recording> OpenRecording(const std::string& path, const OpenOptions& options = {});

// The timelines of PATH, one per rank in rank order (OpenRecording with
// Want::kTimelines; a report.json is an error: it holds no recording).
absl::StatusOr<std::vector<Timeline>> LoadTimelines(const std::string& path, const OpenOptions& options = {});

// A report and, when it was analysed here, the recording it analyses.
struct LoadedReport {
  Report report;
  std::vector<Timeline> timelines;  // empty when read from a report.json file
};

// The report of PATH: a report.json as it is, or any recording analysed
// afresh (AnalyzeRank per timeline, MakeReport). The readers' notes are in
// the timelines' `notes`. Errors: OpenRecording's, "'PATH' is not valid
// JSON", ReportFromJson's, AnalyzeRank's.
absl::StatusOr<LoadedReport> LoadReport(const std::string& path);

// What `memscope replay` replays: one request stream and the defaults its
// source brings.
struct ReplaySource {
  RequestTrace trace;
  // A PyTorch snapshot's device (its settings and segment actions, for
  // --verify); its requests are moved into `trace`.
  std::optional<ImportedTrace> snapshot;
  // The source's own settings (a recording's or a snapshot's), parsed when
  // it was read; nullopt for request traces (JSON lines, RMM).
  std::optional<AllocatorConfig> settings;
  // The source's own GPU size: a recording's capacity, or the capacity a
  // snapshot's OOM implies; 0 when it has none.
  std::uint64_t device_memory = 0;
  // What the user should know about what is replayed (printed on stderr).
  std::vector<std::string> notes;
};

// The request stream of PATH: a JSON-lines or RMM trace, a PyTorch
// snapshot's first device, or rank `rank` of a recording (run directory or
// timeline: its whole request stream, from its first event to its last).
// Errors: OpenRecording's (Want::kRequests), a rank the recording lacks.
absl::StatusOr<ReplaySource> OpenReplaySource(const std::string& path, int rank);

}  // namespace memscope

#endif  // MEMSCOPE_LOAD_RECORDING_H_
