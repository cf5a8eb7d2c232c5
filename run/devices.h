// Which simulated GPU each rank runs on, as PyTorch users choose it:
//
//   torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))   # the launcher sets LOCAL_RANK
//
// A rank's device is an ordinal of the CUDA runtime (cuda:N, "GPU N" in
// messages): LOCAL_RANK by default (our launcher sets it to the rank; an
// external launcher's env is read as is), or what `memscope run --devices`
// says: `same` (every rank on device 0: the scenario of a script that never
// calls set_device) or a list `0,0,1,1` (rank r on device MAP[r]).
// CUDA_VISIBLE_DEVICES then renumbers: ordinal N is physical GPU
// CUDA_VISIBLE_DEVICES[N], and an ordinal beyond the list is CUDA's "invalid
// device ordinal". Ranks whose physical GPUs are equal share that GPU's
// capacity (allocator/device_ledger.h).
//
//   absl::StatusOr<DeviceMap> map = ParseDeviceMap("--devices", "0,0,1,1", 4);
//   absl::StatusOr<DeviceAssignment> d = AssignDevice(*map, rank, DeviceEnvironment::FromProcess());
//   // d->ordinal: the SimDevice's index; d->physical: its ledger line.
#ifndef MEMSCOPE_RUN_DEVICES_H_
#define MEMSCOPE_RUN_DEVICES_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace memscope {

// `--devices`: "local_rank" (the default: LOCAL_RANK), "same" (every rank on
// device 0) or one ordinal per rank.
struct DeviceMap {
  enum class Kind { kLocalRank, kSame, kList };
  Kind kind = Kind::kLocalRank;
  std::vector<int> ordinals;  // kList: rank r on ordinals[r]
  std::string text;           // as given ("" for the default)
  bool operator==(const DeviceMap&) const = default;
};

// Parses `text` for `world_size` ranks: "" or "local_rank", "same", or a
// comma list of as many ordinals (0 to 255) as ranks. Errors name `flag` and
// say what is wrong.
absl::StatusOr<DeviceMap> ParseDeviceMap(std::string_view flag, std::string_view text, int world_size);

// What a rank's environment says: LOCAL_RANK and CUDA_VISIBLE_DEVICES (nullopt when unset).
struct DeviceEnvironment {
  std::optional<std::string> local_rank;
  std::optional<std::string> cuda_visible_devices;
  static DeviceEnvironment FromProcess();
};

struct DeviceAssignment {
  int ordinal = 0;   // torch.cuda.set_device(ordinal); "GPU N" in PyTorch's messages
  int physical = 0;  // the GPU itself (nvidia-smi's index): CUDA_VISIBLE_DEVICES[ordinal], or the ordinal
  std::string how;   // "LOCAL_RANK=1", "--devices same", "--devices 0,0,1,1" (+ ", CUDA_VISIBLE_DEVICES=...")
  bool operator==(const DeviceAssignment&) const = default;
};

// The physical GPUs CUDA_VISIBLE_DEVICES makes visible, in ordinal order.
// CUDA's rule: the list ends at the first entry that is not a device index
// (memscope also ends it at a repeated index; a GPU-UUID is not modelled, so
// it ends the list too). An empty list: no GPU is visible.
std::vector<int> VisibleDevices(std::string_view cuda_visible_devices);

// The device of `rank` under `map` and `env`. Without --devices: LOCAL_RANK
// (the rank itself when LOCAL_RANK is unset). Errors: LOCAL_RANK is not a
// non-negative integer; no GPU is visible ("CUDA_VISIBLE_DEVICES='' hides
// every GPU"); the ordinal is beyond the visible devices ("CUDA error:
// invalid device ordinal: rank 2 on cuda:2, but CUDA_VISIBLE_DEVICES=0,1
// makes 2 devices visible"); the physical GPU is beyond the simulation's 256.
absl::StatusOr<DeviceAssignment> AssignDevice(const DeviceMap& map, int rank, const DeviceEnvironment& env);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_DEVICES_H_
