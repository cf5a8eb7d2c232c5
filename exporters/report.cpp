// The text tables of a report; report.json itself is report_json.cpp.
#include "exporters/report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/sizes.h"
#include "allocator/stats.h"
#include "base/terminal_text.h"

namespace memscope {

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
    if (total > 0)
      absl::StrAppendFormat(&out, " (%d%%)", static_cast<int>(100 * bytes / static_cast<std::int64_t>(total)));
  }
  return out;
}

std::string SitesText(std::string_view title, const std::vector<SiteBytes>& sites) {
  if (sites.empty()) return "";
  std::string out = absl::StrCat("  ", std::string(title), " (bytes, allocations, site):\n");
  for (const SiteBytes& s : sites) {
    absl::StrAppendFormat(&out, "  %12s %7d  %s\n", FormatSize(static_cast<std::uint64_t>(s.bytes)), s.allocations,
                          EscapeForTerminal(s.site));
  }
  return out;
}

std::string SummaryText(const Timeline& t, const RankReport& r, const TraceModel& at_moment,
                        const std::string& moment_text, bool by_category) {
  std::string out = absl::StrCat(
      "rank ", t.rank, ": GPU ", t.device_index, " of ", FormatSize(t.device_capacity), ", alloc_conf ",
      t.alloc_conf.empty() ? "(defaults)" : absl::StrCat("\"", EscapeForTerminal(t.alloc_conf), "\""), ", ", r.events, " events\n\n");
  if (r.phases.empty()) {
    absl::StrAppend(&out, "(no phase marks recorded)\n");
  } else {
    absl::StrAppend(&out, PhaseTableText(r));
    if (by_category) absl::StrAppend(&out, "\nallocated by category at each phase end:\n", PhaseCategoryTableText(r));
  }
  absl::StrAppend(&out, "\npeak allocated ", FormatSize(r.peak_allocated.bytes),
                  r.peak_allocated.phase.empty() ? "" : absl::StrCat(" in ", EscapeForTerminal(r.peak_allocated.phase)), ": ",
                  r.peak_allocated.bytes == 0 ? std::string("nothing allocated")
                                              : CategoryBreakdown(r.peak_allocated.by_category, r.peak_allocated.bytes),
                  "\n");
  if (!r.peak_allocated.top_owners.empty()) {
    absl::StrAppend(&out, "  largest owners:");
    for (const auto& [owner, bytes] : r.peak_allocated.top_owners) {
      absl::StrAppend(&out, " ", EscapeForTerminal(owner), " ", FormatSize(static_cast<std::uint64_t>(bytes)), ";");
    }
    out.back() = '\n';
  }
  absl::StrAppend(&out, SitesText("top allocation sites at the peak", r.peak_allocated.top_sites));
  absl::StrAppend(&out, "peak reserved ", FormatSize(r.peak_reserved.bytes),
                  r.peak_reserved.phase.empty() ? "" : absl::StrCat(" in ", EscapeForTerminal(r.peak_reserved.phase)), "\n");
  absl::StrAppend(&out, "lower bound (peak live requested bytes) ", FormatSize(r.lower_bound), "; peak reserved is ",
                  FormatSize(r.overhead_bytes()), " above it\n");
  if (r.oom) {
    absl::StrAppend(&out, "OOM", r.oom->phase.empty() ? "" : absl::StrCat(" in ", EscapeForTerminal(r.oom->phase)), ": request of ",
                    FormatSize(r.oom->requested), "; ", r.oom->verdict, "\n");
    absl::StrAppend(&out, SitesText("top allocation sites at the OOM", r.oom->top_sites));
  }
  absl::StrAppend(&out, "\nfragmentation at ", moment_text, ":\n", FragmentationText(at_moment.Fragmentation()),
                  PoolsText(BytesByPool(at_moment, t)));
  absl::StrAppend(&out, "\nmemory_summary() at ", moment_text, ":\n", MemorySummary(at_moment.stats(), t.device_index));
  return out;
}

std::uint64_t GpuRow::used_bytes() const {
  std::uint64_t total = 0;
  for (const GpuProcess& p : processes) total += p.used_bytes();
  return total;
}

int GpuRow::ranks_on_it() const {
  int n = 0;
  for (const GpuProcess& p : processes) n += p.ordinal >= 0 ? 1 : 0;
  return n;
}

namespace {

bool AnyMeasured(const std::vector<GpuRow>& gpus) {
  for (const GpuRow& g : gpus) {
    for (const GpuProcess& p : g.processes) {
      if (p.measured) return true;
    }
  }
  return false;
}

// The table of a capture with --all-device-memory: every library's column,
// and per process whether it was measured.
std::string MeasuredGpuTableText(const std::vector<GpuRow>& gpus) {
  std::string out =
      "GPUs (measured: CUPTI's allocations by calling library, each column its peak; context = NVML's used less "
      "the allocations)\n";
  absl::StrAppend(&out, absl::StrFormat("%-5s %-6s %-9s %11s %11s %11s %11s %11s %11s %11s\n", "GPU", "rank", "source",
                                        "context", "reserved", "NCCL", "cuBLAS", "cuDNN", "other", "used"));
  for (const GpuRow& g : gpus) {
    for (const GpuProcess& p : g.processes) {
      const bool context_known = !p.measured || p.context_measured;
      absl::StrAppend(&out, absl::StrFormat("%-5d %-6d %-9s %11s %11s %11s %11s %11s %11s %11s\n", g.physical,
                                            p.rank, p.measured ? "measured" : "modelled",
                                            context_known ? FormatSize(p.context_bytes) : "no NVML",
                                            FormatSize(p.reserved_bytes), FormatSize(p.nccl_bytes),
                                            FormatSize(p.cublas_bytes), FormatSize(p.cudnn_bytes),
                                            FormatSize(p.other_bytes), FormatSize(p.used_bytes())));
      if (p.measured && p.segments > 0) {
        absl::StrAppend(&out, "      rank ", p.rank, ": ", p.segments_matched, " of the snapshot's ", p.segments,
                        " segments matched to their cudaMalloc by address\n");
      }
    }
    absl::StrAppend(&out, absl::StrFormat("%-5d %-6s %-9s %11s %11s %11s %11s %11s %11s %11s%s\n", g.physical,
                                          "total", "", "", "", "", "", "", "", FormatSize(g.used_bytes()),
                                          g.capacity > 0 ? " of " + FormatSize(g.capacity) : ""));
  }
  return out;
}

}  // namespace

std::string GpuTableText(const std::vector<GpuRow>& gpus) {
  if (AnyMeasured(gpus)) return MeasuredGpuTableText(gpus);
  std::string out = "GPUs (as nvidia-smi lists processes; reserved is each rank's peak)\n";
  absl::StrAppend(&out, absl::StrFormat("%-5s %-6s %-8s %12s %12s %12s %12s\n", "GPU", "rank", "as", "context",
                                        "reserved", "NCCL", "used"));
  for (const GpuRow& g : gpus) {
    for (const GpuProcess& p : g.processes) {
      absl::StrAppend(&out, absl::StrFormat("%-5d %-6d %-8s %12s %12s %12s %12s\n", g.physical, p.rank,
                                            p.ordinal >= 0 ? absl::StrCat("cuda:", p.ordinal) : "stray",
                                            FormatSize(p.context_bytes), FormatSize(p.reserved_bytes),
                                            FormatSize(p.nccl_bytes), FormatSize(p.used_bytes())));
    }
    absl::StrAppend(&out, absl::StrFormat("%-5d %-6s %-8s %12s %12s %12s %12s of %s\n", g.physical, "total", "", "", "",
                                          "", FormatSize(g.used_bytes()), FormatSize(g.capacity)));
    if (g.ranks_on_it() > 1) {
      std::vector<int> ranks;
      for (const GpuProcess& p : g.processes) {
        if (p.ordinal >= 0) ranks.push_back(p.rank);
      }
      absl::StrAppend(&out, "note: GPU ", g.physical, " is shared by ranks ", absl::StrJoin(ranks, ", "),
                      ": they share its memory (allowed with Gloo; NCCL refuses two ranks on one GPU)\n");
    }
  }
  return out;
}

}  // namespace memscope
