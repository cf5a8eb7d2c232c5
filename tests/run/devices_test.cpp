#include "run/devices.h"

#include <catch2/catch.hpp>

using namespace memscope;

namespace {
DeviceEnvironment Env(std::optional<std::string> local_rank, std::optional<std::string> visible) {
  return DeviceEnvironment{std::move(local_rank), std::move(visible)};
}
}  // namespace

TEST_CASE("the devices map: local_rank, same, or one device per rank") {
  CHECK(ParseDeviceMap("--devices", "", 4)->kind == DeviceMap::Kind::kLocalRank);
  CHECK(ParseDeviceMap("--devices", "local_rank", 4)->kind == DeviceMap::Kind::kLocalRank);
  CHECK(ParseDeviceMap("--devices", "same", 4)->kind == DeviceMap::Kind::kSame);
  absl::StatusOr<DeviceMap> map = ParseDeviceMap("--devices", "0,0,1,1", 4);
  REQUIRE(map.ok());
  CHECK(map->ordinals == std::vector<int>{0, 0, 1, 1});
  CHECK(ParseDeviceMap("--devices", "0,1", 4).status().message() ==
        "--devices '0,1': 2 devices for 4 ranks; give one per rank");
  CHECK(ParseDeviceMap("--devices", "0,,1,1", 4).status().message().find("'' is not a device") != std::string::npos);
  CHECK(ParseDeviceMap("--devices", "-1", 1).status().message().find("'-1' is not a device (0 to 255)") !=
        std::string::npos);
}

TEST_CASE("CUDA_VISIBLE_DEVICES: the list up to the first entry that is not a new device index") {
  CHECK(VisibleDevices("3,5") == std::vector<int>{3, 5});
  CHECK(VisibleDevices(" 1, 0 ") == std::vector<int>{1, 0});
  CHECK(VisibleDevices("2,x,3") == std::vector<int>{2});
  CHECK(VisibleDevices("4,4,1") == std::vector<int>{4});
  CHECK(VisibleDevices("GPU-8a2b,1").empty());
  CHECK(VisibleDevices("").empty());
}

TEST_CASE("a rank's device: LOCAL_RANK or the map, renumbered by CUDA_VISIBLE_DEVICES") {
  const DeviceMap local = *ParseDeviceMap("--devices", "", 4);
  CHECK(*AssignDevice(local, 2, Env("2", std::nullopt)) == DeviceAssignment{2, 2, "LOCAL_RANK=2"});
  // An external launcher's LOCAL_RANK wins over the rank (two nodes: rank 5 is local rank 1).
  CHECK(*AssignDevice(local, 5, Env("1", std::nullopt)) == DeviceAssignment{1, 1, "LOCAL_RANK=1"});
  CHECK(*AssignDevice(local, 3, Env(std::nullopt, std::nullopt)) ==
        DeviceAssignment{3, 3, "rank 3 (LOCAL_RANK unset)"});
  CHECK(*AssignDevice(local, 1, Env("1", "3,5")) == DeviceAssignment{1, 5, "LOCAL_RANK=1, CUDA_VISIBLE_DEVICES=3,5"});
  CHECK(*AssignDevice(*ParseDeviceMap("--devices", "same", 4), 3, Env("3", std::nullopt)) ==
        DeviceAssignment{0, 0, "--devices same"});
  CHECK(*AssignDevice(*ParseDeviceMap("--devices", "0,0,1,1", 4), 2, Env("2", "6,7")) ==
        DeviceAssignment{1, 7, "--devices 0,0,1,1, CUDA_VISIBLE_DEVICES=6,7"});
  CHECK(AssignDevice(local, 2, Env("2", "0,1")).status().message() ==
        "CUDA error: invalid device ordinal: rank 2 on cuda:2 (LOCAL_RANK=2), but CUDA_VISIBLE_DEVICES=0,1 makes 2 "
        "devices visible");
  CHECK(AssignDevice(local, 0, Env("0", "")).status().message() ==
        "CUDA_VISIBLE_DEVICES='' makes no GPU visible (RuntimeError: No CUDA GPUs are available)");
  CHECK(AssignDevice(local, 0, Env("zero", std::nullopt)).status().message() ==
        "LOCAL_RANK='zero' is not a non-negative integer");
  CHECK(AssignDevice(local, 0, Env("256", std::nullopt)).status().message() ==
        "rank 0 on cuda:256 (LOCAL_RANK=256): the simulation has GPUs 0 to 255");
  CHECK(AssignDevice(local, 0, Env("0", "300")).status().message() ==
        "rank 0 on cuda:0 (LOCAL_RANK=0, CUDA_VISIBLE_DEVICES=300): the simulation has GPUs 0 to 255");
}
