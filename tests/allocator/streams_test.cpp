// record_stream: a block freed while other streams may still use it stays
// active until events recorded on those streams complete.
#include <catch2/catch.hpp>

#include "test_util.h"

using namespace memscope;
using namespace memscope::testing;

TEST_CASE("a block used on another stream is not reused until that stream's work completes") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr p = MustMalloc(a, MiB);
  REQUIRE(a.RecordStream(p, 7).ok());
  MustFree(a, p);
  DeviceStats s = a.GetStats();
  CHECK(s.allocation[kAll].current == 0);
  CHECK(s.allocated_bytes[kAll].current == 0);
  CHECK(s.active[kAll].current == 1);
  CHECK(s.active_bytes[kAll].current == static_cast<std::int64_t>(MiB));
  CHECK(s.requested_bytes[kAll].current == static_cast<std::int64_t>(MiB));
  CHECK(gpu.pending_events() == 1);
  auto snap = a.Snapshot();
  REQUIRE(snap[0].blocks.size() == 2);
  CHECK(snap[0].blocks[0].state == BlockState::kActivePendingFree);
  CHECK(snap[0].active_size == MiB);
  CHECK(snap[0].allocated_size == 0);
  RequireInvariants(a);

  const DevicePtr q = MustMalloc(a, MiB);  // p is still pending: the other half
  CHECK(q == p + MiB);
  gpu.CompleteStream(7);
  const DevicePtr r = MustMalloc(a, MiB);  // the event completed: p is free again
  CHECK(r == p);
  CHECK(gpu.pending_events() == 0);
  s = a.GetStats();
  CHECK(s.active[kAll].current == 2);
  CHECK(s.reserved_bytes[kAll].current == static_cast<std::int64_t>(2 * MiB));
  RequireInvariants(a);
}

TEST_CASE("record_stream on the allocation stream is ignored") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr p = MustMalloc(a, 4096, 3);
  REQUIRE(a.RecordStream(p, 3).ok());
  MustFree(a, p);
  CHECK(gpu.pending_events() == 0);
  CHECK(a.GetStats().active[kAll].current == 0);
}

TEST_CASE("one event per distinct stream, the block waits for all of them") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr p = MustMalloc(a, 4096);
  REQUIRE(a.RecordStream(p, 1).ok());
  REQUIRE(a.RecordStream(p, 2).ok());
  REQUIRE(a.RecordStream(p, 1).ok());
  MustFree(a, p);
  CHECK(gpu.pending_events() == 2);
  gpu.CompleteStream(1);
  MustMalloc(a, 8192);
  CHECK(a.GetStats().active[kAll].current == 2);  // still waiting on stream 2
  gpu.CompleteStream(2);
  MustMalloc(a, 8192);
  CHECK(a.GetStats().active[kAll].current == 2);  // p's block freed, one new allocation
  CHECK(gpu.pending_events() == 0);
  RequireInvariants(a);
}

TEST_CASE("empty_cache waits for pending events, then frees the segment") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr p = MustMalloc(a, 4 * MiB);
  REQUIRE(a.RecordStream(p, 5).ok());
  MustFree(a, p);
  a.EmptyCache();
  const DeviceStats s = a.GetStats();
  CHECK(s.num_sync_all_streams == 1);
  CHECK(s.reserved_bytes[kAll].current == 0);
  CHECK(s.active[kAll].current == 0);
  CHECK(gpu.pending_events() == 0);
  RequireInvariants(a);
}

TEST_CASE("the release-all retry synchronizes pending events too") {
  SimDevice gpu({.capacity = 40 * MiB});
  CachingAllocator a(gpu);
  const DevicePtr p = MustMalloc(a, 30 * MiB);
  REQUIRE(a.RecordStream(p, 9).ok());
  MustFree(a, p);
  MustMalloc(a, 32 * MiB);  // p's segment is freed once its event is waited for
  const DeviceStats s = a.GetStats();
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.num_sync_all_streams == 1);
  CHECK(s.reserved_bytes[kAll].current == static_cast<std::int64_t>(32 * MiB));
  RequireInvariants(a);
}
