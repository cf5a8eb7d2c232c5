#include "run/aggregate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "exporters/report.h"
#include "run/gpu_table.h"
#include "run/interrupt.h"
#include "load/recording.h"
#include "run/run.h"

namespace memscope {
namespace {

// run.json's entry for rank `r`: its own status, overridden by what our
// launcher saw (a signal is "killed", or "stopped" when we sent it).
ManifestRank RankEntry(int r, const std::optional<RankStatus>& st, const std::vector<RankExit>& exits) {
  ManifestRank entry;
  entry.rank = r;
  entry.timeline = RunDirectory::TimelineName(r);
  if (st) {
    entry.status = st->status;
    entry.exit_code = st->exit_code;
    entry.error = WithoutRankPrefix(st->error, r);
    entry.steps_done = st->steps_done;
  } else {
    entry.status = "failed";
    entry.error = "";
  }
  // What the rank said through its status pipe, when it wrote no status.
  if (!exits.empty() && (!st || entry.error->empty())) entry.error = exits[static_cast<std::size_t>(r)].message;
  if (!exits.empty()) {
    const RankExit& e = exits[static_cast<std::size_t>(r)];
    entry.exit_code = e.exit_code;
    entry.signal = e.signal;
    if (e.signal != 0 || e.stopped_by_launcher) entry.status = e.stopped_by_launcher ? "stopped" : "killed";
    entry.how = e.Describe();
  }
  return entry;
}

// The manifest of the run from its settings and the ranks' statuses.
RunManifest BuildManifest(const RunRecord& run, const std::vector<std::optional<RankStatus>>& statuses) {
  RunManifest m;
  m.generator = kMemscopeVersion;
  m.command = "run";
  m.world_size = run.world_size;
  m.alloc_conf = run.alloc_conf;
  m.device_memory = run.device_memory;
  TrainingManifest& t = m.training.emplace(run.training);
  t.steps_done = t.steps;
  for (int r = 0; r < run.world_size; ++r) {
    const std::optional<RankStatus>& st = statuses[static_cast<std::size_t>(r)];
    if (st) {
      t.parameters = st->parameters;
      t.steps_done = std::min(t.steps_done, st->steps_done);
      t.seconds = std::max(t.seconds, st->seconds);
      if (r == 0) t.losses = st->losses;
    }
    m.ranks.push_back(RankEntry(r, st, run.exits));
  }
  if (run.interrupted != 0) m.interrupted = SignalName(run.interrupted);
  if (run.first_failure >= 0) {
    const ManifestRank& f = m.ranks[static_cast<std::size_t>(run.first_failure)];
    std::string message = absl::StrCat("rank ", run.first_failure, " ", f.how.value_or(""));
    if (!f.error->empty()) absl::StrAppend(&message, ": ", *f.error);
    m.failure = RunFailure{run.first_failure, message};
  }
  return m;
}

// What a collective mismatch means for the user's job, said once after it.
constexpr const char* kMismatchHint =
    "memscope run: in PyTorch this hangs until the process group's timeout: every rank "
    "must call the same collectives in the same order. Usual causes: a dist.barrier() only some ranks reach "
    "(inside `if rank == 0:`), or ranks with different numbers of batches (DistributedSampler(drop_last=True), or "
    "DDP's join() context manager).";

// "rank 1", "ranks 0 and 1", "ranks 0, 2 and 3".
std::string RanksText(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    absl::StrAppend(&out, ranks[i]);
  }
  return out;
}

// The stderr lines of a run with a first failure: that rank's line first,
// then the other ranks that did not end well. Ranks that failed alike share a
// line ("ranks 0 and 1 exited with status 4: collective mismatch at ..."), so
// which of them noticed first does not change what is printed.
std::string FailureLines(const std::vector<ManifestRank>& ranks, int first_failure) {
  std::vector<std::pair<std::string, std::vector<int>>> lines;  // what happened, to which ranks
  auto add = [&lines](const ManifestRank& r) {
    const std::string what = absl::StrCat(r.how.value_or("failed"), r.error->empty() ? "" : ": " + *r.error);
    for (auto& [text, who] : lines) {
      if (text == what) {
        who.push_back(r.rank);
        std::sort(who.begin(), who.end());
        return;
      }
    }
    lines.push_back({what, {r.rank}});
  };
  add(ranks[static_cast<std::size_t>(first_failure)]);
  for (const ManifestRank& r : ranks) {
    if (r.rank != first_failure && r.status != "ok") add(r);
  }
  std::string out;
  for (const auto& [text, who] : lines) absl::StrAppend(&out, "memscope run: ", RanksText(who), " ", text, "\n");
  return out;
}

// An interrupted run: its one line, "memscope run: interrupted by SIGINT
// after 12 of 100000 steps; what was recorded is in RUN/ (run.json, ...)",
// and 128 + the signal. A failure before the interrupt is still said first.
void JudgeInterrupted(const RunRecord& run, RunOutcome& out) {
  out.interrupted = run.interrupted;
  out.exit_code = 128 + run.interrupted;
  if (out.manifest.failure) out.diagnostics += FailureLines(out.manifest.ranks, run.first_failure);
  const TrainingManifest* t = out.manifest.training ? &*out.manifest.training : nullptr;
  absl::StrAppend(&out.diagnostics, "memscope run: interrupted by ", SignalName(run.interrupted),
                  t != nullptr ? absl::StrCat(" after ", t->steps_done, " of ", t->steps, " steps") : "",
                  "; what was recorded is in ", run.dir.root(), "/ (", run.dir.ExistingListing(run.world_size), ")\n");
}

// The exit status and the stderr lines about the ranks that did not end well.
void Judge(const RunRecord& run, RunOutcome& out) {
  if (run.interrupted != 0) return JudgeInterrupted(run, out);
  const std::vector<ManifestRank>& ranks = out.manifest.ranks;
  bool oom = false, failed = false, nccl = false;
  for (int r = 0; r < run.world_size; ++r) {
    const std::optional<RankStatus>& st = out.statuses[static_cast<std::size_t>(r)];
    oom = oom || (st && st->status == "oom");
    nccl = nccl || (st && st->status == "nccl_error");
    failed = failed || !st || st->status != "ok";
    if (!run.exits.empty()) failed = failed || !run.exits[static_cast<std::size_t>(r)].ok();
  }
  std::string& err = out.diagnostics;
  if (out.manifest.failure) err += FailureLines(ranks, run.first_failure);
  for (const ManifestRank& r : ranks) {
    if (r.error->find("collective mismatch") == std::string::npos) continue;
    absl::StrAppend(&err, kMismatchHint, "\n");
    break;
  }
  if (oom) {
    for (std::size_t r = 0; r < out.statuses.size(); ++r) {
      const std::optional<RankStatus>& st = out.statuses[r];
      if (!st || st->status != "oom") continue;
      // Under DataParallel the ranks are the devices of one process.
      const std::string who =
          run.training.data_parallel ? absl::StrCat("DataParallel device cuda:", r) : absl::StrCat("rank ", r);
      absl::StrAppend(&err, "memscope run: ", who, " out of memory in step ", st->steps_done, ":\n", st->error, "\n");
      for (const RankReport& rep : out.reports) {
        if (rep.rank == static_cast<int>(r) && rep.oom) absl::StrAppend(&err, rep.oom->verdict, "\n");
      }
      break;
    }
    out.exit_code = kExitOutOfMemory;
    return;
  }
  if (failed) {
    if (!out.manifest.failure) {
      for (const ManifestRank& r : ranks) {
        if (r.status == "ok") continue;
        absl::StrAppend(&err, "memscope run: rank ", r.rank,
                        " failed: ", r.error->empty() ? "it wrote no status (killed, or it never started)" : *r.error,
                        "\n");
      }
    }
    out.exit_code = nccl ? kExitNcclInvalidUsage : kExitRankFailed;
    return;
  }
  out.exit_code = 0;
}

}  // namespace

std::string WithoutRankPrefix(std::string error, int rank) {
  if (const std::string self = absl::StrCat("rank ", rank, ": "); error.rfind(self, 0) == 0)
    error.erase(0, self.size());
  return error;
}

absl::StatusOr<RunOutcome> AggregateRun(const RunRecord& run) {
  RunOutcome out;
  const int world_size = run.world_size;
  for (int r = 0; r < world_size; ++r) out.statuses.push_back(RankStatus::Read(run.dir.RankStatus(r)));
  out.manifest = BuildManifest(run, out.statuses);
  // run.json is written as before: a run directory whose analysis fails still says how its ranks ended.
  std::vector<absl::Status> write_errors;
  if (absl::Status s = out.manifest.Write(run.dir.Manifest()); !s.ok()) write_errors.push_back(s);

  absl::StatusOr<std::vector<Timeline>> recorded = LoadTimelines(run.dir.root());
  if (!recorded.ok()) {
    // Nothing to analyse (a full disk, say), but the ranks' story is told.
    Judge(run, out);
    absl::StrAppend(&out.diagnostics, "memscope run: ", recorded.status().message(), "\n");
    for (const absl::Status& e : write_errors) absl::StrAppend(&out.diagnostics, "memscope run: ", e.message(), "\n");
    if (out.exit_code == 0) out.exit_code = kExitOutputFailed;
    return out;
  }
  // Only this run's ranks (an external launcher's directory may hold more).
  std::erase_if(*recorded, [world_size](const Timeline& t) { return t.rank < 0 || t.rank >= world_size; });
  const std::vector<std::optional<RankStatus>>& statuses = out.statuses;
  const std::vector<ManifestRank>& ranks = out.manifest.ranks;
  // report.json also gets each rank's status, DDP buckets and losses, and
  // the run's first failure (whose rank may have recorded nothing).
  auto amend = [&](Report& report) {
    report.torch_version = run.training.torch_version;
    if (out.manifest.failure) report.failure = ReportFailure{out.manifest.failure->rank, out.manifest.failure->message};
    for (RankReport& r : report.ranks) {
      if (r.rank < 0 || r.rank >= world_size) continue;
      const std::optional<RankStatus>& st = statuses[static_cast<std::size_t>(r.rank)];
      if (st && st->ddp) r.ddp = st->ddp;
      if (st) r.losses = st->losses;
      r.status = ranks[static_cast<std::size_t>(r.rank)].status;
    }
    // The whole GPU (run/gpu_table.h), when there is more to it than the allocator.
    report.gpus = GpuTable(statuses, report.ranks, run.device_memory);
  };
  absl::StatusOr<std::vector<RankReport>> reports = WriteRunOutputs(run.dir.root(), *recorded, amend, &write_errors);
  if (!reports.ok()) return reports.status();
  out.timelines = std::move(*recorded);
  out.reports = std::move(*reports);
  Judge(run, out);
  // Outputs that could not be written (a full disk): each named, after the ranks' story.
  for (const absl::Status& e : write_errors) absl::StrAppend(&out.diagnostics, "memscope run: ", e.message(), "\n");
  if (!write_errors.empty() && out.exit_code == 0) out.exit_code = kExitOutputFailed;
  return out;
}

}  // namespace memscope
