// `memscope run`'s orchestration: from a RunRequest (run/run_request.h) to
// an exit status. One rank in this process, N ranks under our launcher
// (run/launcher.h), a rank of an external launcher (RANK and WORLD_SIZE set;
// rank 0 aggregates), DataParallel over N devices (--dp), and both DDP modes
// in turn, compared (--ddp copy,view). The ranks' work is run/rank.h's, the
// outcome run/aggregate.h's. Nothing here prints: what the command says goes
// through a RunPrinter, which cli/ implements.
//
//   RunRequest r;  // from the flags
//   const int exit_status = RunCommand(r, printer);
#ifndef MEMSCOPE_RUN_RUN_COMMAND_H_
#define MEMSCOPE_RUN_RUN_COMMAND_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "allocator/config.h"
#include "compare/compare.h"
#include "run/aggregate.h"
#include "run/run_request.h"

namespace memscope {

// What `memscope run` says, in the order the orchestration calls it.
class RunPrinter {
 public:
  virtual ~RunPrinter() = default;
  // Unusable options or input: says why (one line on stderr) and returns the
  // exit status (kExitBadOptions).
  virtual int Fail(absl::string_view message) = 0;
  // Before the ranks start, in the process that runs or launches them: notes
  // on settings PyTorch ignores (`config`) and the workspace variables it
  // cannot read (`workspace_warnings`).
  virtual void SettingsNotes(const AllocatorConfig& config, const std::vector<std::string>& workspace_warnings) = 0;
  // Rank `rank` of several failed with `error` (its own rank prefix removed).
  virtual void RankFailed(int rank, absl::string_view error) = 0;
  // A rank rejected its options: `line`, the first line of its log (or the
  // error it sent its launcher), said once for all ranks.
  virtual void RankRejected(absl::string_view line) = 0;
  // The aggregated run of `request`: its tables (or report.json) and its
  // diagnostics.
  virtual void Outcome(const RunRequest& request, const RunOutcome& outcome) = 0;
  // --ddp copy,view: a pass in `mode` (copy or view) begins, and ends.
  virtual void PassBegins(absl::string_view mode) = 0;
  virtual void PassEnds() = 0;
  // --ddp copy,view: the two passes compared, once both ran.
  virtual void Comparison(const memscope::Comparison& comparison) = 0;
};

// Runs `memscope run` as `request` asks (its --gpu applied first), saying
// what happens through `printer`. Returns the exit status: kExitBadOptions
// for unusable options, else the run's (run/aggregate.h); with --ddp
// copy,view the worse of the two passes'.
int RunCommand(const RunRequest& request, RunPrinter& printer);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_RUN_COMMAND_H_
