// The rank launcher behind `memscope run --world-size N`, like torchrun's
// elastic agent on one machine: starts N copies of a command with RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set, and supervises
// them. When one rank fails (non-zero exit or a signal), the others get
// `grace` to stop on their own (their collectives fail fast once a peer is
// gone, or time out), then SIGTERM, then SIGKILL. Nothing hangs. A rank
// whose failure its peers cannot see (it never joined the rendezvous: it
// could not write its timeline on a full disk, say) asks for the SIGTERM at
// once (ReportToLauncher's RankFailure), and the run ends within a second.
#ifndef MEMSCOPE_RUN_LAUNCHER_H_
#define MEMSCOPE_RUN_LAUNCHER_H_

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace memscope {

struct RankExit {
  int rank = 0;
  int exit_code = 0;                 // when it exited
  int signal = 0;                    // when a signal ended it (0 otherwise)
  // SIGTERM/SIGKILL sent by us after another rank failed, and it ended by
  // it (killed, or exited with 128 + SIGTERM: it stopped as asked).
  bool stopped_by_launcher = false;
  int stalled_by = 0;                // it was stopped (e.g. SIGSTOP) longer than `stall`; we killed it
  double stalled_seconds = 0;        // how long it was stopped then
  double seconds = 0;                // since the launch
  // The one line the rank wrote to its status pipe ($MEMSCOPE_STATUS_FD) as
  // it failed: its error, even when its log could not be written.
  std::string message;
  // The rank asked for the run to stop at once (RankFailure kStopRun or
  // kCannotRun): its peers cannot notice its failure themselves.
  bool stop_run = false;
  // It could not run at all (kCannotRun: its timeline, status, store or
  // ledger could not be written): the cause of what its peers see.
  bool cannot_run = false;
  bool ok() const { return signal == 0 && exit_code == 0; }
  std::string Describe() const;  // "exited with status 3", "was killed by signal 9 (SIGKILL)"
};

struct LaunchOptions {
  std::string executable;         // absolute path
  std::vector<std::string> args;  // argv[1..]
  int world_size = 1;
  std::map<std::string, std::string> env;  // added to every rank's environment
  std::string log_dir;                     // a run directory: its rank-R.log (stdout and stderr) per rank
  std::chrono::milliseconds grace{60000};
  // A rank stopped (SIGSTOP, SIGTSTP: it makes no progress) for this long is
  // the run's failure: it is killed, and the others fail at once.
  std::chrono::milliseconds stall{30000};
};

// Each rank gets a status pipe: its fd in $MEMSCOPE_STATUS_FD, where a rank
// writes its last error line (ReportToLauncher) before it exits.
//
// Under InterruptHandlers (run/interrupt.h), the first SIGINT or SIGTERM is
// passed on to every rank, which stops before its next phase; one still
// running 10 s later is killed.
//
// Runs the ranks to the end. The first failure is first among the results'
// non-ok entries by time (`first_failure`, -1 when all succeeded).
struct LaunchResult {
  std::vector<RankExit> ranks;  // by rank
  int first_failure = -1;
  // The SIGINT or SIGTERM this process received while the ranks ran
  // (run/interrupt.h), passed on to them; 0 when none. Failures after it are
  // its consequences, not the run's first failure.
  int interrupted = 0;
};
absl::StatusOr<LaunchResult> LaunchRanks(const LaunchOptions& options);

// What a rank's failure means for its peers (ReportToLauncher).
enum class RankFailure {
  kError,     // its peers notice it themselves (its communicator is gone)
  kStopRun,   // they cannot (it failed in the rendezvous): the launcher stops them at once
  kCannotRun, // as kStopRun, and the rank could not run at all (a file it cannot write): when a peer
              // failed less than a second before it, this rank's failure is the run's first (the cause)
};

// In a rank started by LaunchRanks: sends `line` (one line) to the launcher
// through the status pipe, as `kind`. Does nothing elsewhere.
void ReportToLauncher(const std::string& line, RankFailure kind = RankFailure::kError);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_LAUNCHER_H_
