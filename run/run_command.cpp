#include "run/run_command.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/input_file.h"
#include "load/manifest.h"
#include "load/run_directory.h"
#include "recording/timeline.h"
#include "run/devices.h"
#include "run/interrupt.h"
#include "run/launcher.h"
#include "run/rank.h"
#include "run/run.h"
#include "tensor/blas_workspace.h"
#include "train/data_parallel.h"

namespace memscope {
namespace {

constexpr int kExitOk = 0;

// Unusable options: a rank of ours also tells its launcher why.
int Fail(RunPrinter& printer, absl::string_view message) {
  ReportToLauncher(std::string(message));
  return printer.Fail(message);
}

// Aggregates the finished ranks (run/aggregate.h), writes the run's outputs
// and has them printed. `exits` are the launcher's (empty for one in-process
// rank); `interrupted`, the signal that stopped the ranks (0: none). The
// outcome goes to `kept` when given.
int Finalize(const RunRequest& a, const RankPlan& plan, int world_size, const std::vector<RankExit>& exits,
             int first_failure, int interrupted, RunPrinter& printer, std::optional<RunOutcome>* kept = nullptr,
             const std::optional<TrainingManifest::DataParallel>& data_parallel = std::nullopt) {
  RunRecord record = MakeRecord(a, plan, world_size, exits, first_failure);
  record.training.data_parallel = data_parallel;
  record.interrupted = interrupted;
  absl::StatusOr<RunOutcome> out = AggregateRun(record);
  if (!out.ok()) return Fail(printer, out.status().message());
  printer.Outcome(a, *out);
  const int code = out->exit_code;
  if (kept != nullptr) *kept = std::move(*out);
  return code;
}

// One rank in this process: its status, and its failure said when other
// ranks run beside it. A rank of several also sends its error to our
// launcher (the status pipe), which names it even when this rank's log
// cannot be written (a full disk).
int RankMain(const RankPlan& plan, int rank, int world_size, const RunDirectory& dir, RunPrinter& printer) {
  bool rendezvous_failed = false;
  absl::StatusOr<RankStatus> status = RunRank(plan, rank, world_size, dir, &rendezvous_failed);
  if (!status.ok()) {
    if (world_size == 1) return Fail(printer, status.status().message());
    const std::string error = WithoutRankPrefix(std::string(status.status().message()), rank);
    // Its peers may wait for it in the rendezvous: the launcher stops them now.
    ReportToLauncher(error, RankFailure::kCannotRun);
    printer.RankFailed(rank, error);
    return kExitRankFailed;  // a rank that cannot write is a failed rank, not bad options
  }
  if (status->exit_code != kExitOk && status->status != "interrupted" && world_size > 1) {
    const std::string error = WithoutRankPrefix(status->error, rank);
    ReportToLauncher(error, rendezvous_failed ? RankFailure::kStopRun : RankFailure::kError);
    printer.RankFailed(rank, error);
  }
  return status->exit_code;
}

// A rank started by a launcher (ours, torchrun, Slurm, mpirun). Rank 0 of an
// external launcher also aggregates the run once every rank's status is
// there (or the timeout has passed).
int RunWorker(const RunRequest& a, const RankPlan& plan, int rank, int world_size, RunPrinter& printer,
              std::optional<RunOutcome>* kept) {
  const RunDirectory dir(a.out);
  // A status left by an earlier run must not pass for this one's.
  std::error_code ec;
  std::filesystem::remove(dir.RankStatus(rank), ec);
  const int code = RankMain(plan, rank, world_size, dir, printer);
  if (std::getenv("MEMSCOPE_SUPERVISED") != nullptr || rank != 0) return code;
  const int interrupted = InterruptSignal().load();  // the ranks' end; a signal after it is not theirs
  WaitForRankStatuses(dir, world_size, plan.timeout);
  const int final_code = Finalize(a, plan, world_size, {}, -1, interrupted, printer, kept);
  return code != kExitOk ? code : final_code;
}

// N ranks as processes of this executable under our launcher, then the run aggregated.
int LaunchAndFinalize(const RunRequest& a, const std::string& ddp_mode, const RankPlan& plan, int world_size,
                      RunPrinter& printer, std::optional<RunOutcome>* kept) {
  const RunDirectory dir(a.out);
  absl::StatusOr<LaunchResult> launched = LaunchRankProcesses(dir, ToArgs(a, ddp_mode), world_size, plan.timeout);
  if (!launched.ok()) return Fail(printer, launched.status().message());
  // A rank that rejected its options fails alike everywhere: say why once.
  for (const RankExit& e : launched->ranks) {
    if (e.exit_code == kExitBadOptions) {
      std::ifstream log(dir.RankLog(e.rank));
      std::string line;
      if (ReadBoundedLine(log, line, std::size_t{1} << 16) == LineRead::kTooLong) line.clear();
      // The rank's log may be lost (a full disk): its status pipe is not.
      if (line.empty()) line = absl::StrCat("memscope run: rank ", e.rank, ": ", e.message);
      printer.RankRejected(line);
      return kExitBadOptions;
    }
  }
  return Finalize(a, plan, world_size, launched->ranks, launched->first_failure, launched->interrupted, printer,
                  kept);
}

// Every rank's device is valid (run/devices.h), before anything runs: a
// rank of a launcher checks its own; our launcher checks each rank's, with
// the LOCAL_RANK it will give it. Without CUDA_VISIBLE_DEVICES our
// launcher's machine has the GPUs its ranks run on: a GPU that --touch-device
// or --load-checkpoint cuda:R names must be one of them.
absl::Status CheckDevices(const DeviceMap& map, bool worker, int rank, int world_size, std::optional<int> touch_device,
                          std::optional<int> load_ordinal) {
  DeviceEnvironment env = DeviceEnvironment::FromProcess();
  if (touch_device && env.cuda_visible_devices) {
    const std::size_t visible = VisibleDevices(*env.cuda_visible_devices).size();
    if (static_cast<std::size_t>(*touch_device) >= visible) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA error: invalid device ordinal: --touch-device ", *touch_device, ", but CUDA_VISIBLE_DEVICES=",
          *env.cuda_visible_devices, " makes ", visible, visible == 1 ? " device" : " devices", " visible"));
    }
  }
  if (worker) return AssignDevice(map, rank, env).status();
  int gpus = 1;  // the machine's GPUs, when CUDA_VISIBLE_DEVICES does not say
  for (int r = 0; r < world_size; ++r) {
    if (world_size > 1) env.local_rank = absl::StrCat(r);
    absl::StatusOr<DeviceAssignment> device = AssignDevice(map, r, env);
    if (!device.ok()) return device.status();
    gpus = std::max(gpus, device->ordinal + 1);
  }
  if (env.cuda_visible_devices) return absl::OkStatus();  // CheckCheckpointDevice and the above decide
  for (const auto& [what, ordinal] : {std::pair{"--touch-device", touch_device}, {"--load-checkpoint", load_ordinal}}) {
    if (ordinal && *ordinal >= gpus) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA error: invalid device ordinal: ", what, " on cuda:", *ordinal, ", but the run's ranks are on ",
          gpus == 1 ? "cuda:0" : absl::StrCat("cuda:0 to cuda:", gpus - 1),
          " (CUDA_VISIBLE_DEVICES=0,1,... gives the machine more GPUs)"));
    }
  }
  return absl::OkStatus();
}

// This process as a rank of an external launcher: RANK and WORLD_SIZE, checked.
struct LaunchedRank {
  bool worker = false;  // RANK and WORLD_SIZE are set
  int rank = 0;
  std::int64_t world_size = 1;
};
absl::StatusOr<LaunchedRank> RankOfProcess(const RunRequest& a) {
  const char* env_rank = std::getenv("RANK");
  const char* env_world = std::getenv("WORLD_SIZE");
  LaunchedRank r;
  r.worker = env_rank != nullptr && env_world != nullptr;
  r.world_size = a.world_size;
  if (!r.worker) return r;
  std::int64_t ws = 0;
  if (!absl::SimpleAtoi(env_world, &ws) || ws < 1 || ws > kMaxTimelineWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("WORLD_SIZE='", env_world, "' is not a positive integer up to ", kMaxTimelineWorldSize));
  }
  if (!absl::SimpleAtoi(env_rank, &r.rank) || r.rank < 0 || r.rank >= ws) {
    return absl::InvalidArgumentError(absl::StrCat("RANK='", env_rank, "' is not a rank of WORLD_SIZE=", ws));
  }
  if (a.world_size_given && a.world_size != ws) {
    return absl::InvalidArgumentError(absl::StrCat("--world-size ", a.world_size, " disagrees with WORLD_SIZE=", ws));
  }
  r.world_size = ws;
  return r;
}

// One run in one mode; its outcome goes to `kept` when this process aggregated it.
int RunOne(const RunRequest& a, const std::string& ddp_mode, RunPrinter& printer,
           std::optional<RunOutcome>* kept = nullptr) {
  absl::StatusOr<LaunchedRank> launched = RankOfProcess(a);
  if (!launched.ok()) return Fail(printer, launched.status().message());
  const bool worker = launched->worker;
  const int rank = launched->rank;
  const std::int64_t world_size = launched->world_size;
  absl::StatusOr<RankPlan> plan = MakeRankPlan(a, ddp_mode, world_size);
  if (!plan.ok()) return Fail(printer, plan.status().message());
  const std::optional<int> load_ordinal = plan->checkpoint.load == CheckpointPlan::Load::kCuda
                                              ? std::optional<int>(plan->checkpoint.load_ordinal)
                                              : std::nullopt;
  if (absl::Status s =
          CheckDevices(plan->devices, worker, rank, static_cast<int>(world_size), plan->touch_device, load_ordinal);
      !s.ok()) {
    return Fail(printer, s.message());
  }
  if (absl::Status s = CheckCheckpointDevice(plan->checkpoint, DeviceEnvironment::FromProcess()); !s.ok()) {
    return Fail(printer, s.message());
  }
  if (!worker) {
    // PyTorch's warnings for workspace variables it cannot read (it then uses its defaults).
    std::vector<std::string> warnings;
    if (a.cublas_workspace != "off") {
      ChooseBlasWorkspaceSizes(BlasWorkspaceEnv::FromEnvironment(), a.cublas_workspace == "hopper", &warnings);
    }
    printer.SettingsNotes(plan->config, warnings);
  }
  const RunDirectory dir(a.out);
  if (absl::Status s = dir.Claim(a.force); !s.ok()) return Fail(printer, s.message());
  if (worker) return RunWorker(a, *plan, rank, static_cast<int>(world_size), printer, kept);
  // One run at a time per directory; the ranks of ours run under this lock.
  absl::StatusOr<RunDirectory::Lock> lock = dir.TakeLock(RunDirectory::ThisProcess());
  if (!lock.ok()) return Fail(printer, lock.status().message());
  dir.RemoveRankFiles();  // what an earlier run in this directory left
  if (world_size == 1) {
    const int code = RankMain(*plan, 0, 1, dir, printer);
    if (code == kExitBadOptions) return code;
    return Finalize(a, *plan, 1, {}, -1, InterruptSignal().load(), printer, kept);
  }
  return LaunchAndFinalize(a, ddp_mode, *plan, static_cast<int>(world_size), printer, kept);
}

// `memscope run --dp N`: DataParallel over N simulated GPUs in this process
// (run/rank.h RunDataParallel), the devices recorded as ranks, then the run
// aggregated and printed with the imbalance table.
int RunDataParallelCommand(const RunRequest& a, RunPrinter& printer) {
  if (a.dp < 2 || a.dp > 64)
    return Fail(printer, absl::StrCat("--dp ", a.dp, ": use 2 to 64 devices (DataParallel over N GPUs)"));
  if (a.world_size_given && a.world_size > 1) {
    return Fail(printer, absl::StrCat("--dp is DataParallel in one process; it does not combine with --world-size ",
                                      a.world_size, " (DDP); use one or the other"));
  }
  if (a.ddp != "auto" && a.ddp != "off") return Fail(printer, absl::StrCat("--dp does not combine with --ddp ", a.ddp));
  if (std::getenv("RANK") != nullptr && std::getenv("WORLD_SIZE") != nullptr) {
    return Fail(printer,
                "--dp runs one process over N GPUs; it cannot be a rank of a launcher (RANK and WORLD_SIZE are set)");
  }
  if (a.grad_accum != 1) return Fail(printer, "--dp with --grad-accum is not modelled");
  absl::StatusOr<RankPlan> plan = MakeRankPlan(a, "off", 1);
  if (!plan.ok()) return Fail(printer, plan.status().message());
  plan->ddp = "dp";
  if (absl::Status s = CheckDataParallelOptions(plan->train, static_cast<int>(a.dp), plan->cpu); !s.ok()) {
    return Fail(printer, s.message());
  }
  const RunDirectory dir(a.out);
  if (absl::Status s = dir.Claim(a.force); !s.ok()) return Fail(printer, s.message());
  absl::StatusOr<RunDirectory::Lock> lock = dir.TakeLock(RunDirectory::ThisProcess());
  if (!lock.ok()) return Fail(printer, lock.status().message());
  dir.RemoveRankFiles();
  const int devices = static_cast<int>(a.dp);
  absl::StatusOr<DataParallelRun> run = RunDataParallel(*plan, devices, dir);
  if (!run.ok()) return Fail(printer, run.status().message());
  TrainingManifest::DataParallel dp;
  for (int d = 0; d < devices; ++d) dp.device_ids.push_back(d);
  dp.chunk_sizes = run->chunk_sizes;
  for (std::int64_t c : dp.chunk_sizes) dp.global_batch += c;
  return Finalize(a, *plan, devices, {}, -1, InterruptSignal().load(), printer, nullptr, dp);
}

// `memscope run --ddp copy,view`: the two runs compared, from the reports
// this process just made (or from disk, for a rank of an external launcher
// that did not aggregate a pass).
int CompareModes(const std::string (&dirs)[2], const std::optional<RunOutcome> (&outcomes)[2], int worst,
                 RunPrinter& printer) {
  absl::StatusOr<CompareInput> inputs[2];
  for (int i = 0; i < 2; ++i) {
    const std::optional<RunOutcome>& o = outcomes[i];
    inputs[i] =
        o ? CompareInputFromRun(dirs[i], o->timelines, o->reports, o->manifest.ToJson()) : LoadCompareInput(dirs[i]);
    if (!inputs[i].ok()) return Fail(printer, inputs[i].status().message());
  }
  absl::StatusOr<Comparison> c = Compare(*inputs[0], *inputs[1]);
  if (!c.ok()) return Fail(printer, c.status().message());
  printer.Comparison(*c);
  return worst;
}

// Both modes, each in its own directory (OUT/copy, OUT/view), then the comparison.
int RunBothModes(const RunRequest& a, RunPrinter& printer) {
  // OUT is memscope's once a pass has claimed its copy/ or view/ (load/run_directory.h).
  if (absl::Status s = RunDirectory(a.out).Check(a.force); !s.ok()) return Fail(printer, s.message());
  int worst = kExitOk;
  const char* store = std::getenv("MEMSCOPE_STORE");
  const std::string base_store = store != nullptr ? store : "";
  std::optional<RunOutcome> outcomes[2];
  const std::string dirs[2] = {(std::filesystem::path(a.out) / "copy").string(),
                               (std::filesystem::path(a.out) / "view").string()};
  for (int i = 0; i < 2; ++i) {
    const char* mode = i == 0 ? "copy" : "view";
    RunRequest m = a;
    m.ddp = mode;
    m.out = dirs[i];
    printer.PassBegins(mode);
    // Ranks of an external launcher rendezvous once per pass.
    if (!base_store.empty()) ::setenv("MEMSCOPE_STORE", absl::StrCat(base_store, "-", mode).c_str(), 1);
    const int code = RunOne(m, mode, printer, &outcomes[i]);
    if (code == kExitBadOptions) return code;
    // Interrupted: no second pass, nothing to compare.
    if (const int signal = InterruptSignal().load(); signal != 0) return std::max(code, 128 + signal);
    worst = std::max(worst, code);
    printer.PassEnds();
  }
  return CompareModes(dirs, outcomes, worst, printer);
}

}  // namespace

int RunCommand(const RunRequest& request, RunPrinter& printer) {
  // Ctrl-C and SIGTERM stop the run and report what it recorded; a second
  // one ends the process that started it at once (run/interrupt.h).
  const InterruptHandlers handlers(/*exit_at_second=*/std::getenv("RANK") == nullptr);
  RunRequest a = request;
  if (absl::Status s = ApplyGpuKind(a); !s.ok()) return Fail(printer, s.message());
  if (absl::Status s = ApplyTorchVersion(a); !s.ok()) return Fail(printer, s.message());
  if (a.dp_given) return RunDataParallelCommand(a, printer);
  if (a.ddp != "copy,view" && a.ddp != "view,copy") return RunOne(a, a.ddp, printer);
  return RunBothModes(a, printer);
}

}  // namespace memscope
