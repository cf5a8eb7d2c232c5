#include "run/device_memory.h"

#include <filesystem>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "devicemem/device_timeline.h"
#include "load/run_directory.h"
#include "recording/timeline.h"

namespace memscope {
namespace {

std::uint64_t Bytes(const DeviceUsage& usage, DeviceLibrary library) {
  return usage.peak_by_library[static_cast<std::size_t>(library)];
}

}  // namespace

GpuProcess MergeDeviceMemory(const Timeline& device, const Timeline& snapshot, int rank) {
  absl::flat_hash_set<std::uint64_t> segments;
  for (const Event& e : snapshot.events) {
    if (e.type == EventType::kSegmentAlloc) segments.insert(e.addr);
  }
  const DeviceUsage usage = ReadDeviceUsage(device, segments);
  absl::flat_hash_set<std::uint64_t> matched;
  for (const DeviceAllocation& a : usage.ever) {
    if (segments.contains(a.addr)) matched.insert(a.addr);
  }
  GpuProcess p;
  p.rank = rank;
  p.ordinal = device.device_index;
  p.measured = true;
  p.context_measured = usage.overhead_bytes.has_value();
  p.context_bytes = usage.overhead_bytes.value_or(0);
  p.reserved_bytes = Bytes(usage, DeviceLibrary::kPytorchAllocator);
  p.nccl_bytes = Bytes(usage, DeviceLibrary::kNccl);
  p.cublas_bytes = Bytes(usage, DeviceLibrary::kCublas);
  p.cudnn_bytes = Bytes(usage, DeviceLibrary::kCudnn);
  p.other_bytes = Bytes(usage, DeviceLibrary::kOtherLibrary);
  p.segments = static_cast<int>(segments.size());
  p.segments_matched = static_cast<int>(matched.size());
  return p;
}

std::vector<GpuRow> MeasuredGpuTable(const std::string& run_dir, const std::vector<const Timeline*>& ranks,
                                     std::vector<std::string>& notes) {
  std::map<int, std::vector<std::pair<int, std::string>>> files;  // rank -> (device, name)
  std::error_code ec;
  for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (const auto of = RunDirectory::DeviceTimelineOf(name)) files[of->first].emplace_back(of->second, name);
  }
  std::map<int, GpuRow> by_gpu;
  for (const Timeline* t : ranks) {
    for (const auto& [device, name] : files[t->rank]) {
      absl::StatusOr<Timeline> read = ReadTimelineFile(RunDirectory(run_dir).Path(name));
      if (!read.ok()) {
        notes.push_back(absl::StrCat("device timeline skipped: ", read.status().message()));
        continue;
      }
      GpuRow& row = by_gpu[device];
      row.physical = device;
      row.capacity = std::max(row.capacity, read->device_capacity);
      row.processes.push_back(MergeDeviceMemory(*read, *t, t->rank));
    }
  }
  std::vector<GpuRow> rows;
  for (auto& [device, row] : by_gpu) rows.push_back(std::move(row));
  return rows;
}

}  // namespace memscope
