// memscope run: the reference training loop on simulated GPUs, recorded
// into a run directory, on one rank or N (a launcher process supervising N
// rank processes that talk over Gloo); memscope models: the zoo. This file
// binds the flags to a RunRequest and prints; run/ does the work (the
// orchestration: run/run_command.h, a rank: run/rank.h, the launcher:
// run/launcher.h, the outcome: run/aggregate.h).
#include <algorithm>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "allocator/sizes.h"
#include "cli/commands.h"
#include "compare/compare.h"
#include "exporters/report.h"
#include "load/manifest.h"
#include "load/run_directory.h"
#include "run/aggregate.h"
#include "run/gpu_kinds.h"
#include "run/run_command.h"
#include "run/run_request.h"
#include "train/trainer.h"

namespace memscope::cli {
namespace {

// The DDP bucket lines under a rank's phase table, and ZeRO's share of rank `rank`.
void PrintBuckets(const DdpBuckets& ddp, int rank) {
  for (const bool rebuilt : {false, true}) {
    const std::vector<DdpBucket>& b = rebuilt ? ddp.rebuilt_buckets : ddp.buckets;
    if (b.empty()) continue;
    std::uint64_t total = 0;
    for (const DdpBucket& x : b) total += x.bytes;
    std::cout << (rebuilt ? "rebuilt in gradient-ready order: " : "DDP buckets: ") << b.size()
              << (b.size() == 1 ? " bucket of " : " buckets, ") << FormatSize(total)
              << (b.size() == 1 ? "" : absl::StrCat(" (first ", FormatSize(b[0].bytes), ")")) << "\n";
  }
  if (!ddp.zero || static_cast<std::size_t>(rank) >= ddp.zero->partition.size()) return;
  std::size_t total = 0;
  for (const std::vector<std::string>& names : ddp.zero->partition) total += names.size();
  std::cout << "ZeroRedundancyOptimizer: this rank steps " << ddp.zero->partition[static_cast<std::size_t>(rank)].size()
            << " of " << total << " parameters";
  if (!ddp.zero->bucket_bytes.empty()) {
    std::uint64_t bytes = 0;
    for (std::uint64_t b : ddp.zero->bucket_bytes) bytes += b;
    std::cout << "; " << ddp.zero->bucket_bytes.size() << " flat parameter buckets, " << FormatSize(bytes);
  }
  std::cout << "\n";
}
// The checkpoint line under the tables: who saved what (files and bytes
// written), and where the ranks' torch.load put the tensors.
void PrintCheckpoint(const RunOutcome& out) {
  std::vector<int> savers;
  std::map<std::string, std::vector<int>> onto;  // loaded_onto -> ranks
  const RankCheckpoint* any = nullptr;
  for (const std::optional<RankStatus>& st : out.statuses) {
    if (!st || !st->checkpoint) continue;
    any = &*st->checkpoint;
    if (st->checkpoint->saved) savers.push_back(st->rank);
    if (!st->checkpoint->loaded_onto.empty()) onto[st->checkpoint->loaded_onto].push_back(st->rank);
  }
  if (any == nullptr) return;
  auto ranks = [](const std::vector<int>& r) {
    return absl::StrCat(r.size() == 1 ? "rank " : "ranks ", absl::StrJoin(r, ","));
  };
  std::cout << "checkpoint after step " << any->step << ": " << FormatSize(any->state_bytes)
            << " (parameters, buffers, optimizer state)";
  if (!savers.empty()) {
    std::cout << "; saved by " << ranks(savers) << ": " << savers.size()
              << (savers.size() == 1 ? " file, " : " files, ") << FormatSize(any->state_bytes * savers.size())
              << " written";
    if (savers.size() > 1) std::cout << " (rank 0 alone would write one)";
  }
  if (!onto.empty()) {
    std::cout << "; torch.load(map_location=" << (any->map_location == "none" ? "None" : any->map_location) << ") put";
    const char* sep = " ";
    for (const auto& [where, r] : onto) {
      std::cout << sep << (r.size() == 1 ? "the copy of " : "the copies of ") << ranks(r) << " on " << where;
      sep = ", ";
    }
  }
  std::cout << "\n";
}

// "DataParallel over 2 GPUs (batch 64 scattered 32+32)"; more than four
// chunks as "7 x 9 + 1" (torch.chunk: equal chunks, the last smaller).
std::string DataParallelHeader(const TrainingManifest::DataParallel& dp) {
  const std::vector<std::int64_t>& c = dp.chunk_sizes;
  std::string chunks = absl::StrJoin(c, "+");
  if (c.size() > 4) {
    const bool last_differs = c.back() != c.front();
    chunks = absl::StrCat(c.size() - (last_differs ? 1 : 0), " x ", c.front(),
                          last_differs ? absl::StrCat(" + ", c.back()) : "");
  }
  return absl::StrCat("DataParallel over ", dp.device_ids.size(), " GPUs (batch ", dp.global_batch, " scattered ",
                      chunks, ")");
}

std::string SignedDelta(double bytes) {
  const std::uint64_t magnitude = static_cast<std::uint64_t>(bytes < 0 ? -bytes : bytes);
  return absl::StrCat(bytes < 0 ? "-" : "+", FormatSize(magnitude));
}

// DataParallel's imbalance: each device's peaks against the mean of the devices.
void PrintImbalance(const std::vector<RankReport>& reports) {
  if (reports.empty()) return;
  double mean_alloc = 0, mean_res = 0;
  for (const RankReport& r : reports) {
    mean_alloc += static_cast<double>(r.peak_allocated.bytes);
    mean_res += static_cast<double>(r.peak_reserved.bytes);
  }
  mean_alloc /= static_cast<double>(reports.size());
  mean_res /= static_cast<double>(reports.size());
  std::cout << "\nDataParallel imbalance (output_device cuda:0 gathers the outputs and holds the loss, the reduced "
               "gradients and the optimizer state):\n";
  std::cout << absl::StrFormat("%-8s %15s %12s %15s %12s\n", "device", "peak allocated", "vs mean", "peak reserved",
                               "vs mean");
  for (const RankReport& r : reports) {
    std::cout << absl::StrFormat(
        "%-8s %15s %12s %15s %12s\n", absl::StrCat("cuda:", r.rank), FormatSize(r.peak_allocated.bytes),
        SignedDelta(static_cast<double>(r.peak_allocated.bytes) - mean_alloc), FormatSize(r.peak_reserved.bytes),
        SignedDelta(static_cast<double>(r.peak_reserved.bytes) - mean_res));
  }
  std::cout << absl::StrFormat("%-8s %15s %12s %15s\n", "mean", FormatSize(static_cast<std::uint64_t>(mean_alloc)), "",
                               FormatSize(static_cast<std::uint64_t>(mean_res)));
}

// The losses of a multi-rank run, one line per rank (each rank's loss on its
// own shard of the batch, as each process of a DDP job prints it), then
// their mean over the steps every rank has: with a mean-reduced loss and
// equal shards, the loss of the whole batch.
void PrintRankLosses(const std::vector<std::optional<RankStatus>>& statuses) {
  std::size_t steps = std::numeric_limits<std::size_t>::max();
  for (std::size_t r = 0; r < statuses.size(); ++r) {
    if (!statuses[r]) {
      steps = 0;
      continue;
    }
    steps = std::min(steps, statuses[r]->losses.size());
    std::cout << "loss (rank " << r << "):";
    for (float l : statuses[r]->losses) std::cout << absl::StrFormat(" %.4f", l);
    std::cout << "\n";
  }
  if (steps == 0 || steps == std::numeric_limits<std::size_t>::max()) return;
  std::cout << "loss (mean):";
  for (std::size_t i = 0; i < steps; ++i) {
    double sum = 0;
    for (const std::optional<RankStatus>& st : statuses) sum += st->losses[i];
    std::cout << absl::StrFormat(" %.4f", sum / static_cast<double>(statuses.size()));
  }
  std::cout << "\n";
}

// The tables of `memscope run`: the header line, each rank's phase table,
// buckets and peak, the losses and where it was recorded. Only what
// happened: a rank that never built its model (a failed rendezvous) has no
// parameter count, no phases and no peak to show.
void PrintTables(const RunRequest& a, const RunOutcome& out) {
  const TrainingManifest& t = *out.manifest.training;
  const int world_size = out.manifest.world_size;
  std::cout << "memscope run: " << EscapeForTerminal(t.model)
            << (t.parameters > 0 ? absl::StrCat(" (", t.parameters, " parameters)") : std::string()) << ", "
            << t.steps_done << " of " << t.steps << " steps, --exec " << t.exec << ", "
            << (t.data_parallel
                    ? DataParallelHeader(*t.data_parallel)
                    : absl::StrCat(world_size > 1 ? absl::StrCat(world_size, " ranks, ") : "", "--ddp ", t.ddp))
            << ", simulated GPU of " << FormatSize(out.manifest.device_memory) << ", "
            << absl::StrFormat("%.2f", t.seconds) << " s\n";
  for (const RankReport& r : out.reports) {
    std::cout << "\n";
    if (world_size > 1) {
      std::cout << (t.data_parallel ? "cuda:" : "rank ") << r.rank << " (" << r.events << " events)\n";
    }
    if (r.phases.empty()) {
      std::cout << "(no phase recorded" << (r.status.empty() || r.status == "ok" ? "" : absl::StrCat(": ", r.status))
                << ")\n";
      continue;
    }
    std::cout << PhaseTableText(r);
    const std::optional<RankStatus>& st = out.statuses[static_cast<std::size_t>(r.rank)];
    if (st && st->ddp) PrintBuckets(*st->ddp, r.rank);
    std::cout << "peak allocated " << FormatSize(r.peak_allocated.bytes)
              << (r.peak_allocated.phase.empty() ? "" : absl::StrCat(" in ", r.peak_allocated.phase)) << ": "
              << CategoryBreakdown(r.peak_allocated.by_category, r.peak_allocated.bytes, 4) << "\n";
    if (world_size > 1 && r.rank == 0) {
      bool same = true;
      for (const RankReport& o : out.reports) same = same && o.peak_allocated.bytes == r.peak_allocated.bytes;
      if (same && out.reports.size() > 1) {
        std::cout << (world_size == 2 ? std::string("(rank 1 has") : absl::StrCat("(ranks 1-", world_size - 1, " have"))
                  << " the same peak; every rank's table is in summary.txt)\n";
        break;
      }
    }
  }
  if (t.data_parallel) PrintImbalance(out.reports);
  PrintCheckpoint(out);
  if (!t.losses.empty()) {
    if (world_size > 1) {
      PrintRankLosses(out.statuses);
    } else {
      std::cout << "loss:";
      for (float l : t.losses) std::cout << absl::StrFormat(" %.4f", l);
      std::cout << "\n";
    }
    if (const auto diverged = FirstDivergedLoss(t.losses)) {
      // One loss per micro-batch: --grad-accum of them per step.
      const std::int64_t accum = std::max<std::int64_t>(1, t.grad_accum);
      std::cerr << "memscope run: the training diverged: the loss became " << diverged->second << " at step "
                << static_cast<std::int64_t>(diverged->first) / accum << " (the memory profile is complete; a smaller "
                << "--lr would keep it finite)\n";
    }
  }
  std::cout << "recorded in " << a.out << "/ (" << RunDirectory(a.out).ExistingListing(world_size) << ")\n";
}

// What `memscope run` says: its tables (or report.json) on stdout, its
// errors and diagnostics on stderr.
class Printer : public RunPrinter {
 public:
  int Fail(absl::string_view message) override { return cli::Fail("run", message); }
  void SettingsNotes(const AllocatorConfig& config, const std::vector<std::string>& workspace_warnings) override {
    cli::NoteGcWithoutFraction(config);
    cli::PrintNotes(workspace_warnings);
  }
  void RankFailed(int rank, absl::string_view error) override {
    std::cerr << "memscope run: rank " << rank << ": " << EscapeForTerminal(error) << "\n";
  }
  void RankRejected(absl::string_view line) override { std::cerr << EscapeForTerminal(line) << "\n"; }
  void Outcome(const RunRequest& a, const RunOutcome& out) override {
    if (out.interrupted != 0) {
      // Ctrl-C: one line (and the outputs that could not be written), no tables.
    } else if (a.json) {
      std::ifstream in(RunDirectory(a.out).Report());
      std::cout << in.rdbuf();
    } else {
      PrintTables(a, out);
    }
    for (absl::string_view line : absl::StrSplit(out.diagnostics, '\n', absl::SkipEmpty())) {
      std::cerr << EscapeForTerminal(line) << "\n";
    }
  }
  void PassBegins(absl::string_view mode) override { std::cout << "== --ddp " << mode << "\n"; }
  void PassEnds() override { std::cout << "\n"; }
  void Comparison(const memscope::Comparison& c) override {
    std::cout << "== --ddp copy (A) vs --ddp view (B)\n" << FormatComparison(c);
  }
};

// memscope gpus: the kinds --gpu knows (sources: run/gpu_kinds.md).
int Gpus() {
  std::cout << absl::StrFormat("%-10s %-22s %16s  %-13s %8s  %s\n", "kind", "device", "memory (bytes)", "from",
                               "context", "cuBLAS workspace");
  for (const GpuKind& k : GpuKinds()) {
    std::cout << absl::StrFormat("%-10s %-22s %16d  %-13s %4d MiB  %s\n", k.name, k.product, k.total_memory,
                                 k.memory_from, k.context_mib, k.hopper ? "hopper" : "default");
  }
  return kExitOk;
}

int Models() {
  std::cout << absl::StrFormat("%-14s %15s %8s  %s\n", "model", "parameters", "tensors", "description");
  for (const ModelInfo& m : ListModels()) {
    absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(m.name, {});
    if (!model.ok()) return cli::Fail("run", model.status().message());
    std::string count = absl::StrCat((*model)->NumParameters());
    for (int i = static_cast<int>(count.size()) - 3; i > 0; i -= 3) count.insert(static_cast<std::size_t>(i), ",");
    std::cout << absl::StrFormat("%-14s %15s %8d  %s%s\n", m.name, count, (*model)->NumParameterTensors(),
                                 m.description, m.cpu ? " [--exec cpu]" : "");
  }
  return kExitOk;
}

}  // namespace

namespace {
// models and gpus: what run's --model and --gpu accept.
void RegisterZooCommands(CLI::App& app, int& exit_status) {
  CLI::App* models = app.add_subcommand("models", "List the model zoo with parameter counts.");
  models->callback([&exit_status] { exit_status = Models(); });

  CLI::App* gpus = app.add_subcommand(
      "gpus", "List the GPU kinds of memscope run --gpu: memory, CUDA context, cuBLAS workspace (sources: docs/gpus.md).");
  gpus->callback([&exit_status] { exit_status = Gpus(); });
}
}  // namespace

void RegisterRun(CLI::App& app, int& exit_status) {
  auto a = std::make_shared<RunRequest>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Run the reference training loop (a zoo model, optimizer, phases) on a simulated GPU and record every "
      "allocation into a run directory; prints the phase table. Exit 3 when the run hits OOM.");
  cmd->add_option("--model", a->model,
                  "zoo model (memscope models lists them; default gpt2), file:MODEL.json, or hf:CONFIG.json "
                  "(a Hugging Face config.json)")
      ->each([a](const std::string&) { a->model_given = true; });
  cmd->add_option("--model-file", a->model_file, "a model file (JSON, format memscope.model/1; see docs/model-files.md)");
  cmd->add_option("--lora", a->lora, "PEFT LoRA: an adapter_config.json, the rest frozen (docs/model-files.md)");
  cmd->add_option("--dtype", a->dtype, "the parameters' dtype (model.to(dtype)): float32, float16 or bfloat16");
  cmd->add_option("--world-size", a->world_size, "ranks, one process each (default 1; or WORLD_SIZE from a launcher)")
      ->each([a](const std::string&) { a->world_size_given = true; });
  cmd->add_option("--dp", a->dp,
                  "DataParallel over N simulated GPUs in one process (torch.nn.DataParallel; --batch-size is the "
                  "batch it scatters); the devices are the run's ranks")
      ->each([a](const std::string&) { a->dp_given = true; });
  cmd->add_option("--steps", a->steps, "training steps (default 3)");
  cmd->add_option("--batch-size", a->batch_size, "batch size (default: the model's)")->each([a](const std::string&) {
    a->sizes_given[0] = true;
  });
  cmd->add_option("--seq-len", a->seq_len, "sequence length of text models (default: the model's)")
      ->each([a](const std::string&) { a->sizes_given[1] = true; });
  cmd->add_option("--width", a->width, "mlp hidden width (default 512)")->each([a](const std::string&) {
    a->sizes_given[2] = true;
  });
  cmd->add_option("--depth", a->depth, "mlp hidden layers (default 3)")->each([a](const std::string&) {
    a->sizes_given[3] = true;
  });
  cmd->add_option("--optimizer", a->optimizer, "adam (default), adamw or sgd");
  cmd->add_option("--optimizer-impl", a->optimizer_impl,
                  "foreach (default since PyTorch 2.0, on GPUs), for-loop (1.13's default) or fused")
      ->each([a](const std::string&) { a->optimizer_impl_given = true; });
  cmd->add_option("--torch-version", a->torch_version,
                  "the PyTorch release whose defaults and behaviours the run reproduces: 1.10 to 1.13 or 2.0 to 2.9 "
                  "(default 2.9; docs/run.md lists what it changes)");
  cmd->add_option("--lr", a->lr, "learning rate (default 1e-3 for Adam/AdamW, 0.01 for SGD)")
      ->each([a](const std::string&) { a->lr_given = true; });
  cmd->add_option("--momentum", a->momentum, "SGD momentum (default 0.9; 0 for none)");
  cmd->add_option("--ddp", a->ddp,
                  "copy (gradient_as_bucket_view=False, PyTorch's default), view (=True), off, or copy,view (both, "
                  "compared); default copy with --world-size > 1, else off");
  cmd->add_option("--bucket-cap-mb", a->bucket_cap_mb,
                  "DDP bucket_cap_mb (default None: 25, with a 1 MiB first bucket)")
      ->each([a](const std::string&) { a->bucket_cap_given = true; });
  cmd->add_option("--zero", a->zero,
                  "ZeroRedundancyOptimizer with DDP: off (default), on, or bucket-view (parameters_as_bucket_view)");
  cmd->add_flag("--find-unused-parameters", a->find_unused, "DDP find_unused_parameters=True");
  cmd->add_flag("--static-graph", a->static_graph, "DDP static_graph=True");
  cmd->add_option("--comm-hook", a->comm_hook, "none (default), fp16 or bf16 (the compression hooks)");
  cmd->add_flag("--no-broadcast-buffers", a->no_broadcast_buffers, "DDP broadcast_buffers=False");
  cmd->add_option("--timeout", a->timeout, "collective timeout in seconds (default 60)");
  cmd->add_option("--scenario", a->scenario,
                  "a DDP mistake one rank makes, to see how the run fails: kill:R:S (rank R killed as step S's "
                  "backward begins), skip-barrier:R:S (every rank but R calls dist.barrier() after step S), "
                  "only-barrier:R:S (only rank R does, as inside `if rank == 0:`), extra-step:R (rank R trains one "
                  "step more: uneven inputs)");
  cmd->add_option("--zero-grad", a->zero_grad,
                  "none (set_to_none=True, the default since PyTorch 2.0) or zeros (1.13's default)")
      ->each([a](const std::string&) { a->zero_grad_given = true; });
  cmd->add_option("--alloc-conf", a->alloc_conf, "allocator settings (default: $PYTORCH_CUDA_ALLOC_CONF)")
      ->each([a](const std::string&) { a->alloc_conf_given = true; });
  cmd->add_option("--cublas-workspace", a->cublas_workspace,
                  "cuBLAS/cuBLASLt workspaces the first matmul allocates: default (8.125 MiB + 1 MiB, or as "
                  "$CUBLAS_WORKSPACE_CONFIG / $CUBLASLT_WORKSPACE_SIZE say), hopper (32 MiB + 1 MiB, sm90) or off")
      ->each([a](const std::string&) { a->cublas_workspace_given = true; });
  cmd->add_option("--memory-fraction", a->memory_fraction,
                  "torch.cuda.set_per_process_memory_fraction(F) on every rank's device, 0 to 1 (default 1: no cap)")
      ->each([a](const std::string&) { a->memory_fraction_given = true; });
  cmd->add_option("--device-memory", a->device_memory, "simulated GPU memory (default 80GiB, or --gpu's)")
      ->each([a](const std::string&) { a->device_memory_given = true; });
  cmd->add_option("--gpu", a->gpu,
                  "a GPU kind (memscope gpus lists them): sets the defaults of --device-memory, --cuda-context-mb and "
                  "--cublas-workspace to the kind's")
      ->each([a](const std::string&) { a->gpu_given = true; });
  cmd->add_option("--backend", a->backend,
                  "gloo (default) or nccl: NCCL's communicator checks (two ranks on one GPU fail, exit 5) and "
                  "buffers on each GPU; the data still moves over Gloo");
  cmd->add_option("--cuda-context-mb", a->cuda_context_mb,
                  "each process's CUDA context on each GPU it uses, in MiB (default 0: not modelled; --gpu's)")
      ->each([a](const std::string&) { a->cuda_context_given = true; });
  cmd->add_option("--nccl-buffers-mb", a->nccl_buffers_mb,
                  "NCCL's buffers per communicator in MiB (--backend nccl; default auto: 544 for 2 ranks, 688 for "
                  "more, measured on A100s)");
  cmd->add_option("--touch-device", a->touch_device,
                  "scenario: every rank uses cuda:D before set_device, leaving a context there (needs "
                  "--cuda-context-mb)")
      ->check(InRange(std::int64_t{0}, std::int64_t{255}));
  cmd->add_option("--devices", a->devices,
                  "each rank's GPU: local_rank (default: LOCAL_RANK, renumbered by CUDA_VISIBLE_DEVICES), same "
                  "(every rank on GPU 0), or one per rank (e.g. 0,0,1,1); ranks on one GPU share its memory");
  cmd->add_option("--save-checkpoint", a->save_checkpoint,
                  "torch.save the model and optimizer state dict at --checkpoint-step: rank0 (if rank == 0) or all "
                  "(every rank writes its file)");
  cmd->add_option("--load-checkpoint", a->load_checkpoint,
                  "torch.load it at --checkpoint-step, then load_state_dict: map_location none (back to the device it "
                  "was saved from), cpu or cuda:R");
  cmd->add_option("--checkpoint-step", a->checkpoint_step, "the step after which to save/load (default 0)")
      ->each([a](const std::string&) { a->checkpoint_step_given = true; });
  cmd->add_option("--exec", a->exec, "meta (default: shapes and memory only) or cpu (real float math; mlp, cifar-net)");
  cmd->add_option("--amp", a->amp, "none (default), fp16 (autocast + GradScaler) or bf16 (autocast)");
  cmd->add_flag("--checkpoint-activations", a->checkpoint,
                "torch.utils.checkpoint around each block (recompute in backward)");
  cmd->add_option("--grad-accum", a->grad_accum, "micro-batches per optimizer step (default 1)");
  cmd->add_option("--attention", a->attention, "eager (math, default), sdpa or flash_attention_2 (flash)");
  cmd->add_option("--out", a->out, "run directory (default memscope-run)");
  cmd->add_flag("--force", a->force, "write into an --out that is not empty and was not written by memscope");
  cmd->add_flag("--json", a->json, "print report.json instead of the tables");
  cmd->callback([a, &exit_status] {
    Printer printer;
    exit_status = RunCommand(*a, printer);
  });
  RegisterZooCommands(app, exit_status);
}

}  // namespace memscope::cli
