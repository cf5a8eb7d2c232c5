// `memscope capture --out RUN -- CMD ARGS...`: runs a real PyTorch job, with
// no edits to it, under memscope's Python start-up module
// (capture/sitecustomize.py, written as RUN/.memscope-capture/sitecustomize.py
// and put first on PYTHONPATH). The module marks the training phases with
// record_function scopes and, on a GPU, records the memory history and writes
// RUN/snapshot-rank-R.pickle per rank (RANK, as torchrun sets it) at exit and
// at an OOM. Afterwards run.json (command "capture") names those snapshots,
// so every command reads RUN as a multi-rank run (load/recording.h, LoadTimelines).
//
// The job keeps memscope's standard input, output and error; memscope's
// own lines go to standard error. Its exit status is the job's, as a shell
// would give it (128 + N when signal N ended it).
#ifndef MEMSCOPE_CAPTURE_CAPTURE_H_
#define MEMSCOPE_CAPTURE_CAPTURE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "load/manifest.h"

namespace memscope {

// PyTorch's own default is an unbounded trace (max_entries=sys.maxsize);
// capture bounds it like docs/capture.md's example, at about 100-200 MB of
// host memory per rank with stacks.
inline constexpr std::uint64_t kDefaultCaptureMaxEntries = 1000000;

struct CaptureOptions {
  std::string run_dir;
  std::vector<std::string> command;  // the job: argv[0] is looked up on PATH
  std::uint64_t max_entries = kDefaultCaptureMaxEntries;
  bool force = false;  // --force: run_dir may hold files memscope did not write (RunDirectory::Claim)
  // --all-device-memory: the job runs with CUDA_INJECTION64_PATH naming
  // memscope's CUPTI injection library (DeviceMemoryLibrary), which writes
  // each process's device timelines; they become RUN/device-rank-R.gpu-D.timeline.
  bool all_device_memory = false;
};

// The CUPTI injection library's name, next to the memscope binary
// (build/libmemscope-cupti.so); $MEMSCOPE_CUPTI_LIBRARY names another.
inline constexpr const char* kDeviceMemoryLibraryName = "libmemscope-cupti.so";

// The injection library's path when it is there and loads (its libcupti
// found; dlopen, then dlclose: no CUDA is touched); else an error saying
// which, for a one-line note (the job still runs, recording PyTorch's
// allocator alone).
absl::StatusOr<std::string> DeviceMemoryLibrary();

struct CaptureResult {
  // The job's exit status as a shell gives it: its exit code, 128 + N for
  // signal N, 127 when the command was not found, 126 when it could not be
  // run (then `start_error` says why, and run.json is not written).
  int exit_status = 0;
  std::string start_error;
  RunManifest manifest;            // what run.json now says
  std::vector<std::string> notes;  // what the user should know (no snapshot written, ...)
};

// Runs the job to its end. Errors (nothing was run): the run directory is
// refused (RunDirectory::Claim) or cannot be created or written, another memscope run holds its lock, no
// command. While the job runs, memscope ignores SIGINT and SIGQUIT (the
// terminal sends them to the job, as with a shell's foreground command) and
// passes SIGTERM and SIGHUP on to it.
absl::StatusOr<CaptureResult> RunCapture(const CaptureOptions& options);

}  // namespace memscope

#endif  // MEMSCOPE_CAPTURE_CAPTURE_H_
