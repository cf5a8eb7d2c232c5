#include "compare/compare.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/sizes.h"
#include "base/terminal_text.h"
#include "exporters/report.h"

namespace memscope {
namespace {

using json = nlohmann::json;

// The run.json keys the header shows, in this order.
constexpr const char* kConfigKeys[] = {"model", "source", "optimizer", "steps", "ddp", "world_size", "alloc_conf"};

// ---- What a comparison reads of a report ----

struct PhaseEnd {
  std::int64_t step = kNoStep;
  std::string phase;
  ComparedRow values;
  const std::array<std::int64_t, kNumCategories>* by_category = nullptr;
};

// What one side holds for a moment of the explanation.
struct Breakdown {
  std::string moment;
  std::int64_t total = 0;
  bool known = true;
  std::map<std::string, std::int64_t> by_category;
};

struct RankData {
  int rank = 0;
  std::vector<PhaseEnd> phases;
  std::uint64_t peak_allocated = 0, peak_reserved = 0;
  std::string peak_allocated_phase, peak_reserved_phase;
  Breakdown at_peak, at_end;
};

struct RunData {
  int world_size = 0;
  std::map<int, RankData> ranks;
};

std::map<std::string, std::int64_t> CategoryMap(const std::array<std::int64_t, kNumCategories>& by_category) {
  std::map<std::string, std::int64_t> out;
  for (int c = 0; c < kNumCategories; ++c) out[std::string(CategoryName(static_cast<Category>(c)))] = by_category[c];
  return out;
}

// The moment `end` (analysis.h): the end of the last step's last phase;
// without steps, the end of the recording (by category only when the input
// has the timeline).
Breakdown AtEnd(const CompareInput& input, const RankReport& rank, const std::vector<PhaseEnd>& phases) {
  for (auto it = phases.rbegin(); it != phases.rend(); ++it) {
    if (it->step == kNoStep) continue;
    return {absl::StrCat(it->phase, ":", it->step), static_cast<std::int64_t>(it->values.allocated), true,
            CategoryMap(*it->by_category)};
  }
  Breakdown end;
  end.moment = "end of recording";
  if (auto it = input.end_by_category.find(rank.rank); it != input.end_by_category.end()) {
    end.by_category = CategoryMap(it->second);
    for (const std::int64_t bytes : it->second) end.total += bytes;
  } else {
    end.total = static_cast<std::int64_t>(rank.fragmentation_at_end.allocated);
    end.known = false;
  }
  return end;
}

RankData ReadRank(const CompareInput& input, const RankReport& rank) {
  RankData r;
  r.rank = rank.rank;
  for (const PhaseRow& row : rank.phases) {
    r.phases.push_back(
        {row.step, ReportPhaseName(row), {row.allocated, row.max_allocated, row.reserved}, &row.by_category});
  }
  r.peak_allocated = rank.peak_allocated.bytes;
  r.peak_allocated_phase = rank.peak_allocated.phase;
  r.at_peak = {r.peak_allocated_phase.empty() ? "(no phase)" : r.peak_allocated_phase,
               static_cast<std::int64_t>(r.peak_allocated), true, CategoryMap(rank.peak_allocated.by_category)};
  r.peak_reserved = rank.peak_reserved.bytes;
  r.peak_reserved_phase = rank.peak_reserved.phase;
  r.at_end = AtEnd(input, rank, r.phases);
  return r;
}

RunData ReadRun(const CompareInput& input) {
  RunData run;
  run.world_size = input.report.world_size;
  for (const RankReport& rank : input.report.ranks) run.ranks.emplace(rank.rank, ReadRank(input, rank));
  return run;
}

// ---- Comparing ----

// Rows matched by (step, phase, occurrence): A's order, B's own rows where B has them.
std::vector<ComparedPhase> MatchPhases(const std::vector<PhaseEnd>& a, const std::vector<PhaseEnd>& b) {
  using Key = std::tuple<std::int64_t, std::string, int>;
  auto keys = [](const std::vector<PhaseEnd>& rows) {
    std::map<std::pair<std::int64_t, std::string>, int> seen;
    std::vector<Key> out;
    for (const PhaseEnd& r : rows) out.emplace_back(r.step, r.phase, seen[{r.step, r.phase}]++);
    return out;
  };
  const std::vector<Key> ka = keys(a), kb = keys(b);
  std::map<Key, std::size_t> in_a, in_b;
  for (std::size_t i = 0; i < ka.size(); ++i) in_a[ka[i]] = i;
  for (std::size_t j = 0; j < kb.size(); ++j) in_b[kb[j]] = j;
  std::vector<bool> b_done(b.size(), false);
  std::vector<ComparedPhase> out;
  auto emit = [&](const PhaseEnd* ra, const PhaseEnd* rb) {
    const PhaseEnd& r = ra != nullptr ? *ra : *rb;
    ComparedPhase p;
    p.step = r.step;
    p.phase = r.phase;
    if (ra != nullptr) p.a = ra->values;
    if (rb != nullptr) p.b = rb->values;
    out.push_back(std::move(p));
  };
  std::size_t i = 0, j = 0;
  while (true) {
    while (j < b.size() && b_done[j]) ++j;
    if (i == a.size() && j == b.size()) break;
    if (i == a.size()) {
      emit(nullptr, &b[j]);
      b_done[j] = true;
      continue;
    }
    auto partner = in_b.find(ka[i]);
    if (partner == in_b.end()) {
      emit(&a[i++], nullptr);
    } else if (j < b.size() && partner->second != j && !in_a.contains(kb[j])) {
      emit(nullptr, &b[j]);  // B's own row comes first
      b_done[j] = true;
    } else {
      emit(&a[i++], &b[partner->second]);
      b_done[partner->second] = true;
    }
  }
  return out;
}

int CategoryOrder(const std::string& name) {
  const std::optional<Category> c = ParseCategory(name);
  return c ? static_cast<int>(*c) : kNumCategories;
}

Explanation Explain(const Breakdown& a, const Breakdown& b) {
  Explanation e;
  e.a_moment = a.moment;
  e.b_moment = b.moment;
  e.a_total = a.total;
  e.b_total = b.total;
  e.known = a.known && b.known;
  if (!e.known) return e;
  std::set<std::string> names;
  for (const auto& [name, bytes] : a.by_category) {
    if (bytes != 0) names.insert(name);
  }
  for (const auto& [name, bytes] : b.by_category) {
    if (bytes != 0) names.insert(name);
  }
  for (const std::string& name : names) {
    CategoryDelta d;
    d.category = name;
    if (auto it = a.by_category.find(name); it != a.by_category.end()) d.a = it->second;
    if (auto it = b.by_category.find(name); it != b.by_category.end()) d.b = it->second;
    e.categories.push_back(std::move(d));
  }
  std::sort(e.categories.begin(), e.categories.end(), [](const CategoryDelta& x, const CategoryDelta& y) {
    const std::int64_t dx = std::abs(x.delta()), dy = std::abs(y.delta());
    if (dx != dy) return dx > dy;
    const std::int64_t mx = std::max(x.a, x.b), my = std::max(y.a, y.b);
    if (mx != my) return mx > my;
    return std::make_pair(CategoryOrder(x.category), x.category) <
           std::make_pair(CategoryOrder(y.category), y.category);
  });
  return e;
}

ComparedRun DescribeRun(const CompareInput& input, const RunData& data) {
  ComparedRun run;
  run.label = input.label;
  run.alloc_conf = input.report.ranks.empty() ? "" : input.report.ranks.front().alloc_conf;
  run.world_size = data.world_size;
  for (const auto& [rank, unused] : data.ranks) run.ranks.push_back(rank);
  if (input.run_config.is_object()) {
    run.config = json::object();
    for (const char* key : kConfigKeys) {
      auto it = input.run_config.find(key);
      if (it != input.run_config.end() && !it->is_null()) run.config[key] = *it;
    }
  }
  return run;
}

std::string RankList(const std::vector<int>& ranks) { return absl::StrJoin(ranks, ", "); }

// ---- Text ----

std::string SignedSize(std::int64_t bytes) {
  if (bytes == 0) return FormatSize(0);
  const std::uint64_t magnitude = bytes < 0 ? 0 - static_cast<std::uint64_t>(bytes) : static_cast<std::uint64_t>(bytes);
  return absl::StrCat(bytes < 0 ? "-" : "+", FormatSize(magnitude));
}

std::string Percent(std::uint64_t a, std::int64_t delta) {
  if (a == 0) return "";
  return absl::StrFormat(" (%+.1f%%)", 100.0 * static_cast<double>(delta) / static_cast<double>(a));
}

std::string ConfigValue(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string RunHeader(const char* name, const ComparedRun& run) {
  std::vector<std::string> parts;
  bool have_alloc_conf = false;
  if (run.config.is_object()) {
    for (const char* key : kConfigKeys) {
      auto it = run.config.find(key);
      if (it == run.config.end()) continue;
      const std::string value = ConfigValue(*it);
      if (std::string_view(key) == "steps") {
        parts.push_back(absl::StrCat(value, " steps"));
      } else if (std::string_view(key) == "world_size") {
        parts.push_back(absl::StrCat("world size ", value));
      } else if (std::string_view(key) == "ddp" && value == "dp") {
        parts.push_back("DataParallel");  // memscope run --dp
      } else if (std::string_view(key) == "alloc_conf") {
        have_alloc_conf = true;
        parts.push_back(absl::StrCat("alloc_conf ", value.empty() ? "(defaults)" : absl::StrCat("\"", EscapeForTerminal(value), "\"")));
      } else {
        parts.push_back(absl::StrCat(key, " ", value));
      }
    }
  } else {
    parts.push_back(absl::StrCat("world size ", run.world_size));
  }
  if (!have_alloc_conf) {
    parts.push_back(
        absl::StrCat("alloc_conf ", run.alloc_conf.empty() ? "(defaults)" : absl::StrCat("\"", EscapeForTerminal(run.alloc_conf), "\"")));
  }
  return absl::StrCat(name, ": ", EscapeForTerminal(run.label), " (", absl::StrJoin(parts, ", "), ")\n");
}

constexpr int kMibWidth = 8;

std::string Group(const std::string& title) {
  const int width = 3 * kMibWidth + 2;
  const int pad = width - static_cast<int>(title.size()) - 2;
  const int left = pad / 2, right = pad - pad / 2;
  return absl::StrCat(std::string(static_cast<std::size_t>(std::max(left, 0)), '-'), " ", title, " ",
                      std::string(static_cast<std::size_t>(std::max(right, 0)), '-'));
}

std::string PhaseTable(const std::vector<ComparedPhase>& phases) {
  std::uint64_t largest = 0;
  for (const ComparedPhase& p : phases) {
    for (const auto& side : {p.a, p.b}) {
      if (side) largest = std::max({largest, side->allocated, side->max_allocated, side->reserved});
    }
  }
  const TableUnit unit = TableUnitFor(largest);
  std::string out = absl::StrFormat("%-5s %-14s  %s  %s  %s\n", "", "", Group("allocated"), Group("max allocated"),
                                    Group("reserved"));
  absl::StrAppendFormat(&out, "%-5s %-14s", "step", "phase");
  for (int g = 0; g < 3; ++g)
    absl::StrAppendFormat(&out, "  %*s %*s %*s", kMibWidth, "A", kMibWidth, "B", kMibWidth, "B-A");
  out += "\n";
  for (const ComparedPhase& p : phases) {
    absl::StrAppendFormat(&out, "%-5s %-14s", p.step == kNoStep ? std::string("-") : absl::StrCat(p.step),
                          EscapeForTerminal(p.phase));
    auto column = [&](std::uint64_t ComparedRow::*field) {
      const std::string a = p.a ? FormatInUnit((*p.a).*field, unit) : "-";
      const std::string b = p.b ? FormatInUnit((*p.b).*field, unit) : "-";
      const std::string d = p.a && p.b ? FormatDeltaInUnit(static_cast<std::int64_t>((*p.b).*field) -
                                                               static_cast<std::int64_t>((*p.a).*field),
                                                           unit)
                                       : "-";
      absl::StrAppendFormat(&out, "  %*s %*s %*s", kMibWidth, a, kMibWidth, b, kMibWidth, d);
    };
    column(&ComparedRow::allocated);
    column(&ComparedRow::max_allocated);
    column(&ComparedRow::reserved);
    out += "\n";
  }
  return out;
}

std::string PeakLine(const char* name, const ComparedPeak& p) {
  return absl::StrFormat("%-10s %12s  %-14s %12s  %-14s %12s%s\n", name, FormatSize(p.a),
                         p.a_phase.empty() ? "(no phase)" : EscapeForTerminal(p.a_phase), FormatSize(p.b),
                         p.b_phase.empty() ? "(no phase)" : EscapeForTerminal(p.b_phase), SignedSize(p.delta()), Percent(p.a, p.delta()));
}

std::string ExplanationText(const std::string& title, const Explanation& e) {
  std::string out =
      absl::StrCat("what explains the difference ", title, " (A ", EscapeForTerminal(e.a_moment), ", B ",
                   EscapeForTerminal(e.b_moment), "):\n");
  absl::StrAppendFormat(&out, "%-17s %12s  %12s  %12s\n", "category", "A", "B", "B-A");
  if (!e.known) {
    absl::StrAppend(&out, "(by category unknown: a report.json without phase marks has no breakdown of its end)\n");
  }
  for (const CategoryDelta& d : e.categories) {
    absl::StrAppendFormat(&out, "%-17s %12s  %12s  %12s\n", EscapeForTerminal(d.category), FormatSize(static_cast<std::uint64_t>(d.a)),
                          FormatSize(static_cast<std::uint64_t>(d.b)), SignedSize(d.delta()));
  }
  absl::StrAppendFormat(&out, "%-17s %12s  %12s  %12s\n", "total", FormatSize(static_cast<std::uint64_t>(e.a_total)),
                        FormatSize(static_cast<std::uint64_t>(e.b_total)), SignedSize(e.b_total - e.a_total));
  return out;
}

// ---- JSON ----

json RowJson(const std::optional<ComparedRow>& r) {
  if (!r) return nullptr;
  return {
      {"allocated_bytes", r->allocated}, {"max_allocated_bytes", r->max_allocated}, {"reserved_bytes", r->reserved}};
}

json PeakJson(const ComparedPeak& p) {
  return {
      {"a_bytes", p.a}, {"b_bytes", p.b}, {"delta_bytes", p.delta()}, {"a_phase", p.a_phase}, {"b_phase", p.b_phase}};
}

json ExplanationJson(const Explanation& e) {
  json categories = json::array();
  for (const CategoryDelta& d : e.categories) {
    categories.push_back({{"category", d.category}, {"a_bytes", d.a}, {"b_bytes", d.b}, {"delta_bytes", d.delta()}});
  }
  return {{"a_moment", e.a_moment},
          {"b_moment", e.b_moment},
          {"a_bytes", e.a_total},
          {"b_bytes", e.b_total},
          {"delta_bytes", e.b_total - e.a_total},
          {"known", e.known},
          {"categories", categories}};
}

json RunJson(const ComparedRun& run) {
  return {{"path", run.label},
          {"world_size", run.world_size},
          {"ranks", run.ranks},
          {"alloc_conf", run.alloc_conf},
          {"config", run.config}};
}

// Fills input.end_by_category for the ranks of the report without steps.
absl::Status AddEndsOfRecording(CompareInput& input, const std::vector<Timeline>& timelines) {
  for (const Timeline& t : timelines) {
    bool has_steps = false;
    for (const RankReport& rank : input.report.ranks) {
      if (rank.rank != t.rank) continue;
      for (const PhaseRow& row : rank.phases) has_steps = has_steps || row.step != kNoStep;
    }
    if (has_steps) continue;
    absl::StatusOr<std::pair<TraceModel, std::size_t>> end = ModelAt(t, Moment{});
    if (!end.ok()) return end.status();
    input.end_by_category[t.rank] = end->first.allocated_by_category();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CompareInput> MakeCompareInput(std::string label, Report report, const std::vector<Timeline>& timelines,
                                              json run_config) {
  CompareInput input;
  input.label = std::move(label);
  input.report = std::move(report);
  input.run_config = std::move(run_config);
  if (absl::Status s = AddEndsOfRecording(input, timelines); !s.ok()) return s;
  return input;
}

absl::StatusOr<CompareInput> CompareInputFromRun(std::string label, const std::vector<Timeline>& timelines,
                                                 const std::vector<RankReport>& reports, json run_config) {
  const int world_size = timelines.empty() ? 0 : timelines.front().world_size;
  return MakeCompareInput(std::move(label), MakeReport(world_size, reports), timelines, std::move(run_config));
}

absl::StatusOr<Comparison> Compare(const CompareInput& a, const CompareInput& b, int rank) {
  const RunData da = ReadRun(a);
  const RunData db = ReadRun(b);
  Comparison c;
  c.a = DescribeRun(a, da);
  c.b = DescribeRun(b, db);
  std::vector<int> common;
  for (const auto& [r, unused] : da.ranks) {
    if (db.ranks.contains(r)) common.push_back(r);
  }
  if (rank >= 0) {
    for (const auto* run : {&c.a, &c.b}) {
      if (std::find(run->ranks.begin(), run->ranks.end(), rank) == run->ranks.end()) {
        return absl::InvalidArgumentError(absl::StrCat("--rank ", rank, ": ", run == &c.a ? "A" : "B", " ('",
                                                       run->label, "') has no rank ", rank,
                                                       " (its ranks: ", RankList(run->ranks), ")"));
      }
    }
    common = {rank};
  } else if (common.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("A ('", c.a.label, "', ranks ", RankList(c.a.ranks), ") and B ('",
                                                   c.b.label, "', ranks ", RankList(c.b.ranks),
                                                   ") have no rank in common"));
  }
  if (c.a.world_size != c.b.world_size || c.a.ranks != c.b.ranks) {
    c.notes.push_back(absl::StrCat("A has world size ", c.a.world_size, " (ranks ", RankList(c.a.ranks),
                                   ") and B world size ", c.b.world_size, " (ranks ", RankList(c.b.ranks), "): ",
                                   rank >= 0 ? absl::StrCat("comparing rank ", rank)
                                             : absl::StrCat("comparing the ranks both have (", RankList(common), ")")));
  }
  for (int r : common) {
    const RankData& ra = da.ranks.at(r);
    const RankData& rb = db.ranks.at(r);
    RankComparison rc;
    rc.rank = r;
    rc.phases = MatchPhases(ra.phases, rb.phases);
    rc.peak_allocated = {ra.peak_allocated, rb.peak_allocated, ra.peak_allocated_phase, rb.peak_allocated_phase};
    rc.peak_reserved = {ra.peak_reserved, rb.peak_reserved, ra.peak_reserved_phase, rb.peak_reserved_phase};
    rc.at_peak = Explain(ra.at_peak, rb.at_peak);
    rc.at_end = Explain(ra.at_end, rb.at_end);
    c.ranks.push_back(std::move(rc));
  }
  return c;
}

std::string FormatComparison(const Comparison& c) {
  std::string out;
  absl::StrAppend(&out, RunHeader("A", c.a), RunHeader("B", c.b));
  for (const std::string& note : c.notes) absl::StrAppend(&out, "note: ", EscapeForTerminal(note), "\n");
  for (const RankComparison& r : c.ranks) {
    absl::StrAppend(&out, "\n== rank ", r.rank, "\n");
    if (r.phases.empty()) {
      absl::StrAppend(&out, "(no phase marks recorded in either run)\n");
    } else {
      absl::StrAppend(&out, PhaseTable(r.phases));
    }
    absl::StrAppendFormat(&out, "\n%-10s %12s  %-14s %12s  %-14s %12s\n", "peak", "A", "at", "B", "at", "B-A");
    absl::StrAppend(&out, PeakLine("allocated", r.peak_allocated), PeakLine("reserved", r.peak_reserved), "\n");
    absl::StrAppend(&out, ExplanationText("at the peak of allocated", r.at_peak), "\n");
    absl::StrAppend(&out, ExplanationText("at the end of the run", r.at_end));
  }
  return out;
}

json ComparisonJson(const Comparison& c) {
  json ranks = json::array();
  for (const RankComparison& r : c.ranks) {
    json phases = json::array();
    for (const ComparedPhase& p : r.phases) {
      json delta = nullptr;
      if (p.a && p.b) {
        auto d = [](std::uint64_t x, std::uint64_t y) {
          return static_cast<std::int64_t>(y) - static_cast<std::int64_t>(x);
        };
        delta = {{"allocated_bytes", d(p.a->allocated, p.b->allocated)},
                 {"max_allocated_bytes", d(p.a->max_allocated, p.b->max_allocated)},
                 {"reserved_bytes", d(p.a->reserved, p.b->reserved)}};
      }
      phases.push_back({{"step", p.step == kNoStep ? json(nullptr) : json(p.step)},
                        {"phase", p.phase},
                        {"a", RowJson(p.a)},
                        {"b", RowJson(p.b)},
                        {"delta", delta}});
    }
    ranks.push_back({{"rank", r.rank},
                     {"phases", phases},
                     {"peaks", {{"allocated", PeakJson(r.peak_allocated)}, {"reserved", PeakJson(r.peak_reserved)}}},
                     {"explain", {{"peak", ExplanationJson(r.at_peak)}, {"end", ExplanationJson(r.at_end)}}}});
  }
  return {{"schema", kCompareSchema}, {"generator", kMemscopeVersion},
          {"a", RunJson(c.a)},        {"b", RunJson(c.b)},
          {"notes", c.notes},         {"ranks", ranks}};
}

}  // namespace memscope
