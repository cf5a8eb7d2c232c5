#include "run/gpu_table.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/sizes.h"
#include "base/input_file.h"
#include "load/run_directory.h"

namespace memscope {

std::vector<GpuRow> GpuTable(const std::vector<std::optional<RankStatus>>& statuses,
                             const std::vector<RankReport>& reports, std::uint64_t capacity) {
  std::map<int, GpuRow> by_gpu;
  bool outside = false;
  for (const std::optional<RankStatus>& st : statuses) {
    if (!st || !st->device) continue;
    const RankDevice& d = *st->device;
    std::uint64_t reserved = 0;
    for (const RankReport& r : reports) {
      if (r.rank == st->rank) reserved = r.peak_reserved.bytes;
    }
    GpuRow& row = by_gpu[d.physical];
    row.physical = d.physical;
    row.capacity = capacity;
    row.processes.push_back({st->rank, d.ordinal, d.context_bytes, reserved, d.nccl_bytes});
    outside = outside || d.context_bytes > 0 || d.nccl_bytes > 0;
    for (const auto& [physical, bytes] : d.other_contexts) {
      GpuRow& other = by_gpu[physical];
      other.physical = physical;
      other.capacity = capacity;
      other.processes.push_back({st->rank, -1, bytes, 0, 0});
    }
  }
  std::vector<GpuRow> rows;
  bool shared = false;
  for (auto& [physical, row] : by_gpu) {
    std::stable_sort(row.processes.begin(), row.processes.end(),
                     [](const GpuProcess& a, const GpuProcess& b) { return a.rank < b.rank; });
    shared = shared || row.ranks_on_it() > 1;
    rows.push_back(std::move(row));
  }
  if (!outside && !shared) return {};
  return rows;
}

std::vector<GpuRow> ReadRunGpuTable(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return {};
  absl::StatusOr<std::string> text = ReadInputFile(RunDirectory(path).Report(), "report.json", kMaxReportJsonBytes);
  if (!text.ok()) return {};
  const nlohmann::json json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<Report> report = ReportFromJson(json);
  return report.ok() ? std::move(report->gpus) : std::vector<GpuRow>{};
}

}  // namespace memscope
