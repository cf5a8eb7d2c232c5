#include "devicemem/gpu_memory_probe.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

// NVML's own declarations (nvml.h, which the CUDA toolkit does not ship),
// the few memscope calls: return 0 is NVML_SUCCESS.
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlProcessInfoV2 {  // nvmlProcessInfo_t of the _v3 call
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;
constexpr int kNvmlErrorInsufficientSize = 7;
using NvmlInit = int (*)();
using NvmlShutdown = int (*)();
using NvmlHandleByPci = int (*)(const char*, NvmlDevice*);
using NvmlRunningProcesses = int (*)(NvmlDevice, unsigned int*, NvmlProcessInfoV2*);

class NvmlProbe final : public GpuMemoryProbe {
 public:
  NvmlProbe(void* library, NvmlShutdown shutdown, NvmlHandleByPci by_pci, NvmlRunningProcesses processes)
      : library_(library), shutdown_(shutdown), by_pci_(by_pci), processes_(processes) {}
  ~NvmlProbe() override {
    shutdown_();
    dlclose(library_);
  }
  NvmlProbe(const NvmlProbe&) = delete;
  NvmlProbe& operator=(const NvmlProbe&) = delete;

  std::optional<std::uint64_t> ProcessUsedBytes(const std::string& pci_bus_id, std::uint32_t pid) override {
    NvmlDevice device = nullptr;
    if (by_pci_(pci_bus_id.c_str(), &device) != 0) return std::nullopt;
    std::vector<NvmlProcessInfoV2> infos(64);
    unsigned int count = static_cast<unsigned int>(infos.size());
    int rc = processes_(device, &count, infos.data());
    if (rc == kNvmlErrorInsufficientSize && count <= 65536) {
      infos.resize(count + 16);
      count = static_cast<unsigned int>(infos.size());
      rc = processes_(device, &count, infos.data());
    }
    if (rc != 0) return std::nullopt;
    for (unsigned int i = 0; i < count && i < infos.size(); ++i) {
      if (infos[i].pid == pid && infos[i].used_gpu_memory != kNvmlValueNotAvailable) return infos[i].used_gpu_memory;
    }
    return std::nullopt;
  }

 private:
  void* library_;
  NvmlShutdown shutdown_;
  NvmlHandleByPci by_pci_;
  NvmlRunningProcesses processes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuMemoryProbe>> OpenNvml() {
  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return absl::NotFoundError("NVML (libnvidia-ml.so.1) is not installed");
  const auto init = reinterpret_cast<NvmlInit>(dlsym(library, "nvmlInit_v2"));
  const auto shutdown = reinterpret_cast<NvmlShutdown>(dlsym(library, "nvmlShutdown"));
  const auto by_pci = reinterpret_cast<NvmlHandleByPci>(dlsym(library, "nvmlDeviceGetHandleByPciBusId_v2"));
  const auto processes =
      reinterpret_cast<NvmlRunningProcesses>(dlsym(library, "nvmlDeviceGetComputeRunningProcesses_v3"));
  if (init == nullptr || shutdown == nullptr || by_pci == nullptr || processes == nullptr) {
    dlclose(library);
    return absl::NotFoundError("NVML (libnvidia-ml.so.1) lacks nvmlDeviceGetComputeRunningProcesses_v3");
  }
  if (const int rc = init(); rc != 0) {
    dlclose(library);
    return absl::UnavailableError(absl::StrCat("nvmlInit failed (NVML error ", rc, ")"));
  }
  return std::make_unique<NvmlProbe>(library, shutdown, by_pci, processes);
}

int SampleDevices(GpuMemoryProbe& probe, std::uint32_t pid, std::uint64_t timestamp_ns, std::string_view label,
                  const std::vector<SampledDevice>& devices) {
  int answered = 0;
  for (const SampledDevice& d : devices) {
    if (d.recorder == nullptr) continue;
    if (const std::optional<std::uint64_t> used = probe.ProcessUsedBytes(d.pci_bus_id, pid)) {
      d.recorder->Sample(timestamp_ns, *used, label);
      ++answered;
    }
  }
  return answered;
}

}  // namespace memscope
