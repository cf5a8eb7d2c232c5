// memscope explain: why a recording ran out of memory (or how close it
// came) and which changes would have saved it (explain/explain.h).
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/sizes.h"
#include "cli/commands.h"
#include "cli/explain_training.h"
#include "explain/explain.h"

namespace memscope::cli {
namespace {

struct ExplainArgs {
  std::string path;
  int rank = 0;
  std::string device_memory;
  std::optional<std::string> alloc_conf;
  std::optional<double> memory_fraction;
  bool json = false;
};

int Run(const ExplainArgs& args) {
  ExplainOptions options{.rank = args.rank, .alloc_conf = args.alloc_conf, .memory_fraction = args.memory_fraction};
  if (!args.device_memory.empty()) {
    absl::StatusOr<std::uint64_t> size = ParseSize(args.device_memory);
    if (!size.ok()) return Fail("explain", absl::StrCat("--device-memory: ", size.status().message()));
    options.gpu_memory = *size;
  }
  absl::StatusOr<MemoryExplanation> e = Explain(args.path, options);
  if (!e.ok()) return Fail("explain", e.status().message());
  AddTrainingChanges(args.path, *e);
  if (args.json) {
    std::cout << ExplanationJson(*e).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << ExplanationText(*e);
  }
  PrintNotes(e->notes);
  return kExitOk;
}

}  // namespace

void RegisterExplain(CLI::App& app, int& exit_status) {
  auto args = std::make_shared<ExplainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "explain",
      "Why a recording ran out of memory (or how close it came): the cause in a few lines, what filled the device, "
      "and which settings would have avoided it, each proven by a replay of the same requests.");
  cmd->add_option("file", args->path,
                  "a JSON-lines or RMM request trace, a torch.cuda.memory._snapshot() pickle, or a memscope "
                  "recording (run directory or rank-R.timeline)")
      ->required();
  cmd->add_option("--rank", args->rank, "of a run directory: the rank to explain (default 0)");
  cmd->add_option("--device-memory", args->device_memory,
                  "the GPU's whole memory, e.g. 80GiB (a PyTorch OOM snapshot: what its OOM does not account for "
                  "was held by other processes; default: the recording's own, else 80GiB)");
  cmd->add_option("--alloc-conf", args->alloc_conf,
                  "the allocator settings the job ran with (default: the recording's own, else "
                  "$PYTORCH_CUDA_ALLOC_CONF or $PYTORCH_ALLOC_CONF)");
  cmd->add_option("--memory-fraction", args->memory_fraction,
                  "torch.cuda.set_per_process_memory_fraction(F) the job ran with, 0 to 1");
  cmd->add_flag("--json", args->json, "print the explanation as JSON");
  cmd->callback([args, &exit_status] { exit_status = Run(*args); });
}

}  // namespace memscope::cli
