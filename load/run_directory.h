// The run directory (docs/design.md, "The run directory"): the one place that knows
// the name of every file a run writes or reads, so that the writers (memscope
// run, replay --out, the launcher's logs) and the readers (LoadTimelines, compare)
// agree on them.
//
//   RUN/run.json                   the run manifest (RunManifest)
//   RUN/rank-R.timeline            rank R's binary event log
//   RUN/rank-R.json                rank R's status, written as it ends (RankStatus)
//   RUN/rank-R.log                 rank R's stdout and stderr (launched ranks)
//   RUN/report.json, summary.txt, trace.json, report.html
//   RUN/snapshot-rank-R.pickle     PyTorch-format snapshot at rank R's peak
//   RUN/.memscope-store/           Gloo FileStore rendezvous of our launcher
//   RUN/.memscope-files            the names of the per-rank files memscope wrote here
//   RUN/.memscope-lock             held (flock) by the run writing here; says who
//   RUN/.memscope-capture/         memscope capture: its Python start-up module
//                                  (sitecustomize.py) and each rank's capture status (rank-R.json)
#ifndef MEMSCOPE_LOAD_RUN_DIRECTORY_H_
#define MEMSCOPE_LOAD_RUN_DIRECTORY_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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
  // device-rank-R.gpu-D.timeline: a capture's device timeline of rank R on
  // CUDA device D (`memscope capture --all-device-memory`, devicemem/device_timeline.h).
  static std::string DeviceTimelineName(int rank, int device);
  // The rank and device of a device timeline's name; nullopt for any other name.
  static std::optional<std::pair<int, int>> DeviceTimelineOf(const std::string& name);
  static constexpr const char* kManifest = "run.json";
  static constexpr const char* kReport = "report.json";
  static constexpr const char* kSummary = "summary.txt";
  static constexpr const char* kTrace = "trace.json";
  static constexpr const char* kHtml = "report.html";
  static constexpr const char* kStore = ".memscope-store";
  static constexpr const char* kFileList = ".memscope-files";
  static constexpr const char* kLock = ".memscope-lock";
  static constexpr const char* kCapture = ".memscope-capture";

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
  std::string Capture() const { return Path(kCapture); }

  // The rank of a timeline file name ("rank-3.timeline" is 3); nullopt for any other name.
  static std::optional<int> TimelineRank(const std::string& name);

  // The files a run writes per rank (rank-R.json, rank-R.json.tmp, rank-R.log,
  // rank-R.timeline, snapshot-rank-R.pickle, device-rank-R.gpu-D.timeline;
  // R and D numbers): only these, and the
  // rendezvous directory, are cleaned before a run.
  static bool IsRankFile(const std::string& name);

  // What a run directory holds, for the "recorded in DIR/ (...)" line:
  // "run.json, rank-0.timeline, report.json, ..." (rank-{0..N-1} for N ranks).
  static std::string Listing(int world_size);
  // The same, of the files that exist (a failed run wrote fewer): the
  // per-rank ones as "rank-{0..1}.timeline" only when every rank has one.
  std::string ExistingListing(int world_size) const;

  // Creates the directory (and its parents). The error names the directory.
  absl::Status Create() const;

  // Whether memscope wrote here: the directory holds .memscope-lock or
  // .memscope-files (each writer creates one before its first output), or
  // is a --ddp copy,view directory whose copy/ or view/ is memscope's.
  bool WrittenByMemscope() const;

  // Makes ROOT a run's directory before anything is written there: checks
  // it (Check) and creates it with its marker (.memscope-files). Every
  // command that writes a run directory (run, replay --out, capture) calls
  // it. Errors start with "--out".
  absl::Status Claim(bool force) const;
  // Refuses ROOT when it is the root directory or the home directory
  // (always), is not a directory, or is not empty and was not written by
  // memscope (unless `force`): one line naming one of its files, e.g.
  // "--out 'U' is not empty and was not written by memscope (it holds
  // report.json): choose a new or empty directory, or --force to write into it".
  absl::Status Check(bool force) const;

  // Notes that memscope writes the per-rank file `name` here (appended to
  // .memscope-files), so that a later run's cleanup may remove it.
  void RecordFile(const std::string& name) const;

  // Removes what an earlier run left here: the per-rank files that
  // .memscope-files names (regular files only: never a directory, never
  // through a symlink) and the rendezvous directory (a symlink in its place
  // is removed, never followed). Everything else (the
  // user's files, even when named like rank files, and run.json,
  // report.json, which a new run overwrites) stays. A directory of a
  // memscope without that list loses only its rank-R.timeline files that
  // are timelines (they would be read as this run's ranks).
  void RemoveRankFiles() const;

  // The exclusive lock of a run on this directory: while it lives no other
  // memscope run can write here. Released when destroyed (or when the
  // process ends, however it ends).
  class Lock {
   public:
    explicit Lock(int fd) : fd_(fd) {}
    Lock(Lock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
    Lock& operator=(Lock&&) = delete;
    ~Lock();

   private:
    int fd_;
  };
  // Takes the lock (flock on .memscope-lock, which then names `holder`:
  // this process's pid and command). Error when another run holds it: "'DIR'
  // is in use by another memscope run (pid 123: memscope run --model ...)".
  absl::StatusOr<Lock> TakeLock(const std::string& holder) const;
  // This process as a lock's holder: "pid 123: memscope run --model ...".
  static std::string ThisProcess();

 private:
  std::string root_;
};

}  // namespace memscope

#endif  // MEMSCOPE_LOAD_RUN_DIRECTORY_H_
