// record_stream: a block freed while other streams may still use it stays
// active until events recorded on those streams complete.
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "allocator/ska_map.h"
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

// Issue 33's checked case. Blocks a (2 MiB + 1 B: 2,097,664 B) and b
// (2,670,592 B) split a 20 MiB segment on the default stream, the rest
// (16,203,264 B) stays free; a is used on pool stream x, b on pool stream y;
// both are freed, then empty_cache. Allocating a split the new segment
// (inactive_split +1 block, +18,873,856 B). Freeing a first adds a
// split-off free block (+1, +2,097,664 B); freeing b then merges all. Freeing
// b first merges it into the free rest (the count stays, +2,670,592 B).
// PyTorch frees them in the order of its cuda_events map's slots: with
// device 0's hashes, stream 35's slot (2 of 4) comes before stream 3's (3).
TEST_CASE("pending frees of two streams complete in the order of PyTorch's stream map, not by stream number") {
  const auto run = [](StreamId a_stream, StreamId b_stream) {
    SimDevice gpu;
    CachingAllocator alloc(gpu);
    const DevicePtr a = MustMalloc(alloc, 2 * MiB + 1);
    const DevicePtr b = MustMalloc(alloc, 2670592);
    REQUIRE(alloc.RecordStream(a, a_stream).ok());
    REQUIRE(alloc.RecordStream(b, b_stream).ok());
    MustFree(alloc, a);
    MustFree(alloc, b);
    alloc.EmptyCache();
    RequireInvariants(alloc);
    const DeviceStats s = alloc.GetStats();
    CHECK(s.reserved_bytes[kAll].current == 0);
    return std::pair{s.inactive_split[kAll].allocated, s.inactive_split_bytes[kAll].allocated};
  };
  STATIC_REQUIRE(PoolStreamId(0) == 3);
  STATIC_REQUIRE(PoolStreamId(1) == 35);
  CHECK(run(PoolStreamId(0), PoolStreamId(1)) == std::pair<std::int64_t, std::int64_t>{1, 21544448});  // b first
  CHECK(run(PoolStreamId(1), PoolStreamId(0)) == std::pair<std::int64_t, std::int64_t>{2, 20971520});  // a first
}

TEST_CASE("a block used on several streams joins their queues in the order of PyTorch's stream set") {
  // Streams 3, 35 and 67 on device 0 take slots 3, 2 and 1 of a 4-slot set;
  // the third insert grows it to 8 slots (7, 5, 3): 67, 35, 3 in order.
  SkaMap<char> set;
  for (StreamId s : {3, 35, 67}) set[s] = 1;
  std::vector<StreamId> order;
  for (std::size_t i = set.Begin(); i != set.End(); i = set.Next(i)) order.push_back(set.Key(i));
  CHECK(order == std::vector<StreamId>{67, 35, 3});
  CHECK(set.bucket_count() == 8);
  // Erasing while walking (process_events) visits every other entry once.
  std::vector<StreamId> visited;
  for (std::size_t i = set.Begin(); i != set.End();) {
    visited.push_back(set.Key(i));
    i = set.Key(i) == 67 ? set.Erase(i) : set.Next(i);
  }
  CHECK(visited == std::vector<StreamId>{67, 35, 3});
  CHECK(set.size() == 2);
  set.clear();
  CHECK(set.empty());
  CHECK(set.bucket_count() == 8);  // the slots stay, as in PyTorch
}
