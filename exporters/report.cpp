#include "exporters/report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/sizes.h"
#include "allocator/stats.h"

namespace memscope {
namespace {

nlohmann::json CategoriesJson(const std::array<std::int64_t, kNumCategories>& by_category) {
  nlohmann::json j = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c) j[std::string(CategoryName(static_cast<Category>(c)))] = by_category[c];
  return j;
}

double TimeUs(const Timeline& t, std::int64_t time_ns) {
  return static_cast<double>(t.wall_start_us) + static_cast<double>(time_ns) / 1000.0;
}

nlohmann::json PeakJson(const Timeline& t, const PeakInfo& p) {
  nlohmann::json owners = nlohmann::json::array();
  for (const auto& [owner, bytes] : p.top_owners) owners.push_back({{"owner", owner}, {"bytes", bytes}});
  return {{"bytes", p.bytes},
          {"time_us", TimeUs(t, p.time_ns)},
          {"phase", p.phase},
          {"by_category", CategoriesJson(p.by_category)},
          {"top_owners", owners}};
}

}  // namespace

std::string CategoryBreakdown(const std::array<std::int64_t, kNumCategories>& by_category, std::uint64_t total,
                              std::size_t max_parts) {
  std::vector<std::pair<std::int64_t, int>> parts;
  for (int c = 0; c < kNumCategories; ++c) {
    if (by_category[c] > 0) parts.emplace_back(by_category[c], c);
  }
  std::sort(parts.rbegin(), parts.rend());
  if (parts.size() > max_parts) parts.resize(max_parts);
  std::string out;
  for (const auto& [bytes, c] : parts) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", std::string(CategoryName(static_cast<Category>(c))), " ",
                    FormatSize(static_cast<std::uint64_t>(bytes)));
    if (total > 0) absl::StrAppendFormat(&out, " (%d%%)", static_cast<int>(100 * bytes / static_cast<std::int64_t>(total)));
  }
  return out;
}

nlohmann::json FragmentationJson(const FragmentationInfo& f) {
  return {{"reserved_bytes", f.reserved},
          {"allocated_bytes", f.allocated},
          {"reserved_minus_allocated_bytes", f.reserved_minus_allocated},
          {"inactive_split_bytes", f.inactive_split_bytes},
          {"free_in_segments_bytes", f.free_in_segments},
          {"largest_free_block_bytes", f.largest_free_block},
          {"fragmentation", f.fragmentation},
          {"segments", f.segments},
          {"free_blocks", f.free_blocks}};
}

nlohmann::json ReportJson(const std::vector<const Timeline*>& timelines, const std::vector<RankReport>& reports) {
  nlohmann::json ranks = nlohmann::json::array();
  for (std::size_t i = 0; i < reports.size(); ++i) {
    const Timeline& t = *timelines[i];
    const RankReport& r = reports[i];
    nlohmann::json phases = nlohmann::json::array();
    for (const PhaseRow& row : r.phases) {
      phases.push_back({{"step", row.step == kNoStep ? nlohmann::json(nullptr) : nlohmann::json(row.step)},
                        {"phase", row.phase == Phase::kUser && !row.label.empty() ? row.label
                                                                                   : std::string(PhaseName(row.phase))},
                        {"allocated_bytes", row.allocated},
                        {"max_allocated_bytes", row.max_allocated},
                        {"reserved_bytes", row.reserved},
                        {"max_reserved_bytes", row.max_reserved},
                        {"peak_allocated_bytes_in_phase", row.peak_allocated_in_phase},
                        {"by_category", CategoriesJson(row.by_category)}});
    }
    nlohmann::json stats = nlohmann::json::object();
    for (const auto& [key, value] : FlattenStats(r.stats)) stats[key] = value;
    nlohmann::json oom = nullptr;
    if (r.oom) {
      oom = {{"time_us", TimeUs(t, r.oom->time_ns)},
             {"phase", r.oom->phase},
             {"requested_bytes", r.oom->requested},
             {"rounded_bytes", r.oom->rounded},
             {"device_free_bytes", r.oom->device_free},
             {"caused_by_fragmentation", r.oom->caused_by_fragmentation},
             {"verdict", r.oom->verdict}};
    }
    ranks.push_back({{"rank", t.rank},
                     {"device_index", t.device_index},
                     {"device_capacity", t.device_capacity},
                     {"alloc_conf", t.alloc_conf},
                     {"events", r.events},
                     {"torn_bytes", t.torn_bytes},
                     {"phases", phases},
                     {"peak", {{"allocated", PeakJson(t, r.peak_allocated)}, {"reserved", PeakJson(t, r.peak_reserved)}}},
                     {"fragmentation",
                      {{"end", FragmentationJson(r.fragmentation_at_end)},
                       {"peak", FragmentationJson(r.fragmentation_at_peak)},
                       {"oom", r.oom ? FragmentationJson(r.oom->fragmentation) : nlohmann::json(nullptr)}}},
                     {"oom", oom},
                     {"memory_stats", stats},
                     {"lower_bound_bytes", r.lower_bound},
                     {"peak_reserved_bytes", r.peak_reserved.bytes},
                     {"overhead_bytes", r.overhead_bytes()}});
  }
  return {{"schema", kReportSchema},
          {"generator", kMemscopeVersion},
          {"world_size", timelines.empty() ? 0 : timelines.front()->world_size},
          {"ranks", ranks}};
}

std::string SummaryText(const Timeline& t, const RankReport& r, const TraceModel& at_moment,
                        const std::string& moment_text) {
  std::string out = absl::StrCat("rank ", t.rank, ": GPU ", t.device_index, " of ", FormatSize(t.device_capacity),
                                 ", alloc_conf ", t.alloc_conf.empty() ? "(defaults)" : absl::StrCat("\"", t.alloc_conf, "\""),
                                 ", ", r.events, " events\n\n");
  if (r.phases.empty()) {
    absl::StrAppend(&out, "(no phase marks recorded)\n");
  } else {
    absl::StrAppend(&out, PhaseTableText(r));
  }
  absl::StrAppend(&out, "\npeak allocated ", FormatSize(r.peak_allocated.bytes),
                  r.peak_allocated.phase.empty() ? "" : absl::StrCat(" in ", r.peak_allocated.phase), ": ",
                  r.peak_allocated.bytes == 0 ? std::string("nothing allocated")
                                              : CategoryBreakdown(r.peak_allocated.by_category, r.peak_allocated.bytes),
                  "\n");
  if (!r.peak_allocated.top_owners.empty()) {
    absl::StrAppend(&out, "  largest owners:");
    for (const auto& [owner, bytes] : r.peak_allocated.top_owners) {
      absl::StrAppend(&out, " ", owner, " ", FormatSize(static_cast<std::uint64_t>(bytes)), ";");
    }
    out.back() = '\n';
  }
  absl::StrAppend(&out, "peak reserved ", FormatSize(r.peak_reserved.bytes),
                  r.peak_reserved.phase.empty() ? "" : absl::StrCat(" in ", r.peak_reserved.phase), "\n");
  absl::StrAppend(&out, "lower bound (peak live requested bytes) ", FormatSize(r.lower_bound), "; peak reserved is ",
                  FormatSize(r.overhead_bytes()), " above it\n");
  if (r.oom) {
    absl::StrAppend(&out, "OOM", r.oom->phase.empty() ? "" : absl::StrCat(" in ", r.oom->phase), ": request of ",
                    r.oom->requested, " B; ", r.oom->verdict, "\n");
  }
  absl::StrAppend(&out, "\nfragmentation at ", moment_text, ":\n", FragmentationText(at_moment.Fragmentation()));
  absl::StrAppend(&out, "\nmemory_summary() at ", moment_text, ":\n",
                  MemorySummary(at_moment.stats(), t.device_index));
  return out;
}

}  // namespace memscope
