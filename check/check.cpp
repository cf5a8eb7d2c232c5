#include "check/check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/sizes.h"
#include "base/terminal_text.h"
#include "exporters/report.h"

namespace memscope {
namespace {

using nlohmann::json;

constexpr CheckMetric kAllMetrics[] = {CheckMetric::kPeakAllocated, CheckMetric::kPeakReserved,
                                       CheckMetric::kPeakActive};

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::StatusOr<std::uint64_t> MetricValue(const RankReport& rank, CheckMetric metric) {
  switch (metric) {
    case CheckMetric::kPeakAllocated: return rank.peak_allocated.bytes;
    case CheckMetric::kPeakReserved: return rank.peak_reserved.bytes;
    case CheckMetric::kPeakActive:
      if (!rank.stats_known) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", rank.rank, " has no memory_stats \"active_bytes.all.peak\" (peak_active)"));
      }
      return static_cast<std::uint64_t>(std::max<std::int64_t>(All(rank.stats.active_bytes).peak, 0));
  }
  return absl::InternalError("unknown metric");
}

// Where the metric's peak happened: peak_active's with allocated's (active
// bytes peak with allocated bytes, up to blocks whose free waits on a stream).
const PeakInfo& PeakOf(const RankReport& rank, CheckMetric metric) {
  return metric == CheckMetric::kPeakReserved ? rank.peak_reserved : rank.peak_allocated;
}

// The report's ranks by rank.
std::vector<const RankReport*> Ranks(const Report& report) {
  std::vector<const RankReport*> out;
  for (const RankReport& r : report.ranks) out.push_back(&r);
  std::stable_sort(out.begin(), out.end(), [](const RankReport* a, const RankReport* b) { return a->rank < b->rank; });
  return out;
}

const RankReport* FindRank(const std::vector<const RankReport*>& ranks, int id) {
  for (const RankReport* r : ranks) {
    if (r->rank == id) return r;
  }
  return nullptr;
}

std::string Percent(double pct) { return absl::StrFormat("%+.1f%%", pct); }

std::string ToleranceText(double pct) { return absl::StrFormat("%g%%", pct); }

// Fills phase, by_category and line of a check whose other fields are set.
void Describe(CheckOutcome& c, const RankReport& rank) {
  const PeakInfo& peak = PeakOf(rank, c.metric);
  c.phase = peak.phase;
  c.by_category = peak.by_category;
  const std::string name(CheckMetricName(c.metric));
  std::string detail;
  if (c.kind == CheckOutcome::Kind::kBaseline) {
    const std::uint64_t b = *c.baseline;
    const std::string growth =
        b > 0 ? Percent(100.0 * (static_cast<double>(c.value) - static_cast<double>(b)) / static_cast<double>(b))
              : (c.value == 0 ? Percent(0) : std::string("new"));
    detail =
        absl::StrCat(" (", growth, " vs baseline ", FormatSize(b), ", tolerance ", ToleranceText(c.tolerance_pct), ")");
  } else if (!c.passed && c.limit > 0) {
    detail =
        absl::StrCat(" (", Percent(100.0 * static_cast<double>(c.value - c.limit) / static_cast<double>(c.limit)), ")");
  }
  if (c.passed) {
    c.line =
        absl::StrCat("ok   ", name, " rank ", c.rank, ": ", FormatSize(c.value), " <= ", FormatSize(c.limit), detail);
    return;
  }
  std::string where = c.phase.empty() ? "" : absl::StrCat(" at ", c.phase);
  const std::string cats = CategoryBreakdown(c.by_category, peak.bytes, 3);
  if (!cats.empty()) absl::StrAppend(&where, "; ", cats);
  c.line = absl::StrCat("FAIL ", name, " rank ", c.rank, ": ", FormatSize(c.value), " > limit ", FormatSize(c.limit),
                        detail, where);
}

std::string XmlEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\n': out += "&#10;"; break;
      case '\r': out += "&#13;"; break;
      case '\t': out += "&#9;"; break;
      default:
        // Other control characters are not allowed in XML 1.0.
        out += static_cast<unsigned char>(ch) < 0x20 ? '?' : ch;
    }
  }
  return out;
}

}  // namespace

std::string_view CheckMetricName(CheckMetric metric) {
  switch (metric) {
    case CheckMetric::kPeakAllocated: return "peak_allocated";
    case CheckMetric::kPeakReserved: return "peak_reserved";
    case CheckMetric::kPeakActive: return "peak_active";
  }
  return "?";
}

absl::StatusOr<CheckMetric> ParseCheckMetric(std::string_view text) {
  for (const CheckMetric m : kAllMetrics) {
    if (text == CheckMetricName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown metric '", AbslView(text), "' (metrics: peak_allocated, peak_reserved, peak_active)"));
}

absl::StatusOr<Budget> ParseBudget(std::string_view std_text) {
  const absl::string_view text = AbslView(std_text);
  const std::size_t eq = text.find('=');
  if (eq == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget '", text, "' must be METRIC=SIZE or rankR.METRIC=SIZE (e.g. peak_allocated=2GiB)"));
  }
  absl::string_view lhs = absl::StripAsciiWhitespace(text.substr(0, eq));
  const absl::string_view size = text.substr(eq + 1);
  Budget b;
  if (const std::size_t dot = lhs.find('.'); dot != absl::string_view::npos) {
    const absl::string_view scope = lhs.substr(0, dot);
    lhs = lhs.substr(dot + 1);
    if (scope != "all") {
      int rank = -1;
      if (!absl::StartsWith(scope, "rank") || scope.size() == 4 ||
          !std::all_of(scope.begin() + 4, scope.end(), [](char c) { return absl::ascii_isdigit(c); }) ||
          !absl::SimpleAtoi(scope.substr(4), &rank) || rank < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad rank '", scope, "' in budget '", text,
                         "' (expected rankR.METRIC=SIZE, e.g. rank1.peak_reserved=3GiB)"));
      }
      b.rank = rank;
    }
  }
  absl::StatusOr<CheckMetric> metric = ParseCheckMetric(std::string_view(lhs.data(), lhs.size()));
  if (!metric.ok())
    return absl::InvalidArgumentError(absl::StrCat(metric.status().message(), " in budget '", text, "'"));
  b.metric = *metric;
  absl::StatusOr<std::uint64_t> limit = ParseSize(std::string_view(size.data(), size.size()));
  if (!limit.ok()) return absl::InvalidArgumentError(absl::StrCat(limit.status().message(), " in budget '", text, "'"));
  b.limit = *limit;
  return b;
}

absl::StatusOr<CheckResult> RunChecks(const Report& report, const std::vector<Budget>& budgets, const Report* baseline,
                                      double tolerance_pct) {
  if (!std::isfinite(tolerance_pct) || tolerance_pct < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("invalid tolerance %g: expected a percentage >= 0", tolerance_pct));
  }
  const std::vector<const RankReport*> ranks = Ranks(report);
  CheckResult result;
  auto add = [&](CheckOutcome c, const RankReport& rank) {
    Describe(c, rank);
    if (!c.passed) ++result.failed;
    result.checks.push_back(std::move(c));
  };

  for (const Budget& b : budgets) {
    if (b.rank >= 0 && FindRank(ranks, b.rank) == nullptr) {
      std::vector<int> ids;
      for (const RankReport* r : ranks) ids.push_back(r->rank);
      return absl::NotFoundError(absl::StrCat(
          "rank ", b.rank, " is not in the report (ranks: ", ids.empty() ? "none" : absl::StrJoin(ids, ", "), ")"));
    }
    for (const RankReport* r : ranks) {
      if (b.rank >= 0 && r->rank != b.rank) continue;
      absl::StatusOr<std::uint64_t> v = MetricValue(*r, b.metric);
      if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("report: ", v.status().message()));
      CheckOutcome c;
      c.kind = CheckOutcome::Kind::kBudget;
      c.metric = b.metric;
      c.rank = r->rank;
      c.value = *v;
      c.limit = b.limit;
      c.passed = *v <= b.limit;
      add(std::move(c), *r);
    }
  }

  if (baseline != nullptr) {
    const std::vector<const RankReport*> base_ranks = Ranks(*baseline);
    const long double factor = 1.0L + static_cast<long double>(tolerance_pct) / 100.0L;
    for (const RankReport* r : ranks) {
      const RankReport* br = FindRank(base_ranks, r->rank);
      if (br == nullptr) {
        result.notes.push_back(absl::StrCat("note: rank ", r->rank, " is not in the baseline; not compared"));
        continue;
      }
      for (const CheckMetric m : kAllMetrics) {
        absl::StatusOr<std::uint64_t> v = MetricValue(*r, m);
        if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("report: ", v.status().message()));
        absl::StatusOr<std::uint64_t> bv = MetricValue(*br, m);
        if (!bv.ok()) return absl::InvalidArgumentError(absl::StrCat("baseline: ", bv.status().message()));
        const long double limit = std::floor(static_cast<long double>(*bv) * factor);
        CheckOutcome c;
        c.kind = CheckOutcome::Kind::kBaseline;
        c.metric = m;
        c.rank = r->rank;
        c.value = *v;
        c.limit = limit >= 18446744073709551615.0L ? std::numeric_limits<std::uint64_t>::max()
                                                   : static_cast<std::uint64_t>(limit);
        c.baseline = *bv;
        c.tolerance_pct = tolerance_pct;
        c.passed = *v <= c.limit;
        add(std::move(c), *r);
      }
    }
    for (const RankReport* br : base_ranks) {
      if (FindRank(ranks, br->rank) == nullptr) {
        result.notes.push_back(absl::StrCat("note: baseline rank ", br->rank, " is not in the report; not compared"));
      }
    }
  }
  return result;
}

std::string CheckText(const CheckResult& result) {
  std::string out;
  for (const CheckOutcome& c : result.checks) absl::StrAppend(&out, EscapeForTerminal(c.line), "\n");
  for (const std::string& n : result.notes) absl::StrAppend(&out, EscapeForTerminal(n), "\n");
  absl::StrAppend(&out, "memscope check: ", result.checks.size(), " check", result.checks.size() == 1 ? "" : "s", ", ",
                  result.failed, " failed\n");
  return out;
}

nlohmann::json CheckJson(const CheckResult& result) {
  json checks = json::array();
  for (const CheckOutcome& c : result.checks) {
    checks.push_back({{"metric", std::string(CheckMetricName(c.metric))},
                      {"rank", c.rank},
                      {"kind", c.kind == CheckOutcome::Kind::kBudget ? "budget" : "baseline"},
                      {"value", c.value},
                      {"limit", c.limit},
                      {"baseline", c.baseline ? json(*c.baseline) : json(nullptr)},
                      {"passed", c.passed},
                      {"phase", c.phase},
                      {"by_category", ByCategoryJson(c.by_category)},
                      {"message", c.line}});
  }
  return {{"checks", checks}, {"notes", result.notes}, {"failed", result.failed}};
}

std::string JUnitXml(const CheckResult& result) {
  const std::size_t tests = result.checks.size();
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  absl::StrAppend(&out, "<testsuites tests=\"", tests, "\" failures=\"", result.failed, "\">\n");
  absl::StrAppend(&out, "  <testsuite name=\"memscope check\" tests=\"", tests, "\" failures=\"", result.failed,
                  "\" errors=\"0\" skipped=\"0\">\n");
  for (const CheckOutcome& c : result.checks) {
    const bool baseline = c.kind == CheckOutcome::Kind::kBaseline;
    absl::StrAppend(&out, "    <testcase classname=\"memscope.rank", c.rank, "\" name=\"",
                    XmlEscape(AbslView(CheckMetricName(c.metric))), baseline ? " vs baseline" : "", "\"");
    if (c.passed) {
      absl::StrAppend(&out, "/>\n");
      continue;
    }
    const std::string line = XmlEscape(c.line);
    absl::StrAppend(&out, ">\n      <failure message=\"", line, "\" type=\"memscope.", baseline ? "baseline" : "budget",
                    "\">", line, "</failure>\n    </testcase>\n");
  }
  if (!result.notes.empty()) {
    std::string notes;
    for (const std::string& n : result.notes) absl::StrAppend(&notes, n, "\n");
    absl::StrAppend(&out, "    <system-out>", XmlEscape(notes), "</system-out>\n");
  }
  absl::StrAppend(&out, "  </testsuite>\n</testsuites>\n");
  return out;
}

}  // namespace memscope
