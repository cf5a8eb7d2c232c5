#include "fleet/fleet.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <utility>

#include "recording/event.h"

namespace memscope {
namespace {

constexpr FleetMetric kAllFleetMetrics[] = {FleetMetric::kPeakAllocated, FleetMetric::kPeakReserved,
                                            FleetMetric::kGrowthPerStep};
constexpr std::int64_t kMinDifference = std::int64_t{1} << 20;  // differences under 1 MiB are not shown
constexpr std::size_t kMaxDifferences = 3;

std::int64_t Signed(std::uint64_t v) { return static_cast<std::int64_t>(std::min<std::uint64_t>(v, INT64_MAX)); }

std::int64_t MetricValue(const FleetRankFigures& f, FleetMetric metric) {
  switch (metric) {
    case FleetMetric::kPeakAllocated: return Signed(f.peak_allocated);
    case FleetMetric::kPeakReserved: return Signed(f.peak_reserved);
    case FleetMetric::kGrowthPerStep: return f.growth_per_step;
  }
  return 0;
}

double MedianOfSorted(const std::vector<double>& v) {
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

FleetSpread SpreadOf(const std::vector<std::int64_t>& values, const std::vector<FleetRank>& ranks) {
  FleetSpread s;
  std::size_t lo = 0, hi = 0;
  for (std::size_t i = 1; i < values.size(); ++i) {
    if (values[i] < values[lo]) lo = i;
    if (values[i] > values[hi]) hi = i;
  }
  std::vector<std::int64_t> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  // The mean of the two middle values, rounded down, without overflow.
  s.median = n % 2 == 1 ? sorted[n / 2]
                        : sorted[n / 2 - 1] / 2 + sorted[n / 2] / 2 + (sorted[n / 2 - 1] % 2 + sorted[n / 2] % 2) / 2;
  s.min = values[lo];
  s.max = values[hi];
  s.min_rank = ranks[lo].report.rank;
  s.max_rank = ranks[hi].report.rank;
  s.skew = s.median != 0 ? static_cast<double>(s.max - s.min) / static_cast<double>(s.median) : 0.0;
  return s;
}

// The modified z-score's scale (fleet.h): 1.4826 MAD, or 1.2533 mean
// absolute deviation when MAD is 0, at least `floor`.
double ScaleOf(const std::vector<std::int64_t>& values, double floor) {
  std::vector<double> v(values.begin(), values.end());
  std::sort(v.begin(), v.end());
  const double median = MedianOfSorted(v);
  std::vector<double> dev;
  double sum = 0;
  for (const double x : v) {
    dev.push_back(std::abs(x - median));
    sum += dev.back();
  }
  std::sort(dev.begin(), dev.end());
  double scale = 1.4826 * MedianOfSorted(dev);
  if (scale == 0) scale = 1.2533 * sum / static_cast<double>(dev.size());
  return std::max(scale, floor);
}

double MedianOf(const std::vector<std::int64_t>& values) {
  std::vector<double> v(values.begin(), values.end());
  std::sort(v.begin(), v.end());
  return MedianOfSorted(v);
}

// Largest |difference| first (then by name), at most kMaxDifferences, none under kMinDifference.
std::vector<FleetDifference> Differences(const std::map<std::string, std::pair<std::int64_t, std::int64_t>>& bytes) {
  std::vector<FleetDifference> out;
  for (const auto& [what, b] : bytes) {
    FleetDifference d{what, b.first, b.second};
    if (std::llabs(d.delta()) >= kMinDifference) out.push_back(std::move(d));
  }
  std::stable_sort(out.begin(), out.end(), [](const FleetDifference& x, const FleetDifference& y) {
    return std::llabs(x.delta()) > std::llabs(y.delta());
  });
  if (out.size() > kMaxDifferences) out.resize(kMaxDifferences);
  return out;
}

void Explain(FleetOutlier& o, const FleetRank& outlier_rank, const FleetRank& median_rank) {
  const RankReport& outlier = outlier_rank.report;
  const RankReport& median = median_rank.report;
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> cats, sites, phases;
  for (int c = 0; c < kNumCategories; ++c) {
    const std::string name(CategoryName(static_cast<Category>(c)));
    cats[name] = {outlier.peak_allocated.by_category[c], median.peak_allocated.by_category[c]};
  }
  for (const SiteBytes& s : outlier.peak_allocated.top_sites) sites[s.site].first = s.bytes;
  for (const SiteBytes& s : median.peak_allocated.top_sites) sites[s.site].second = s.bytes;
  for (const auto& [name, bytes] : outlier_rank.figures.phase_peaks) phases[name].first = bytes;
  for (const auto& [name, bytes] : median_rank.figures.phase_peaks) phases[name].second = bytes;
  o.categories = Differences(cats);
  o.sites = Differences(sites);
  o.phases = Differences(phases);
}

}  // namespace

std::string_view FleetMetricName(FleetMetric metric) {
  switch (metric) {
    case FleetMetric::kPeakAllocated: return "peak_allocated";
    case FleetMetric::kPeakReserved: return "peak_reserved";
    case FleetMetric::kGrowthPerStep: return "growth_per_step";
  }
  return "?";
}

FleetRankFigures FiguresOf(const RankReport& r) {
  FleetRankFigures f;
  f.peak_allocated = r.peak_allocated.bytes;
  f.peak_reserved = r.peak_reserved.bytes;
  f.frag_bytes = r.fragmentation_at_peak.reserved_minus_allocated;
  f.fragmentation = r.fragmentation_at_peak.fragmentation;
  if (r.stats_known) {
    f.ooms = r.stats.num_ooms;
    f.retries = r.stats.num_alloc_retries;
  }
  if (r.oom && f.ooms == 0) f.ooms = 1;
  std::uint64_t max_reserved = 0;  // max_memory_reserved before the row
  std::vector<std::uint64_t> step_end_allocated;
  for (const PhaseRow& row : r.phases) {
    std::int64_t& phase_peak = f.phase_peaks[ReportPhaseName(row)];
    phase_peak = std::max(phase_peak, Signed(row.peak_allocated_in_phase));
    const std::uint64_t in_row = row.max_reserved > max_reserved ? row.max_reserved : row.reserved;
    max_reserved = std::max(max_reserved, row.max_reserved);
    if (row.step == kNoStep) continue;
    if (f.steps.empty() || f.steps.back() != row.step) {
      f.steps.push_back(row.step);
      f.step_peak_reserved.push_back(0);
      step_end_allocated.push_back(0);
    }
    f.step_peak_reserved.back() = std::max(f.step_peak_reserved.back(), in_row);
    step_end_allocated.back() = row.allocated;
  }
  if (step_end_allocated.size() >= 2) {
    const std::int64_t grown = Signed(step_end_allocated.back()) - Signed(step_end_allocated.front());
    f.growth_per_step = grown / static_cast<std::int64_t>(step_end_allocated.size() - 1);
  }
  return f;
}

void ReduceRank(FleetRank& rank) {
  if (rank.reduced) return;
  rank.figures = FiguresOf(rank.report);
  RankReport& r = rank.report;
  r.phases = {};
  r.ddp.reset();
  r.losses = {};
  r.model_at_end.reset();
  r.pools_at_end = {};
  rank.reduced = true;
}

FleetResult AnalyzeFleet(std::vector<FleetRank> ranks) {
  for (FleetRank& r : ranks) ReduceRank(r);
  FleetResult fleet;
  std::stable_sort(ranks.begin(), ranks.end(),
                   [](const FleetRank& a, const FleetRank& b) { return a.report.rank < b.report.rank; });
  fleet.ranks = std::move(ranks);
  const std::size_t n = fleet.ranks.size();
  std::array<std::vector<std::int64_t>, kNumFleetMetrics> values;
  for (const FleetMetric m : kAllFleetMetrics) {
    for (const FleetRank& r : fleet.ranks) values[static_cast<int>(m)].push_back(MetricValue(r.figures, m));
    fleet.spreads[static_cast<int>(m)] = SpreadOf(values[static_cast<int>(m)], fleet.ranks);
  }
  for (const FleetMetric m : kAllFleetMetrics) {
    // growth_per_step's floor: 1% of the median peak allocated (a median growth is usually 0).
    const auto& base = values[static_cast<int>(m == FleetMetric::kGrowthPerStep ? FleetMetric::kPeakAllocated : m)];
    fleet.scales[static_cast<int>(m)] = ScaleOf(values[static_cast<int>(m)], kMinScaleOfMedian * std::abs(MedianOf(base)));
  }
  // The median rank: the middle one by peak reserved (then peak allocated, then rank).
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const FleetRankFigures &x = fleet.ranks[a].figures, &y = fleet.ranks[b].figures;
    return std::pair(x.peak_reserved, x.peak_allocated) < std::pair(y.peak_reserved, y.peak_allocated);
  });
  const std::size_t median = order[(n - 1) / 2];
  fleet.median_rank = fleet.ranks[median].report.rank;
  std::array<double, kNumFleetMetrics> medians{};
  for (const FleetMetric m : kAllFleetMetrics) medians[static_cast<int>(m)] = MedianOf(values[static_cast<int>(m)]);
  std::vector<std::int64_t> ooms;
  for (const FleetRank& r : fleet.ranks) ooms.push_back(r.figures.ooms);
  const bool most_ran_out = MedianOf(ooms) > 0;
  for (std::size_t i = 0; i < n; ++i) {
    FleetOutlier o;
    o.rank = fleet.ranks[i].report.rank;
    for (const FleetMetric m : kAllFleetMetrics) {
      const int k = static_cast<int>(m);
      const double scale = fleet.scales[k];
      o.scores[k] = scale > 0 ? (static_cast<double>(values[k][i]) - medians[k]) / scale : 0.0;
      if (std::abs(o.scores[k]) > kOutlierScore) o.flagged.push_back(m);
    }
    o.oom = fleet.ranks[i].figures.ooms > 0 && !most_ran_out;
    if (o.flagged.empty() && !o.oom) continue;
    Explain(o, fleet.ranks[i], fleet.ranks[median]);
    fleet.outliers.push_back(std::move(o));
  }
  return fleet;
}

Report FleetReport(const FleetResult& fleet) {
  std::vector<RankReport> ranks;
  int world_size = 0;
  for (const FleetRank& r : fleet.ranks) {
    ranks.push_back(r.report);
    world_size = std::max(world_size, r.report.rank + 1);
  }
  return MakeReport(world_size, std::move(ranks));
}

}  // namespace memscope
