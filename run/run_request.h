// What `memscope run` was asked for: the flags' values as a typed
// RunRequest (cli/ binds its options to the fields), the RankPlan a rank
// runs (run/rank.h), checked, built from it, a rank's command line, and the
// settings run.json records. Pure: nothing here runs or prints.
//
//   RunRequest r;
//   r.model = "mlp";
//   r.world_size = 2;
//   absl::StatusOr<RankPlan> plan = MakeRankPlan(r, "copy", r.world_size);
#ifndef MEMSCOPE_RUN_RUN_REQUEST_H_
#define MEMSCOPE_RUN_RUN_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "run/aggregate.h"
#include "run/launcher.h"
#include "run/rank.h"

namespace memscope {

// Unusable options or input (cli/commands.h kExitBadInput).
inline constexpr int kExitBadOptions = 2;

// Every flag of `memscope run`, with its default; `*_given` says a flag was
// on the command line (where its default and a given value differ in meaning).
struct RunRequest {
  std::string model = "gpt2";
  std::string model_file;  // --model-file F: the same as --model file:F
  bool model_given = false;
  std::int64_t world_size = 1;
  bool world_size_given = false;
  std::int64_t steps = 3;
  std::int64_t batch_size = 0;
  std::int64_t seq_len = 0;
  std::int64_t width = 0;
  std::int64_t depth = 0;
  // Which of --batch-size, --seq-len, --width, --depth were given (0 is refused, not "the default").
  bool sizes_given[4] = {false, false, false, false};
  std::string optimizer = "adam";
  std::string optimizer_impl = "foreach";  // --torch-version's default unless given
  bool optimizer_impl_given = false;
  // --torch-version X.Y (run/torch_version.h): the defaults of --zero-grad,
  // --optimizer-impl and --cublas-workspace, DDP's first bucket, the
  // allocator settings allowed and the autograd behaviours.
  std::string torch_version = "2.9";
  double lr = 0;
  bool lr_given = false;
  double momentum = 0.9;
  std::string ddp = "auto";
  std::string zero = "off";  // --zero off|on|bucket-view: ZeroRedundancyOptimizer
  double bucket_cap_mb = 0;
  bool bucket_cap_given = false;
  bool find_unused = false;
  bool static_graph = false;
  std::string comm_hook = "none";
  bool no_broadcast_buffers = false;
  double timeout = 60;
  std::string zero_grad = "none";  // --torch-version's default unless given
  bool zero_grad_given = false;
  std::string alloc_conf;
  bool alloc_conf_given = false;
  std::string cublas_workspace = "default";  // default, hopper or off
  double memory_fraction = 1.0;              // torch.cuda.set_per_process_memory_fraction
  bool memory_fraction_given = false;
  std::string device_memory = "80GiB";
  std::string
      gpu;  // --gpu KIND (run/gpu_kinds.h): the defaults of --device-memory, --cuda-context-mb, --cublas-workspace
  bool gpu_given = false;
  bool device_memory_given = false;
  bool cuda_context_given = false;
  bool cublas_workspace_given = false;
  std::string devices;  // --devices: "" (LOCAL_RANK), same, or one device per rank
  std::string backend = "gloo";
  double cuda_context_mb = 0;
  std::string nccl_buffers_mb = "auto";
  std::int64_t touch_device = -1;
  std::string exec = "meta";
  std::string amp = "none";
  bool checkpoint = false;
  std::string save_checkpoint;  // --save-checkpoint rank0|all
  std::string load_checkpoint;  // --load-checkpoint none|cpu|cuda:R
  std::int64_t checkpoint_step = 0;
  bool checkpoint_step_given = false;
  std::int64_t grad_accum = 1;
  std::string attention = "math";
  std::string lora;  // --lora adapter_config.json (PEFT LoRA)
  std::string dtype;  // --dtype float32|float16|bfloat16 ("": the model's own)
  std::string out = "memscope-run";
  bool force = false;  // --force: write into an --out that memscope did not write (load/run_directory.h Check)
  bool json = false;
  std::string scenario;  // --scenario NAME:RANK[:STEP] (run/rank.h Scenario)
  std::int64_t dp = 0;   // --dp N: DataParallel over N simulated GPUs in this process
  bool dp_given = false;
};

// --model, or file:F for --model-file F.
std::string ModelName(const RunRequest& r);

// --scenario NAME:RANK[:STEP] of a run of `world_size` ranks and `steps`
// steps ("" is no scenario). Errors name the option and what it accepts.
absl::StatusOr<Scenario> ParseScenario(const std::string& text, std::int64_t world_size, std::int64_t steps);

// The plan of a rank of `world_size` under `ddp_mode` (auto, off, copy or
// view), every option checked. Errors: the first unusable option, named.
absl::StatusOr<RankPlan> MakeRankPlan(const RunRequest& r, const std::string& ddp_mode, std::int64_t world_size);

// --gpu KIND: the kind's device memory, CUDA context and cuBLAS workspace,
// for those of the three options not given. The ranks get the values as
// options (ToArgs), not the kind. Errors: an unknown kind.
absl::Status ApplyGpuKind(RunRequest& r);

// --torch-version: its defaults of --zero-grad, --optimizer-impl and
// --cublas-workspace, for those not given (after ApplyGpuKind: a release
// whose cuBLAS allocates outside the allocator turns --gpu's workspace off).
// Errors: a version memscope does not model.
absl::Status ApplyTorchVersion(RunRequest& r);

// The command line of a rank ("run", then options): the same run in `ddp_mode`.
std::vector<std::string> ToArgs(const RunRequest& r, const std::string& ddp_mode);

// The settings of a run as run.json records them.
RunRecord MakeRecord(const RunRequest& r, const RankPlan& plan, int world_size, const std::vector<RankExit>& exits,
                     int first_failure);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_RUN_REQUEST_H_
