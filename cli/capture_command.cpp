// memscope capture --out RUN [--max-entries N] [--all-device-memory] -- CMD ARGS...: runs a real
// PyTorch job under memscope's start-up module (capture/capture.h) and exits
// with the job's status.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capture/capture.h"
#include "cli/commands.h"
#include "load/run_directory.h"

namespace memscope::cli {
namespace {

struct CaptureArgs {
  std::string out;
  std::uint64_t max_entries = kDefaultCaptureMaxEntries;
  bool force = false;
  bool all_device_memory = false;
  std::vector<std::string> command;
};

int Capture(const CaptureArgs& a) {
  if (a.out.empty()) return Fail("capture", "--out RUN must not be empty");
  if (a.command.empty()) return Fail("capture", "no command to run: memscope capture --out RUN -- CMD ARGS...");
  absl::StatusOr<CaptureResult> r = RunCapture({a.out, a.command, a.max_entries, a.force, a.all_device_memory});
  if (!r.ok()) return Fail("capture", r.status().message());
  if (!r->start_error.empty()) {
    Fail("capture", r->start_error);
    return r->exit_status;
  }
  PrintNotes(r->notes);
  FlushNotes();  // before the last line, which says where the capture is
  std::vector<int> snapshots;
  for (const ManifestRank& rank : r->manifest.ranks) {
    if (!rank.timeline.empty()) snapshots.push_back(rank.rank);
  }
  std::string files = RunDirectory::kManifest;
  if (snapshots.size() == 1) {
    absl::StrAppend(&files, ", ", RunDirectory::SnapshotName(snapshots[0]));
  } else if (!snapshots.empty()) {
    absl::StrAppend(&files, ", snapshot-rank-{", snapshots.front(), "..", snapshots.back(), "}.pickle");
  }
  std::fprintf(stderr, "memscope capture: the job %s; recorded in %s/ (%s)%s\n",
               r->manifest.capture->signal ? absl::StrCat("was killed by signal ", *r->manifest.capture->signal).c_str()
                                           : absl::StrCat("exited with status ", r->exit_status).c_str(),
               EscapeForTerminal(a.out).c_str(), files.c_str(),
               snapshots.empty() ? "" : absl::StrCat(": memscope summary ", EscapeForTerminal(a.out)).c_str());
  return r->exit_status;
}

}  // namespace

void RegisterCapture(CLI::App& app, int& exit_status, const std::optional<std::vector<std::string>>& job) {
  auto args = std::make_shared<CaptureArgs>();
  CLI::App* capture = app.add_subcommand(
      "capture",
      "Run a PyTorch job (python train.py, torchrun ...) unchanged, marking its phases and recording its GPU memory "
      "into a run directory (snapshot-rank-R.pickle per rank); exits with the job's status.");
  capture->add_option("--out", args->out, "run directory to write (run.json, snapshot-rank-R.pickle)")->required();
  capture->add_flag("--force", args->force, "write into an --out that is not empty and was not written by memscope");
  capture->add_flag("--all-device-memory", args->all_device_memory,
                    "also record every device allocation of the job's processes (NCCL, cuBLAS, cuDNN, the CUDA "
                    "context, ...) with CUPTI and NVML: RUN/device-rank-R.gpu-D.timeline (untested on a GPU)");
  capture
      ->add_option("--max-entries", args->max_entries,
                   "entries kept by PyTorch's memory history ring (_record_memory_history max_entries; default "
                   "1000000)")
      ->check(InRange(std::uint64_t{1}, std::uint64_t{1} << 40));
  // The job's words are never memscope's options: everything from the first
  // word that is not one is the job (CLI11's "remaining"), and so is what
  // follows `--` (split off by main); a `--` after the job's first word is
  // the job's own.
  capture->prefix_command();
  capture->footer(
      "The job: -- CMD ARGS... (e.g. -- python train.py --lr 0.1, or -- torchrun --nproc_per_node 8 train.py)\n");
  capture->callback([args, capture, job, &exit_status] {
    args->command = capture->remaining();
    if (job) {
      if (!args->command.empty()) args->command.push_back("--");
      args->command.insert(args->command.end(), job->begin(), job->end());
    }
    exit_status = Capture(*args);
  });
}

}  // namespace memscope::cli
