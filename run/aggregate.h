// After the ranks of `memscope run` end: read their statuses, decide the
// run's outcome and exit status, write run.json and the run's outputs
// (report.json with each rank's status and DDP buckets, summary.txt, ...).
// The command prints what it returns.
//
// Exit statuses: 0 when every rank ended well; kExitOutOfMemory when a rank
// ran out of memory (the OOM is recorded and reported); kExitRankFailed when
// a rank failed otherwise (killed, a collective timed out or mismatched, a
// crash) or wrote no status; 128 + the signal when Ctrl-C or SIGTERM
// stopped the run (what it recorded is reported all the same).
#ifndef MEMSCOPE_RUN_AGGREGATE_H_
#define MEMSCOPE_RUN_AGGREGATE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/analysis.h"
#include "recording/event.h"
#include "run/launcher.h"
#include "load/manifest.h"
#include "load/run_directory.h"

namespace memscope {

// An OOM during the run: recorded and reported, with its own status.
inline constexpr int kExitOutOfMemory = 3;
// A rank failed: killed, a collective timed out or mismatched, or it crashed.
inline constexpr int kExitRankFailed = 4;
// --backend nccl refused the communicator: two ranks of one host on one GPU
// (NCCL's "Duplicate GPU detected", ncclInvalidUsage).
inline constexpr int kExitNcclInvalidUsage = 5;
// Every rank ended well but an output (run.json, report.json, trace.json,
// ...) could not be written: each is named on stderr. The same status as
// unusable options and files (cli/commands.h kExitBadInput).
inline constexpr int kExitOutputFailed = 2;

// What the aggregation needs to know of a finished run.
struct RunRecord {
  RunDirectory dir{""};
  int world_size = 1;
  // The run's settings for run.json; parameters, steps_done, seconds and
  // losses are filled from the ranks' statuses.
  TrainingManifest training;
  std::string alloc_conf;
  std::uint64_t device_memory = 0;
  // Our launcher's view of the ranks (empty for one in-process rank or for
  // an external launcher) and its first failure (-1: none).
  std::vector<RankExit> exits;
  int first_failure = -1;
  // The SIGINT or SIGTERM that stopped the run before its end (run/interrupt.h), 0 when none.
  int interrupted = 0;
};

// The outcome of a run, as written to its directory.
struct RunOutcome {
  RunManifest manifest;                             // run.json
  std::vector<std::optional<RankStatus>> statuses;  // by rank; nullopt: the rank wrote none
  std::vector<Timeline> timelines;                  // this run's ranks, as recorded
  std::vector<RankReport> reports;                  // their analyses (report.json)
  // 0, kExitOutOfMemory, kExitRankFailed, kExitNcclInvalidUsage, kExitOutputFailed, or 128 + the signal of an
  // interrupted run (130 for SIGINT, 143 for SIGTERM, as a shell says it).
  int exit_code = 0;
  int interrupted = 0;  // RunRecord::interrupted: the command says one line, no tables
  // What `memscope run` says on stderr about failed ranks: each line starts
  // "memscope run: " (an OOM's message and verdict follow on their own lines).
  std::string diagnostics;
};

// The communicator's errors name their rank first ("rank 1: ..."); where the
// rank is already named, that prefix goes.
std::string WithoutRankPrefix(std::string error, int rank);

// Reads the ranks' statuses from `run.dir`, writes run.json and the outputs
// (run/run.h WriteRunOutputs) and decides the exit status. Errors: the
// recordings cannot be read or analysed, or an output cannot be written.
absl::StatusOr<RunOutcome> AggregateRun(const RunRecord& run);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_AGGREGATE_H_
