// Private pools (CUDA graphs, torch.cuda.MemPool), as PyTorch's
// CUDACachingAllocator keeps them: a PrivatePool has its own large and small
// BlockPools; get_pool routes a request there, and its blocks return to it
// (free_block uses block->pool). release_cached_blocks (empty_cache) frees
// the default pools' segments and those of freeable pools only (use_count 0
// after releasePool); stats count a private pool's bytes under the large or
// small pool by size, like the default pool's.
#include <catch2/catch.hpp>

#include "allocator/caching_allocator.h"
#include "test_util.h"

using namespace memscope;
using namespace memscope::testing;

namespace {

DevicePtr MustMallocIn(CachingAllocator& a, std::size_t size, std::uint16_t pool) {
  auto p = a.Malloc(size, 0, pool);
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  return *p;
}

std::uint16_t Index(CachingAllocator& a, PoolId id) {
  const absl::StatusOr<std::uint16_t> index = a.PoolIndex(id);
  INFO(index.status().ToString());
  REQUIRE(index.ok());
  return *index;
}

const SegmentInfo* SegmentAt(const std::vector<SegmentInfo>& snap, DevicePtr p) {
  for (const SegmentInfo& s : snap) {
    if (p >= s.address && p < s.address + s.total_size) return &s;
  }
  return nullptr;
}

// The snapshot's two segments: p's in pool `pool`, q's in the default pool.
std::vector<SegmentInfo> RequireTwoPools(const CachingAllocator& a, DevicePtr p, PoolId pool, DevicePtr q) {
  std::vector<SegmentInfo> snap = a.Snapshot();
  REQUIRE(snap.size() == 2);
  REQUIRE(SegmentAt(snap, p) != nullptr);
  REQUIRE(SegmentAt(snap, q) != nullptr);
  CHECK(SegmentAt(snap, p)->pool_id == pool);
  CHECK(SegmentAt(snap, q)->pool_id == PoolId{});
  return snap;
}

constexpr PoolId kMemPool{0, 1};    // torch.cuda.MemPool ids are (0, n)
constexpr PoolId kGraphPool{1, 0};  // CUDA graph pools are (n, 0)

}  // namespace

TEST_CASE("pool indices: 0 is the default pool, a private pool gets the next index once") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  CHECK(Index(a, PoolId{}) == 0);
  CHECK(Index(a, kMemPool) == 1);
  CHECK(Index(a, kGraphPool) == 2);
  CHECK(Index(a, kMemPool) == 1);
  CHECK(a.pool_ids() == std::vector<PoolId>{PoolId{}, kMemPool, kGraphPool});
  const auto bad = a.Malloc(1024, 0, 3);
  CHECK(absl::IsInvalidArgument(bad.status()));
  // At most kMaxPrivatePools (63: the pool index of a recorded event has 6 bits).
  for (std::uint64_t n = 3; n <= CachingAllocator::kMaxPrivatePools; ++n) CHECK(Index(a, PoolId{0, n}) == n);
  CHECK(absl::IsResourceExhausted(a.PoolIndex(PoolId{0, 64}).status()));
  CHECK(Index(a, PoolId{0, 63}) == 63);
}

TEST_CASE("a private pool's free block is never handed to the default pool, nor the default pool's to it") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const std::uint16_t pool = Index(a, kMemPool);
  // 4 MiB: a 20 MiB segment (kLargeBuffer) in the pool.
  const DevicePtr p = MustMallocIn(a, 4 * MiB, pool);
  MustFree(a, p);
  // The default pool has no cached block: a segment of its own, though the
  // pool holds 20 MiB free.
  const DevicePtr q = MustMalloc(a, 4 * MiB);
  CHECK(a.GetStats().num_device_alloc == 2);
  CHECK(a.memory_reserved() == 40 * MiB);
  MustFree(a, q);
  // And the pool takes its own block back, not the default pool's.
  const DevicePtr r = MustMallocIn(a, 4 * MiB, pool);
  CHECK(r == p);
  const DevicePtr s = MustMalloc(a, 4 * MiB);
  CHECK(s == q);
  CHECK(a.GetStats().num_device_alloc == 2);
  // Stats: the pool's bytes count in the large pool's, like the default pool's.
  const DeviceStats st = a.GetStats();
  CHECK(st.reserved_bytes[kLarge].current == static_cast<std::int64_t>(40 * MiB));
  CHECK(st.allocated_bytes[kLarge].current == static_cast<std::int64_t>(8 * MiB));
  CHECK(st.segment[kLarge].current == 2);
  // The snapshot names each segment's pool (segment_pool_id).
  RequireTwoPools(a, p, kMemPool, q);
  RequireInvariants(a);
}

TEST_CASE("small requests in a private pool get a 2 MiB small segment of the pool's own") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const std::uint16_t pool = Index(a, kGraphPool);
  const DevicePtr p = MustMallocIn(a, 1000, pool);
  const DevicePtr q = MustMalloc(a, 1000);
  const DeviceStats st = a.GetStats();
  CHECK(st.segment[kSmall].current == 2);
  CHECK(st.reserved_bytes[kSmall].current == static_cast<std::int64_t>(4 * MiB));
  const auto snap = RequireTwoPools(a, p, kGraphPool, q);
  CHECK_FALSE(SegmentAt(snap, p)->is_large);
  RequireInvariants(a);
}

TEST_CASE(
    "empty_cache leaves a live private pool's segments, ReleasePool frees its free ones, later empty_cache the rest") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const std::uint16_t pool = Index(a, kMemPool);
  const DevicePtr p1 = MustMallocIn(a, 4 * MiB, pool);   // 20 MiB segment, stays allocated
  const DevicePtr p2 = MustMallocIn(a, 30 * MiB, pool);  // a 30 MiB segment of its own
  MustFree(a, p2);
  const DevicePtr d = MustMalloc(a, 4 * MiB);  // the default pool's 20 MiB segment
  MustFree(a, d);
  CHECK(a.memory_reserved() == 70 * MiB);
  a.EmptyCache();  // frees the default pool's free segment only
  CHECK(a.memory_reserved() == 50 * MiB);
  CHECK(a.GetStats().num_device_free == 1);
  RequireInvariants(a);
  a.ReleasePool(kMemPool);  // the MemPool is deleted: its wholly free 30 MiB segment goes
  CHECK(a.memory_reserved() == 20 * MiB);
  CHECK(a.GetStats().num_device_free == 2);
  RequireInvariants(a);
  MustFree(a, p1);  // back to its (released) pool: cached until the next empty_cache
  CHECK(a.memory_reserved() == 20 * MiB);
  a.EmptyCache();
  CHECK(a.memory_reserved() == 0);
  RequireInvariants(a);
}

TEST_CASE("the out-of-memory release frees the default pool's cache, not a live private pool's") {
  SimDevice gpu({.capacity = 60 * MiB});
  CachingAllocator a(gpu);
  const std::uint16_t pool = Index(a, kMemPool);
  MustFree(a, MustMallocIn(a, 30 * MiB, pool));  // 30 MiB cached in the pool
  MustFree(a, MustMalloc(a, 20 * MiB));          // 20 MiB cached in the default pool
  // 25 MiB: 10 MiB free on the device; the release-all retry frees the
  // default pool's 20 MiB, which gives 30 MiB; the pool's 30 MiB stays.
  const DevicePtr p = MustMalloc(a, 25 * MiB);
  CHECK(p != 0);
  CHECK(a.GetStats().num_alloc_retries == 1);
  CHECK(a.memory_reserved() == 56 * MiB);  // 30 MiB pool + the 26 MiB segment (25 MiB rounded to 2 MiB)
  // A request the device cannot meet without the pool's cache fails; PyTorch's
  // message counts the private pools' cached free bytes apart.
  const auto q = a.Malloc(20 * MiB);
  CHECK(absl::IsResourceExhausted(q.status()));
  CHECK_THAT(std::string(q.status().message()),
             Catch::Contains("Of the allocated memory 26.00 MiB is allocated by PyTorch, with 30.00 MiB allocated in "
                             "private pools (e.g., CUDA Graphs), and 0 bytes is reserved by PyTorch but unallocated."));
  // The diagnosis counts the cache the request could use: the default pool's (none).
  REQUIRE(a.last_oom().has_value());
  CHECK(a.last_oom()->cached_free == 0);
  RequireInvariants(a);
}

TEST_CASE("a request in a private pool neither frees the whole cache to retry nor processes stream events") {
  // PyTorch: while captures_underway is not empty (a capture or use_mem_pool
  // routes requests to the pool) malloc skips process_events and the
  // release_cached_blocks retry.
  SimDevice gpu({.capacity = 100 * MiB});
  CachingAllocator a(gpu);
  const std::uint16_t pool = Index(a, kMemPool);
  MustFree(a, MustMalloc(a, 80 * MiB));  // 80 MiB cached in the default pool
  const auto p = a.Malloc(70 * MiB, 0, pool);
  CHECK(absl::IsResourceExhausted(p.status()));
  CHECK(a.GetStats().num_alloc_retries == 0);
  CHECK(a.memory_reserved() == 80 * MiB);
  // A default-pool request does free it and retry.
  const DevicePtr q = MustMalloc(a, 90 * MiB);
  CHECK(q != 0);
  CHECK(a.GetStats().num_alloc_retries == 1);
  // Stream events: a block used on another stream waits in the pool's
  // request; the default pool's next request processes the events.
  const DevicePtr r = MustMallocIn(a, 1000, pool);
  REQUIRE(a.RecordStream(r, 7).ok());
  MustFree(a, r);
  gpu.CompleteAll();
  CHECK(MustMallocIn(a, 1000, pool) != r);  // the event is not processed: r is still pending
  MustMalloc(a, 1000);                      // processes it
  CHECK(MustMallocIn(a, 1000, pool) == r);
  RequireInvariants(a);
}

TEST_CASE("expandable segments: a private pool maps its own range, apart from the default pool's") {
  SimDevice gpu;
  CachingAllocator a(gpu, Conf("expandable_segments:True"));
  const std::uint16_t pool = Index(a, kMemPool);
  const DevicePtr p = MustMallocIn(a, 4 * MiB, pool);
  const DevicePtr q = MustMalloc(a, 4 * MiB);
  const auto snap = RequireTwoPools(a, p, kMemPool, q);
  CHECK(SegmentAt(snap, p)->is_expandable);
  CHECK(SegmentAt(snap, p)->total_size == 20 * MiB);
  CHECK(a.memory_reserved() == 40 * MiB);
  RequireInvariants(a);
}
