// `memscope fleet`: many ranks at once. Each rank is reduced to a small
// summary (a RankReport without its model: tens of KiB at most), and the
// fleet is analysed from those summaries alone:
//
//   - per rank: peak allocated and reserved, fragmentation at the peak,
//     OOMs, allocation retries, steps, the peak reserved of every step, the
//     GPU table's rows where the input has one;
//   - across ranks: min / median / max and skew ((max - min) / median) of
//     each metric;
//   - outlier ranks, by a robust score (Iglewicz and Hoaglin's modified
//     z-score, median and median absolute deviation, not mean and standard
//     deviation, so that one outlier cannot hide itself), and for each what
//     differs from the median rank: categories and top sites at the peak,
//     phases, growth per step.
//
//   absl::StatusOr<std::vector<FleetRank>> ranks = LoadFleet({"capture/"}, {});
//   FleetResult fleet = AnalyzeFleet(std::move(*ranks));
//   std::cout << FleetText(fleet);
//
// Loading (fleet/fleet_load.h) reads the files with a pool of workers; this
// header is pure functions over what they returned.
#ifndef MEMSCOPE_FLEET_FLEET_H_
#define MEMSCOPE_FLEET_FLEET_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/analysis.h"
#include "exporters/report.h"
#include "nlohmann/json.hpp"

namespace memscope {

// What the fleet analysis derives from one rank's report.
struct FleetRankFigures {
  std::uint64_t peak_allocated = 0;
  std::uint64_t peak_reserved = 0;
  // At the peak of allocated: reserved minus allocated, and the
  // fragmentation ratio (1 - largest free block / free bytes in segments).
  std::uint64_t frag_bytes = 0;
  double fragmentation = 0;
  std::int64_t ooms = 0;     // memory_stats num_ooms (1 when only the report's "oom" says so)
  std::int64_t retries = 0;  // memory_stats num_alloc_retries
  // Steps with a phase row, in order, and each one's peak reserved: the
  // max_memory_reserved its phases raised it to, or else the largest
  // reserved at its phase ends (reserved memory only shrinks on empty_cache
  // or an OOM retry, so this is the step's peak unless it emptied the cache
  // and grew again below the earlier maximum).
  std::vector<std::int64_t> steps;
  std::vector<std::uint64_t> step_peak_reserved;
  // Allocated at the end of the last step minus at the end of the first,
  // over the steps between them: a leak's growth per step. 0 with fewer than
  // two steps.
  std::int64_t growth_per_step = 0;
  // The highest peak allocated inside each phase, by phase name ("forward",
  // a user phase's label), every step together.
  std::map<std::string, std::int64_t> phase_peaks;
};
FleetRankFigures FiguresOf(const RankReport& report);

// One rank of the fleet: where it came from and its analysis.
struct FleetRank {
  std::string source;  // the file (or run directory) it was read from
  std::string kind;    // RecordingKindName of the source: "PyTorch snapshot", "timeline", "report.json", ...
  // AnalyzeRank's report, or a report.json / summary
  // --json rank as read: the same numbers either way (ReduceRank drops the
  // parts the fleet does not use).
  RankReport report;
  std::vector<GpuRow> gpus;  // the GPU table's rows of GPUs this rank uses, its processes only; often empty
  std::vector<std::string> notes;  // the readers' notes about this rank
  FleetRankFigures figures;        // FiguresOf(report), once ReduceRank has run
  bool reduced = false;
};

// Computes the rank's figures and drops what the fleet does not use (the
// phase table, DDP buckets, losses, the model): a rank of many steps then
// costs its steps' peaks, not its phase rows. Does nothing the second time.
void ReduceRank(FleetRank& rank);


// The metrics scored for outliers, in this order.
enum class FleetMetric { kPeakAllocated, kPeakReserved, kGrowthPerStep };
inline constexpr int kNumFleetMetrics = 3;
std::string_view FleetMetricName(FleetMetric metric);  // "peak_allocated", "peak_reserved", "growth_per_step"

// min / median / max of one metric across the ranks. The median of an even
// count is the mean of the two middle values, rounded down.
struct FleetSpread {
  std::int64_t min = 0;
  std::int64_t median = 0;
  std::int64_t max = 0;
  int min_rank = 0;
  int max_rank = 0;
  double skew = 0;  // (max - min) / median; 0 when the median is 0
};

// The modified z-score of Iglewicz and Hoaglin: (x - median) / (1.4826 MAD),
// where MAD is the median absolute deviation from the median. When more than
// half the ranks sit at the median (MAD = 0) the scale is 1.2533 times the
// mean absolute deviation instead (the same estimator's fallback). The
// scale is never below 1% of the metric's median (for growth_per_step, of
// peak_allocated's): ranks within a few percent of each other are alike,
// however uniform the rest. A rank is an outlier when |score| > 3.5.
inline constexpr double kOutlierScore = 3.5;
inline constexpr double kMinScaleOfMedian = 0.01;

// One way an outlier differs from the median rank (bytes: outlier minus median rank).
struct FleetDifference {
  std::string what;  // a category ("OPTIMIZER_STATE"), a site, a phase ("step"), "growth per step"
  std::int64_t outlier_bytes = 0;
  std::int64_t median_bytes = 0;
  std::int64_t delta() const { return outlier_bytes - median_bytes; }
};

struct FleetOutlier {
  int rank = 0;
  // Each metric's score, and which metrics made it an outlier (|score| > 3.5).
  std::array<double, kNumFleetMetrics> scores{};
  std::vector<FleetMetric> flagged;
  bool oom = false;  // it ran out of memory, and most ranks did not (the median OOM count is 0)
  // What differs from the median rank, largest difference first, at most 3
  // of each (differences under 1 MiB are left out).
  std::vector<FleetDifference> categories;  // at the peak of allocated
  std::vector<FleetDifference> sites;       // top sites at the peak of allocated
  std::vector<FleetDifference> phases;      // highest peak allocated inside each phase (by phase name)
};

struct FleetResult {
  std::vector<FleetRank> ranks;  // by rank, reduced (ReduceRank)
  std::array<FleetSpread, kNumFleetMetrics> spreads{};
  int median_rank = 0;  // the rank outliers are compared with: the middle one by peak reserved
  std::vector<FleetOutlier> outliers;  // by rank
  std::array<double, kNumFleetMetrics> scales{};  // each metric's score scale, in bytes
};

// The fleet's analysis (each rank reduced first). `ranks` must not be empty and must have distinct
// ranks (LoadFleet sees to both).
FleetResult AnalyzeFleet(std::vector<FleetRank> ranks);

// The ranks as `memscope check`'s report (exporters/report.h), for its budgets.
Report FleetReport(const FleetResult& fleet);

// The text `memscope fleet` prints: the spread of each metric, the outliers
// with what differs, then one line per rank.
std::string FleetText(const FleetResult& fleet);

// `memscope fleet --json` (schema memscope.fleet/1):
//   {"schema", "ranks": [{"rank", "source", "kind", "peak_allocated_bytes", "peak_reserved_bytes",
//     "frag_bytes", "fragmentation", "ooms", "retries", "steps", "step_peak_reserved_bytes",
//     "growth_per_step_bytes", "gpus", "notes"}],
//    "spread": {METRIC: {"min", "median", "max", "min_rank", "max_rank", "skew"}},
//    "median_rank", "scales": {METRIC: bytes},
//    "outliers": [{"rank", "scores": {METRIC: score}, "flagged": [METRIC], "oom",
//                  "categories"|"sites"|"phases": [{"what", "bytes", "median_bytes", "delta"}]}]}
nlohmann::json FleetJson(const FleetResult& fleet);

// The self-contained HTML page: the spread, the outliers (each linked to
// `links[rank]` when given: its own report.html), and a rank x step heat map
// of peak reserved.
struct FleetHtmlLink {
  int rank = 0;
  std::string href;
};
std::string FleetHtml(const FleetResult& fleet, const std::vector<FleetHtmlLink>& links);

}  // namespace memscope

#endif  // MEMSCOPE_FLEET_FLEET_H_
