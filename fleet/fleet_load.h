// Reading a fleet: every rank of the paths given, by a pool of workers, each
// reading one file at a time and keeping only its rank's summary
// (FleetRank): memory is bounded by the summaries and by one recording per
// worker, never by the fleet.
//
//   FleetLoadOptions options;             // workers: one per core
//   absl::StatusOr<FleetInputs> in = LoadFleet({"capture/"}, options);
//
// What a path may be:
//   - a file: a PyTorch snapshot, a rank-R.timeline, a report.json or the
//     output of `memscope summary --json` (one rank or many);
//   - a run or capture directory (run.json, rank-R.timeline or
//     snapshot-rank-R.pickle files): each rank file is read on its own, and
//     its GPU table comes from the directory's report.json when it has one;
//   - any other directory: every file in it that is a snapshot, a timeline
//     or a JSON report (others are skipped, and a note counts them).
// A file holding one rank is that rank if its name says so (rank-R, rank_R,
// rankR, as in snapshot-rank-R.pickle or rank7.json), else it keeps its own
// rank (a snapshot: its device index, usually 0). A snapshot with several
// devices is read as its device with the most events.
#ifndef MEMSCOPE_FLEET_FLEET_LOAD_H_
#define MEMSCOPE_FLEET_FLEET_LOAD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fleet/fleet.h"

namespace memscope {

struct FleetLoadOptions {
  int jobs = 0;  // workers; 0: one per core
  // The simulated GPU a snapshot is replayed on; nullopt: the capacity its
  // OOM implies, else 80 GiB (load/recording.h SnapshotDeviceMemory).
  std::optional<std::uint64_t> device_memory;
};

struct FleetInputs {
  std::vector<FleetRank> ranks;    // in the order read (AnalyzeFleet sorts them)
  std::vector<std::string> notes;  // about the inputs: files skipped
};

// Every rank of `paths`. Errors (the first in the order of the inputs, so
// that the message does not depend on the workers' timing): a path that
// does not exist or cannot be read, a reader's error naming the file, a
// request trace given as a file, a directory without ranks, the same rank
// twice ("rank 3 is in both 'a' and 'b'"), no paths.
absl::StatusOr<FleetInputs> LoadFleet(const std::vector<std::string>& paths, const FleetLoadOptions& options);

// The rank a file's name gives (".../snapshot-rank-37.pickle": 37), if any.
std::optional<int> RankInFileName(const std::string& path);

// Rank `rank`'s own HTML report (viewer/), read again from `source`; for
// the outliers of the fleet's page. Errors: the source's reader's; a
// report.json or summary has no recording to show (FailedPrecondition).
absl::StatusOr<std::string> FleetRankHtml(const FleetRank& rank, const FleetLoadOptions& options);

}  // namespace memscope

#endif  // MEMSCOPE_FLEET_FLEET_LOAD_H_
