// Tests for CudaDevice. They run on every machine: without a driver or a GPU
// they check that Create fails cleanly; with a GPU they do a real round trip
// through cudaMalloc, the VMM API and events.
#include "allocator/cuda_device.h"

#include <catch2/catch.hpp>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/device.h"

namespace memscope {
namespace {

constexpr std::size_t kPage = std::size_t{2} << 20;  // VMM granularity.

// Checks what every CudaDevice::Create error must look like: a single
// non-empty line that says it is about CUDA, fit for a CLI error message.
void CheckCleanError(const absl::Status& status) {
  INFO("status: " << status.ToString());
  CHECK_FALSE(status.ok());
  const std::string message(status.message());
  CHECK_FALSE(message.empty());
  CHECK(message.find('\n') == std::string::npos);
  CHECK(message.find("CUDA") != std::string::npos);
}

TEST_CASE("CudaDevice::Create rejects invalid device indices", "[cuda]") {
  for (int index : {-1, 9999}) {
    INFO("device index " << index);
    absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(index);
    CheckCleanError(device.status());
  }
}

TEST_CASE("CudaDevice round trip, or a clean error without a GPU", "[cuda]") {
  absl::StatusOr<std::unique_ptr<CudaDevice>> created = CudaDevice::Create(0);
  if (!created.ok()) {
    CheckCleanError(created.status());
    WARN("no usable GPU, skipping the round trip: " << created.status().message());
    return;
  }
  CudaDevice& device = **created;
  CHECK(device.index() == 0);

  SECTION("Malloc, MemoryInfo, Free") {
    absl::StatusOr<DevicePtr> ptr = device.Malloc(kPage);
    REQUIRE(ptr.ok());
    CHECK(*ptr != 0);
    CHECK(*ptr % 512 == 0);
    const DeviceMemoryInfo info = device.MemoryInfo();
    CHECK(info.total_bytes > 0);
    CHECK(info.free_bytes <= info.total_bytes);
    CHECK(device.Free(*ptr).ok());
  }

  SECTION("Malloc(0) is rejected") { CHECK(device.Malloc(0).status().code() == absl::StatusCode::kInvalidArgument); }

  SECTION("ReserveAddress, MapPage, UnmapPage, ReleaseAddress") {
    absl::StatusOr<DevicePtr> base = device.ReserveAddress(2 * kPage);
    if (base.status().code() == absl::StatusCode::kUnimplemented) {
      // A GPU or driver without virtual memory management: the allocator
      // then does not use expandable segments. Nothing else to check.
      WARN(base.status().message());
      return;
    }
    REQUIRE(base.ok());
    CHECK(*base != 0);
    CHECK(*base % kPage == 0);

    REQUIRE(device.MapPage(*base, kPage).ok());
    REQUIRE(device.MapPage(*base + kPage, kPage).ok());
    CHECK(device.MapPage(*base, kPage).code() == absl::StatusCode::kAlreadyExists);
    CHECK(device.UnmapPage(*base + kPage, kPage).ok());
    CHECK(device.UnmapPage(*base, kPage).ok());
    CHECK(device.UnmapPage(*base, kPage).code() == absl::StatusCode::kNotFound);
    CHECK(device.ReleaseAddress(*base, 2 * kPage).ok());
  }

  SECTION("RecordEvent on the default stream") {
    const EventId event = device.RecordEvent(/*stream=*/0);
    CHECK(event != 0);
    device.SynchronizeEvent(event);
    CHECK(device.QueryEvent(event));
    device.ReleaseEvent(event);

    // The released event comes back from the pool.
    const EventId again = device.RecordEvent(/*stream=*/0);
    CHECK(again == event);
    device.SynchronizeEvent(again);
    CHECK(device.QueryEvent(again));
    device.ReleaseEvent(again);
  }
}

}  // namespace
}  // namespace memscope
