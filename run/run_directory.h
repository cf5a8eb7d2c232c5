// The run directory (DESIGN.md "The run directory"): the one place that knows
// the name of every file a run writes or reads, so that the writers (memscope
// run, replay --out, the launcher's logs) and the readers (LoadRun, compare)
// agree on them.
//
//   RUN/run.json                   the run manifest (RunManifest)
//   RUN/rank-R.timeline            rank R's binary event log
//   RUN/rank-R.json                rank R's status, written as it ends (RankStatus)
//   RUN/rank-R.log                 rank R's stdout and stderr (launched ranks)
//   RUN/report.json, summary.txt, trace.json, report.html
//   RUN/snapshot-rank-R.pickle     PyTorch-format snapshot at rank R's peak
//   RUN/.memscope-store/           Gloo FileStore rendezvous of our launcher
#ifndef MEMSCOPE_RUN_RUN_DIRECTORY_H_
#define MEMSCOPE_RUN_RUN_DIRECTORY_H_

#include <optional>
#include <string>

#include "absl/status/status.h"

namespace memscope {

class RunDirectory {
 public:
  explicit RunDirectory(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }

  // File names, relative to the directory (run.json's "timeline" entries use these).
  static std::string TimelineName(int rank);    // rank-R.timeline
  static std::string RankStatusName(int rank);  // rank-R.json
  static std::string RankLogName(int rank);     // rank-R.log
  static std::string SnapshotName(int rank);    // snapshot-rank-R.pickle
  static constexpr const char* kManifest = "run.json";
  static constexpr const char* kReport = "report.json";
  static constexpr const char* kSummary = "summary.txt";
  static constexpr const char* kTrace = "trace.json";
  static constexpr const char* kHtml = "report.html";
  static constexpr const char* kStore = ".memscope-store";

  // Paths inside this directory.
  std::string Path(const std::string& name) const;  // ROOT/NAME
  std::string Manifest() const { return Path(kManifest); }
  std::string Timeline(int rank) const { return Path(TimelineName(rank)); }
  std::string RankStatus(int rank) const { return Path(RankStatusName(rank)); }
  std::string RankLog(int rank) const { return Path(RankLogName(rank)); }
  std::string Snapshot(int rank) const { return Path(SnapshotName(rank)); }
  std::string Report() const { return Path(kReport); }
  std::string Summary() const { return Path(kSummary); }
  std::string Trace() const { return Path(kTrace); }
  std::string Html() const { return Path(kHtml); }
  std::string Store() const { return Path(kStore); }

  // The rank of a timeline file name ("rank-3.timeline" is 3); nullopt for any other name.
  static std::optional<int> TimelineRank(const std::string& name);

  // The files a run writes per rank (rank-R.json, rank-R.json.tmp, rank-R.log,
  // rank-R.timeline, snapshot-rank-R.pickle; R a number): only these, and the
  // rendezvous directory, are cleaned before a run.
  static bool IsRankFile(const std::string& name);

  // What a run directory holds, for the "recorded in DIR/ (...)" line:
  // "run.json, rank-0.timeline, report.json, ..." (rank-{0..N-1} for N ranks).
  static std::string Listing(int world_size);

  // Creates the directory (and its parents). The error names the directory.
  absl::Status Create() const;

  // Removes what an earlier run left here: the per-rank files and the
  // rendezvous directory. Everything else (the user's files, run.json,
  // report.json, which a new run overwrites) stays.
  void RemoveRankFiles() const;

 private:
  std::string root_;
};

}  // namespace memscope

#endif  // MEMSCOPE_RUN_RUN_DIRECTORY_H_
