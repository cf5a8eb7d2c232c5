// memscope run: the reference training loop on a simulated GPU, recorded
// into a run directory; memscope models: the zoo.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/config.h"
#include "allocator/sizes.h"
#include "cli/commands.h"
#include "profiler/report.h"
#include "profiler/run.h"
#include "profiler/timeline.h"
#include "train/trainer.h"

namespace memscope::cli {
namespace {

// An OOM during the run: recorded and reported, with its own status.
inline constexpr int kExitOutOfMemory = 3;

struct RunArgs {
  std::string model = "gpt2";
  std::int64_t world_size = 1;
  std::int64_t steps = 3;
  std::int64_t batch_size = 0;
  std::int64_t seq_len = 0;
  std::int64_t width = 0;
  std::int64_t depth = 0;
  std::string optimizer = "adam";
  std::string optimizer_impl = "foreach";
  double lr = 0;
  double momentum = 0.9;
  std::string ddp = "off";
  std::string zero_grad = "none";
  std::string alloc_conf;
  bool alloc_conf_given = false;
  std::string device_memory = "80GiB";
  std::string exec = "meta";
  std::string amp = "none";
  bool checkpoint = false;
  std::int64_t grad_accum = 1;
  std::string attention = "math";
  std::string out = "memscope-run";
  bool json = false;
};

int Fail(absl::string_view message) { return cli::Fail("run", message); }

int Run(const RunArgs& a) {
  if (a.world_size != 1 || a.ddp != "off") {
    return Fail("--world-size > 1 and --ddp copy|view are not available yet: this build runs one rank with --ddp off");
  }
  TrainOptions t;
  t.model = a.model;
  t.steps = a.steps;
  t.grad_accum = a.grad_accum;
  t.model_options.batch_size = a.batch_size;
  t.model_options.seq_len = a.seq_len;
  t.model_options.width = a.width;
  t.model_options.depth = a.depth;
  t.model_options.checkpoint_activations = a.checkpoint;
  if (a.attention == "flash") {
    t.model_options.attention = AttentionKind::kFlash;
  } else if (a.attention != "math") {
    return Fail(absl::StrCat("--attention '", a.attention, "': use math or flash"));
  }
  absl::StatusOr<OptimizerKind> kind = ParseOptimizerKind(a.optimizer);
  if (!kind.ok()) return Fail(absl::StrCat("--optimizer: ", kind.status().message()));
  absl::StatusOr<OptimizerImpl> impl = ParseOptimizerImpl(a.optimizer_impl);
  if (!impl.ok()) return Fail(absl::StrCat("--optimizer-impl: ", impl.status().message()));
  t.optimizer.kind = *kind;
  t.optimizer.impl = *impl;
  // torch.optim defaults: Adam/AdamW lr 1e-3 (AdamW weight_decay 1e-2); SGD needs an lr (0.01 here).
  t.optimizer.lr = static_cast<float>(a.lr > 0 ? a.lr : (*kind == OptimizerKind::kSgd ? 0.01 : 1e-3));
  if (*kind == OptimizerKind::kSgd) t.optimizer.momentum = static_cast<float>(a.momentum);
  if (*kind == OptimizerKind::kAdamW) t.optimizer.weight_decay = 1e-2f;
  if (a.zero_grad == "zeros") {
    t.zero_grad_set_to_none = false;
  } else if (a.zero_grad != "none") {
    return Fail(absl::StrCat("--zero-grad '", a.zero_grad, "': use none (set_to_none=True) or zeros"));
  }
  if (a.amp == "fp16") {
    t.amp = DType::kFloat16;
  } else if (a.amp == "bf16") {
    t.amp = DType::kBFloat16;
  } else if (a.amp != "none") {
    return Fail(absl::StrCat("--amp '", a.amp, "': use none, fp16 or bf16"));
  }
  if (a.exec != "meta" && a.exec != "cpu") {
    return Fail(a.exec == "cuda" ? "--exec cuda: this build has no GPU execution path; use meta or cpu"
                                 : absl::StrCat("--exec '", a.exec, "': use meta or cpu"));
  }
  absl::StatusOr<std::uint64_t> device_memory = ParseSize(a.device_memory);
  if (!device_memory.ok()) return Fail(absl::StrCat("--device-memory: ", device_memory.status().message()));
  if (*device_memory == 0) return Fail("--device-memory: must be greater than 0");
  absl::StatusOr<AllocatorConfig> config =
      a.alloc_conf_given ? AllocatorConfig::Parse(a.alloc_conf) : AllocatorConfig::FromEnvironment();
  if (!config.ok()) return Fail(absl::StrCat("--alloc-conf \"", a.alloc_conf, "\": ", config.status().message()));
  // Bad options are reported before anything is written.
  if (absl::StatusOr<std::unique_ptr<Model>> probe = CreateModel(t.model, t.model_options); !probe.ok()) {
    return Fail(probe.status().message());
  }

  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (ec) return Fail(absl::StrCat("--out: cannot create '", a.out, "': ", ec.message()));
  Timeline header;
  header.device_capacity = *device_memory;
  header.alloc_conf = config->text;
  header.wall_start_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  absl::StatusOr<std::unique_ptr<TimelineWriter>> writer = TimelineWriter::Create(TimelinePath(a.out, 0), header);
  if (!writer.ok()) return Fail(writer.status().message());

  const bool cpu = a.exec == "cpu";
  absl::StatusOr<TrainResult> result;
  double seconds = 0;
  {
    SimDevice gpu({.capacity = *device_memory, .index = 0, .host_backed = cpu});
    CachingAllocator allocator(gpu, *config);
    Recorder recorder(**writer);
    allocator.SetObserver(&recorder);
    DeviceContext ctx(allocator, cpu ? ExecMode::kCpu : ExecMode::kMeta, cpu ? &gpu : nullptr);
    const auto start = std::chrono::steady_clock::now();
    result = Train(t, ctx, &recorder);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    allocator.SetObserver(nullptr);
  }
  if (!result.ok()) return Fail(result.status().message());
  if (absl::Status s = (*writer)->Flush(); !s.ok()) return Fail(s.message());
  writer->reset();

  const std::string status = result->oom ? "oom" : result->error.empty() ? "ok" : "error";
  nlohmann::json run = {{"schema", "memscope.run/1"},
                        {"generator", kMemscopeVersion},
                        {"command", "run"},
                        {"model", a.model},
                        {"parameters", result->parameters},
                        {"steps", a.steps},
                        {"steps_done", result->steps_done},
                        {"batch_size", a.batch_size},
                        {"optimizer", a.optimizer},
                        {"optimizer_impl", a.optimizer_impl},
                        {"zero_grad", a.zero_grad},
                        {"amp", a.amp},
                        {"checkpoint_activations", a.checkpoint},
                        {"grad_accum", a.grad_accum},
                        {"attention", a.attention},
                        {"exec", a.exec},
                        {"ddp", a.ddp},
                        {"world_size", 1},
                        {"alloc_conf", config->text},
                        {"device_memory", *device_memory},
                        {"seconds", seconds},
                        {"losses", result->losses},
                        {"ranks", {{{"rank", 0},
                                    {"status", status},
                                    {"exit_code", result->oom ? kExitOutOfMemory : 0},
                                    {"error", result->error},
                                    {"timeline", "rank-0.timeline"}}}}};
  std::ofstream(std::filesystem::path(a.out) / "run.json") << run.dump(1) << "\n";
  absl::StatusOr<std::vector<Timeline>> recorded = LoadRun(a.out);
  if (!recorded.ok()) return Fail(recorded.status().message());
  absl::StatusOr<std::vector<RankReport>> reports = WriteRunOutputs(a.out, *recorded);
  if (!reports.ok()) return Fail(reports.status().message());

  const RankReport& r = reports->front();
  if (a.json) {
    std::ifstream in(std::filesystem::path(a.out) / "report.json");
    std::cout << in.rdbuf();
  } else {
    std::cout << "memscope run: " << a.model << " (" << result->parameters << " parameters), " << result->steps_done
              << " of " << a.steps << " steps, --exec " << a.exec << ", simulated GPU of " << FormatSize(*device_memory)
              << ", " << r.events << " events in " << absl::StrFormat("%.2f", seconds) << " s\n\n"
              << PhaseTableText(r);
    if (!result->losses.empty()) {
      std::cout << "loss:";
      for (float l : result->losses) std::cout << absl::StrFormat(" %.4f", l);
      std::cout << "\n";
    }
    std::cout << "peak allocated " << FormatSize(r.peak_allocated.bytes) << " in " << r.peak_allocated.phase << ": "
              << CategoryBreakdown(r.peak_allocated.by_category, r.peak_allocated.bytes, 4) << "\n"
              << "recorded in " << a.out << "/ (" << RunOutputListing(1) << ")\n";
  }
  if (result->oom) {
    std::cerr << "memscope run: out of memory in step " << result->steps_done << ":\n" << result->error << "\n";
    if (r.oom) std::cerr << r.oom->verdict << "\n";
    return kExitOutOfMemory;
  }
  if (!result->error.empty()) return Fail(result->error);
  return kExitOk;
}

int Models() {
  std::cout << absl::StrFormat("%-14s %15s %8s  %s\n", "model", "parameters", "tensors", "description");
  for (const ModelInfo& m : ListModels()) {
    absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(m.name, {});
    if (!model.ok()) return Fail(model.status().message());
    std::string count = absl::StrCat((*model)->NumParameters());
    for (int i = static_cast<int>(count.size()) - 3; i > 0; i -= 3) count.insert(static_cast<std::size_t>(i), ",");
    std::cout << absl::StrFormat("%-14s %15s %8d  %s%s\n", m.name, count, (*model)->NumParameterTensors(), m.description,
                                 m.cpu ? " [--exec cpu]" : "");
  }
  return kExitOk;
}

}  // namespace

void RegisterRun(CLI::App& app, int& exit_status) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Run the reference training loop (a zoo model, optimizer, phases) on a simulated GPU and record every "
      "allocation into a run directory; prints the phase table. Exit 3 when the run hits OOM.");
  cmd->add_option("--model", a->model, "zoo model (memscope models lists them; default gpt2)");
  cmd->add_option("--world-size", a->world_size, "ranks (1 in this build)");
  cmd->add_option("--steps", a->steps, "training steps (default 3)");
  cmd->add_option("--batch-size", a->batch_size, "batch size (default: the model's)");
  cmd->add_option("--seq-len", a->seq_len, "sequence length of text models (default: the model's)");
  cmd->add_option("--width", a->width, "mlp hidden width (default 512)");
  cmd->add_option("--depth", a->depth, "mlp hidden layers (default 3)");
  cmd->add_option("--optimizer", a->optimizer, "adam (default), adamw or sgd");
  cmd->add_option("--optimizer-impl", a->optimizer_impl, "foreach (default, as on GPUs), for-loop or fused");
  cmd->add_option("--lr", a->lr, "learning rate (default 1e-3 for Adam/AdamW, 0.01 for SGD)");
  cmd->add_option("--momentum", a->momentum, "SGD momentum (default 0.9; 0 for none)");
  cmd->add_option("--ddp", a->ddp, "off (copy and view come with multi-rank runs)");
  cmd->add_option("--zero-grad", a->zero_grad, "none (set_to_none=True, the default) or zeros");
  cmd->add_option("--alloc-conf", a->alloc_conf, "allocator settings (default: $PYTORCH_CUDA_ALLOC_CONF)")
      ->each([a](const std::string&) { a->alloc_conf_given = true; });
  cmd->add_option("--device-memory", a->device_memory, "simulated GPU memory (default 80GiB)");
  cmd->add_option("--exec", a->exec, "meta (default: shapes and memory only) or cpu (real float math; mlp, cifar-net)");
  cmd->add_option("--amp", a->amp, "none (default), fp16 (autocast + GradScaler) or bf16 (autocast)");
  cmd->add_flag("--checkpoint-activations", a->checkpoint, "torch.utils.checkpoint around each block (recompute in backward)");
  cmd->add_option("--grad-accum", a->grad_accum, "micro-batches per optimizer step (default 1)");
  cmd->add_option("--attention", a->attention, "gpt2*: math (eager, default) or flash (scaled_dot_product_attention)");
  cmd->add_option("--out", a->out, "run directory (default memscope-run)");
  cmd->add_flag("--json", a->json, "print report.json instead of the tables");
  cmd->callback([a, &exit_status] { exit_status = Run(*a); });

  CLI::App* models = app.add_subcommand("models", "List the model zoo with parameter counts.");
  models->callback([&exit_status] { exit_status = Models(); });
}

}  // namespace memscope::cli
