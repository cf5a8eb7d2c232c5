#include "run/run_request.h"

#include <chrono>
#include <limits>
#include <memory>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "allocator/config.h"
#include "allocator/sizes.h"
#include "recording/timeline.h"
#include "reducer/communicator.h"
#include "run/devices.h"
#include "run/gpu_kinds.h"
#include "run/torch_version.h"
#include "tensor/blas_workspace.h"
#include "train/trainer.h"

namespace memscope {
namespace {

constexpr const char* kScenarioUsage =
    "use kill:RANK:STEP, skip-barrier:RANK:STEP, only-barrier:RANK:STEP or extra-step:RANK";

// Bounds of the numeric options: far beyond any real run, small enough that
// shapes and times computed from them cannot overflow.
constexpr std::int64_t kMaxDimension = std::int64_t{1} << 24;  // --batch-size, --seq-len, --width
constexpr std::int64_t kMaxDepth = 1 << 16;
constexpr std::int64_t kMaxSteps = 1000000;  // --steps: about three hours of gpt2 on the simulated GPU
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;  // one week

absl::Status CheckOptionRanges(const RunRequest& a) {
  const char* names[4] = {"--batch-size", "--seq-len", "--width", "--depth"};
  const std::int64_t values[4] = {a.batch_size, a.seq_len, a.width, a.depth};
  for (int i = 0; i < 4; ++i) {
    const std::int64_t max = i == 3 ? kMaxDepth : kMaxDimension;
    if (a.sizes_given[i] && (values[i] < 1 || values[i] > max)) {
      return absl::InvalidArgumentError(absl::StrCat(names[i], " ", values[i], ": use 1 to ", max));
    }
  }
  if (a.lr_given && !(a.lr > 0 && a.lr <= std::numeric_limits<float>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lr ", a.lr, ": must be a positive finite float32 number (at most 3.4e+38)"));
  }
  if (!(a.momentum >= 0 && a.momentum <= std::numeric_limits<float>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("--momentum ", a.momentum, ": must be a finite number >= 0"));
  }
  if (!(a.timeout > 0 && a.timeout <= kMaxTimeoutSeconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout ", a.timeout, ": use more than 0 and at most ", kMaxTimeoutSeconds, " seconds"));
  }
  if (a.bucket_cap_given && !(a.bucket_cap_mb > 0 && a.bucket_cap_mb <= 1024.0 * 1024 * 1024)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bucket-cap-mb ", a.bucket_cap_mb, ": must be greater than 0 and at most 1 PiB"));
  }
  if (a.steps < 1 || a.steps > kMaxSteps) {
    return absl::InvalidArgumentError(absl::StrCat("--steps ", a.steps, ": use 1 to ", kMaxSteps));
  }
  if (a.grad_accum < 1 || a.grad_accum > kMaxDimension) {
    return absl::InvalidArgumentError(absl::StrCat("--grad-accum ", a.grad_accum, ": use 1 to ", kMaxDimension));
  }
  return absl::OkStatus();
}

// --model, the sizes, --attention, --optimizer, --zero-grad and --amp.
absl::Status TrainPlan(const RunRequest& a, TrainOptions& t) {
  if (!a.model_file.empty() && a.model_given)
    return absl::InvalidArgumentError("give --model or --model-file, not both");
  t.model = ModelName(a);
  t.steps = a.steps;
  t.grad_accum = a.grad_accum;
  t.model_options.batch_size = a.batch_size;
  t.model_options.seq_len = a.seq_len;
  t.model_options.width = a.width;
  t.model_options.depth = a.depth;
  t.model_options.checkpoint_activations = a.checkpoint;
  absl::StatusOr<AttentionKind> attention = ParseAttention(a.attention);
  if (!attention.ok()) return attention.status();
  t.model_options.attention = *attention;
  if (a.gpu_given) {
    absl::StatusOr<GpuKind> kind = FindGpuKind(a.gpu);
    if (!kind.ok()) return kind.status();
    t.model_options.compute_capability = kind->compute_capability;
  }
  if (absl::Status lora = UseLora(a.lora, t.model_options); !lora.ok()) return lora;
  if (absl::Status dtype = UseDType(a.dtype, t.model_options); !dtype.ok()) return dtype;
  absl::StatusOr<OptimizerKind> kind = ParseOptimizerKind(a.optimizer);
  if (!kind.ok()) return absl::InvalidArgumentError(absl::StrCat("--optimizer: ", kind.status().message()));
  absl::StatusOr<OptimizerImpl> impl = ParseOptimizerImpl(a.optimizer_impl);
  if (!impl.ok()) return absl::InvalidArgumentError(absl::StrCat("--optimizer-impl: ", impl.status().message()));
  t.optimizer.kind = *kind;
  t.optimizer.impl = *impl;
  // torch.optim defaults: Adam/AdamW lr 1e-3 (AdamW weight_decay 1e-2); SGD needs an lr (0.01 here).
  t.optimizer.lr = static_cast<float>(a.lr > 0 ? a.lr : (*kind == OptimizerKind::kSgd ? 0.01 : 1e-3));
  if (*kind == OptimizerKind::kSgd) t.optimizer.momentum = static_cast<float>(a.momentum);
  if (*kind == OptimizerKind::kAdamW) t.optimizer.weight_decay = 1e-2f;
  if (a.zero_grad == "zeros") {
    t.zero_grad_set_to_none = false;
  } else if (a.zero_grad != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("--zero-grad '", a.zero_grad, "': use none (set_to_none=True) or zeros"));
  }
  if (a.amp == "fp16") {
    t.amp = DType::kFloat16;
  } else if (a.amp == "bf16") {
    t.amp = DType::kBFloat16;
  } else if (a.amp != "none") {
    return absl::InvalidArgumentError(absl::StrCat("--amp '", a.amp, "': use none, fp16 or bf16"));
  }
  return absl::OkStatus();
}

// --zero: ZeroRedundancyOptimizer(parameters_as_bucket_view=...) around the optimizer, with DDP.
absl::Status ZeroPlan(const RunRequest& a, RankPlan& p) {
  if (a.zero == "off") return absl::OkStatus();
  if (a.zero != "on" && a.zero != "bucket-view") {
    return absl::InvalidArgumentError(absl::StrCat("--zero '", a.zero, "': use off, on or bucket-view"));
  }
  if (!p.train.ddp) return absl::InvalidArgumentError("--zero needs DDP: --ddp copy or view, or --world-size > 1");
  p.train.zero = ZeroOptions{a.zero == "bucket-view"};
  return absl::OkStatus();
}

// --world-size, --ddp and DDP's options.
absl::Status DdpPlan(const RunRequest& a, const std::string& ddp_mode, std::int64_t world_size, RankPlan& p) {
  if (world_size < 1) return absl::InvalidArgumentError("--world-size must be at least 1");
  if (world_size > 64) return absl::InvalidArgumentError("--world-size: at most 64 ranks run on one machine");
  p.ddp = ddp_mode == "auto" ? (world_size > 1 ? "copy" : "off") : ddp_mode;
  if (p.ddp != "off" && p.ddp != "copy" && p.ddp != "view") {
    return absl::InvalidArgumentError(
        absl::StrCat("--ddp '", ddp_mode, "': use copy, view, off, or copy,view to compare"));
  }
  if (p.ddp == "off") {
    if (a.zero != "off") return ZeroPlan(a, p);  // a bad value, else "needs DDP"
    if (a.bucket_cap_given || a.find_unused || a.static_graph || a.comm_hook != "none" || a.no_broadcast_buffers) {
      return absl::InvalidArgumentError(
          "DDP options (--bucket-cap-mb, --find-unused-parameters, --static-graph, "
          "--comm-hook, --no-broadcast-buffers) need --ddp copy or view");
    }
    return absl::OkStatus();
  }
  reducer::DdpOptions d;
  d.gradient_as_bucket_view = p.ddp == "view";
  if (a.bucket_cap_given) d.bucket_cap_mb = a.bucket_cap_mb;
  d.find_unused_parameters = a.find_unused;
  d.static_graph = a.static_graph;
  d.broadcast_buffers = !a.no_broadcast_buffers;
  if (a.comm_hook == "fp16") {
    d.comm_hook = reducer::CommHook::kFp16;
  } else if (a.comm_hook == "bf16") {
    d.comm_hook = reducer::CommHook::kBf16;
  } else if (a.comm_hook != "none") {
    return absl::InvalidArgumentError(absl::StrCat("--comm-hook '", a.comm_hook, "': use none, fp16 or bf16"));
  }
  if (d.comm_hook != reducer::CommHook::kNone && p.cpu) {
    return absl::InvalidArgumentError("--comm-hook fp16|bf16 needs --exec meta (the CPU kernels compute float32)");
  }
  p.train.ddp = d;
  return ZeroPlan(a, p);
}

// NCCL's buffers per communicator when --nccl-buffers-mb is not given:
// measured on 4 A100s over NVLink under PyTorch, after a communicator's first
// 4 MB allreduce: 544 MB for a group of 2 GPUs, 688 MB for more
// (https://github.com/NVIDIA/nccl/issues/964).
constexpr double kNcclBuffersMbTwoRanks = 544;
constexpr double kNcclBuffersMbMoreRanks = 688;

// --backend, --cuda-context-mb, --nccl-buffers-mb, --touch-device: memory outside the allocator.
absl::Status OutsideMemoryPlan(const RunRequest& a, std::int64_t world_size, RankPlan& p) {
  if (a.backend != "gloo" && a.backend != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat("--backend '", a.backend, "': use gloo or nccl"));
  }
  p.nccl = a.backend == "nccl";
  constexpr double kMaxMb = 1024.0 * 1024 * 1024;  // 1 PiB
  if (!(a.cuda_context_mb >= 0 && a.cuda_context_mb <= kMaxMb)) {
    return absl::InvalidArgumentError(absl::StrCat("--cuda-context-mb ", a.cuda_context_mb, ": use 0 to 1 PiB"));
  }
  p.cuda_context_bytes = static_cast<std::uint64_t>(a.cuda_context_mb * 1024 * 1024);
  double nccl_mb = world_size > 2 ? kNcclBuffersMbMoreRanks : kNcclBuffersMbTwoRanks;
  if (a.nccl_buffers_mb != "auto") {
    if (!absl::SimpleAtod(a.nccl_buffers_mb, &nccl_mb) || !(nccl_mb >= 0 && nccl_mb <= kMaxMb)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--nccl-buffers-mb '", a.nccl_buffers_mb, "': use auto or 0 to 1 PiB (MiB)"));
    }
    if (!p.nccl) return absl::InvalidArgumentError("--nccl-buffers-mb needs --backend nccl");
  }
  p.nccl_buffer_bytes = p.nccl ? static_cast<std::uint64_t>(nccl_mb * 1024 * 1024) : 0;
  if (a.touch_device >= 0) {
    if (a.touch_device > 255) {
      return absl::InvalidArgumentError(absl::StrCat("--touch-device ", a.touch_device, ": use a device 0 to 255"));
    }
    if (p.cuda_context_bytes == 0) {
      return absl::InvalidArgumentError("--touch-device needs --cuda-context-mb (the size of the context it creates)");
    }
    p.touch_device = static_cast<int>(a.touch_device);
  } else if (a.touch_device != -1) {
    return absl::InvalidArgumentError(absl::StrCat("--touch-device ", a.touch_device, ": use a device 0 to 255"));
  }
  return absl::OkStatus();
}

// --device-memory, --devices and the memory outside the allocator.
absl::Status DevicePlan(const RunRequest& a, std::int64_t world_size, RankPlan& p) {
  absl::StatusOr<std::uint64_t> device_memory = ParseSize(a.device_memory);
  if (!device_memory.ok())
    return absl::InvalidArgumentError(absl::StrCat("--device-memory: ", device_memory.status().message()));
  if (*device_memory == 0) return absl::InvalidArgumentError("--device-memory: must be greater than 0");
  if (*device_memory > kMaxTimelineDeviceCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("--device-memory ", a.device_memory, ": at most 1 PiB"));
  }
  p.device_memory = *device_memory;
  absl::StatusOr<DeviceMap> devices = ParseDeviceMap("--devices", a.devices, static_cast<int>(world_size));
  if (!devices.ok()) return devices.status();
  p.devices = *devices;
  return OutsideMemoryPlan(a, world_size, p);
}

// --save-checkpoint, --load-checkpoint and --checkpoint-step.
absl::Status CheckpointPlanOf(const RunRequest& a, RankPlan& p) {
  absl::StatusOr<CheckpointPlan> checkpoint =
      ParseCheckpointPlan(a.save_checkpoint, a.load_checkpoint, a.checkpoint_step, a.checkpoint_step_given);
  if (!checkpoint.ok()) return checkpoint.status();
  if (checkpoint->step >= a.steps) {
    return absl::InvalidArgumentError(absl::StrCat("--checkpoint-step ", checkpoint->step, ": the run has ", a.steps,
                                                   a.steps == 1 ? " step" : " steps", " (0 to ", a.steps - 1, ")"));
  }
  if (checkpoint->step >= 0 && p.cpu) {
    return absl::InvalidArgumentError("checkpoints need --exec meta (the state dict's values are not modelled)");
  }
  if (checkpoint->step >= 0 && p.train.zero) {
    return absl::InvalidArgumentError(
        "checkpoints with --zero: ZeroRedundancyOptimizer.consolidate_state_dict() is not modelled");
  }
  p.checkpoint = *checkpoint;
  return absl::OkStatus();
}

// --alloc-conf, --memory-fraction and --cublas-workspace, under --torch-version.
absl::Status AllocatorPlan(const RunRequest& a, const TorchDefaults& torch, TorchVersion version, RankPlan& p) {
  absl::StatusOr<AllocatorConfig> config =
      a.alloc_conf_given ? AllocatorConfig::Parse(a.alloc_conf) : AllocatorConfig::FromEnvironment();
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--alloc-conf \"", a.alloc_conf, "\": ", config.status().message()));
  }
  if (absl::Status s = CheckAllocatorSettings(*config, version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(a.alloc_conf_given ? "--alloc-conf" : "PYTORCH_CUDA_ALLOC_CONF",
                                                   " \"", config->text, "\": ", s.message()));
  }
  p.config = *config;
  if (a.memory_fraction_given) {
    if (!(a.memory_fraction >= 0.0 && a.memory_fraction <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("--memory-fraction ", a.memory_fraction, ": use 0 to 1"));
    }
    // torch.cuda.set_per_process_memory_fraction(F) before the first allocation.
    p.config.per_process_memory_fraction = a.memory_fraction;
  }
  if (a.cublas_workspace != "default" && a.cublas_workspace != "hopper" && a.cublas_workspace != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cublas-workspace '", a.cublas_workspace, "': use default, hopper or off"));
  }
  if (a.cublas_workspace != "off") {
    p.blas_workspaces =
        ChooseBlasWorkspaceSizes(BlasWorkspaceEnv::FromEnvironment(), a.cublas_workspace == "hopper", nullptr);
    if (!torch.cublaslt_persistent_workspace) p.blas_workspaces.cublaslt = 0;
  }
  return absl::OkStatus();
}

// The model builds, and runs under --exec and --amp.
absl::Status CheckModel(const RankPlan& p) {
  const TrainOptions& t = p.train;
  if (absl::StatusOr<std::unique_ptr<Model>> probe = CreateModel(t.model, t.model_options); !probe.ok()) {
    return probe.status();
  }
  if (p.cpu && t.amp) return absl::InvalidArgumentError("--amp needs --exec meta (the CPU kernels compute float32)");
  if (p.cpu) {
    bool cpu_model = false;
    for (const ModelInfo& m : ListModels()) cpu_model = cpu_model || (m.name == t.model && m.cpu);
    if (!cpu_model)
      return absl::InvalidArgumentError(
          absl::StrCat("--exec cpu runs mlp and cifar-net; ", t.model, " needs --exec meta"));
  }
  return absl::OkStatus();
}

// A double as text that parses back to the same value.
std::string Exact(double v) { return absl::StrFormat("%.17g", v); }

}  // namespace

std::string ModelName(const RunRequest& r) { return r.model_file.empty() ? r.model : "file:" + r.model_file; }

absl::StatusOr<Scenario> ParseScenario(const std::string& text, std::int64_t world_size, std::int64_t steps) {
  Scenario sc;
  if (text.empty()) return sc;
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  const std::string& name = parts[0];
  const std::size_t fields = name == "extra-step" ? 2 : 3;
  sc.kind = name == "kill"           ? Scenario::Kind::kKill
            : name == "skip-barrier" ? Scenario::Kind::kSkipBarrier
            : name == "only-barrier" ? Scenario::Kind::kOnlyBarrier
            : name == "extra-step"   ? Scenario::Kind::kExtraStep
                                     : Scenario::Kind::kNone;
  if (sc.kind == Scenario::Kind::kNone || parts.size() != fields || !absl::SimpleAtoi(parts[1], &sc.rank) ||
      (fields == 3 && !absl::SimpleAtoi(parts[2], &sc.step))) {
    return absl::InvalidArgumentError(absl::StrCat("--scenario '", text, "': ", kScenarioUsage));
  }
  if (world_size < 2) return absl::InvalidArgumentError("--scenario needs --world-size 2 or more");
  if (sc.rank < 0 || sc.rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--scenario '", text, "': rank ", parts[1], " is not a rank of --world-size ", world_size));
  }
  if (fields == 3 && (sc.step < 0 || sc.step >= steps)) {
    return absl::InvalidArgumentError(absl::StrCat("--scenario '", text, "': step ", parts[2],
                                                   " is not a step of --steps ", steps, " (0 to ", steps - 1, ")"));
  }
  return sc;
}

absl::StatusOr<RankPlan> MakeRankPlan(const RunRequest& a, const std::string& ddp_mode, std::int64_t world_size) {
  if (absl::Status s = CheckOptionRanges(a); !s.ok()) return s;
  absl::StatusOr<TorchVersion> version = ParseTorchVersion(a.torch_version);
  if (!version.ok()) return version.status();
  const TorchDefaults torch = TorchDefaultsOf(*version);
  RankPlan p;
  p.torch_behaviour = torch.behaviour;
  if (absl::Status s = TrainPlan(a, p.train); !s.ok()) return s;
  if (a.exec != "meta" && a.exec != "cpu") {
    return absl::InvalidArgumentError(a.exec == "cuda"
                                          ? "--exec cuda: this build has no GPU execution path; use meta or cpu"
                                          : absl::StrCat("--exec '", a.exec, "': use meta or cpu"));
  }
  p.cpu = a.exec == "cpu";
  if (absl::Status s = DdpPlan(a, ddp_mode, world_size, p); !s.ok()) return s;
  if (p.train.ddp) p.train.ddp->first_bucket_from_cap = torch.first_bucket_from_cap;
  p.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(a.timeout * 1000));
  absl::StatusOr<Scenario> scenario = ParseScenario(a.scenario, world_size, a.steps);
  if (!scenario.ok()) return scenario.status();
  p.scenario = *scenario;
  if (absl::Status s = DevicePlan(a, world_size, p); !s.ok()) return s;
  if (absl::Status s = CheckpointPlanOf(a, p); !s.ok()) return s;
  if (absl::Status s = AllocatorPlan(a, torch, *version, p); !s.ok()) return s;
  if (absl::Status s = CheckModel(p); !s.ok()) return s;
  return p;
}

absl::Status ApplyGpuKind(RunRequest& a) {
  if (!a.gpu_given) return absl::OkStatus();
  absl::StatusOr<GpuKind> kind = FindGpuKind(a.gpu);
  if (!kind.ok()) return kind.status();
  if (!a.device_memory_given) a.device_memory = absl::StrCat(kind->total_memory);
  if (!a.cuda_context_given) a.cuda_context_mb = static_cast<double>(kind->context_mib);
  if (!a.cublas_workspace_given) a.cublas_workspace = kind->hopper ? "hopper" : "default";
  return absl::OkStatus();
}

absl::Status ApplyTorchVersion(RunRequest& a) {
  absl::StatusOr<TorchVersion> version = ParseTorchVersion(a.torch_version);
  if (!version.ok()) return version.status();
  const TorchDefaults d = TorchDefaultsOf(*version);
  if (!a.zero_grad_given) a.zero_grad = d.zero_grad;
  if (!a.optimizer_impl_given) a.optimizer_impl = d.optimizer_impl;
  if (!a.cublas_workspace_given && !d.cublas_workspace_in_allocator) a.cublas_workspace = "off";
  return absl::OkStatus();
}

std::vector<std::string> ToArgs(const RunRequest& a, const std::string& ddp_mode) {
  std::vector<std::string> v = {"run",
                                "--model",
                                ModelName(a),
                                "--steps",
                                absl::StrCat(a.steps),
                                "--optimizer",
                                a.optimizer,
                                "--optimizer-impl",
                                a.optimizer_impl,
                                "--momentum",
                                Exact(a.momentum),
                                "--ddp",
                                ddp_mode,
                                "--comm-hook",
                                a.comm_hook,
                                "--timeout",
                                Exact(a.timeout),
                                "--zero-grad",
                                a.zero_grad,
                                "--device-memory",
                                a.device_memory,
                                "--exec",
                                a.exec,
                                "--amp",
                                a.amp,
                                "--grad-accum",
                                absl::StrCat(a.grad_accum),
                                "--attention",
                                a.attention,
                                "--torch-version",
                                a.torch_version,
                                "--out",
                                a.out};
  auto add = [&v](const char* flag, std::int64_t value) {
    if (value != 0) {
      v.push_back(flag);
      v.push_back(absl::StrCat(value));
    }
  };
  add("--batch-size", a.batch_size);
  add("--seq-len", a.seq_len);
  add("--width", a.width);
  add("--depth", a.depth);
  if (a.lr > 0) v.insert(v.end(), {"--lr", Exact(a.lr)});
  if (a.bucket_cap_given) v.insert(v.end(), {"--bucket-cap-mb", Exact(a.bucket_cap_mb)});
  if (a.find_unused) v.push_back("--find-unused-parameters");
  if (a.static_graph) v.push_back("--static-graph");
  if (a.no_broadcast_buffers) v.push_back("--no-broadcast-buffers");
  if (a.zero != "off") v.insert(v.end(), {"--zero", a.zero});
  if (a.checkpoint) v.push_back("--checkpoint-activations");
  if (!a.lora.empty()) v.insert(v.end(), {"--lora", a.lora});
  if (!a.dtype.empty()) v.insert(v.end(), {"--dtype", a.dtype});
  if (a.alloc_conf_given) v.insert(v.end(), {"--alloc-conf", a.alloc_conf});
  if (a.memory_fraction_given) v.insert(v.end(), {"--memory-fraction", Exact(a.memory_fraction)});
  if (a.cublas_workspace != "default") v.insert(v.end(), {"--cublas-workspace", a.cublas_workspace});
  if (!a.scenario.empty()) v.insert(v.end(), {"--scenario", a.scenario});
  if (!a.devices.empty()) v.insert(v.end(), {"--devices", a.devices});
  if (a.backend != "gloo") v.insert(v.end(), {"--backend", a.backend});
  if (a.cuda_context_mb != 0) v.insert(v.end(), {"--cuda-context-mb", Exact(a.cuda_context_mb)});
  if (a.nccl_buffers_mb != "auto") v.insert(v.end(), {"--nccl-buffers-mb", a.nccl_buffers_mb});
  if (a.touch_device != -1) v.insert(v.end(), {"--touch-device", absl::StrCat(a.touch_device)});
  if (!a.save_checkpoint.empty()) v.insert(v.end(), {"--save-checkpoint", a.save_checkpoint});
  if (!a.load_checkpoint.empty()) v.insert(v.end(), {"--load-checkpoint", a.load_checkpoint});
  if (a.checkpoint_step_given) v.insert(v.end(), {"--checkpoint-step", absl::StrCat(a.checkpoint_step)});
  return v;
}

RunRecord MakeRecord(const RunRequest& a, const RankPlan& plan, int world_size, const std::vector<RankExit>& exits,
                     int first_failure) {
  RunRecord run;
  run.dir = RunDirectory(a.out);
  run.world_size = world_size;
  run.alloc_conf = plan.config.text;
  run.device_memory = plan.device_memory;
  run.exits = exits;
  run.first_failure = first_failure;
  TrainingManifest& t = run.training;
  t.model = ModelName(a);
  t.steps = a.steps;
  t.batch_size = a.batch_size;
  t.optimizer = a.optimizer;
  t.optimizer_impl = a.optimizer_impl;
  t.zero_grad = a.zero_grad;
  t.torch_version = a.torch_version;
  t.amp = a.amp;
  t.checkpoint_activations = a.checkpoint;
  t.grad_accum = a.grad_accum;
  t.attention = a.attention;
  t.exec = a.exec;
  t.ddp = plan.ddp;
  if (plan.train.zero) t.zero = a.zero;
  t.seq_len = a.seq_len;
  t.width = a.width;
  t.depth = a.depth;
  t.dtype = a.dtype;
  t.lora = a.lora;
  if (a.gpu_given) t.gpu = a.gpu;
  if (plan.train.ddp) {
    t.ddp_options = TrainingManifest::Ddp{a.bucket_cap_given ? std::optional<double>(a.bucket_cap_mb) : std::nullopt,
                                          a.find_unused, a.static_graph, a.comm_hook, !a.no_broadcast_buffers};
  }
  return run;
}

}  // namespace memscope
