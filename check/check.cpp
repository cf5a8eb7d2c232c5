#include "check/check.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/sizes.h"
#include "exporters/report.h"

namespace memscope {
namespace {

using nlohmann::json;

constexpr CheckMetric kAllMetrics[] = {CheckMetric::kPeakAllocated, CheckMetric::kPeakReserved,
                                       CheckMetric::kPeakActive};

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The value at j[k0][k1]..., or null when a step is missing or not an object.
const json* Find(const json& j, std::initializer_list<const char*> keys) {
  const json* at = &j;
  for (const char* k : keys) {
    if (!at->is_object()) return nullptr;
    auto it = at->find(k);
    if (it == at->end()) return nullptr;
    at = &*it;
  }
  return at;
}

// A non-negative number as bytes; nullopt for anything else.
std::optional<std::uint64_t> Bytes(const json* j) {
  if (j == nullptr) return std::nullopt;
  if (j->is_number_unsigned()) return j->get<std::uint64_t>();
  if (j->is_number_integer()) {
    const std::int64_t v = j->get<std::int64_t>();
    if (v < 0) return std::nullopt;
    return static_cast<std::uint64_t>(v);
  }
  if (j->is_number_float()) {
    const double v = j->get<double>();
    if (!std::isfinite(v) || v < 0 || v >= 18446744073709551615.0) return std::nullopt;
    return static_cast<std::uint64_t>(std::floor(v));
  }
  return std::nullopt;
}

absl::StatusOr<std::uint64_t> MetricValue(const json& rank, int rank_id, CheckMetric metric) {
  std::optional<std::uint64_t> v;
  const char* field = "";
  switch (metric) {
    case CheckMetric::kPeakAllocated:
      field = "peak.allocated.bytes";
      v = Bytes(Find(rank, {"peak", "allocated", "bytes"}));
      if (!v) v = Bytes(Find(rank, {"memory_stats", "allocated_bytes.all.peak"}));
      break;
    case CheckMetric::kPeakReserved:
      field = "peak_reserved_bytes";
      v = Bytes(Find(rank, {"peak_reserved_bytes"}));
      if (!v) v = Bytes(Find(rank, {"peak", "reserved", "bytes"}));
      if (!v) v = Bytes(Find(rank, {"memory_stats", "reserved_bytes.all.peak"}));
      break;
    case CheckMetric::kPeakActive:
      field = "memory_stats \"active_bytes.all.peak\"";
      v = Bytes(Find(rank, {"memory_stats", "active_bytes.all.peak"}));
      break;
  }
  if (!v) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_id, " has no ", field, " (", AbslView(CheckMetricName(metric)), ")"));
  }
  return *v;
}

// Where the metric's peak happened: the PEAK object of report.json.
const json* PeakOf(const json& rank, CheckMetric metric) {
  return Find(rank, {"peak", metric == CheckMetric::kPeakReserved ? "reserved" : "allocated"});
}

// "ACTIVATION 40.00 MiB (33%), TEMPORARY ...": the three largest categories
// of a report's by_category object.
std::string TopCategories(const json& by_category, std::uint64_t total) {
  std::array<std::int64_t, kNumCategories> bytes{};
  if (by_category.is_object()) {
    for (auto it = by_category.begin(); it != by_category.end(); ++it) {
      const std::optional<Category> c = ParseCategory(it.key());
      const std::optional<std::uint64_t> b = Bytes(&it.value());
      if (c && b) bytes[static_cast<int>(*c)] = static_cast<std::int64_t>(*b);
    }
  }
  return CategoryBreakdown(bytes, total, 3);
}

struct RankRef {
  int id = 0;
  const json* j = nullptr;
};

absl::StatusOr<std::vector<RankRef>> Ranks(const json& report, absl::string_view what) {
  std::vector<RankRef> out;
  for (const json& r : report["ranks"]) {
    const json* id = Find(r, {"rank"});
    if (id == nullptr || !id->is_number_integer() || id->get<std::int64_t>() < 0 ||
        id->get<std::int64_t>() > 1000000) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": an entry of ranks has no valid \"rank\""));
    }
    out.push_back({static_cast<int>(id->get<std::int64_t>()), &r});
  }
  std::stable_sort(out.begin(), out.end(), [](const RankRef& a, const RankRef& b) { return a.id < b.id; });
  return out;
}

const RankRef* FindRank(const std::vector<RankRef>& ranks, int id) {
  for (const RankRef& r : ranks) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

std::string Percent(double pct) { return absl::StrFormat("%+.1f%%", pct); }

std::string ToleranceText(double pct) { return absl::StrFormat("%g%%", pct); }

// Fills phase, by_category and line of a check whose other fields are set.
void Describe(CheckOutcome& c, const json& rank) {
  std::uint64_t peak_bytes = 0;
  if (const json* peak = PeakOf(rank, c.metric)) {
    if (const json* p = Find(*peak, {"phase"}); p != nullptr && p->is_string()) c.phase = p->get<std::string>();
    if (const json* b = Find(*peak, {"by_category"}); b != nullptr && b->is_object()) c.by_category = *b;
    peak_bytes = Bytes(Find(*peak, {"bytes"})).value_or(0);
  }
  const std::string name(CheckMetricName(c.metric));
  std::string detail;
  if (c.kind == CheckOutcome::Kind::kBaseline) {
    const std::uint64_t b = *c.baseline;
    const std::string growth =
        b > 0 ? Percent(100.0 * (static_cast<double>(c.value) - static_cast<double>(b)) / static_cast<double>(b))
              : (c.value == 0 ? Percent(0) : std::string("new"));
    detail = absl::StrCat(" (", growth, " vs baseline ", FormatSize(b), ", tolerance ", ToleranceText(c.tolerance_pct),
                          ")");
  } else if (!c.passed && c.limit > 0) {
    detail = absl::StrCat(
        " (", Percent(100.0 * static_cast<double>(c.value - c.limit) / static_cast<double>(c.limit)), ")");
  }
  if (c.passed) {
    c.line = absl::StrCat("ok   ", name, " rank ", c.rank, ": ", FormatSize(c.value), " <= ", FormatSize(c.limit),
                          detail);
    return;
  }
  std::string where = c.phase.empty() ? "" : absl::StrCat(" at ", c.phase);
  const std::string cats = TopCategories(c.by_category, peak_bytes);
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
  return absl::InvalidArgumentError(absl::StrCat("unknown metric '", AbslView(text),
                                                 "' (metrics: peak_allocated, peak_reserved, peak_active)"));
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
        return absl::InvalidArgumentError(absl::StrCat("bad rank '", scope, "' in budget '", text,
                                                       "' (expected rankR.METRIC=SIZE, e.g. rank1.peak_reserved=3GiB)"));
      }
      b.rank = rank;
    }
  }
  absl::StatusOr<CheckMetric> metric = ParseCheckMetric(std::string_view(lhs.data(), lhs.size()));
  if (!metric.ok()) return absl::InvalidArgumentError(absl::StrCat(metric.status().message(), " in budget '", text, "'"));
  b.metric = *metric;
  absl::StatusOr<std::uint64_t> limit = ParseSize(std::string_view(size.data(), size.size()));
  if (!limit.ok()) return absl::InvalidArgumentError(absl::StrCat(limit.status().message(), " in budget '", text, "'"));
  b.limit = *limit;
  return b;
}

absl::Status ValidateReport(const nlohmann::json& report) {
  if (!report.is_object()) return absl::InvalidArgumentError("not a JSON object (expected memscope.report/1)");
  const json* schema = Find(report, {"schema"});
  if (schema == nullptr || !schema->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("has no \"schema\" (expected ", kReportSchema, ")"));
  }
  if (schema->get<std::string>() != kReportSchema) {
    return absl::InvalidArgumentError(
        absl::StrCat("has schema '", schema->get<std::string>(), "', not ", kReportSchema));
  }
  const json* ranks = Find(report, {"ranks"});
  if (ranks == nullptr || !ranks->is_array()) return absl::InvalidArgumentError("has no \"ranks\" array");
  return absl::OkStatus();
}

absl::StatusOr<CheckResult> RunChecks(const nlohmann::json& report, const std::vector<Budget>& budgets,
                                      const nlohmann::json* baseline, double tolerance_pct) {
  if (absl::Status s = ValidateReport(report); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("report ", s.message()));
  }
  if (baseline != nullptr) {
    if (absl::Status s = ValidateReport(*baseline); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("baseline ", s.message()));
    }
  }
  if (!std::isfinite(tolerance_pct) || tolerance_pct < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("invalid tolerance %g: expected a percentage >= 0", tolerance_pct));
  }
  absl::StatusOr<std::vector<RankRef>> ranks = Ranks(report, "report");
  if (!ranks.ok()) return ranks.status();

  CheckResult result;
  auto add = [&](CheckOutcome c, const json& rank) {
    Describe(c, rank);
    if (!c.passed) ++result.failed;
    result.checks.push_back(std::move(c));
  };

  for (const Budget& b : budgets) {
    if (b.rank >= 0 && FindRank(*ranks, b.rank) == nullptr) {
      std::vector<int> ids;
      for (const RankRef& r : *ranks) ids.push_back(r.id);
      return absl::NotFoundError(absl::StrCat("rank ", b.rank, " is not in the report (ranks: ",
                                              ids.empty() ? "none" : absl::StrJoin(ids, ", "), ")"));
    }
    for (const RankRef& r : *ranks) {
      if (b.rank >= 0 && r.id != b.rank) continue;
      absl::StatusOr<std::uint64_t> v = MetricValue(*r.j, r.id, b.metric);
      if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("report: ", v.status().message()));
      CheckOutcome c;
      c.kind = CheckOutcome::Kind::kBudget;
      c.metric = b.metric;
      c.rank = r.id;
      c.value = *v;
      c.limit = b.limit;
      c.passed = *v <= b.limit;
      add(std::move(c), *r.j);
    }
  }

  if (baseline != nullptr) {
    absl::StatusOr<std::vector<RankRef>> base_ranks = Ranks(*baseline, "baseline");
    if (!base_ranks.ok()) return base_ranks.status();
    const long double factor = 1.0L + static_cast<long double>(tolerance_pct) / 100.0L;
    for (const RankRef& r : *ranks) {
      const RankRef* br = FindRank(*base_ranks, r.id);
      if (br == nullptr) {
        result.notes.push_back(absl::StrCat("note: rank ", r.id, " is not in the baseline; not compared"));
        continue;
      }
      for (const CheckMetric m : kAllMetrics) {
        absl::StatusOr<std::uint64_t> v = MetricValue(*r.j, r.id, m);
        if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("report: ", v.status().message()));
        absl::StatusOr<std::uint64_t> bv = MetricValue(*br->j, br->id, m);
        if (!bv.ok()) return absl::InvalidArgumentError(absl::StrCat("baseline: ", bv.status().message()));
        const long double limit = std::floor(static_cast<long double>(*bv) * factor);
        CheckOutcome c;
        c.kind = CheckOutcome::Kind::kBaseline;
        c.metric = m;
        c.rank = r.id;
        c.value = *v;
        c.limit = limit >= 18446744073709551615.0L ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(limit);
        c.baseline = *bv;
        c.tolerance_pct = tolerance_pct;
        c.passed = *v <= c.limit;
        add(std::move(c), *r.j);
      }
    }
    for (const RankRef& br : *base_ranks) {
      if (FindRank(*ranks, br.id) == nullptr) {
        result.notes.push_back(absl::StrCat("note: baseline rank ", br.id, " is not in the report; not compared"));
      }
    }
  }
  return result;
}

std::string CheckText(const CheckResult& result) {
  std::string out;
  for (const CheckOutcome& c : result.checks) absl::StrAppend(&out, c.line, "\n");
  for (const std::string& n : result.notes) absl::StrAppend(&out, n, "\n");
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
                      {"by_category", c.by_category},
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
