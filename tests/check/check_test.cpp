// memscope check on hand-written report.json: budgets, per-rank budgets,
// baseline regressions, the JUnit XML and bad budgets.
#include "check/check.h"

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "exporters/report.h"
#include "nlohmann/json.hpp"

using namespace memscope;
using nlohmann::json;

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;

json Rank(int rank, std::uint64_t allocated, std::uint64_t reserved, std::uint64_t active) {
  return {
      {"rank", rank},
      {"peak",
       {{"allocated",
         {{"bytes", allocated},
          {"phase", "forward:3"},
          {"by_category",
           {{"ACTIVATION", allocated / 2},
            {"PARAMETER", allocated / 4},
            {"TEMPORARY", allocated / 8},
            {"GRADIENT", allocated / 16},
            {"OTHER", 0}}}}},
        {"reserved", {{"bytes", reserved}, {"phase", "backward:3"}, {"by_category", {{"GRADIENT", reserved / 2}}}}}}},
      {"memory_stats", {{"allocated_bytes.all.peak", allocated}, {"active_bytes.all.peak", active}}},
      {"peak_reserved_bytes", reserved}};
}

json ReportDoc(std::vector<json> ranks) {
  return {{"schema", "memscope.report/1"}, {"world_size", ranks.size()}, {"ranks", ranks}};
}

// RunChecks on hand-written report.json documents, read as `memscope check`
// reads a file: errors of the reader name the document ("report ...",
// "baseline ...").
absl::StatusOr<CheckResult> RunChecksOnJson(const json& report, const std::vector<Budget>& budgets,
                                            const json* baseline, double tolerance_pct) {
  absl::StatusOr<memscope::Report> r = ReportFromJson(report);
  if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("report ", r.status().message()));
  std::optional<memscope::Report> b;
  if (baseline != nullptr) {
    absl::StatusOr<memscope::Report> read = ReportFromJson(*baseline);
    if (!read.ok()) return absl::InvalidArgumentError(absl::StrCat("baseline ", read.status().message()));
    b = std::move(*read);
  }
  return RunChecks(*r, budgets, b ? &*b : nullptr, tolerance_pct);
}

Budget B(const char* text) {
  absl::StatusOr<Budget> b = ParseBudget(text);
  REQUIRE(b.ok());
  return *b;
}

}  // namespace

TEST_CASE("check: budgets pass with an ok line per rank and a summary") {
  const json report = ReportDoc({Rank(0, 100 * MiB, 120 * MiB, 110 * MiB), Rank(1, 90 * MiB, 100 * MiB, 95 * MiB)});
  absl::StatusOr<CheckResult> r = RunChecksOnJson(report, {B("peak_allocated=200MiB")}, nullptr, 0);
  REQUIRE(r.ok());
  REQUIRE(r->checks.size() == 2);
  CHECK(r->failed == 0);
  CHECK(r->checks[0].line == "ok   peak_allocated rank 0: 100.00 MiB <= 200.00 MiB");
  CHECK(r->checks[1].line == "ok   peak_allocated rank 1: 90.00 MiB <= 200.00 MiB");
  CHECK(CheckText(*r) ==
        "ok   peak_allocated rank 0: 100.00 MiB <= 200.00 MiB\n"
        "ok   peak_allocated rank 1: 90.00 MiB <= 200.00 MiB\n"
        "memscope check: 2 checks, 0 failed\n");
}

TEST_CASE("check: a failed budget says by how much, where, and the top three categories") {
  const json report = ReportDoc({Rank(0, 120 * MiB, 160 * MiB, 130 * MiB)});
  absl::StatusOr<CheckResult> r = RunChecksOnJson(
      report, {B("peak_allocated=100MiB"), B("peak_reserved=150MiB"), B("peak_active=2GiB")}, nullptr, 0);
  REQUIRE(r.ok());
  REQUIRE(r->checks.size() == 3);
  CHECK(r->failed == 2);
  CHECK(r->checks[0].line ==
        "FAIL peak_allocated rank 0: 120.00 MiB > limit 100.00 MiB (+20.0%) at forward:3; "
        "ACTIVATION 60.00 MiB (50%), PARAMETER 30.00 MiB (25%), TEMPORARY 15.00 MiB (12%)");
  CHECK(r->checks[0].phase == "forward:3");
  CHECK(r->checks[0].value == 120 * MiB);
  CHECK(r->checks[0].limit == 100 * MiB);
  // peak_reserved: where the reserved peak happened.
  CHECK(r->checks[1].line ==
        "FAIL peak_reserved rank 0: 160.00 MiB > limit 150.00 MiB (+6.7%) at backward:3; GRADIENT 80.00 MiB (50%)");
  CHECK(r->checks[2].line == "ok   peak_active rank 0: 130.00 MiB <= 2.00 GiB");
  CHECK(CheckText(*r).ends_with("memscope check: 3 checks, 2 failed\n"));

  const json j = CheckJson(*r);
  CHECK(j["failed"] == 2);
  CHECK(j["checks"][0]["metric"] == "peak_allocated");
  CHECK(j["checks"][0]["rank"] == 0);
  CHECK(j["checks"][0]["value"] == 120 * MiB);
  CHECK(j["checks"][0]["limit"] == 100 * MiB);
  CHECK(j["checks"][0]["passed"] == false);
  CHECK(j["checks"][0]["phase"] == "forward:3");
  CHECK(j["checks"][0]["by_category"]["ACTIVATION"] == 60 * MiB);
  CHECK(j["checks"][2]["passed"] == true);
}

TEST_CASE("check: per-rank budgets apply to their rank only") {
  const json report = ReportDoc({Rank(0, 100 * MiB, 120 * MiB, 110 * MiB), Rank(1, 300 * MiB, 320 * MiB, 310 * MiB)});
  absl::StatusOr<CheckResult> r =
      RunChecksOnJson(report, {B("rank1.peak_reserved=256MiB"), B("all.peak_active=1GiB")}, nullptr, 0);
  REQUIRE(r.ok());
  REQUIRE(r->checks.size() == 3);
  CHECK(r->checks[0].rank == 1);
  CHECK(
      r->checks[0].line.starts_with("FAIL peak_reserved rank 1: 320.00 MiB > limit 256.00 MiB (+25.0%) at backward:3"));
  CHECK(r->checks[1].rank == 0);
  CHECK(r->checks[2].rank == 1);
  CHECK(r->failed == 1);

  absl::StatusOr<CheckResult> missing = RunChecksOnJson(report, {B("rank5.peak_allocated=1GiB")}, nullptr, 0);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message() == "rank 5 is not in the report (ranks: 0, 1)");
}

TEST_CASE("check: baseline regressions with a tolerance") {
  const json baseline = ReportDoc({Rank(0, 100 * MiB, 100 * MiB, 100 * MiB), Rank(2, 1, 1, 1)});
  const json report = ReportDoc({Rank(0, 115 * MiB, 105 * MiB, 100 * MiB), Rank(1, 1, 1, 1)});

  absl::StatusOr<CheckResult> strict = RunChecksOnJson(report, {}, &baseline, 10);
  REQUIRE(strict.ok());
  REQUIRE(strict->checks.size() == 3);  // rank 0 only, three metrics
  CHECK(strict->failed == 1);
  CHECK(strict->checks[0].line ==
        "FAIL peak_allocated rank 0: 115.00 MiB > limit 110.00 MiB (+15.0% vs baseline 100.00 MiB, tolerance 10%) at "
        "forward:3; ACTIVATION 57.50 MiB (50%), PARAMETER 28.75 MiB (25%), TEMPORARY 14.38 MiB (12%)");
  CHECK(strict->checks[1].line ==
        "ok   peak_reserved rank 0: 105.00 MiB <= 110.00 MiB (+5.0% vs baseline 100.00 MiB, tolerance 10%)");
  CHECK(strict->checks[2].passed);
  CHECK(strict->checks[0].baseline == 100 * MiB);
  // Ranks in only one report are notes, not failures.
  CHECK(strict->notes == std::vector<std::string>{"note: rank 1 is not in the baseline; not compared",
                                                  "note: baseline rank 2 is not in the report; not compared"});

  absl::StatusOr<CheckResult> loose = RunChecksOnJson(report, {}, &baseline, 15);
  REQUIRE(loose.ok());
  CHECK(loose->failed == 0);  // exactly +15% holds

  absl::StatusOr<CheckResult> bad = RunChecksOnJson(report, {}, &baseline, -1);
  REQUIRE_FALSE(bad.ok());
  json other = baseline;
  other["schema"] = "memscope.run/1";
  absl::StatusOr<CheckResult> wrong = RunChecksOnJson(report, {}, &other, 10);
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.status().message() == "baseline has schema 'memscope.run/1', not memscope.report/1");
}

TEST_CASE("check: JUnit XML has one testcase per check and escaped failures") {
  json report = ReportDoc({Rank(0, 120 * MiB, 160 * MiB, 130 * MiB)});
  report["ranks"][0]["peak"]["allocated"]["phase"] = "step<1>&\"x\"";
  absl::StatusOr<CheckResult> r =
      RunChecksOnJson(report, {B("peak_allocated=100MiB"), B("peak_active=1GiB")}, nullptr, 0);
  REQUIRE(r.ok());
  const std::string xml = JUnitXml(*r);
  CHECK(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"2\" failures=\"1\">\n"));
  CHECK(xml.find("<testsuite name=\"memscope check\" tests=\"2\" failures=\"1\"") != std::string::npos);
  CHECK(xml.find(
            "<testcase classname=\"memscope.rank0\" name=\"peak_allocated\">\n      <failure message=\"FAIL "
            "peak_allocated rank 0: 120.00 MiB &gt; limit 100.00 MiB (+20.0%) at step&lt;1&gt;&amp;&quot;x&quot;;") !=
        std::string::npos);
  CHECK(xml.find("<testcase classname=\"memscope.rank0\" name=\"peak_active\"/>") != std::string::npos);
  CHECK(xml.find("step<1>") == std::string::npos);
  CHECK(xml.ends_with("</testsuite>\n</testsuites>\n"));
}

TEST_CASE("check: budgets that do not parse name the problem") {
  auto message = [](const char* text) {
    absl::StatusOr<Budget> b = ParseBudget(text);
    REQUIRE_FALSE(b.ok());
    return std::string(b.status().message());
  };
  CHECK(message("bogus=1GiB") ==
        "unknown metric 'bogus' (metrics: peak_allocated, peak_reserved, peak_active) in budget 'bogus=1GiB'");
  CHECK(message("peak_allocated") ==
        "budget 'peak_allocated' must be METRIC=SIZE or rankR.METRIC=SIZE (e.g. peak_allocated=2GiB)");
  CHECK(message("peak_allocated=lots").starts_with("invalid size 'lots'"));
  CHECK(message("node1.peak_allocated=1GiB").starts_with("bad rank 'node1'"));
  CHECK(message("rank.peak_allocated=1GiB").starts_with("bad rank 'rank'"));
  CHECK(message("rank-1.peak_allocated=1GiB").starts_with("bad rank 'rank-1'"));

  const Budget b = B("rank3.peak_active=2.5GiB");
  CHECK(b.rank == 3);
  CHECK(b.metric == CheckMetric::kPeakActive);
  CHECK(b.limit == 2560 * MiB);
  CHECK(B("peak_reserved=512MB").limit == 512000000);
  CHECK(B("all.peak_reserved=1KiB").rank == -1);
}

TEST_CASE("check: a report without the schema or a metric is an error, not a failure") {
  absl::StatusOr<CheckResult> r =
      RunChecksOnJson(json{{"ranks", json::array()}}, {B("peak_allocated=1GiB")}, nullptr, 0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "report has no \"schema\" (expected memscope.report/1)");
  json report = ReportDoc({Rank(0, 1, 1, 1)});
  report["ranks"][0].erase("memory_stats");
  r = RunChecksOnJson(report, {B("peak_active=1GiB")}, nullptr, 0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "report: rank 0 has no memory_stats \"active_bytes.all.peak\" (peak_active)");
}
