// One rank of `memscope run`: trains the reference loop on a RankSession,
// recording into rank-R.timeline, and writes rank-R.json (RankStatus) as it
// ends. The command (cli/run_command.cpp) builds the plan from its flags.
#ifndef MEMSCOPE_RUN_RANK_H_
#define MEMSCOPE_RUN_RANK_H_

#include <chrono>
#include <cstdint>
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

// --save-checkpoint rank0|all, --load-checkpoint none|cpu|cuda:R and
// --checkpoint-step S: what each rank does in the checkpoint phase of step S
// (train/trainer.h). Loading without --save-checkpoint loads the file rank 0
// saved (the usual `if rank == 0: torch.save`).
struct CheckpointPlan {
  enum class Save { kNone, kRank0, kAll };
  enum class Load { kNone, kMapNone, kCpu, kCuda };
  Save save = Save::kNone;
  Load load = Load::kNone;
  int load_ordinal = 0;    // kCuda: map_location='cuda:R'
  std::int64_t step = -1;  // -1: no checkpoint
  bool operator==(const CheckpointPlan&) const = default;
};

// Parses the three flags ("" when not given; `step_given` for
// --checkpoint-step, default 0). Errors name the flag and its accepted values.
absl::StatusOr<CheckpointPlan> ParseCheckpointPlan(std::string_view save, std::string_view load, std::int64_t step,
                                                   bool step_given);

// --load-checkpoint cuda:R names a GPU this process sees (CUDA_VISIBLE_DEVICES
// renumbers): else CUDA's "invalid device ordinal", checked before any rank starts.
absl::Status CheckCheckpointDevice(const CheckpointPlan& plan, const DeviceEnvironment& env);

// Everything a rank needs, checked before anything is written.
struct RankPlan {
  TrainOptions train;
  AllocatorConfig config;
  std::uint64_t device_memory = 0;
  bool cpu = false;   // --exec cpu: real float math on a host-backed device
  std::string ddp;    // "off", "copy" or "view"
  DeviceMap devices;  // --devices (run/devices.h)
  CheckpointPlan checkpoint;
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
