// A run directory (DESIGN.md): RUN/run.json, RUN/rank-R.timeline,
// RUN/report.json, RUN/summary.txt, RUN/trace.json,
// RUN/snapshot-rank-R.pickle, RUN/report.html. Commands take a run directory or a single
// timeline file.
#ifndef MEMSCOPE_RUN_RUN_H_
#define MEMSCOPE_RUN_RUN_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "allocator/config.h"
#include "analysis/analysis.h"
#include "recording/event.h"
#include "importers/replayer.h"
#include "importers/request_trace.h"
#include "compare/compare.h"

namespace memscope {

// Reads every rank-R.timeline of a run directory (ordered by rank), one
// timeline file, or a PyTorch snapshot pickle (each device's trace replayed
// under the snapshot's own allocator settings on a simulated GPU of
// `device_memory` bytes; one Timeline per device, rank = device). Errors name
// the path and what is wrong.
absl::StatusOr<std::vector<Timeline>> LoadRun(const std::string& path, std::uint64_t device_memory = 80ULL << 30);

// A run's report (memscope.report/1) and, when it was analysed here, the
// recording it analyses.
struct LoadedReport {
  nlohmann::json report;
  std::vector<Timeline> timelines;  // empty when read from a report.json file
};

// The report of a run directory, timeline file or PyTorch snapshot (loaded
// with LoadRun and analysed afresh), or of a report.json file (recognised by
// its content: a JSON object). Errors name the path: missing, unreadable, not
// JSON, not memscope.report/1, or LoadRun's and AnalyzeRank's errors. The
// readers' notes are in the timelines' `notes`.
absl::StatusOr<LoadedReport> LoadReport(const std::string& path);

// Reads PATH as LoadReport does (run directory, timeline file, PyTorch
// snapshot, report.json) plus the run.json of the run directory, or the one
// next to the file, when there is one, as one side of `memscope compare`.
// `notes` (if given) receives the readers' notes. Errors: LoadReport's.
absl::StatusOr<CompareInput> LoadCompareInput(const std::string& path, std::vector<std::string>* notes = nullptr);

// Replays a request trace under `config`, recording it into a Timeline; the
// replay's own result goes to `result` when given.
absl::StatusOr<Timeline> RecordReplay(const RequestTrace& trace, const AllocatorConfig& config,
                                      std::uint64_t device_memory, int rank, ReplayResult* result = nullptr);

// Writes report.json, summary.txt, trace.json, snapshot-rank-R.pickle (at
// each rank's peak) and report.html into `dir` for these timelines, in two
// walks over each rank's events (analysis/timeline_walk.h). Returns the analyses.
// `amend_report`, when given, adds what only the caller knows (e.g. a run's
// DDP buckets) to report.json before it is written.
absl::StatusOr<std::vector<RankReport>> WriteRunOutputs(
    const std::string& dir, const std::vector<Timeline>& timelines,
    const std::function<void(nlohmann::json& report)>& amend_report = {});

// What a run directory holds, for the "recorded in DIR/ (...)" line:
// "run.json, rank-0.timeline, report.json, ..." (rank-0..N-1 files for N ranks).
std::string RunOutputListing(int world_size);

// The path of rank R's timeline in a run directory.
std::string TimelinePath(const std::string& dir, int rank);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_RUN_H_
