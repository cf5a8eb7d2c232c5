// torch.cuda.memory_summary(), reproduced from torch/cuda/memory.py (2.x).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/stats.h"

namespace memscope {
namespace {

// "{sz:6d} {unit}": the unit steps up while the row's reference value (the
// "all" row in the same column) is >= 768 KiB of the current unit.
std::string FormatSizeCell(std::int64_t value, std::int64_t reference) {
  static constexpr const char* kUnits[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  const char* unit = kUnits[0];
  double ref = static_cast<double>(reference);
  for (int i = 1; i < 6; ++i) {
    if (ref < 768.0 * 1024) break;
    unit = kUnits[i];
    value /= 1024;
    ref /= 1024;
  }
  return absl::StrFormat("%6d %s", value, unit);
}

// "{cnt:7d} {unit} " with units " ", "K", "M", stepping at 750,000.
std::string FormatCountCell(std::int64_t value, std::int64_t reference) {
  static constexpr const char* kUnits[] = {" ", "K", "M"};
  const char* unit = kUnits[0];
  double ref = static_cast<double>(reference);
  for (int i = 1; i < 3; ++i) {
    if (ref < 750.0 * 1000) break;
    unit = kUnits[i];
    value /= 1000;
    ref /= 1000;
  }
  return absl::StrFormat("%7d %s ", value, unit);
}

using Formatter = std::string (*)(std::int64_t, std::int64_t);

std::string Row(std::string_view name, const Stat& s, const Stat& ref, Formatter f) {
  return absl::StrFormat(" %-21s | %s | %s | %s | %s ", name, f(s.current, ref.current), f(s.peak, ref.peak),
                         f(s.allocated, ref.allocated), f(s.freed, ref.freed));
}

}  // namespace

std::string MemorySummary(const DeviceStats& stats, int device, bool abbreviated) {
  struct Metric {
    const StatArray* array;
    const char* name;
    Formatter format;
  };
  const Metric metrics[] = {
      {&stats.allocated_bytes, "Allocated memory", FormatSizeCell},
      {&stats.active_bytes, "Active memory", FormatSizeCell},
      {&stats.requested_bytes, "Requested memory", FormatSizeCell},
      {&stats.reserved_bytes, "GPU reserved memory", FormatSizeCell},
      {&stats.inactive_split_bytes, "Non-releasable memory", FormatSizeCell},
      {&stats.allocation, "Allocations", FormatCountCell},
      {&stats.active, "Active allocs", FormatCountCell},
      {&stats.segment, "GPU reserved segments", FormatCountCell},
      {&stats.inactive_split, "Non-releasable allocs", FormatCountCell},
  };
  const std::string equals(75, '=');
  const std::string dashes(75, '-');

  std::vector<std::string> lines;
  lines.push_back(equals);
  lines.push_back(absl::StrFormat(" %16s PyTorch CUDA memory summary, device ID %-17d ", "", device));
  lines.push_back(dashes);
  lines.push_back(absl::StrFormat("  %9s CUDA OOMs: %-12d | %6s cudaMalloc retries: %-8d  ", "", stats.num_ooms, "",
                                  stats.num_alloc_retries));
  lines.push_back(equals);
  lines.push_back("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
  for (const Metric& m : metrics) {
    lines.push_back(dashes);
    const Stat& all = (*m.array)[static_cast<int>(StatType::kAll)];
    lines.push_back(Row(m.name, all, all, m.format));
    if (!abbreviated) {
      lines.push_back(Row("      from large pool", (*m.array)[static_cast<int>(StatType::kLargePool)], all, m.format));
      lines.push_back(Row("      from small pool", (*m.array)[static_cast<int>(StatType::kSmallPool)], all, m.format));
    }
  }
  lines.push_back(dashes);
  lines.push_back(Row("Oversize allocations", stats.oversize_allocations, stats.oversize_allocations, FormatCountCell));
  lines.push_back(dashes);
  lines.push_back(Row("Oversize GPU segments", stats.oversize_segments, stats.oversize_segments, FormatCountCell));
  lines.push_back(equals);
  return absl::StrCat("|", absl::StrJoin(lines, "|\n|"), "|\n");
}

}  // namespace memscope
