#include "run/gpu_table.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/sizes.h"
#include "load/run_directory.h"

namespace memscope {

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

std::string GpuTableText(const std::vector<GpuRow>& gpus) {
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

nlohmann::json GpuTableJson(const std::vector<GpuRow>& gpus) {
  nlohmann::json out = nlohmann::json::array();
  for (const GpuRow& g : gpus) {
    nlohmann::json processes = nlohmann::json::array();
    nlohmann::json shared_by = nlohmann::json::array();
    for (const GpuProcess& p : g.processes) {
      processes.push_back({{"rank", p.rank},
                           {"cuda", p.ordinal >= 0 ? nlohmann::json(p.ordinal) : nlohmann::json(nullptr)},
                           {"context_bytes", p.context_bytes},
                           {"reserved_bytes", p.reserved_bytes},
                           {"nccl_bytes", p.nccl_bytes},
                           {"used_bytes", p.used_bytes()}});
      if (p.ordinal >= 0) shared_by.push_back(p.rank);
    }
    out.push_back({{"physical", g.physical},
                   {"capacity_bytes", g.capacity},
                   {"used_bytes", g.used_bytes()},
                   {"shared_by_ranks", g.ranks_on_it() > 1 ? shared_by : nlohmann::json::array()},
                   {"processes", processes}});
  }
  return out;
}

nlohmann::json ReadRunGpuTable(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return nullptr;
  std::ifstream in(RunDirectory(path).Report());
  if (!in) return nullptr;
  nlohmann::json report = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!report.is_object()) return nullptr;
  const auto gpus = report.find("gpus");
  if (gpus == report.end() || !gpus->is_array() || gpus->empty()) return nullptr;
  return *gpus;
}

}  // namespace memscope
