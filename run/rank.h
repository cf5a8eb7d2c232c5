// One rank of `memscope run`: trains the reference loop on a RankSession,
// recording into rank-R.timeline, and writes rank-R.json (RankStatus) as it
// ends. The command (cli/run_command.cpp) builds the plan from its flags.
#ifndef MEMSCOPE_RUN_RANK_H_
#define MEMSCOPE_RUN_RANK_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "run/devices.h"
#include "run/launcher.h"
#include "run/manifest.h"
#include "run/run_directory.h"
#include "train/trainer.h"

namespace memscope {

// Everything a rank needs, checked before anything is written.
struct RankPlan {
  TrainOptions train;
  AllocatorConfig config;
  std::uint64_t device_memory = 0;
  bool cpu = false;   // --exec cpu: real float math on a host-backed device
  std::string ddp;    // "off", "copy" or "view"
  DeviceMap devices;  // --devices (run/devices.h)
  // Memory outside the caching allocator (README "The whole GPU").
  bool nccl = false;                         // --backend nccl: NCCL's checks and buffers; data over Gloo
  std::uint64_t cuda_context_bytes = 0;      // --cuda-context-mb: each process's context on each GPU it touches
  std::uint64_t nccl_buffer_bytes = 0;       // --nccl-buffers-mb: per NCCL communicator
  std::optional<int> touch_device;           // --touch-device D: cuda:D used before set_device
  std::chrono::milliseconds timeout{60000};  // of each collective and the rendezvous
  // Testing (--fault-kill, --fault-skip-barrier): {RANK, STEP}, -1 when off.
  std::pair<int, std::int64_t> fault_kill{-1, -1}, fault_skip_barrier{-1, -1};
};

// Trains rank `rank` of `world_size` into `dir` (its rendezvous: $MEMSCOPE_STORE
// or dir's store, over Gloo when world_size > 1) and writes its rank-R.json.
// Returns that status: an OOM, a tensor error or a collective error ends the
// rank and is in it (exit_code 3 or 4). Errors: the timeline or the status
// cannot be written, or the plan is invalid.
absl::StatusOr<RankStatus> RunRank(RankPlan plan, int rank, int world_size, const RunDirectory& dir);

// Starts `world_size` ranks as processes of this executable with `args`
// (the rank's own command line) under our launcher (run/launcher.h): logs in
// dir's rank-R.log, rendezvous in dir's store (removed afterwards), the
// others stopped `timeout` + 5 s after a first failure, a rank stopped
// (SIGSTOP) for `timeout` / 2 killed as the run's failure. Errors: this
// executable cannot be found, or the launcher's.
absl::StatusOr<LaunchResult> LaunchRankProcesses(const RunDirectory& dir, std::vector<std::string> args, int world_size,
                                                 std::chrono::milliseconds timeout);

// For rank 0 of an external launcher (torchrun, Slurm): waits until every
// rank has written its rank-R.json, or `timeout` has passed.
void WaitForRankStatuses(const RunDirectory& dir, int world_size, std::chrono::milliseconds timeout);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_RANK_H_
