// expandable_segments:True: one growing virtual range per (pool, stream),
// pages mapped on demand (20 MiB large / 2 MiB small) at the lowest address
// that fits, wholly free pages unmapped by empty_cache.
#include <catch2/catch.hpp>

#include "test_util.h"

using namespace memscope;
using namespace memscope::testing;

TEST_CASE("expandable segments grow page by page and do not count as new segments") {
  SimDevice gpu({.capacity = 1024 * MiB});
  CachingAllocator a(gpu, Conf("expandable_segments:True"));
  const DevicePtr x = MustMalloc(a, 30 * MiB);
  DeviceStats s = a.GetStats();
  CHECK(s.reserved_bytes[kLarge].current == 40 * MiB);  // two 20 MiB pages
  CHECK(s.segment[kAll].current == 0);
  CHECK(s.num_device_alloc == 1);
  CHECK(s.inactive_split_bytes[kAll].current == 0);  // not counted for expandable segments
  CHECK(gpu.used_bytes() == 40 * MiB);
  CHECK(gpu.live_reservations() == 1);
  auto snap = a.Snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].is_expandable);
  CHECK(snap[0].address == x);
  CHECK(snap[0].total_size == 40 * MiB);
  REQUIRE(snap[0].blocks.size() == 2);
  CHECK(snap[0].blocks[1].size == 10 * MiB);

  // The free 10 MiB tail grows into a newly mapped page: same segment.
  const DevicePtr y = MustMalloc(a, 25 * MiB);
  CHECK(y == x + 30 * MiB);
  s = a.GetStats();
  CHECK(s.reserved_bytes[kAll].current == 60 * MiB);
  CHECK(s.num_device_alloc == 2);
  snap = a.Snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].total_size == 60 * MiB);
  REQUIRE(snap[0].blocks.size() == 3);
  CHECK(snap[0].blocks[2].size == 5 * MiB);
  RequireInvariants(a);

  // empty_cache unmaps only the wholly free page below x's old place.
  MustFree(a, x);
  a.EmptyCache();
  s = a.GetStats();
  CHECK(s.reserved_bytes[kAll].current == 40 * MiB);
  CHECK(s.num_device_free == 1);
  snap = a.Snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].address == x + 20 * MiB);
  CHECK(snap[0].total_size == 40 * MiB);
  RequireInvariants(a);

  // A new request maps the lowest free address again and merges with its neighbour.
  const DevicePtr z = MustMalloc(a, 15 * MiB);
  CHECK(z == x);
  CHECK(a.memory_reserved() == 60 * MiB);
  snap = a.Snapshot();
  REQUIRE(snap.size() == 1);
  REQUIRE(snap[0].blocks.size() == 4);
  CHECK(snap[0].blocks[1].size == 15 * MiB);
  CHECK(snap[0].blocks[1].state == BlockState::kInactive);
  RequireInvariants(a);

  // All free: empty_cache unmaps everything and releases the reservation.
  MustFree(a, y);
  MustFree(a, z);
  a.EmptyCache();
  CHECK(a.memory_reserved() == 0);
  CHECK(gpu.used_bytes() == 0);
  CHECK(gpu.live_reservations() == 0);
  CHECK(a.Snapshot().empty());
  RequireInvariants(a);
}

TEST_CASE("expandable small-pool segments map 2 MiB pages") {
  SimDevice gpu({.capacity = 1024 * MiB});
  CachingAllocator a(gpu, Conf("expandable_segments:True"));
  MustMalloc(a, 1000);
  MustMalloc(a, 1000, /*stream=*/1);  // another stream: another segment
  const DeviceStats s = a.GetStats();
  CHECK(s.reserved_bytes[kSmall].current == 4 * MiB);
  CHECK(gpu.live_reservations() == 2);
  RequireInvariants(a);
}

TEST_CASE("expandable segments: a failed mapping leaves nothing mapped and ends in OOM") {
  SimDevice gpu({.capacity = 100 * MiB});
  CachingAllocator a(gpu, Conf("expandable_segments:True"));
  const DevicePtr x = MustMalloc(a, 50 * MiB);  // 3 pages
  MustMalloc(a, 30 * MiB);                      // tail 10 + 1 page
  CHECK(a.memory_reserved() == 80 * MiB);
  auto r = a.Malloc(30 * MiB);  // needs 2 pages, 1 fits
  REQUIRE_FALSE(r.ok());
  CHECK(a.GetStats().num_ooms == 1);
  CHECK(gpu.used_bytes() == 80 * MiB);
  RequireInvariants(a);
  MustFree(a, x);
  MustMalloc(a, 30 * MiB);  // fits in x's place without mapping
  CHECK(a.memory_reserved() == 80 * MiB);
  RequireInvariants(a);
}

TEST_CASE("expandable segments split any remainder of at least 512 B in the large pool") {
  SimDevice gpu({.capacity = 1024 * MiB});
  CachingAllocator a(gpu, Conf("expandable_segments:True"));
  const DevicePtr x = MustMalloc(a, 20 * MiB - 512);
  CHECK(a.BlockSize(x) == 20 * MiB - 512);
  const DevicePtr y = MustMalloc(a, 512);  // small pool: its own segment
  CHECK(a.BlockSize(y) == 512);
  RequireInvariants(a);
}
