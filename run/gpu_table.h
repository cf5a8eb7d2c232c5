// The whole GPU, as nvidia-smi lists its processes: per physical GPU, each
// rank's CUDA context + the caching allocator's reserved memory (its peak) +
// NCCL's buffers = what the process uses on it, and their total against the
// GPU's capacity. A rank that touched another GPU before set_device has a
// row there with its stray context alone. Built from the ranks' rank-R.json
// ("device") and their analyses; summary.txt, report.json ("gpus") and
// `memscope summary` show it.
//
//   std::vector<GpuRow> gpus = GpuTable(statuses, reports, capacity);
//   if (!gpus.empty()) text += GpuTableText(gpus);
#ifndef MEMSCOPE_RUN_GPU_TABLE_H_
#define MEMSCOPE_RUN_GPU_TABLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/analysis.h"
#include "nlohmann/json.hpp"
#include "load/manifest.h"

namespace memscope {

struct GpuProcess {
  int rank = 0;
  int ordinal = -1;  // the rank's cuda:N for this GPU; -1 for a stray context (not its device)
  std::uint64_t context_bytes = 0;
  std::uint64_t reserved_bytes = 0;  // the rank's peak reserved (max_memory_reserved)
  std::uint64_t nccl_bytes = 0;
  std::uint64_t used_bytes() const { return context_bytes + reserved_bytes + nccl_bytes; }
};

struct GpuRow {
  int physical = 0;
  std::uint64_t capacity = 0;
  std::vector<GpuProcess> processes;  // by rank; a rank's own device before its stray context
  std::uint64_t used_bytes() const;
  int ranks_on_it() const;  // processes whose device it is
};

// The table, by physical GPU; empty when there is nothing beyond the
// allocator's view to show: no context, no NCCL buffers, and no GPU shared
// by two ranks (so runs without these options keep their outputs).
std::vector<GpuRow> GpuTable(const std::vector<std::optional<RankStatus>>& statuses,
                             const std::vector<RankReport>& reports, std::uint64_t capacity);

// The text: one line per process, a total per GPU, and a note on each GPU
// that two ranks share (allowed with Gloo; NCCL refuses it).
std::string GpuTableText(const std::vector<GpuRow>& gpus);

// report.json's "gpus": [{"physical", "capacity_bytes", "used_bytes", "shared_by_ranks",
//   "processes": [{"rank", "cuda", "context_bytes", "reserved_bytes", "nccl_bytes", "used_bytes"}]}]
// ("cuda": the rank's ordinal for it, null for a stray context).
nlohmann::json GpuTableJson(const std::vector<GpuRow>& gpus);

// The GPU table a run directory's own report.json holds ("gpus"), for the
// commands that re-read a run (`memscope trace`, `memscope report`); null
// when `path` is not a directory or its report.json is missing, unreadable
// or has no table.
nlohmann::json ReadRunGpuTable(const std::string& path);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_GPU_TABLE_H_
