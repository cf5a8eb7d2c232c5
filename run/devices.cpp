#include "run/devices.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "allocator/device_ledger.h"

namespace memscope {
namespace {

constexpr int kMaxOrdinal = DeviceLedger::kMaxDevices - 1;

bool ParseIndex(std::string_view text, int* out) {
  if (text.empty() || text.size() > 9) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(absl::string_view(text.data(), text.size()), out);
}

}  // namespace

absl::StatusOr<DeviceMap> ParseDeviceMap(std::string_view flag_view, std::string_view text_view, int world_size) {
  const std::string flag(flag_view), text(text_view);
  DeviceMap map;
  map.text = std::string(text);
  if (text.empty() || text == "local_rank") {
    map.kind = DeviceMap::Kind::kLocalRank;
    return map;
  }
  if (text == "same") {
    map.kind = DeviceMap::Kind::kSame;
    return map;
  }
  map.kind = DeviceMap::Kind::kList;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int ordinal = 0;
    if (!ParseIndex(std::string_view(part.data(), part.size()), &ordinal) || ordinal > kMaxOrdinal) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " '", text, "': '", part, "' is not a device (0 to ",
                                                     kMaxOrdinal,
                                                     "); use local_rank, same, or one device per rank "
                                                     "(e.g. 0,0,1,1)"));
    }
    map.ordinals.push_back(ordinal);
  }
  if (static_cast<int>(map.ordinals.size()) != world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", text, "': ", map.ordinals.size(), map.ordinals.size() == 1 ? " device" : " devices",
                     " for ", world_size, world_size == 1 ? " rank" : " ranks", "; give one per rank"));
  }
  return map;
}

DeviceEnvironment DeviceEnvironment::FromProcess() {
  DeviceEnvironment env;
  if (const char* v = std::getenv("LOCAL_RANK"); v != nullptr) env.local_rank = v;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr) env.cuda_visible_devices = v;
  return env;
}

std::vector<int> VisibleDevices(std::string_view cuda_visible_devices) {
  std::vector<int> devices;
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(cuda_visible_devices.data(), cuda_visible_devices.size()), ',')) {
    const absl::string_view entry = absl::StripAsciiWhitespace(part);
    int index = 0;
    if (!ParseIndex(std::string_view(entry.data(), entry.size()), &index)) break;
    bool repeated = false;
    for (int d : devices) repeated = repeated || d == index;
    if (repeated) break;
    devices.push_back(index);
  }
  return devices;
}

absl::StatusOr<DeviceAssignment> AssignDevice(const DeviceMap& map, int rank, const DeviceEnvironment& env) {
  DeviceAssignment a;
  switch (map.kind) {
    case DeviceMap::Kind::kSame:
      a.ordinal = 0;
      a.how = "--devices same";
      break;
    case DeviceMap::Kind::kList:
      if (rank < 0 || rank >= static_cast<int>(map.ordinals.size())) {
        return absl::InvalidArgumentError(absl::StrCat("--devices '", map.text, "' names no device for rank ", rank));
      }
      a.ordinal = map.ordinals[static_cast<std::size_t>(rank)];
      a.how = absl::StrCat("--devices ", map.text);
      break;
    case DeviceMap::Kind::kLocalRank:
      if (env.local_rank) {
        if (!ParseIndex(*env.local_rank, &a.ordinal)) {
          return absl::InvalidArgumentError(
              absl::StrCat("LOCAL_RANK='", *env.local_rank, "' is not a non-negative integer"));
        }
        a.how = absl::StrCat("LOCAL_RANK=", a.ordinal);
      } else {
        a.ordinal = rank;
        a.how = absl::StrCat("rank ", rank, " (LOCAL_RANK unset)");
      }
      break;
  }
  a.physical = a.ordinal;
  if (env.cuda_visible_devices) {
    const std::vector<int> visible = VisibleDevices(*env.cuda_visible_devices);
    if (visible.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA_VISIBLE_DEVICES='", *env.cuda_visible_devices,
                       "' makes no GPU visible (RuntimeError: No CUDA GPUs are available)"));
    }
    if (a.ordinal >= static_cast<int>(visible.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA error: invalid device ordinal: rank ", rank, " on cuda:", a.ordinal, " (", a.how,
                       "), but CUDA_VISIBLE_DEVICES=", *env.cuda_visible_devices, " makes ", visible.size(),
                       visible.size() == 1 ? " device" : " devices", " visible"));
    }
    a.physical = visible[static_cast<std::size_t>(a.ordinal)];
    absl::StrAppend(&a.how, ", CUDA_VISIBLE_DEVICES=", *env.cuda_visible_devices);
  }
  if (a.ordinal > kMaxOrdinal || a.physical > kMaxOrdinal) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " on cuda:", a.ordinal, " (", a.how,
                                                   "): the simulation has GPUs 0 to ", kMaxOrdinal));
  }
  return a;
}

}  // namespace memscope
