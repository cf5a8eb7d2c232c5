#include "allocator/sim_device.h"

#include <catch2/catch.hpp>
#include <cstring>

using namespace memscope;

TEST_CASE("the simulated device fails allocations beyond its capacity, like cudaMalloc") {
  SimDevice gpu({.capacity = 10 << 20});
  auto a = gpu.Malloc(6 << 20);
  REQUIRE(a.ok());
  CHECK(*a % 512 == 0);
  auto b = gpu.Malloc(6 << 20);
  CHECK(absl::IsResourceExhausted(b.status()));
  CHECK(gpu.MemoryInfo().free_bytes == 4 << 20);
  CHECK(gpu.MemoryInfo().total_bytes == 10 << 20);
  CHECK(gpu.Free(*a).ok());
  CHECK_FALSE(gpu.Free(*a).ok());
  CHECK(gpu.used_bytes() == 0);
}

TEST_CASE("fault injection fails exactly the n-th device allocation") {
  SimDevice gpu;
  gpu.FailNthAllocation(2);
  CHECK(gpu.Malloc(1024).ok());
  CHECK(absl::IsResourceExhausted(gpu.Malloc(1024).status()));
  CHECK(gpu.Malloc(1024).ok());
}

TEST_CASE("reservations map and unmap pages that count against capacity") {
  SimDevice gpu({.capacity = 8 << 20});
  auto base = gpu.ReserveAddress(64 << 20);  // address space is not memory
  REQUIRE(base.ok());
  CHECK(gpu.MapPage(*base, 4 << 20).ok());
  CHECK(gpu.MapPage(*base + (4 << 20), 4 << 20).ok());
  CHECK(absl::IsResourceExhausted(gpu.MapPage(*base + (8 << 20), 4 << 20)));
  CHECK(gpu.used_bytes() == 8 << 20);
  CHECK(gpu.UnmapPage(*base, 4 << 20).ok());
  CHECK_FALSE(gpu.UnmapPage(*base, 4 << 20).ok());
  CHECK(gpu.ReleaseAddress(*base, 64 << 20).ok());
  CHECK(gpu.used_bytes() == 0);
  CHECK_FALSE(gpu.MapPage(*base, 4 << 20).ok());
}

TEST_CASE("events complete only when their stream's work is completed") {
  SimDevice gpu;
  const EventId e1 = gpu.RecordEvent(1);
  const EventId e2 = gpu.RecordEvent(2);
  CHECK_FALSE(gpu.QueryEvent(e1));
  gpu.CompleteStream(1);
  CHECK(gpu.QueryEvent(e1));
  CHECK_FALSE(gpu.QueryEvent(e2));
  const EventId e3 = gpu.RecordEvent(1);  // new work on stream 1
  CHECK_FALSE(gpu.QueryEvent(e3));
  gpu.SynchronizeEvent(e2);
  CHECK(gpu.QueryEvent(e2));
  gpu.CompleteAll();
  CHECK(gpu.QueryEvent(e3));
}

TEST_CASE("a host-backed device has real bytes behind every address") {
  SimDevice gpu({.capacity = 64 << 20, .index = 1, .host_backed = true});
  CHECK(gpu.index() == 1);
  auto p = gpu.Malloc(1 << 20);
  REQUIRE(p.ok());
  auto* host = static_cast<unsigned char*>(gpu.HostPointer(*p));
  REQUIRE(host != nullptr);
  std::memset(host, 0xab, 1 << 20);
  CHECK(static_cast<unsigned char*>(gpu.HostPointer(*p + 100))[0] == 0xab);
  auto base = gpu.ReserveAddress(8 << 20);
  REQUIRE(base.ok());
  REQUIRE(gpu.MapPage(*base + (2 << 20), 2 << 20).ok());
  auto* page = static_cast<unsigned char*>(gpu.HostPointer(*base + (2 << 20)));
  page[0] = 7;
  page[(2 << 20) - 1] = 9;
  CHECK(page[(2 << 20) - 1] == 9);
  SimDevice plain;
  auto q = plain.Malloc(1024);
  CHECK(plain.HostPointer(*q) == nullptr);
}

TEST_CASE("planned addresses go to the calls that match them, in order") {
  SimDevice gpu({.capacity = 1ULL << 30});
  constexpr DevicePtr kA = 0x7f3a00000000, kB = 0x7f3a40000000, kR = 0x7f3b00000000;
  gpu.PlanAddresses({{20 << 20, kA}, {30 << 20, kB}, {20 << 20, kA}}, {{40 << 20, kR}});
  // A call of another size is not in the plan: the device's own address, above every planned range.
  auto other = gpu.Malloc(2 << 20);
  REQUIRE(other.ok());
  CHECK(*other >= kR + (2ULL << 30));  // room for a reservation of twice the capacity
  auto a = gpu.Malloc(20 << 20);
  auto b = gpu.Malloc(30 << 20);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*a == kA);
  CHECK(*b == kB);
  // kA is still in use: the third planned address is not taken.
  auto c = gpu.Malloc(20 << 20);
  REQUIRE(c.ok());
  CHECK(*c != kA);
  CHECK(*c >= kR + (2ULL << 30));
  auto r = gpu.ReserveAddress(64 << 20);
  REQUIRE(r.ok());
  CHECK(*r == kR);
  CHECK(gpu.MapPage(kR, 2 << 20).ok());
  CHECK(gpu.planned_taken() == 3);
  CHECK(gpu.planned_missed() == 1);
  // Paused, the plan is left as it is.
  gpu.PlanAddresses({{4 << 20, 0x7f3c00000000}}, {});
  gpu.PausePlan(true);
  auto d = gpu.Malloc(4 << 20);
  REQUIRE(d.ok());
  CHECK(*d != 0x7f3c00000000);
  gpu.PausePlan(false);
  auto e = gpu.Malloc(4 << 20);
  REQUIRE(e.ok());
  CHECK(*e == 0x7f3c00000000);
}
