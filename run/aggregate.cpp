#include "run/aggregate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "exporters/report.h"
#include "run/gpu_table.h"
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
    if (e.signal != 0) entry.status = e.stopped_by_launcher ? "stopped" : "killed";
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
  if (run.first_failure >= 0) {
    const ManifestRank& f = m.ranks[static_cast<std::size_t>(run.first_failure)];
    std::string message = absl::StrCat("rank ", run.first_failure, " ", f.how.value_or(""));
    if (!f.error->empty()) absl::StrAppend(&message, ": ", *f.error);
    m.failure = RunFailure{run.first_failure, message};
  }
  return m;
}

// The exit status and the stderr lines about the ranks that did not end well.
void Judge(const RunRecord& run, RunOutcome& out) {
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
  if (out.manifest.failure) {
    absl::StrAppend(&err, "memscope run: ", out.manifest.failure->message, "\n");
    for (const ManifestRank& r : ranks) {
      if (r.rank != run.first_failure && r.status != "ok") {
        absl::StrAppend(&err, "memscope run: rank ", r.rank, " ", r.how.value_or("failed"),
                        r.error->empty() ? "" : ": " + *r.error, "\n");
      }
    }
  }
  if (oom) {
    for (std::size_t r = 0; r < out.statuses.size(); ++r) {
      const std::optional<RankStatus>& st = out.statuses[r];
      if (!st || st->status != "oom") continue;
      absl::StrAppend(&err, "memscope run: rank ", r, " out of memory in step ", st->steps_done, ":\n", st->error,
                      "\n");
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

  absl::StatusOr<std::vector<Timeline>> recorded = LoadRun(run.dir.root());
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
  // report.json also gets each rank's status and DDP buckets, and the run's
  // first failure on the rank that failed first.
  auto amend = [&](std::vector<RankReport>& reports) {
    for (RankReport& r : reports) {
      if (r.rank < 0 || r.rank >= world_size) continue;
      const std::optional<RankStatus>& st = statuses[static_cast<std::size_t>(r.rank)];
      if (st && st->ddp) r.ddp = st->ddp;
      r.status = ranks[static_cast<std::size_t>(r.rank)].status;
      if (out.manifest.failure && out.manifest.failure->rank == r.rank) r.failure = out.manifest.failure->message;
    }
  };
  // The whole GPU (run/gpu_table.h), when there is more to it than the allocator.
  auto extend = [&](const std::vector<RankReport>& reports, nlohmann::json& report, std::string& summary) {
    const std::vector<GpuRow> gpus = GpuTable(statuses, reports, run.device_memory);
    if (gpus.empty()) return;
    report["gpus"] = GpuTableJson(gpus);
    absl::StrAppend(&summary, "\n", GpuTableText(gpus));
  };
  absl::StatusOr<std::vector<RankReport>> reports =
      WriteRunOutputs(run.dir.root(), *recorded, amend, &write_errors, extend);
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
