// `memscope check`: memory budgets and baseline regressions for CI, as a pure
// function over a report (exporters/report.h: report.json read, or analysed
// here).
//
// Metrics (per rank):
//   peak_allocated  peak.allocated.bytes          (torch.cuda.max_memory_allocated)
//   peak_reserved   peak.reserved.bytes           (= report.json's peak_reserved_bytes)
//   peak_active     memory_stats "active_bytes.all.peak"
// Where a peak happened (phase, categories) comes from peak.allocated for
// peak_allocated and peak_active (active bytes peak with allocated bytes up to
// blocks whose free waits on a stream), and from peak.reserved for
// peak_reserved.
//
// Budgets: "METRIC=SIZE" (or "all.METRIC=SIZE") holds for every rank,
// "rankR.METRIC=SIZE" for rank R; SIZE as ParseSize reads it (2GiB, 512MB).
// Baseline: for each rank in both reports, each metric must satisfy
// value <= baseline * (1 + tolerance_pct / 100); a rank missing from either
// report is a note, not a failure.
#ifndef MEMSCOPE_CHECK_CHECK_H_
#define MEMSCOPE_CHECK_CHECK_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "exporters/report.h"
#include "nlohmann/json.hpp"

namespace memscope {

enum class CheckMetric { kPeakAllocated, kPeakReserved, kPeakActive };

// "peak_allocated", "peak_reserved", "peak_active".
std::string_view CheckMetricName(CheckMetric metric);
// InvalidArgument naming the text and the known metrics.
absl::StatusOr<CheckMetric> ParseCheckMetric(std::string_view text);

struct Budget {
  CheckMetric metric = CheckMetric::kPeakAllocated;
  int rank = -1;  // -1: every rank
  std::uint64_t limit = 0;
};

// "peak_allocated=2GiB", "all.peak_reserved=3GiB", "rank1.peak_active=512MiB".
// Errors (InvalidArgument) name the budget and the part that is wrong.
absl::StatusOr<Budget> ParseBudget(std::string_view text);

// One evaluated check.
struct CheckOutcome {
  enum class Kind { kBudget, kBaseline };
  Kind kind = Kind::kBudget;
  CheckMetric metric = CheckMetric::kPeakAllocated;
  int rank = 0;
  std::uint64_t value = 0;
  std::uint64_t limit = 0;
  std::optional<std::uint64_t> baseline;  // baseline checks: the baseline's value
  double tolerance_pct = 0;               // baseline checks
  bool passed = true;
  std::string phase;                                       // where the peak happened, "" if unknown
  std::array<std::int64_t, kNumCategories> by_category{};  // bytes by category at that peak
  // "ok   peak_allocated rank 0: 120.00 MiB <= 200.00 MiB" or
  // "FAIL peak_allocated rank 0: 120.00 MiB > limit 100.00 MiB (+20.0%) at forward:0; TEMPORARY ..."
  std::string line;
};

struct CheckResult {
  std::vector<CheckOutcome> checks;  // budgets in the order given (ranks ascending), then baseline checks
  std::vector<std::string> notes;    // "note: rank 1 is not in the baseline; not compared"
  int failed = 0;
};

// Evaluates the budgets and, when `baseline` is not null, the regression
// checks against it. Errors (InvalidArgument / NotFound): a rank without a
// metric a check needs ("report: rank 0 has no memory_stats ..."), a budget
// naming a rank the report does not have, a negative or non-finite tolerance.
absl::StatusOr<CheckResult> RunChecks(const Report& report, const std::vector<Budget>& budgets, const Report* baseline,
                                      double tolerance_pct);

// The lines, the notes and "memscope check: N checks, M failed", each ending in '\n'.
std::string CheckText(const CheckResult& result);

// {"checks": [{"metric", "rank", "kind", "value", "limit", "baseline", "passed",
//              "phase", "by_category", "message"}], "notes": [...], "failed": M}
nlohmann::json CheckJson(const CheckResult& result);

// JUnit XML: <testsuites><testsuite name="memscope check" tests= failures=>
// <testcase classname="memscope.rankR" name="METRIC"> (name "METRIC vs baseline"
// for baseline checks), with <failure message="LINE"> for failed checks.
std::string JUnitXml(const CheckResult& result);

}  // namespace memscope

#endif  // MEMSCOPE_CHECK_CHECK_H_
