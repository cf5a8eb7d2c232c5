// `memscope compare RUN_A RUN_B`: two runs side by side, rank by rank, as a
// pure function over their reports (memscope.report/1), so that it serves
// run directories, report.json files, PyTorch snapshots and reports still in
// memory (memscope run comparing DDP modes) alike.
//
//   absl::StatusOr<CompareInput> a = LoadCompareInput("runs/sgd");   // run/run.h
//   absl::StatusOr<CompareInput> b = LoadCompareInput("runs/adam");
//   absl::StatusOr<Comparison> c = Compare(*a, *b);  // every rank both have
//   std::cout << FormatComparison(*c);
//
// Per rank it holds:
//   - the phase tables matched by (step, phase): allocated, max allocated and
//     reserved after each phase in A and B, and B - A; a row only one run has
//     is kept with the other side empty. Rows keep A's order; B's own rows
//     come where B has them. A (step, phase) that repeats (user phases,
//     gradient accumulation) is matched occurrence by occurrence.
//   - the peaks of allocated and reserved of A and B, where each happened
//     (the innermost phase open, "backward:1") and B - A;
//   - what explains the difference: the bytes per category at each run's own
//     peak of allocated and at each run's steady state, the end of its last
//     phase (for a training loop, the end of the last step: the recording's
//     own end comes after the model and optimizer are freed); a rank without
//     phase marks uses the end of the recording. Categories held by either
//     run, sorted by |B - A|, the largest first.
//
// JSON (ComparisonJson, schema memscope.compare/1):
//   {"schema": "memscope.compare/1", "generator": "memscope 0.1.0",
//    "a": RUN, "b": RUN, "notes": [...],
//    "ranks": [{"rank",
//      "phases": [{"step" (null for model/ddp), "phase", "a": ROW or null, "b": ROW or null,
//                  "delta": ROW or null (null unless both)}],
//         ROW = {"allocated_bytes", "max_allocated_bytes", "reserved_bytes"}
//      "peaks": {"allocated": PEAK, "reserved": PEAK},
//         PEAK = {"a_bytes", "b_bytes", "delta_bytes", "a_phase", "b_phase"}
//      "explain": {"peak": EXPLAIN, "end": EXPLAIN}}]}
//         EXPLAIN = {"a_moment", "b_moment", "a_bytes", "b_bytes", "delta_bytes",
//                    "categories": [{"category", "a_bytes", "b_bytes", "delta_bytes"}]}
//                   ("categories" empty and "known": false when a report.json
//                   without phase marks gives no breakdown of its end)
//   RUN = {"path", "world_size", "ranks": [R, ...], "alloc_conf" (its first rank's),
//          "config": {run.json's model, source, optimizer, steps, ddp, world_size,
//          alloc_conf, those present} or null}
#ifndef MEMSCOPE_COMPARE_COMPARE_H_
#define MEMSCOPE_COMPARE_COMPARE_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/analysis.h"
#include "exporters/report.h"
#include "nlohmann/json.hpp"
#include "recording/event.h"

namespace memscope {

inline constexpr const char* kCompareSchema = "memscope.compare/1";

// One side of a comparison.
struct CompareInput {
  std::string label;                    // shown as "A: LABEL": the path given, or a name
  Report report;                        // read (ReportFromJson) or analysed here
  nlohmann::json run_config = nullptr;  // the run's run.json (memscope.run/1), or null
  // Allocated bytes per category at the end of the recording, by rank, for
  // ranks without phase marks (report.json has breakdowns only at the peaks
  // and phase ends). Computed from the timelines when the input has them.
  std::map<int, std::array<std::int64_t, kNumCategories>> end_by_category;
};

// A comparison input from a report and, when it was analysed here, the
// recording it analyses (for the end of ranks without phase marks).
// LoadCompareInput (run/run.h) reads one from a path.
// Errors: an inconsistent timeline.
absl::StatusOr<CompareInput> MakeCompareInput(std::string label, Report report, const std::vector<Timeline>& timelines,
                                              nlohmann::json run_config = nullptr);

// A comparison input from a run analysed in memory (reports[i] analyses
// timelines[i]), e.g. by `memscope run`. Errors: an inconsistent timeline.
absl::StatusOr<CompareInput> CompareInputFromRun(std::string label, const std::vector<Timeline>& timelines,
                                                 const std::vector<RankReport>& reports,
                                                 nlohmann::json run_config = nullptr);

// The phase-table numbers of one run at one phase end.
struct ComparedRow {
  std::uint64_t allocated = 0;
  std::uint64_t max_allocated = 0;
  std::uint64_t reserved = 0;
};

struct ComparedPhase {
  std::int64_t step = kNoStep;
  std::string phase;  // "forward", or a user phase's label
  std::optional<ComparedRow> a, b;
};

struct ComparedPeak {
  std::uint64_t a = 0, b = 0;
  std::string a_phase, b_phase;  // "" when no phase was open
  std::int64_t delta() const { return static_cast<std::int64_t>(b) - static_cast<std::int64_t>(a); }
};

struct CategoryDelta {
  std::string category;  // "GRADIENT"
  std::int64_t a = 0, b = 0;
  std::int64_t delta() const { return b - a; }
};

// Bytes per category of A and B at a moment of each.
struct Explanation {
  std::string a_moment, b_moment;  // "backward:1", or "end of recording"
  std::int64_t a_total = 0, b_total = 0;
  bool known = true;                      // false: no breakdown (a report.json without phase marks), totals only
  std::vector<CategoryDelta> categories;  // held by either run; largest |delta| first
};

struct RankComparison {
  int rank = 0;
  std::vector<ComparedPhase> phases;
  ComparedPeak peak_allocated, peak_reserved;
  Explanation at_peak;  // at each run's peak of allocated
  Explanation at_end;   // at each run's steady state (end of the last phase)
};

// A run as the header names it.
struct ComparedRun {
  std::string label;
  int world_size = 0;
  std::vector<int> ranks;
  std::string alloc_conf;           // of its first rank in report.json
  nlohmann::json config = nullptr;  // selected run.json keys, or null
};

struct Comparison {
  ComparedRun a, b;
  std::vector<std::string> notes;  // "A has 2 ranks and B 1: ..."
  std::vector<RankComparison> ranks;
};

// Compares rank `rank` of A and B, or (rank < 0) every rank both have.
// Errors (InvalidArgument): `rank` missing from either run; no rank in
// common. (A report.json that is not usable fails earlier, in ReportFromJson.)
absl::StatusOr<Comparison> Compare(const CompareInput& a, const CompareInput& b, int rank = -1);

// The text of `memscope compare`: the header, then per rank the phase table
// of both with B - A (MiB, as the phase table), the peaks and the
// explanations. Ends with '\n'.
std::string FormatComparison(const Comparison& comparison);

// The same as JSON (schema memscope.compare/1, above).
nlohmann::json ComparisonJson(const Comparison& comparison);

}  // namespace memscope

#endif  // MEMSCOPE_COMPARE_COMPARE_H_
