// FleetText, FleetJson and FleetHtml (fleet/fleet.h).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/sizes.h"
#include "fleet/fleet.h"

namespace memscope {
namespace {

using nlohmann::json;

constexpr FleetMetric kMetrics[] = {FleetMetric::kPeakAllocated, FleetMetric::kPeakReserved,
                                    FleetMetric::kGrowthPerStep};

std::string SizeText(std::int64_t bytes) {
  return bytes < 0 ? absl::StrCat("-", FormatSize(static_cast<std::uint64_t>(-bytes)))
                   : FormatSize(static_cast<std::uint64_t>(bytes));
}
std::string DeltaText(std::int64_t bytes) { return bytes > 0 ? absl::StrCat("+", SizeText(bytes)) : SizeText(bytes); }

std::string SkewText(const FleetSpread& s) {
  return s.median != 0 ? absl::StrFormat("%.1f%%", 100.0 * s.skew) : std::string("-");
}

// "40 PyTorch snapshots", "2 report.json files" ...
std::string KindsText(const FleetResult& fleet) {
  std::map<std::string, int> kinds;
  for (const FleetRank& r : fleet.ranks) ++kinds[r.kind];
  std::vector<std::string> parts;
  for (const auto& [kind, n] : kinds) {
    const bool file = kind.find('.') != std::string::npos;  // "report.json"
    parts.push_back(absl::StrCat(n, " from ", kind, file ? " file" : "", n == 1 ? "" : "s"));
  }
  return absl::StrJoin(parts, ", ");
}

std::uint64_t GpuUsed(const FleetRank& r) {
  std::uint64_t used = 0;
  for (const GpuRow& row : r.gpus) {
    for (const GpuProcess& p : row.processes) used += p.used_bytes();
  }
  return used;
}

std::string DifferencesLine(const std::string& title, const std::vector<FleetDifference>& diffs) {
  if (diffs.empty()) return "";
  std::vector<std::string> parts;
  for (const FleetDifference& d : diffs) {
    parts.push_back(absl::StrCat(d.what, " ", DeltaText(d.delta()), " (", SizeText(d.outlier_bytes), " against ",
                                 SizeText(d.median_bytes), ")"));
  }
  return absl::StrCat("  ", title, ": ", absl::StrJoin(parts, "; "), "\n");
}

std::string OutlierText(const FleetResult& fleet, const FleetOutlier& o) {
  std::vector<std::string> why;
  const std::size_t i = static_cast<std::size_t>(
      std::find_if(fleet.ranks.begin(), fleet.ranks.end(),
                   [&](const FleetRank& r) { return r.report.rank == o.rank; }) -
      fleet.ranks.begin());
  for (const FleetMetric m : o.flagged) {
    const int k = static_cast<int>(m);
    const std::int64_t value = m == FleetMetric::kPeakAllocated   ? static_cast<std::int64_t>(fleet.ranks[i].figures.peak_allocated)
                               : m == FleetMetric::kPeakReserved ? static_cast<std::int64_t>(fleet.ranks[i].figures.peak_reserved)
                                                                  : fleet.ranks[i].figures.growth_per_step;
    why.push_back(absl::StrFormat("%s %s against a median of %s (score %.1f)", std::string(FleetMetricName(m)), SizeText(value),
                                  SizeText(fleet.spreads[k].median), o.scores[k]));
  }
  if (o.oom) why.push_back(absl::StrCat("ran out of memory ", fleet.ranks[i].figures.ooms, " time(s)"));
  std::string text = absl::StrCat("rank ", o.rank, ": ", absl::StrJoin(why, "; "), "\n");
  absl::StrAppend(&text, DifferencesLine("categories at the peak", o.categories));
  absl::StrAppend(&text, DifferencesLine("sites at the peak", o.sites));
  absl::StrAppend(&text, DifferencesLine("phases (peak inside)", o.phases));
  return text;
}

std::string RanksTable(const FleetResult& fleet) {
  const bool gpus = std::any_of(fleet.ranks.begin(), fleet.ranks.end(), [](const FleetRank& r) { return !r.gpus.empty(); });
  std::string text = absl::StrFormat("%5s %15s %15s %13s %5s %8s %6s%s  %s\n", "rank", "peak allocated", "peak reserved",
                                     "frag at peak", "ooms", "retries", "steps", gpus ? absl::StrFormat(" %12s", "GPU used") : "",
                                     "source");
  for (std::size_t i = 0; i < fleet.ranks.size(); ++i) {
    const FleetRank& r = fleet.ranks[i];
    const FleetRankFigures& f = fleet.ranks[i].figures;
    absl::StrAppendFormat(&text, "%5d %15s %15s %13s %5d %8d %6d%s  %s\n", r.report.rank, FormatSize(f.peak_allocated),
                          FormatSize(f.peak_reserved), FormatSize(f.frag_bytes), f.ooms, f.retries, f.steps.size(),
                          gpus ? absl::StrFormat(" %12s", r.gpus.empty() ? "-" : FormatSize(GpuUsed(r))) : "", r.source);
  }
  return text;
}

json DifferencesJson(const std::vector<FleetDifference>& diffs) {
  json out = json::array();
  for (const FleetDifference& d : diffs) {
    out.push_back({{"what", d.what}, {"bytes", d.outlier_bytes}, {"median_bytes", d.median_bytes}, {"delta", d.delta()}});
  }
  return out;
}

json RankJson(const FleetRank& r) {
  const FleetRankFigures& f = r.figures;
  return {{"rank", r.report.rank},
          {"source", r.source},
          {"kind", r.kind},
          {"peak_allocated_bytes", f.peak_allocated},
          {"peak_reserved_bytes", f.peak_reserved},
          {"frag_bytes", f.frag_bytes},
          {"fragmentation", f.fragmentation},
          {"ooms", f.ooms},
          {"retries", f.retries},
          {"steps", f.steps},
          {"step_peak_reserved_bytes", f.step_peak_reserved},
          {"growth_per_step_bytes", f.growth_per_step},
          {"gpus", GpuTableJson(r.gpus)},
          {"notes", r.notes}};
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// A cell's colour: light yellow (the smallest value) to dark red (the largest).
std::string HeatColor(std::uint64_t v, std::uint64_t lo, std::uint64_t hi) {
  const double x = hi > lo ? static_cast<double>(v - lo) / static_cast<double>(hi - lo) : 0.0;
  return absl::StrFormat("hsl(%d,90%%,%d%%)", static_cast<int>(55 - 55 * x), static_cast<int>(88 - 48 * x));
}

// The heat map: one row per rank, one column per step (one column "run"
// when no rank has steps), coloured by peak reserved.
std::string HeatMap(const FleetResult& fleet, const std::map<int, std::string>& links) {
  std::set<std::int64_t> steps;
  for (const FleetRank& r : fleet.ranks) steps.insert(r.figures.steps.begin(), r.figures.steps.end());
  std::uint64_t lo = UINT64_MAX, hi = 0;
  std::vector<std::map<std::int64_t, std::uint64_t>> cells(fleet.ranks.size());
  for (std::size_t i = 0; i < fleet.ranks.size(); ++i) {
    const FleetRankFigures& f = fleet.ranks[i].figures;
    if (steps.empty()) cells[i][0] = f.peak_reserved;
    for (std::size_t s = 0; s < f.steps.size(); ++s) cells[i][f.steps[s]] = f.step_peak_reserved[s];
    for (const auto& [step, v] : cells[i]) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  std::string html = absl::StrCat("<p>Each cell: the step's peak reserved, from <span class=swatch style=\"background:",
                                  HeatColor(lo, lo, hi), "\"></span> ", FormatSize(lo), " to <span class=swatch style=\"background:",
                                  HeatColor(hi, lo, hi), "\"></span> ", FormatSize(hi), ".</p>\n");
  html += "<table class=heat><tr><th>rank</th>";
  if (steps.empty()) html += "<th>run</th>";
  for (const std::int64_t s : steps) absl::StrAppend(&html, "<th>", s, "</th>");
  html += "</tr>\n";
  for (std::size_t i = 0; i < fleet.ranks.size(); ++i) {
    const int rank = fleet.ranks[i].report.rank;
    auto link = links.find(rank);
    const bool outlier = std::any_of(fleet.outliers.begin(), fleet.outliers.end(),
                                     [&](const FleetOutlier& o) { return o.rank == rank; });
    absl::StrAppend(&html, "<tr", outlier ? " class=outlier" : "", "><th>",
                    link != links.end() ? absl::StrCat("<a href=\"", HtmlEscape(link->second), "\">", rank, "</a>")
                                        : absl::StrCat(rank),
                    "</th>");
    for (const std::int64_t s : steps.empty() ? std::set<std::int64_t>{0} : steps) {
      auto c = cells[i].find(s);
      if (c == cells[i].end()) {
        html += "<td></td>";
        continue;
      }
      absl::StrAppend(&html, "<td style=\"background:", HeatColor(c->second, lo, hi), "\" title=\"rank ", rank,
                      steps.empty() ? "" : absl::StrCat(" step ", s), ": ", FormatSize(c->second), "\"></td>");
    }
    html += "</tr>\n";
  }
  return html + "</table>\n";
}

constexpr const char* kStyle =
    "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}pre{background:#f6f6f6;padding:.8em;white-space:pre-wrap}"
    ".swatch{display:inline-block;width:14px;height:14px;vertical-align:middle}"
    "table.heat{border-collapse:collapse}table.heat td{width:14px;height:14px;padding:0;border:1px solid #fff}"
    "table.heat th{font-weight:normal;font-size:11px;padding:0 4px}tr.outlier th{color:#b00;font-weight:bold}";

}  // namespace

std::string FleetText(const FleetResult& fleet) {
  std::string text = absl::StrCat("memscope fleet: ", fleet.ranks.size(), " rank", fleet.ranks.size() == 1 ? "" : "s",
                                  " (", KindsText(fleet), "); the median rank is ", fleet.median_rank, "\n");
  absl::StrAppendFormat(&text, "%-16s %-22s %-12s %-22s %s\n", "metric", "min", "median", "max", "skew");
  for (const FleetMetric m : kMetrics) {
    const FleetSpread& s = fleet.spreads[static_cast<int>(m)];
    absl::StrAppendFormat(&text, "%-16s %-22s %-12s %-22s %s\n", std::string(FleetMetricName(m)),
                          absl::StrCat(SizeText(s.min), " (rank ", s.min_rank, ")"), SizeText(s.median),
                          absl::StrCat(SizeText(s.max), " (rank ", s.max_rank, ")"), SkewText(s));
  }
  if (fleet.outliers.empty()) {
    absl::StrAppend(&text, "no outlier rank (modified z-score above ", kOutlierScore, ")\n");
  } else {
    absl::StrAppend(&text, fleet.outliers.size(), " outlier rank", fleet.outliers.size() == 1 ? "" : "s",
                    " (modified z-score above ", kOutlierScore, "), against the median rank ", fleet.median_rank, ":\n");
    for (const FleetOutlier& o : fleet.outliers) text += OutlierText(fleet, o);
  }
  return text + "\n" + RanksTable(fleet);
}

json FleetJson(const FleetResult& fleet) {
  json ranks = json::array();
  for (std::size_t i = 0; i < fleet.ranks.size(); ++i) ranks.push_back(RankJson(fleet.ranks[i]));
  json spread = json::object(), scales = json::object();
  for (const FleetMetric m : kMetrics) {
    const FleetSpread& s = fleet.spreads[static_cast<int>(m)];
    spread[std::string(FleetMetricName(m))] = {{"min", s.min},           {"median", s.median},
                                               {"max", s.max},           {"min_rank", s.min_rank},
                                               {"max_rank", s.max_rank}, {"skew", s.skew}};
    scales[std::string(FleetMetricName(m))] = fleet.scales[static_cast<int>(m)];
  }
  json outliers = json::array();
  for (const FleetOutlier& o : fleet.outliers) {
    json scores = json::object(), flagged = json::array();
    for (const FleetMetric m : kMetrics) scores[std::string(FleetMetricName(m))] = o.scores[static_cast<int>(m)];
    for (const FleetMetric m : o.flagged) flagged.push_back(std::string(FleetMetricName(m)));
    outliers.push_back({{"rank", o.rank},
                        {"scores", scores},
                        {"flagged", flagged},
                        {"oom", o.oom},
                        {"categories", DifferencesJson(o.categories)},
                        {"sites", DifferencesJson(o.sites)},
                        {"phases", DifferencesJson(o.phases)}});
  }
  return {{"schema", "memscope.fleet/1"}, {"ranks", ranks},         {"spread", spread},
          {"median_rank", fleet.median_rank}, {"scales", scales}, {"outliers", outliers}};
}

std::string FleetHtml(const FleetResult& fleet, const std::vector<FleetHtmlLink>& links) {
  std::map<int, std::string> by_rank;
  for (const FleetHtmlLink& l : links) by_rank[l.rank] = l.href;
  std::string html = absl::StrCat(
      "<!DOCTYPE html>\n<html><head><meta charset=utf-8>"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
      "<title>memscope fleet</title><style>",
      kStyle, "</style></head><body>\n<h1>memscope fleet</h1>\n");
  // The text's summary and outliers, with each outlier's own report linked.
  std::string summary = FleetText(fleet);
  summary.resize(summary.find("\n\n") + 1);
  absl::StrAppend(&html, "<pre>", HtmlEscape(summary), "</pre>\n");
  if (!by_rank.empty()) {
    html += "<p>Own reports of the outliers: ";
    std::vector<std::string> parts;
    for (const auto& [rank, href] : by_rank) {
      parts.push_back(absl::StrCat("<a href=\"", HtmlEscape(href), "\">rank ", rank, "</a>"));
    }
    absl::StrAppend(&html, absl::StrJoin(parts, ", "), "</p>\n");
  }
  absl::StrAppend(&html, "<h2>Peak reserved, rank x step</h2>\n", HeatMap(fleet, by_rank));
  absl::StrAppend(&html, "<h2>Ranks</h2>\n<pre>", HtmlEscape(RanksTable(fleet)), "</pre>\n</body></html>\n");
  return html;
}

}  // namespace memscope
