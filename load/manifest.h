// The two JSON files that describe a run (docs/design.md, "The run directory"),
// typed: run.json (`RunManifest`, schema memscope.run/1), written once by
// `memscope run`, `memscope replay --out` or `memscope capture` after the ranks end, and
// rank-R.json (`RankStatus`), written by each rank as it ends and read by
// the aggregation (run/aggregate.h). Both read back what they write (ToJson
// then FromJson is the identity), and FromJson rejects a document that is not
// one with a one-line error.
#ifndef MEMSCOPE_LOAD_MANIFEST_H_
#define MEMSCOPE_LOAD_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/analysis.h"
#include "nlohmann/json.hpp"

namespace memscope {

inline constexpr const char* kRunSchema = "memscope.run/1";
// The largest run.json and rank-R.json read (docs/run-directory.md): a
// loss per step of up to 1,000,000 steps fits.
inline constexpr std::uint64_t kMaxManifestBytes = std::uint64_t{64} << 20;

// The first loss that is not finite (the training diverged: --lr too large),
// as {index in `losses`, the loss}; nullopt when every loss is finite.
// run.json and rank-R.json write such a loss as null.
std::optional<std::pair<std::size_t, float>> FirstDivergedLoss(const std::vector<float>& losses);

// The GPU a rank ran on (run/devices.h): rank-R.json's "device".
struct RankDevice {
  int ordinal = 0;   // cuda:N in the rank
  int physical = 0;  // after CUDA_VISIBLE_DEVICES
  std::string how;   // what chose it: "LOCAL_RANK=1", "--devices same", ...
  // Memory outside the allocator: the CUDA context on this GPU, NCCL's
  // buffers on it, and contexts on other GPUs {physical, bytes} (cuda:D
  // touched before set_device).
  std::uint64_t context_bytes = 0;
  std::uint64_t nccl_bytes = 0;
  std::vector<std::pair<int, std::uint64_t>> other_contexts;
  bool operator==(const RankDevice&) const = default;
};

// A checkpoint of `memscope run --save-checkpoint/--load-checkpoint`:
// rank-R.json's "checkpoint".
struct RankCheckpoint {
  std::int64_t step = 0;
  bool saved = false;             // this rank called torch.save (one file of state_bytes)
  std::uint64_t state_bytes = 0;  // the state dict's tensors: parameters, buffers, optimizer state
  std::string map_location;       // "none", "cpu", "cuda:R"; "" without a load
  std::string loaded_onto;        // where torch.load put the tensors: "cuda:N" or "cpu"
  bool loaded = false;            // the load completed
  // The GPU the tensors were loaded onto once every rank had loaded (before
  // load_state_dict): its physical index (-1: a load to the host), its used
  // bytes (every process) and each rank's share.
  int load_physical = -1;
  std::uint64_t gpu_used = 0;
  std::vector<std::uint64_t> gpu_used_by_rank;
  bool operator==(const RankCheckpoint&) const = default;
};

// rank-R.json: how one rank of `memscope run` ended.
struct RankStatus {
  int rank = 0;
  std::string status;  // "ok", "oom", "comm_error", "nccl_error", "error" or "interrupted" (Ctrl-C, SIGTERM)
  int exit_code = 0;
  std::string error;  // the OOM, tensor or collective error ("" when ok)
  std::int64_t parameters = 0;
  std::int64_t steps_done = 0;
  double seconds = 0;
  std::vector<float> losses;      // per step (--exec cpu)
  std::optional<DdpBuckets> ddp;  // with --ddp copy|view
  std::optional<RankDevice> device;
  std::optional<RankCheckpoint> checkpoint;
  bool operator==(const RankStatus&) const = default;

  nlohmann::json ToJson() const;
  static absl::StatusOr<RankStatus> FromJson(const nlohmann::json& j);
  // Writes PATH atomically (a temporary, then renamed): a reader never sees half a status.
  absl::Status Write(const std::string& path) const;
  // Reads PATH; nullopt when it is missing or not a rank status (the rank
  // died before writing it).
  static std::optional<RankStatus> Read(const std::string& path);
};

// One rank's entry in run.json. Which optional fields are there depends on
// what is known: a replay writes rank, status, exit_code and timeline; `memscope run`
// adds the error, the steps done (from the rank's status) and, for launched
// ranks, the signal and how it ended.
struct ManifestRank {
  int rank = 0;
  std::string timeline;  // file name in the run directory
  std::string status;    // RankStatus::status, or "failed" (no status), "killed", "stopped" (by our launcher)
  std::optional<int> exit_code;
  std::optional<std::string> error;
  std::optional<std::int64_t> steps_done;
  std::optional<int> signal;
  std::optional<std::string> how;  // RankExit::Describe()
  bool operator==(const ManifestRank&) const = default;
};

// The training settings of a `memscope run` manifest.
struct TrainingManifest {
  std::string model;
  std::int64_t parameters = 0;
  std::int64_t steps = 0;
  std::int64_t steps_done = 0;
  std::int64_t batch_size = 0;  // 0: the model's
  std::string optimizer, optimizer_impl, zero_grad, amp;
  // --torch-version ("" in a run.json written before memscope had it).
  std::string torch_version;
  bool checkpoint_activations = false;
  std::int64_t grad_accum = 1;
  std::string attention, exec;
  std::string ddp;  // "off", "copy" or "view"
  std::string zero;  // --zero "on" or "bucket-view"; "" when off (run.json has no "zero" then)
  // The model's options when given (run.json has each only then): --seq-len,
  // --width, --depth, --dtype, --lora, --gpu.
  std::int64_t seq_len = 0, width = 0, depth = 0;
  std::string dtype, lora, gpu;
  double seconds = 0;
  std::vector<float> losses;
  // The DDP options (present unless ddp is "off").
  struct Ddp {
    std::optional<double> bucket_cap_mb;  // null: PyTorch's default
    bool find_unused_parameters = false;
    bool static_graph = false;
    std::string comm_hook = "none";
    bool broadcast_buffers = true;
    bool operator==(const Ddp&) const = default;
  };
  std::optional<Ddp> ddp_options;
  // torch.nn.DataParallel (ddp "dp"): one process over `device_ids`; rank R
  // of the run is device cuda:R. run.json's "data_parallel".
  struct DataParallel {
    std::vector<int> device_ids;
    int output_device = 0;
    std::int64_t global_batch = 0;
    std::vector<std::int64_t> chunk_sizes;  // the batch scattered: one chunk per device used
    bool operator==(const DataParallel&) const = default;
  };
  std::optional<DataParallel> data_parallel;
  bool operator==(const TrainingManifest&) const = default;
};

// The first failure of a run: its rank and the message printed for it.
struct RunFailure {
  int rank = 0;
  std::string message;
  bool operator==(const RunFailure&) const = default;
};

// What `memscope capture` ran (run.json's "capture", command "capture").
struct CaptureManifest {
  std::vector<std::string> argv;  // the job's command line
  int exit_status = 0;            // as a shell says it: the job's exit code, or 128 + the signal that ended it
  std::optional<int> signal;      // the signal that ended the job
  std::uint64_t max_entries = 0;  // the ring of the memory history (_record_memory_history's max_entries)
  bool operator==(const CaptureManifest&) const = default;
};

// run.json.
struct RunManifest {
  std::string generator;  // kMemscopeVersion of the writer
  std::string command;    // "run", "replay" or "capture"
  int world_size = 1;
  std::string alloc_conf;
  std::uint64_t device_memory = 0;
  std::vector<ManifestRank> ranks;
  std::optional<TrainingManifest> training;  // command "run"
  std::optional<std::string> source;         // command "replay": the request trace
  std::optional<CaptureManifest> capture;    // command "capture"; its ranks' "timeline" is snapshot-rank-R.pickle
  std::optional<RunFailure> failure;
  // The run was stopped by this signal ("SIGINT": Ctrl-C, or "SIGTERM")
  // before its last step; what it recorded until then is analysed.
  std::optional<std::string> interrupted;
  bool operator==(const RunManifest&) const = default;

  nlohmann::json ToJson() const;
  static absl::StatusOr<RunManifest> FromJson(const nlohmann::json& j);
  absl::Status Write(const std::string& path) const;
  // Errors name the path: missing, not JSON, not memscope.run/1.
  static absl::StatusOr<RunManifest> Read(const std::string& path);
};

}  // namespace memscope

#endif  // MEMSCOPE_LOAD_MANIFEST_H_
