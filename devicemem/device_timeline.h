// The device timeline: every device allocation of one process on one GPU,
// in memscope's timeline format (recording/timeline.h), written by the
// CUPTI injection library (devicemem/injection.cpp) as
// RUN/.memscope-capture/device-pid-P.gpu-D.timeline and renamed by
// `memscope capture` to RUN/device-rank-R.gpu-D.timeline.
//
// What the events mean in a device timeline (its header: rank 0, world size
// 1, device_index D, device_capacity the GPU's total memory or 0):
//   segment_alloc / segment_free   a driver allocation of device memory
//       (cudaMalloc, cuMemAlloc, cuMemCreate, ...; CUPTI's MEMORY2 record):
//       addr, size, stream (CUPTI's stream id), name = its owner, the path
//       of the calling library's shared object (devicemem/library.h; its
//       category is ClassifyLibrary(owner); "" when none was found).
//   alloc / free_requested + free_completed   an allocation from a
//       stream-ordered memory pool (cudaMallocAsync): the same fields; the
//       pool's memory itself is not a segment (CUPTI reports pools only when
//       created, trimmed or destroyed).
//   mark "cuda_pool created|destroyed|trimmed ADDR bytes N release_threshold N utilized N"
//       (MEMORY_POOL).
//   mark "nvml_used_bytes N LABEL"   NVML's used memory of the process on
//       this GPU at that moment (devicemem/gpu_memory_probe.h); LABEL is
//       "start", "end" or a phase's name.
// Host memory (pinned, pageable) is not recorded. Times are CUPTI's clock
// less the recording's start.
#ifndef MEMSCOPE_DEVICEMEM_DEVICE_TIMELINE_H_
#define MEMSCOPE_DEVICEMEM_DEVICE_TIMELINE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "devicemem/library.h"
#include "devicemem/memory_record.h"
#include "recording/event.h"
#include "recording/timeline.h"

namespace memscope {

inline constexpr std::string_view kNvmlMarkPrefix = "nvml_used_bytes ";
inline constexpr std::string_view kPoolMarkPrefix = "cuda_pool ";

// Turns one GPU's DeviceMemoryRecords into device-timeline events appended
// to `sink` (a TimelineWriter in the injection library; a MemorySink in
// tests). Not thread-safe: the injection library holds a lock.
class DeviceTimelineRecorder {
 public:
  // `start_ns`: CUPTI's clock at the recording's start (time 0).
  DeviceTimelineRecorder(EventSink& sink, std::uint64_t start_ns) : sink_(sink), start_ns_(start_ns) {}

  // A record of this GPU. `caller`: who made the allocation (its API call's
  // attribution), null when unknown; a free takes its allocation's owner.
  // Host memory is skipped (returns false), as is a free of an address
  // that is not live (recorded before the capture began).
  bool Add(const DeviceMemoryRecord& record, const Attribution* caller);
  // An NVML sample of the process's used bytes on this GPU.
  void Sample(std::uint64_t timestamp_ns, std::uint64_t used_bytes, std::string_view label);

  std::uint64_t live_bytes() const { return live_bytes_; }

 private:
  std::int64_t Time(std::uint64_t timestamp_ns) const {
    return timestamp_ns > start_ns_ ? static_cast<std::int64_t>(timestamp_ns - start_ns_) : 0;
  }
  void AddPool(const DeviceMemoryRecord& record);

  struct Live {
    std::uint64_t size = 0;
    std::uint32_t owner = 0;
    bool pooled = false;
  };
  EventSink& sink_;
  std::uint64_t start_ns_;
  absl::flat_hash_map<std::uint64_t, Live> live_;  // by address
  std::uint64_t live_bytes_ = 0;
};

// One device allocation live in a device timeline.
struct DeviceAllocation {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::string owner;  // the calling library's path
  DeviceLibrary library = DeviceLibrary::kOtherLibrary;
  bool pooled = false;  // from a stream-ordered pool
  bool operator==(const DeviceAllocation&) const = default;
};

// What a device timeline says, read back.
struct DeviceUsage {
  int device = 0;
  std::vector<DeviceAllocation> ever;  // every allocation, in order (an address freed and reused: twice)
  std::array<std::uint64_t, kNumDeviceLibraries> peak_by_library{};  // each library's own peak of live bytes
  std::array<std::uint64_t, kNumDeviceLibraries> end_by_library{};   // live at the end
  std::uint64_t peak_bytes = 0;  // all libraries' live bytes at their common peak
  // The NVML samples: the largest used bytes, and the largest of used less
  // the live allocations at the same moment (the CUDA context and the
  // driver's own memory); none without a sample.
  std::optional<std::uint64_t> used_bytes;
  std::optional<std::uint64_t> overhead_bytes;
  int samples = 0;
};

// Reads a device timeline's events (ReadTimelineFile's result). An
// allocation at an address of `pytorch_segments` (the caching allocator's
// segments, from the rank's snapshot) is PYTORCH_ALLOCATOR's whatever its
// owner.
DeviceUsage ReadDeviceUsage(const Timeline& timeline, const absl::flat_hash_set<std::uint64_t>& pytorch_segments = {});

}  // namespace memscope

#endif  // MEMSCOPE_DEVICEMEM_DEVICE_TIMELINE_H_
