// memscope explain's training-side changes (cli/explain_training.h).
#include "cli/explain_training.h"

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "allocator/config.h"
#include "load/manifest.h"
#include "run/plan.h"
#include "tensor/blas_workspace.h"
#include "train/models.h"
#include "train/optimizer.h"

namespace memscope::cli {
namespace {

// Why plan cannot reproduce the run ("" when it can): a flag run.json holds
// that `memscope plan` has no option for.
std::string Unplannable(const TrainingManifest& t) {
  if (t.exec != "meta") return absl::StrCat("--exec ", t.exec);
  if (t.ddp == "dp" || t.data_parallel) return "DataParallel";
  if (!t.zero.empty()) return "--zero";
  if (t.grad_accum != 1) return "--grad-accum";
  if (t.width != 0 || t.depth != 0) return "--width/--depth";
  if (!t.lora.empty()) return "--lora";
  if (!t.gpu.empty()) return "--gpu";
  if (t.optimizer == "sgd") return "--optimizer sgd (its momentum is not in run.json)";
  if (t.optimizer_impl != "foreach") return absl::StrCat("--optimizer-impl ", t.optimizer_impl);
  if (t.zero_grad != "none") return absl::StrCat("--zero-grad ", t.zero_grad);
  if (t.ddp_options && !(*t.ddp_options == TrainingManifest::Ddp{})) return "non-default DDP options";
  return "";
}

std::optional<DType> AmpOf(const std::string& amp) {
  if (amp == "fp16") return DType::kFloat16;
  if (amp == "bf16") return DType::kBFloat16;
  return std::nullopt;
}

// The `memscope plan` command line that prints the same figures.
std::string PlanCommand(const TrainingManifest& t, const RunManifest& m, std::int64_t batch) {
  std::vector<std::string> v = {"memscope plan"};
  v.push_back(
      absl::StrCat(t.model.rfind("file:", 0) == 0 ? "--model-file " + t.model.substr(5) : "--model " + t.model));
  v.push_back(absl::StrCat("--device-memory ", m.device_memory));
  if (m.world_size > 1) v.push_back(absl::StrCat("--world-size ", m.world_size));
  v.push_back(absl::StrCat("--batch-size ", batch, " --max-batch ", batch));
  if (t.seq_len != 0) v.push_back(absl::StrCat("--seq-len ", t.seq_len));
  if (t.attention != "math") v.push_back("--attention " + t.attention);
  if (!t.dtype.empty()) v.push_back("--dtype " + t.dtype);
  if (t.optimizer != "adam") v.push_back("--optimizer " + t.optimizer);
  if (!m.alloc_conf.empty()) v.push_back(absl::StrCat("--alloc-conf \"", m.alloc_conf, "\""));
  return absl::StrJoin(v, " ");
}

absl::StatusOr<PlanOptions> OptionsOf(const TrainingManifest& t, const RunManifest& m) {
  PlanOptions o;
  o.model = t.model;
  o.device_memory = m.device_memory;
  o.world_size = m.world_size;
  o.model_options.seq_len = t.seq_len;
  absl::StatusOr<AttentionKind> attention = ParseAttention(t.attention);
  if (!attention.ok()) return attention.status();
  o.model_options.attention = *attention;
  if (absl::Status dtype = UseDType(t.dtype, o.model_options); !dtype.ok()) return dtype;
  absl::StatusOr<OptimizerKind> kind = ParseOptimizerKind(t.optimizer);
  if (!kind.ok()) return kind.status();
  o.optimizer.kind = *kind;  // as `memscope plan` sets it
  o.optimizer.lr = 1e-3f;
  if (*kind == OptimizerKind::kAdamW) o.optimizer.weight_decay = 1e-2f;
  absl::StatusOr<AllocatorConfig> config = AllocatorConfig::Parse(m.alloc_conf);
  if (!config.ok()) return config.status();
  o.config = *config;
  o.blas_workspaces = ChooseBlasWorkspaceSizes(BlasWorkspaceEnv::FromEnvironment(), false, nullptr);
  o.batch_size = t.batch_size;
  if (o.batch_size == 0) {  // the model's own
    absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(o.model, o.model_options);
    if (!model.ok()) return model.status();
    o.batch_size = (*model)->batch_size();
  }
  o.max_batch = o.batch_size;  // a fitting row stops at the run's batch: one probe or a few
  return o;
}

}  // namespace

void AddTrainingChanges(const std::string& path, MemoryExplanation& e) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return;
  absl::StatusOr<RunManifest> m = RunManifest::Read((std::filesystem::path(path) / "run.json").string());
  if (!m.ok()) return;
  if (!m->training) {
    e.training_note = absl::StrCat("not listed: a ", m->command,
                                   " directory has no training options to plan with (only memscope run's have)");
    return;
  }
  const TrainingManifest& t = *m->training;
  if (const std::string why = Unplannable(t); !why.empty()) {
    e.training_note = absl::StrCat("not listed: the run used ", why, ", which memscope plan cannot reproduce");
    return;
  }
  absl::StatusOr<PlanOptions> o = OptionsOf(t, *m);
  absl::StatusOr<PlanResult> plan = o.ok() ? MakePlan(*o) : absl::StatusOr<PlanResult>(o.status());
  if (!plan.ok()) {
    e.training_note = absl::StrCat("not listed: memscope plan failed: ", plan.status().message());
    return;
  }
  const std::optional<DType> amp = AmpOf(t.amp);
  const bool expandable = o->config.expandable_segments;
  TrainingChanges changes{
      .command = PlanCommand(t, *m, o->batch_size), .batch_size = o->batch_size, .device_memory = o->device_memory};
  for (const PlanRow& row : plan->rows) {
    const PlanStrategy& s = row.strategy;
    changes.rows.push_back(TrainingChange{
        .strategy = StrategyName(s),
        .own = s.amp == amp && s.checkpoint == t.checkpoint_activations && s.ddp == t.ddp && s.expandable == expandable,
        .max_batch = row.max_batch,
        .fits = row.max_batch >= o->batch_size,
        .peak_reserved = row.peak_reserved,
        .error = row.error});
  }
  RankTrainingChanges(changes.rows);
  e.training = std::move(changes);
}

}  // namespace memscope::cli
