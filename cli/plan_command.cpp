// memscope plan: the largest batch per rank that fits a GPU, per strategy
// combination (run/plan.h does the search); this file parses and prints.
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/sizes.h"
#include "cli/commands.h"
#include "nlohmann/json.hpp"
#include "run/gpu_kinds.h"
#include "run/plan.h"
#include "tensor/blas_workspace.h"

namespace memscope::cli {
namespace {

struct PlanArgs {
  std::string model = "gpt2";
  std::string model_file;
  std::string lora;
  std::string dtype;
  bool model_given = false;
  std::string device_memory;
  std::string gpu;  // --gpu KIND: its memory less its CUDA context, its cuBLAS workspace
  bool gpu_given = false;
  std::string gpu_note;  // " (h100-80gb: 79.65 GiB less a 400.00 MiB CUDA context)", set by Plan
  int world_size = 1;
  std::int64_t global_batch = 0;
  std::int64_t batch_size = 0;
  std::int64_t seq_len = 0;
  std::string attention = "math";
  std::string optimizer = "adam";
  std::string alloc_conf;
  bool alloc_conf_given = false;
  std::int64_t steps = 2;
  std::int64_t max_batch = 1 << 16;
  std::string zero = "off";
  bool json = false;
};

int Fail(absl::string_view message) { return cli::Fail("plan", message); }

std::string Grouped(std::int64_t n) {
  std::string s = absl::StrCat(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<std::size_t>(i), ",");
  return s;
}

nlohmann::json ToJson(const PlanArgs& a, const PlanOptions& o, const PlanResult& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const PlanRow& row : r.rows) {
    const PlanStrategy& s = row.strategy;
    nlohmann::json j = {
        {"strategy", StrategyName(s)},
        {"amp", s.amp ? std::string(DTypeName(*s.amp)) : "none"},
        {"checkpoint_activations", s.checkpoint},
        {"ddp", s.ddp},
        {"expandable_segments", s.expandable},
        {"max_batch", row.max_batch},
        {"max_batch_capped", row.capped},
        {"peak_allocated_bytes", row.max_batch > 0 ? nlohmann::json(row.peak_allocated) : nlohmann::json()},
        {"peak_reserved_bytes", row.max_batch > 0 ? nlohmann::json(row.peak_reserved) : nlohmann::json()},
        {"lower_bound_bytes", row.max_batch > 0 ? nlohmann::json(row.lower_bound) : nlohmann::json()},
        {"fragmentation_at_peak", row.max_batch > 0 ? nlohmann::json(row.fragmentation) : nlohmann::json()},
        {"micro_batch", row.micro_batch},
        {"grad_accum", row.grad_accum},
        {"min_device_memory_bytes",
         row.min_device_memory > 0 ? nlohmann::json(row.min_device_memory) : nlohmann::json()},
        {"probes", row.probes},
        {"error", row.error.empty() ? nlohmann::json() : nlohmann::json(row.error)}};
    rows.push_back(j);
  }
  return {{"schema", "memscope.plan/1"},
          {"model", r.model},
          {"parameters", r.parameters},
          {"trainable_parameters", r.trainable_parameters},
          {"device_memory", o.device_memory},
          {"world_size", o.world_size},
          {"global_batch", a.global_batch > 0 ? nlohmann::json(a.global_batch) : nlohmann::json()},
          {"target_batch_per_rank", r.target_batch},
          {"optimizer", a.optimizer},
          {"steps", o.steps},
          {"model_state_bytes", r.model_state_bytes},
          {"zero", a.zero},
          {"zero_rank", r.zero_rank >= 0 ? nlohmann::json(r.zero_rank) : nlohmann::json()},
          {"zero_rank_parameters", r.zero_rank >= 0 ? nlohmann::json(r.zero_rank_elements) : nlohmann::json()},
          {"rows", rows},
          {"seconds", r.seconds}};
}

void PrintTable(const PlanArgs& a, const PlanOptions& o, const PlanResult& r) {
  std::cout << "memscope plan: " << EscapeForTerminal(r.model) << " (" << Grouped(r.parameters) << " parameters";
  if (r.trainable_parameters != r.parameters) std::cout << ", " << Grouped(r.trainable_parameters) << " trainable";
  std::cout << "), " << a.optimizer << ", GPU of " << FormatSize(o.device_memory) << a.gpu_note << ", world size "
            << o.world_size << "\n";
  std::cout << "model state (parameters + gradients + " << a.optimizer
            << " state, the usual estimate): " << FormatSize(r.model_state_bytes) << "\n";
  std::cout << "target batch: " << r.target_batch << " per rank"
            << (a.global_batch > 0 ? absl::StrCat(" (global ", a.global_batch, ")") : "")
            << "; micro x accum reaches it on this GPU, min GPU runs it in one step\n";
  if (r.zero_rank >= 0) {
    std::cout << "ZeroRedundancyOptimizer" << (a.zero == "bucket-view" ? " (parameters_as_bucket_view)" : "")
              << " in every row: rank " << r.zero_rank << " of " << o.world_size
              << " planned, the one stepping the most (" << Grouped(r.zero_rank_elements) << " of "
              << Grouped(r.trainable_parameters) << " trainable parameters), alone, its collectives simulated\n";
  }
  std::cout << "\n";
  std::cout << absl::StrFormat("%-20s %9s %12s %13s %12s %9s %14s %12s\n", "strategy", "max batch", "peak alloc",
                               "peak reserved", "lower bound", "frag@peak", "micro x accum", "min GPU");
  std::vector<std::string> errors;
  for (const PlanRow& row : r.rows) {
    if (!row.error.empty()) {  // the same error is said once
      // (the error's number, taken before push_back can invalidate an iterator)
      const auto index = static_cast<std::size_t>(std::find(errors.begin(), errors.end(), row.error) - errors.begin());
      if (index == errors.size()) errors.push_back(row.error);
      std::cout << absl::StrFormat("%-20s %9s  (error %d below)\n", StrategyName(row.strategy), "-", index + 1);
      continue;
    }
    const bool any = row.max_batch > 0;
    const std::string max = any ? absl::StrCat(row.max_batch, row.capped ? "+" : "") : "OOM";
    const std::string target =
        row.grad_accum > 0 ? absl::StrCat(row.micro_batch, " x ", row.grad_accum) : std::string("-");
    std::cout << absl::StrFormat("%-20s %9s %12s %13s %12s %9s %14s %12s\n", StrategyName(row.strategy), max,
                                 any ? FormatSize(row.peak_allocated) : "-", any ? FormatSize(row.peak_reserved) : "-",
                                 any ? FormatSize(row.lower_bound) : "-",
                                 any ? absl::StrFormat("%.3f", row.fragmentation) : "-", target,
                                 row.min_device_memory > 0 ? FormatSize(row.min_device_memory) : "-");
  }
  for (std::size_t i = 0; i < errors.size(); ++i) std::cout << "error " << i + 1 << ": " << errors[i] << "\n";
  if (!errors.empty()) std::cout << "(memscope run with the strategy's flags shows the same error)\n";
  std::int64_t probes = 0;
  for (const PlanRow& row : r.rows) probes += row.probes;
  std::cout << "\n"
            << probes << " simulated runs of " << o.steps << " steps, " << absl::StrFormat("%.2f", r.seconds) << " s\n";
}

int Plan(const PlanArgs& given) {
  PlanArgs a = given;
  if (!a.model_file.empty() && a.model_given) return Fail("give --model or --model-file, not both");
  std::optional<GpuKind> gpu;
  if (a.gpu_given) {
    absl::StatusOr<GpuKind> kind = FindGpuKind(a.gpu);
    if (!kind.ok()) return Fail(kind.status().message());
    gpu = *kind;
    if (a.device_memory.empty()) a.device_memory = absl::StrCat(kind->total_memory);
  }
  if (a.device_memory.empty()) return Fail("--device-memory or --gpu is required (the GPU to plan for, e.g. 24GiB)");
  PlanOptions o;
  o.model = a.model_file.empty() ? a.model : "file:" + a.model_file;
  absl::StatusOr<std::uint64_t> device = ParseSize(a.device_memory);
  if (!device.ok()) return Fail(absl::StrCat("--device-memory: ", device.status().message()));
  o.device_memory = *device;
  if (gpu) {
    // What the allocator can have: the GPU less the process's CUDA context (as memscope run --gpu charges it).
    const std::uint64_t context = gpu->context_mib << 20;
    if (o.device_memory <= context) {
      return Fail(absl::StrCat("--device-memory ", a.device_memory, ": not more than --gpu ", std::string(gpu->name),
                               "'s ", FormatSize(context), " CUDA context"));
    }
    a.gpu_note = absl::StrCat(" (", std::string(gpu->name), ": ", FormatSize(o.device_memory), " less a ",
                              FormatSize(context), " CUDA context)");
    o.device_memory -= context;
  }
  if (a.world_size < 1 || a.world_size > 1 << 20) return Fail("--world-size must be at least 1");
  o.world_size = a.world_size;
  if (a.global_batch < 0 || a.batch_size < 0 || a.seq_len < 0)
    return Fail("batch sizes and --seq-len must be positive");
  if (a.global_batch > 0 && a.batch_size > 0) return Fail("give --global-batch or --batch-size, not both");
  if (a.global_batch / a.world_size > kMaxPlanBatch) {
    return Fail(absl::StrCat("--global-batch ", a.global_batch, ": at most ", kMaxPlanBatch, " per rank (",
                             kMaxPlanBatch * a.world_size, " for --world-size ", a.world_size, ")"));
  }
  o.global_batch = a.global_batch;
  o.batch_size = a.batch_size;
  o.model_options.seq_len = a.seq_len;
  absl::StatusOr<AttentionKind> attention = ParseAttention(a.attention);
  if (!attention.ok()) return Fail(attention.status().message());
  o.model_options.attention = *attention;
  if (gpu) o.model_options.compute_capability = gpu->compute_capability;
  if (absl::Status lora = UseLora(a.lora, o.model_options); !lora.ok()) return Fail(lora.message());
  if (absl::Status dtype = UseDType(a.dtype, o.model_options); !dtype.ok()) return Fail(dtype.message());
  absl::StatusOr<OptimizerKind> kind = ParseOptimizerKind(a.optimizer);
  if (!kind.ok()) return Fail(absl::StrCat("--optimizer: ", kind.status().message()));
  o.optimizer.kind = *kind;
  o.optimizer.lr = *kind == OptimizerKind::kSgd ? 0.01f : 1e-3f;
  if (*kind == OptimizerKind::kSgd) o.optimizer.momentum = 0.9f;
  if (*kind == OptimizerKind::kAdamW) o.optimizer.weight_decay = 1e-2f;
  absl::StatusOr<AllocatorConfig> config =
      a.alloc_conf_given ? AllocatorConfig::Parse(a.alloc_conf) : AllocatorConfig::FromEnvironment();
  if (!config.ok()) return Fail(absl::StrCat("--alloc-conf \"", a.alloc_conf, "\": ", config.status().message()));
  o.config = *config;
  // The cuBLAS/cuBLASLt workspaces of the first matmul, as `memscope run` (its default).
  o.blas_workspaces =
      ChooseBlasWorkspaceSizes(BlasWorkspaceEnv::FromEnvironment(), gpu.has_value() && gpu->hopper, nullptr);
  if (a.steps < 1) return Fail("--steps must be at least 1");
  o.steps = a.steps;
  if (a.max_batch < 1 || a.max_batch > kMaxPlanBatch) {
    return Fail(absl::StrCat("--max-batch must be 1 to ", kMaxPlanBatch));
  }
  o.max_batch = a.max_batch;
  if (a.zero == "on" || a.zero == "bucket-view") {
    o.zero = ZeroOptions{.parameters_as_bucket_view = a.zero == "bucket-view"};
  } else if (a.zero != "off") {
    return Fail(absl::StrCat("--zero '", a.zero, "': use off, on or bucket-view"));
  }
  absl::StatusOr<PlanResult> r = MakePlan(o);
  if (!r.ok()) return Fail(r.status().message());
  if (a.json) {
    std::cout << ToJson(a, o, *r).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    PrintTable(a, o, *r);
  }
  return kExitOk;
}

}  // namespace

void RegisterPlan(CLI::App& app, int& exit_status) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "The largest batch per rank that trains without OOM on a GPU of --device-memory, for each combination of "
      "AMP, activation checkpointing, DDP mode and expandable segments (bisection over simulated runs).");
  cmd->add_option("--model", a->model, "zoo model (default gpt2), file:MODEL.json or hf:CONFIG.json")
      ->each([a](const std::string&) { a->model_given = true; });
  cmd->add_option("--model-file", a->model_file, "a model file (JSON, format memscope.model/1)");
  cmd->add_option("--lora", a->lora, "PEFT LoRA: an adapter_config.json (docs/model-files.md)");
  cmd->add_option("--dtype", a->dtype, "the parameters' dtype (model.to(dtype)): float32, float16 or bfloat16");
  cmd->add_option("--device-memory", a->device_memory, "the GPU's memory, e.g. 24GiB (or --gpu)");
  cmd->add_option("--gpu", a->gpu,
                  "a GPU kind (memscope gpus): plan for its memory (or --device-memory) less its CUDA context, with "
                  "its cuBLAS workspace")
      ->each([a](const std::string&) { a->gpu_given = true; });
  cmd->add_option("--world-size", a->world_size, "ranks (default 1; > 1 adds the DDP copy and view rows)");
  cmd->add_option("--global-batch", a->global_batch,
                  "the global batch to reach (world size x micro-batch x gradient accumulation)")
      ->check(InRange(std::int64_t{1}, kMaxPlanBatch << 20));
  cmd->add_option("--batch-size", a->batch_size, "the per-rank batch to reach (default: the model's)")
      ->check(InRange(std::int64_t{1}, kMaxPlanBatch));
  cmd->add_option("--seq-len", a->seq_len, "sequence length of text models (default: the model's)")
      ->check(InRange(std::int64_t{1}, kMaxPlanBatch));
  cmd->add_option("--attention", a->attention, "eager (math, default), sdpa or flash_attention_2 (flash): as run's");
  cmd->add_option("--optimizer", a->optimizer, "adam (default), adamw or sgd (momentum 0.9)");
  cmd->add_option("--alloc-conf", a->alloc_conf, "base allocator settings (default: $PYTORCH_CUDA_ALLOC_CONF)")
      ->each([a](const std::string&) { a->alloc_conf_given = true; });
  cmd->add_option("--steps", a->steps, "training steps per simulated run (default 2)")
      ->check(InRange(std::int64_t{1}, kMaxPlanSteps));
  cmd->add_option("--max-batch", a->max_batch,
                  "the search stops at this per-rank batch (default 65536; a row that reaches it reads N+)");
  cmd->add_option("--zero", a->zero,
                  "off (default), on or bucket-view: ZeroRedundancyOptimizer (parameters_as_bucket_view) in every DDP "
                  "row, planned for the rank that steps the most parameters (needs --world-size > 1)");
  cmd->add_flag("--json", a->json, "print the plan as JSON (schema memscope.plan/1)");
  cmd->callback([a, &exit_status] { exit_status = Plan(*a); });
}

}  // namespace memscope::cli
