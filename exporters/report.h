// What memscope writes about a recording: report.json (versioned schema,
// memscope.report/1) and the text tables a person reads first.
//
// report.json:
//   {"schema": "memscope.report/1", "generator": "memscope 0.1.0", "world_size": N,
//    "ranks": [{
//      "rank", "device_index", "device_capacity", "alloc_conf", "events", "torn_bytes",
//      "phases": [{"step" (null before the first step), "phase", "allocated_bytes",
//                  "max_allocated_bytes", "reserved_bytes", "max_reserved_bytes",
//                  "peak_allocated_bytes_in_phase", "by_category": {CATEGORY: bytes}}],
//      "peak": {"allocated": PEAK, "reserved": PEAK},
//         PEAK = {"bytes", "time_us", "phase", "by_category": {...}, "top_owners": [{"owner", "bytes"}]}
//      "fragmentation": {"end": FRAG, "peak": FRAG, "oom": FRAG or null},
//         FRAG = {"reserved_bytes", "allocated_bytes", "reserved_minus_allocated_bytes",
//                 "inactive_split_bytes", "free_in_segments_bytes", "largest_free_block_bytes",
//                 "fragmentation", "segments", "free_blocks"}
//      "oom": null or {"time_us", "phase", "requested_bytes", "rounded_bytes", "device_free_bytes",
//                      "caused_by_fragmentation", "verdict"},
//      "memory_stats": {every torch.cuda.memory_stats() key, flattened},
//      "lower_bound_bytes", "peak_reserved_bytes", "overhead_bytes"}]}
#ifndef MEMSCOPE_EXPORTERS_REPORT_H_
#define MEMSCOPE_EXPORTERS_REPORT_H_

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "analysis/analysis.h"
#include "recording/event.h"

namespace memscope {

inline constexpr const char* kReportSchema = "memscope.report/1";
inline constexpr const char* kMemscopeVersion = "memscope 0.1.0";

nlohmann::json FragmentationJson(const FragmentationInfo& f);

// "ACTIVATION 812.00 MiB (86%), PARAMETER 288.00 MiB (30%)": the categories
// holding memory, largest first, at most `max_parts` of them, with their share
// of `total`. "" when nothing is allocated.
std::string CategoryBreakdown(const std::array<std::int64_t, kNumCategories>& by_category, std::uint64_t total,
                              std::size_t max_parts = kNumCategories);
// `reports[i]` analyses `timelines[i]`.
nlohmann::json ReportJson(const std::vector<const Timeline*>& timelines, const std::vector<RankReport>& reports);

// The text of `memscope summary` for one rank: header, phase table, peaks,
// lower bound, fragmentation and memory_summary() at `moment`.
std::string SummaryText(const Timeline& timeline, const RankReport& report, const TraceModel& at_moment,
                        const std::string& moment_text);

}  // namespace memscope

#endif  // MEMSCOPE_EXPORTERS_REPORT_H_
