// How much GPU memory a process uses, as nvidia-smi lists it (NVML's
// running compute processes), behind a small interface: NVML in the
// injection library, a fake in the tests. Sampled at the capture's start,
// at each phase end the start-up module reports, and at the end; the
// device timeline keeps each sample as a mark, and the context and driver
// overhead is that figure less the allocations recorded at the moment
// (devicemem/device_timeline.h, ReadDeviceUsage).
#ifndef MEMSCOPE_DEVICEMEM_GPU_MEMORY_PROBE_H_
#define MEMSCOPE_DEVICEMEM_GPU_MEMORY_PROBE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "devicemem/device_timeline.h"

namespace memscope {

class GpuMemoryProbe {
 public:
  virtual ~GpuMemoryProbe() = default;
  // The bytes process `pid` uses on the GPU with PCI bus id `pci_bus_id`
  // ("0000:3B:00.0", as cuDeviceGetPCIBusId gives it); none when the GPU
  // is unknown, the process is not listed on it, or the figure is not
  // available (NVML_VALUE_NOT_AVAILABLE).
  virtual std::optional<std::uint64_t> ProcessUsedBytes(const std::string& pci_bus_id, std::uint32_t pid) = 0;
};

// NVML, loaded at run time (dlopen("libnvidia-ml.so.1"): the toolkit ships
// no nvml.h, and a machine without the driver must still run). Errors:
// the library is missing, or nvmlInit fails; the message says which.
absl::StatusOr<std::unique_ptr<GpuMemoryProbe>> OpenNvml();

// One GPU of the process: its PCI bus id and its timeline.
struct SampledDevice {
  std::string pci_bus_id;
  DeviceTimelineRecorder* recorder = nullptr;
};

// Asks `probe` for the process's used bytes on each device and records
// each answer as an NVML mark at `timestamp_ns` named `label`. Returns
// how many devices answered.
int SampleDevices(GpuMemoryProbe& probe, std::uint32_t pid, std::uint64_t timestamp_ns, std::string_view label,
                  const std::vector<SampledDevice>& devices);

}  // namespace memscope

#endif  // MEMSCOPE_DEVICEMEM_GPU_MEMORY_PROBE_H_
