// A capture's measured device memory (`memscope capture
// --all-device-memory`): each rank's device timeline
// (RUN/device-rank-R.gpu-D.timeline, devicemem/device_timeline.h) merged
// with its PyTorch snapshot. The caching allocator's segments are matched
// to their driver allocations by address (such an allocation is PyTorch's,
// whichever library the stack named); every other allocation stays its
// calling library's: NCCL, cuBLAS, cuDNN, other. The context is NVML's
// used bytes less the allocations live at the sample.
//
//   GpuProcess p = MergeDeviceMemory(device_timeline, snapshot_timeline, rank);
//   p.reserved_bytes   // PyTorch's allocations at their peak
//   p.nccl_bytes       // NCCL's
#ifndef MEMSCOPE_RUN_DEVICE_MEMORY_H_
#define MEMSCOPE_RUN_DEVICE_MEMORY_H_

#include <string>
#include <vector>

#include "exporters/report.h"
#include "recording/event.h"

namespace memscope {

// The measured GPU process of rank `rank` from its device timeline and the
// timeline imported from its snapshot (whose segment_alloc events carry
// the snapshot's own addresses). Each column is that library's peak of live
// bytes; ordinal = the device timeline's device.
GpuProcess MergeDeviceMemory(const Timeline& device, const Timeline& snapshot, int rank);

// The measured GPU table of a capture directory: per rank of `ranks` (the
// timelines imported from its snapshots), its device timelines
// (RUN/device-rank-R.gpu-D.timeline) merged; empty when the directory has
// none. A device timeline that does not read is skipped, and says so in
// `notes`.
std::vector<GpuRow> MeasuredGpuTable(const std::string& run_dir, const std::vector<const Timeline*>& ranks,
                                     std::vector<std::string>& notes);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_DEVICE_MEMORY_H_
