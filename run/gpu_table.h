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
#include "exporters/report.h"
#include "nlohmann/json.hpp"
#include "load/manifest.h"

namespace memscope {

// The table, by physical GPU; empty when there is nothing beyond the
// allocator's view to show: no context, no NCCL buffers, and no GPU shared
// by two ranks (so runs without these options keep their outputs).
std::vector<GpuRow> GpuTable(const std::vector<std::optional<RankStatus>>& statuses,
                             const std::vector<RankReport>& reports, std::uint64_t capacity);

// The GPU table a run directory's own report.json holds ("gpus"), for the
// commands that re-read a run (`memscope trace`, `memscope report`); empty
// when `path` is not a directory or its report.json is missing, not a
// usable report, or has no table.
std::vector<GpuRow> ReadRunGpuTable(const std::string& path);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_GPU_TABLE_H_
