// One rank of `memscope run`: trains the reference loop on a RankSession,
// recording into rank-R.timeline, and writes rank-R.json (RankStatus) as it
// ends. run/run_request.h MakeRankPlan builds the plan from the flags.
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
#include "tensor/autograd.h"
#include "load/manifest.h"
#include "load/run_directory.h"
#include "tensor/blas_workspace.h"
#include "train/trainer.h"

namespace memscope {

// A scenario of `memscope run --scenario`: a mistake from users' DDP jobs,
// made by one rank, so that the run shows how it fails (a collective
// mismatch or a lost peer, named; never a hang).
struct Scenario {
  enum class Kind {
    kNone,
    kKill,         // kill:R:S      rank R is killed (SIGKILL) as backward of step S begins
    kSkipBarrier,  // skip-barrier:R:S  every rank but R calls dist.barrier() after step S
    kOnlyBarrier,  // only-barrier:R:S  only rank R calls dist.barrier() after step S
                   //                   (a barrier inside `if rank == 0:`)
    kExtraStep,    // extra-step:R  rank R trains one step more than the others (uneven inputs)
  };
  Kind kind = Kind::kNone;
  int rank = -1;
  std::int64_t step = -1;  // -1 for extra-step
};

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
  BlasWorkspaceSizes blas_workspaces;  // cuBLAS/cuBLASLt (tensor/blas_workspace.h)
  bool cpu = false;                    // --exec cpu: real float math on a host-backed device
  std::string ddp;                     // "off", "copy" or "view"
  DeviceMap devices;                   // --devices (run/devices.h)
  // Memory outside the caching allocator (docs/ddp.md, "The whole GPU").
  bool nccl = false;                     // --backend nccl: NCCL's checks and buffers; data over Gloo
  std::uint64_t cuda_context_bytes = 0;  // --cuda-context-mb: each process's context on each GPU it touches
  std::uint64_t nccl_buffer_bytes = 0;   // --nccl-buffers-mb: per NCCL communicator
  std::optional<int> touch_device;       // --touch-device D: cuda:D used before set_device
  CheckpointPlan checkpoint;
  std::chrono::milliseconds timeout{60000};  // of each collective and the rendezvous
  Scenario scenario;                         // --scenario
  // --torch-version's autograd behaviours, set on the thread that trains.
  TorchBehaviour torch_behaviour;
};

// Trains rank `rank` of `world_size` into `dir` (its rendezvous: $MEMSCOPE_STORE
// or dir's store, over Gloo when world_size > 1) and writes its rank-R.json.
// Returns that status: an OOM, a tensor error or a collective error ends the
// rank and is in it (exit_code 3 or 4). Errors: the timeline or the status
// cannot be written, or the plan is invalid. `rendezvous_failed` (when
// given) is set when the rank never got past the rendezvous: its peers
// cannot see it fail (run/launcher.h RankFailure::kStopRun).
absl::StatusOr<RankStatus> RunRank(RankPlan plan, int rank, int world_size, const RunDirectory& dir,
                                   bool* rendezvous_failed = nullptr);

// `memscope run --dp N`: DataParallel in this process over N simulated GPUs
// (train/data_parallel.h), each with its own allocator and recorder, so that
// the run reads as N ranks: rank R is device cuda:R, recorded in
// rank-R.timeline, its status in rank-R.json (an OOM is on the device whose
// allocation failed; the losses are device 0's). Returns the statuses and
// the chunk sizes of the batch. Errors: a timeline or status cannot be
// written, or the options do not fit DataParallel.
struct DataParallelRun {
  std::vector<RankStatus> statuses;
  std::vector<std::int64_t> chunk_sizes;
};
absl::StatusOr<DataParallelRun> RunDataParallel(const RankPlan& plan, int devices, const RunDirectory& dir);

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
