// memscope compare on recordings made by driving a real allocator: exact
// deltas per phase, peaks, the categories that explain the difference, rows
// only one run has, ranks and bad reports.
#include "compare/compare.h"

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"

#include "../recording/recording_session.h"

using namespace memscope;
using namespace memscope::testing;
using nlohmann::json;

namespace {

// A training-like recording: a 30 MiB parameter (model), then per step a
// 40 MiB activation (forward), a `gradient`-byte gradient while the
// activation is freed (backward), and an empty optimizer step. The gradient
// stays (set_to_none only at the next zero_grad, which is not recorded).
Timeline Train(std::size_t gradient, int steps = 1, int rank = 0, int world_size = 1) {
  Session s(1024 * MiB);
  s.t.rank = rank;
  s.t.world_size = world_size;
  s.rec.PhaseBegin(Phase::kModel);
  s.Alloc(30 * MiB, Category::kParameter, "fc.weight");
  s.rec.PhaseEnd(Phase::kModel);
  DevicePtr grad{};
  for (int step = 0; step < steps; ++step) {
    if (step > 0) MustFree(s.a, grad);
    s.rec.PhaseBegin(Phase::kForward, step);
    const DevicePtr act = s.Alloc(40 * MiB, Category::kActivation, "fc");
    s.rec.PhaseEnd(Phase::kForward, step);
    s.rec.PhaseBegin(Phase::kBackward, step);
    grad = s.Alloc(gradient, Category::kGradient, "fc.weight");
    MustFree(s.a, act);
    s.rec.PhaseEnd(Phase::kBackward, step);
    s.rec.PhaseBegin(Phase::kStep, step);
    s.rec.PhaseEnd(Phase::kStep, step);
  }
  return std::move(s.t);
}

CompareInput Input(const std::string& label, const std::vector<Timeline>& timelines) {
  std::vector<RankReport> reports;
  for (const Timeline& t : timelines) {
    absl::StatusOr<RankReport> r = AnalyzeRank(t);
    REQUIRE(r.ok());
    reports.push_back(std::move(*r));
  }
  absl::StatusOr<CompareInput> input = CompareInputFromRun(label, timelines, reports);
  REQUIRE(input.ok());
  return std::move(*input);
}

Comparison MustCompare(const CompareInput& a, const CompareInput& b, int rank = -1) {
  absl::StatusOr<Comparison> c = Compare(a, b, rank);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return std::move(*c);
}

// A report read from a report.json document, as `memscope compare` reads a
// file: no timelines behind it; errors name the file.
absl::StatusOr<CompareInput> ReadInput(const std::string& label, const json& report) {
  absl::StatusOr<Report> r = ReportFromJson(report);
  if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("'", label, "' ", r.status().message()));
  CompareInput input;
  input.label = label;
  input.report = std::move(*r);
  return input;
}

CompareInput FromJson(const std::string& label, const json& report) {
  absl::StatusOr<CompareInput> input = ReadInput(label, report);
  INFO(input.status().ToString());
  REQUIRE(input.ok());
  return std::move(*input);
}

// Compares `a` with the report.json document `doc` read as ReadInput does,
// as B (or as A when `doc_is_a`).
absl::StatusOr<Comparison> CompareWithJson(const CompareInput& a, const std::string& label, const json& doc,
                                           bool doc_is_a = false) {
  absl::StatusOr<CompareInput> read = ReadInput(label, doc);
  if (!read.ok()) return read.status();
  return doc_is_a ? Compare(*read, a) : Compare(a, *read);
}

constexpr std::int64_t kMiB64 = static_cast<std::int64_t>(MiB);

}  // namespace

TEST_CASE("compare: 2 MiB more gradient in B is +2M in backward and GRADIENT tops the explanation") {
  const CompareInput a = Input("runs/a", {Train(30 * MiB)});
  const CompareInput b = Input("runs/b", {Train(32 * MiB)});
  const Comparison c = MustCompare(a, b);
  CHECK(c.notes.empty());
  REQUIRE(c.ranks.size() == 1);
  const RankComparison& r = c.ranks[0];
  CHECK(r.rank == 0);

  // model, forward:0, backward:0, step:0, each in both runs.
  REQUIRE(r.phases.size() == 4);
  for (const ComparedPhase& p : r.phases) REQUIRE((p.a && p.b));
  CHECK(r.phases[0].phase == "model");
  CHECK(r.phases[0].step == kNoStep);
  CHECK(r.phases[1].phase == "forward");
  CHECK(r.phases[1].a->allocated == r.phases[1].b->allocated);
  const ComparedPhase& backward = r.phases[2];
  CHECK(backward.phase == "backward");
  CHECK(backward.step == 0);
  CHECK(backward.a->allocated == 60 * MiB);
  CHECK(backward.b->allocated == 62 * MiB);
  CHECK(backward.a->max_allocated == 100 * MiB);
  CHECK(backward.b->max_allocated == 102 * MiB);
  CHECK(backward.a->reserved == 100 * MiB);
  CHECK(backward.b->reserved == 102 * MiB);

  CHECK(r.peak_allocated.a == 100 * MiB);
  CHECK(r.peak_allocated.b == 102 * MiB);
  CHECK(r.peak_allocated.delta() == 2 * kMiB64);
  CHECK(r.peak_allocated.a_phase == "backward:0");
  CHECK(r.peak_allocated.b_phase == "backward:0");
  CHECK(r.peak_reserved.delta() == 2 * kMiB64);

  // At the peak: GRADIENT +2 MiB first, the others unchanged (larger first).
  CHECK(r.at_peak.a_moment == "backward:0");
  CHECK(r.at_peak.b_total - r.at_peak.a_total == 2 * kMiB64);
  REQUIRE(r.at_peak.categories.size() == 3);
  CHECK(r.at_peak.categories[0].category == "GRADIENT");
  CHECK(r.at_peak.categories[0].delta() == 2 * kMiB64);
  CHECK(r.at_peak.categories[1].category == "ACTIVATION");
  CHECK(r.at_peak.categories[1].delta() == 0);
  CHECK(r.at_peak.categories[2].category == "PARAMETER");
  CHECK(r.at_peak.categories[2].delta() == 0);
  // At the end of the run (the end of step:0): the activation is gone.
  CHECK(r.at_end.a_moment == "step:0");
  CHECK(r.at_end.a_total == 60 * kMiB64);
  CHECK(r.at_end.b_total == 62 * kMiB64);
  REQUIRE(r.at_end.categories.size() == 2);
  CHECK(r.at_end.categories[0].category == "GRADIENT");
  CHECK(r.at_end.categories[0].delta() == 2 * kMiB64);
  CHECK(r.at_end.categories[1].category == "PARAMETER");
  CHECK(r.at_end.categories[1].delta() == 0);

  const std::string text = FormatComparison(c);
  INFO(text);
  CHECK(text.find(
            "A: runs/a (world size 1, alloc_conf (defaults))\nB: runs/b (world size 1, alloc_conf (defaults))\n") == 0);
  CHECK(
      text.find("step  phase                  A        B      B-A         A        B      B-A         A        B      "
                "B-A\n") != std::string::npos);
  CHECK(
      text.find("-     model                30M      30M       0M       30M      30M       0M       30M      30M       "
                "0M\n") != std::string::npos);
  CHECK(
      text.find("0     backward             60M      62M      +2M      100M     102M      +2M      100M     102M      "
                "+2M\n") != std::string::npos);
  CHECK(text.find("allocated    100.00 MiB  backward:0       102.00 MiB  backward:0        +2.00 MiB (+2.0%)\n") !=
        std::string::npos);
  CHECK(text.find("what explains the difference at the peak of allocated (A backward:0, B backward:0):\n"
                  "category                     A             B           B-A\n"
                  "GRADIENT             30.00 MiB     32.00 MiB     +2.00 MiB\n"
                  "ACTIVATION           40.00 MiB     40.00 MiB       0 bytes\n"
                  "PARAMETER            30.00 MiB     30.00 MiB       0 bytes\n"
                  "total               100.00 MiB    102.00 MiB     +2.00 MiB\n") != std::string::npos);
  CHECK(text.find("what explains the difference at the end of the run (A step:0, B step:0):\n") != std::string::npos);

  const json j = ComparisonJson(c);
  CHECK(j["schema"] == "memscope.compare/1");
  CHECK(j["a"]["path"] == "runs/a");
  CHECK(j["a"]["config"].is_null());
  const json& row = j["ranks"][0]["phases"][2];
  CHECK(row["phase"] == "backward");
  CHECK(row["step"] == 0);
  CHECK(row["delta"]["allocated_bytes"] == 2 * kMiB64);
  CHECK(row["a"]["allocated_bytes"] == 60 * MiB);
  CHECK(j["ranks"][0]["phases"][0]["step"].is_null());
  CHECK(j["ranks"][0]["peaks"]["allocated"]["delta_bytes"] == 2 * kMiB64);
  const json& top = j["ranks"][0]["explain"]["peak"]["categories"][0];
  CHECK(
      top ==
      json{{"category", "GRADIENT"}, {"a_bytes", 30 * kMiB64}, {"b_bytes", 32 * kMiB64}, {"delta_bytes", 2 * kMiB64}});
  CHECK(j["ranks"][0]["explain"]["end"]["delta_bytes"] == 2 * kMiB64);
}

TEST_CASE("compare: the same run against itself has every delta 0") {
  const CompareInput a = Input("a", {Train(30 * MiB, 2)});
  const Comparison c = MustCompare(a, a);
  for (const ComparedPhase& p : c.ranks[0].phases) {
    REQUIRE((p.a && p.b));
    CHECK(p.a->allocated == p.b->allocated);
    CHECK(p.a->reserved == p.b->reserved);
  }
  for (const CategoryDelta& d : c.ranks[0].at_peak.categories) CHECK(d.delta() == 0);
  CHECK(c.ranks[0].peak_allocated.delta() == 0);
}

TEST_CASE("compare: rows only one run has are kept, with '-' on the other side") {
  const CompareInput a = Input("a", {Train(30 * MiB, 1)});
  const CompareInput b = Input("b", {Train(30 * MiB, 2)});
  const Comparison c = MustCompare(a, b);
  const std::vector<ComparedPhase>& rows = c.ranks[0].phases;
  REQUIRE(rows.size() == 7);
  for (std::size_t i = 0; i < 4; ++i) CHECK((rows[i].a && rows[i].b));
  for (std::size_t i = 4; i < 7; ++i) {
    CHECK(rows[i].step == 1);
    CHECK_FALSE(rows[i].a);
    CHECK(rows[i].b);
  }
  const std::string text = FormatComparison(c);
  INFO(text);
  CHECK(text.find(
            "1     forward                -      70M        -         -     100M        -         -     100M        "
            "-\n") != std::string::npos);
  // B's end is step:1, A's step:0.
  CHECK(c.ranks[0].at_end.a_moment == "step:0");
  CHECK(c.ranks[0].at_end.b_moment == "step:1");
  // The other way round, A's own rows keep their place.
  const Comparison reverse = MustCompare(b, a);
  REQUIRE(reverse.ranks[0].phases.size() == 7);
  CHECK(reverse.ranks[0].phases[5].a);
  CHECK_FALSE(reverse.ranks[0].phases[5].b);
  CHECK(ComparisonJson(reverse)["ranks"][0]["phases"][5]["b"].is_null());
  CHECK(ComparisonJson(reverse)["ranks"][0]["phases"][5]["delta"].is_null());
}

TEST_CASE("compare: a run with more ranks is compared on the ranks both have, with a note") {
  std::vector<Timeline> two;
  two.push_back(Train(30 * MiB, 1, 0, 2));
  two.push_back(Train(34 * MiB, 1, 1, 2));
  const CompareInput a = Input("two", two);
  const CompareInput b = Input("one", {Train(32 * MiB)});
  const Comparison c = MustCompare(a, b);
  REQUIRE(c.ranks.size() == 1);
  CHECK(c.ranks[0].rank == 0);
  REQUIRE(c.notes.size() == 1);
  CHECK(c.notes[0] ==
        "A has world size 2 (ranks 0, 1) and B world size 1 (ranks 0): comparing the ranks both have (0)");
  CHECK(FormatComparison(c).find("\nnote: A has world size 2") != std::string::npos);
  CHECK(ComparisonJson(c)["notes"].size() == 1);

  // Two ranks each: one block per rank, or the one asked for.
  const Comparison both = MustCompare(a, a);
  REQUIRE(both.ranks.size() == 2);
  CHECK(FormatComparison(both).find("\n== rank 1\n") != std::string::npos);
  const Comparison only = MustCompare(a, a, 1);
  REQUIRE(only.ranks.size() == 1);
  CHECK(only.ranks[0].rank == 1);

  absl::StatusOr<Comparison> missing = Compare(a, b, 1);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message() == "--rank 1: B ('one') has no rank 1 (its ranks: 0)");
}

TEST_CASE("compare: without phase marks the end of the recording is the end of the run") {
  auto record = [](std::size_t other) {
    Session s(1024 * MiB);
    s.Alloc(10 * MiB, Category::kParameter, "w");
    const DevicePtr tmp = s.Alloc(other, Category::kTemporary, "t");
    s.Alloc(other, Category::kOther, "o");
    MustFree(s.a, tmp);
    return std::move(s.t);
  };
  const CompareInput a = Input("a", {record(4 * MiB)});
  const CompareInput b = Input("b", {record(6 * MiB)});
  const Comparison c = MustCompare(a, b);
  const RankComparison& r = c.ranks[0];
  CHECK(r.phases.empty());
  CHECK(r.at_end.known);
  CHECK(r.at_end.a_moment == "end of recording");
  REQUIRE(r.at_end.categories.size() == 2);
  CHECK(r.at_end.categories[0].category == "OTHER");
  CHECK(r.at_end.categories[0].delta() == 2 * kMiB64);
  // Equal deltas (+2 MiB) and sizes: in the order of the categories.
  REQUIRE(r.at_peak.categories.size() == 3);
  CHECK(r.at_peak.categories[0].category == "TEMPORARY");
  CHECK(r.at_peak.categories[1].category == "OTHER");
  CHECK(r.at_peak.categories[2].category == "PARAMETER");
  CHECK(r.peak_allocated.a_phase.empty());
  CHECK(FormatComparison(c).find("(no phase marks recorded in either run)") != std::string::npos);

  // From report.json alone (no timeline) the end has totals only.
  const CompareInput a_json = FromJson("a.json", ReportToJson(a.report));
  const Comparison from_json = MustCompare(a_json, b);
  CHECK_FALSE(from_json.ranks[0].at_end.known);
  CHECK(from_json.ranks[0].at_end.categories.empty());
  CHECK(from_json.ranks[0].at_end.a_total == 14 * kMiB64);
  CHECK(from_json.ranks[0].at_end.b_total == 16 * kMiB64);
}

TEST_CASE("compare: a report that is not usable is an error naming the run and the field") {
  const CompareInput good = Input("good", {Train(30 * MiB)});
  absl::StatusOr<Comparison> c = CompareWithJson(good, "x.json", json{{"schema", "memscope.run/1"}});
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() == "'x.json' has schema 'memscope.run/1', not memscope.report/1");

  const json good_json = ReportToJson(good.report);
  json broken = good_json;
  broken["ranks"][0]["phases"][1].erase("reserved_bytes");
  c = CompareWithJson(good, "broken.json", broken);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() ==
        "'broken.json' is not a usable memscope.report/1: rank 0 phases[1] has no \"reserved_bytes\" (bytes)");

  broken = good_json;
  broken["ranks"][0]["peak"]["allocated"]["by_category"]["GRADIENT"] = "lots";
  c = CompareWithJson(good, "broken.json", broken, /*doc_is_a=*/true);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() ==
        "'broken.json' is not a usable memscope.report/1: rank 0 peak.allocated has no integer "
        "\"by_category\".\"GRADIENT\"");

  broken = good_json;
  broken["ranks"][0].erase("peak");
  c = CompareWithJson(good, "broken.json", broken);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() ==
        "'broken.json' is not a usable memscope.report/1: rank 0 has no \"peak\".\"allocated\" object");

  broken = good_json;
  broken["ranks"][0]["rank"] = 5;
  c = CompareWithJson(good, "broken.json", broken);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() == "A ('good', ranks 0) and B ('broken.json', ranks 5) have no rank in common");
}
