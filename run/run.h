// Writing a run's outputs (one driver: two walks over each rank's events),
// `memscope replay --out`, and one side of `memscope compare`. Loading is
// load/'s (load/recording.h); a run directory's files are named in
// load/run_directory.h.
#ifndef MEMSCOPE_RUN_RUN_H_
#define MEMSCOPE_RUN_RUN_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "analysis/analysis.h"
#include "compare/compare.h"
#include "exporters/report.h"
#include "importers/replayer.h"
#include "importers/request_trace.h"
#include "load/recording.h"
#include "nlohmann/json.hpp"
#include "recording/event.h"

namespace memscope {

// Reads PATH as LoadReport does (load/recording.h: run directory, timeline
// file, PyTorch snapshot, report.json) plus the run.json of the run
// directory, or the one next to the file, when there is one, as one side of
// `memscope compare`. `notes` (if given) receives the readers' notes.
// Errors: LoadReport's.
absl::StatusOr<CompareInput> LoadCompareInput(const std::string& path, std::vector<std::string>* notes = nullptr);

// What `memscope replay --out` recorded: the replay's own result and the
// analyses of the run it wrote.
struct RecordedReplay {
  ReplayResult replay;
  std::vector<RankReport> reports;
};

// `memscope replay --out DIR`: replays `trace` under `config` on a simulated
// GPU of `device_memory` bytes, recording into DIR (claimed as memscope run
// does: RunDirectory::Claim, `force` for --force) as rank 0, writes its
// run.json (command "replay") and the run's outputs (WriteRunOutputs).
// Errors: DIR is refused, the directory or a file cannot be written, the
// replay's own errors.
absl::StatusOr<RecordedReplay> RecordReplayRun(const std::string& dir, const RequestTrace& trace,
                                               const AllocatorConfig& config, std::uint64_t device_memory,
                                               bool force = false);

// Writes report.json, summary.txt, trace.json, snapshot-rank-R.pickle (at
// each rank's peak) and report.html into `dir` for these timelines, in two
// walks over each rank's events (analysis/timeline_walk.h). Returns the
// analyses, amended. `amend`, when given, fills what only the caller knows (a
// run's first failure, and each rank's status, DDP buckets and losses:
// Report's and RankReport's fields for them) before report.json is written. Each file is written whole or not at all (a
// temporary name, then renamed; run/output_file.h); one that cannot be
// written does not stop the others. Its error ("cannot write 'PATH':
// REASON") goes to `write_errors` when given; else the first is returned
// (naming how many more failed) after every output was tried. The GPU table
// `amend` puts in Report::gpus is written to report.json, summary.txt, the
// trace and the page.
absl::StatusOr<std::vector<RankReport>> WriteRunOutputs(const std::string& dir, const std::vector<Timeline>& timelines,
                                                        const std::function<void(Report& report)>& amend = {},
                                                        std::vector<absl::Status>* write_errors = nullptr);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_RUN_H_
