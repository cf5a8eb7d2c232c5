// The caching allocator's decisions, with the exact values PyTorch's
// allocator produces (PyTorch's c10/cuda/CUDACachingAllocator.cpp).
#include "allocator/caching_allocator.h"

#include <catch2/catch.hpp>

#include "test_util.h"

using namespace memscope;
using namespace memscope::testing;

TEST_CASE("1 B takes one 512 B block in a new 2 MiB small-pool segment") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr p = MustMalloc(a, 1);
  const DeviceStats s = a.GetStats();
  CHECK(s.allocated_bytes[kAll].current == 512);
  CHECK(s.allocated_bytes[kSmall].current == 512);
  CHECK(s.allocated_bytes[kLarge].current == 0);
  CHECK(s.requested_bytes[kAll].current == 1);
  CHECK(s.reserved_bytes[kAll].current == 2 * MiB);
  CHECK(s.segment[kSmall].current == 1);
  CHECK(s.inactive_split[kSmall].current == 1);
  CHECK(s.inactive_split_bytes[kSmall].current == 2 * MiB - 512);
  CHECK(s.num_device_alloc == 1);
  CHECK(gpu.used_bytes() == 2 * MiB);
  const auto snap = a.Snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].total_size == 2 * MiB);
  CHECK_FALSE(snap[0].is_large);
  REQUIRE(snap[0].blocks.size() == 2);
  CHECK(snap[0].blocks[0].address == p);
  CHECK(snap[0].blocks[0].size == 512);
  CHECK(snap[0].blocks[0].requested_size == 1);
  CHECK(snap[0].blocks[0].state == BlockState::kActiveAllocated);
  CHECK(snap[0].blocks[1].size == 2 * MiB - 512);
  CHECK(snap[0].blocks[1].state == BlockState::kInactive);
  RequireInvariants(a);
}

TEST_CASE("1 MiB is a small-pool request: a 2 MiB segment with 1 MiB inactive split") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  MustMalloc(a, MiB);
  const DeviceStats s = a.GetStats();
  CHECK(s.allocated_bytes[kSmall].current == MiB);
  CHECK(s.reserved_bytes[kSmall].current == 2 * MiB);
  CHECK(s.inactive_split_bytes[kSmall].current == MiB);
  CHECK(s.segment[kLarge].current == 0);
}

TEST_CASE("1,048,577 B is rounded to a 1,049,088 B large block carved from a 20 MiB segment") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr p = MustMalloc(a, 1048577);
  CHECK(a.BlockSize(p) == 1049088);
  const DeviceStats s = a.GetStats();
  CHECK(s.allocated_bytes[kLarge].current == 1049088);
  CHECK(s.requested_bytes[kLarge].current == 1048577);
  CHECK(s.reserved_bytes[kLarge].current == 20 * MiB);
  CHECK(s.inactive_split_bytes[kLarge].current == 20 * MiB - 1049088);
  CHECK(s.inactive_split[kLarge].current == 1);
}

TEST_CASE("a 16,000,000 B tensor in a fresh segment occupies the whole 16 MiB block") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr p = MustMalloc(a, 16000000);
  CHECK(a.BlockSize(p) == 16777216);
  const DeviceStats s = a.GetStats();
  CHECK(s.allocated_bytes[kAll].current == 16777216);
  CHECK(s.requested_bytes[kAll].current == 16000000);
  CHECK(s.reserved_bytes[kAll].current == 16777216);
  CHECK(s.inactive_split_bytes[kAll].current == 0);  // the 777,216 B remainder is not split off
  CHECK(a.Snapshot()[0].blocks.size() == 1);
}

TEST_CASE("free keeps the memory cached, empty_cache returns reserved to 0") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr small = MustMalloc(a, 1000);
  const DevicePtr large = MustMalloc(a, 30 * MiB);
  MustFree(a, small);
  MustFree(a, large);
  DeviceStats s = a.GetStats();
  CHECK(s.allocated_bytes[kAll].current == 0);
  CHECK(s.allocated_bytes[kAll].peak == 1024 + 30 * MiB);
  CHECK(s.reserved_bytes[kAll].current == 32 * MiB);
  CHECK(s.inactive_split_bytes[kAll].current == 0);
  // A second request of the same size reuses the cached block.
  const DevicePtr again = MustMalloc(a, 30 * MiB);
  CHECK(again == large);
  MustFree(a, again);
  a.EmptyCache();
  s = a.GetStats();
  CHECK(s.reserved_bytes[kAll].current == 0);
  CHECK(s.reserved_bytes[kAll].peak == 32 * MiB);
  CHECK(s.segment[kAll].current == 0);
  CHECK(s.num_device_free == 2);
  CHECK(s.num_sync_all_streams == 1);
  CHECK(gpu.used_bytes() == 0);
  CHECK(a.Snapshot().empty());
  RequireInvariants(a);
}

TEST_CASE("empty_cache keeps segments that still hold an allocation") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr x = MustMalloc(a, 4096);
  const DevicePtr y = MustMalloc(a, 4096);
  MustFree(a, x);
  a.EmptyCache();
  CHECK(a.memory_reserved() == 2 * MiB);
  MustFree(a, y);
  a.EmptyCache();
  CHECK(a.memory_reserved() == 0);
}

TEST_CASE("when the device is full, cached segments are freed and the allocation retried") {
  SimDevice gpu({.capacity = 40 * MiB});
  CachingAllocator a(gpu);
  const DevicePtr x = MustMalloc(a, 12 * MiB);
  const DevicePtr y = MustMalloc(a, 12 * MiB);
  MustFree(a, x);
  MustFree(a, y);
  CHECK(a.memory_reserved() == 24 * MiB);
  MustMalloc(a, 30 * MiB);  // 24 + 30 > 40: free the cache, then it fits
  const DeviceStats s = a.GetStats();
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.num_ooms == 0);
  CHECK(s.num_device_free == 2);
  CHECK(s.num_sync_all_streams == 1);
  CHECK(s.reserved_bytes[kAll].current == 30 * MiB);
  CHECK(s.reserved_bytes[kAll].peak == 30 * MiB);
  RequireInvariants(a);
}

TEST_CASE("out of memory: num_ooms, num_alloc_retries and PyTorch's message") {
  SimDevice gpu({.capacity = 40 * MiB});
  CachingAllocator a(gpu);
  MustMalloc(a, 30 * MiB);
  auto r = a.Malloc(9 * MiB);  // needs a 20 MiB segment; 10 MiB are free
  REQUIRE_FALSE(r.ok());
  CHECK(absl::IsResourceExhausted(r.status()));
  const DeviceStats s = a.GetStats();
  CHECK(s.num_ooms == 1);
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.allocated_bytes[kAll].current == 30 * MiB);
  const auto oom = a.last_oom();
  REQUIRE(oom.has_value());
  CHECK(oom->message ==
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 40.00 MiB of which "
        "10.00 MiB is free. Of the allocated memory 30.00 MiB is allocated by PyTorch, and 0 bytes is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.");
  CHECK(oom->requested == 9 * MiB);
  CHECK(oom->alloc_size == 20 * MiB);
  CHECK(std::string(r.status().message()) == oom->message + "\n" + oom->diagnosis);
  CHECK(oom->diagnosis.find("Fragmentation") == std::string::npos);
  RequireInvariants(a);
}

TEST_CASE("an OOM caused by fragmentation says so: enough free bytes, no block that fits") {
  SimDevice gpu({.capacity = 30 * MiB});
  CachingAllocator a(gpu);
  const DevicePtr x = MustMalloc(a, 6 * MiB);  // a 20 MiB segment: [x 6][free 14]
  MustMalloc(a, 6 * MiB);                      // [x 6][y 6][free 8]
  MustFree(a, x);                              // [free 6][y 6][free 8]
  auto r = a.Malloc(12 * MiB);
  REQUIRE_FALSE(r.ok());
  const auto oom = a.last_oom();
  REQUIRE(oom.has_value());
  CHECK(oom->cached_free == 14 * MiB);
  CHECK(oom->largest_free_block == 8 * MiB);
  CHECK(oom->inactive_split == 14 * MiB);
  CHECK(oom->message.find("Tried to allocate 12.00 MiB. GPU 0 has a total capacity of 30.00 MiB of which 10.00 MiB "
                          "is free. Of the allocated memory 6.00 MiB is allocated by PyTorch, and 14.00 MiB is "
                          "reserved by PyTorch but unallocated.") != std::string::npos);
  CHECK(oom->diagnosis ==
        "memscope: the request of 12582912 B needs a 12.00 MiB block (large pool, stream 0); the cache holds "
        "14.00 MiB free in 2 blocks, the largest 8.00 MiB, and 14.00 MiB of it is non-releasable (inactive split). "
        "Fragmentation, not capacity: enough bytes are free but no free block fits.");
}

TEST_CASE("max_split_size: a smaller request never takes an oversize cached block") {
  SimDevice gpu;
  CachingAllocator a(gpu, Conf("max_split_size_mb:20"));
  MustFree(a, MustMalloc(a, 40 * MiB));
  MustMalloc(a, 12 * MiB);
  const DeviceStats s = a.GetStats();
  CHECK(s.reserved_bytes[kAll].current == 52 * MiB);  // a new 12 MiB segment, the 40 MiB one untouched
  CHECK(s.oversize_segments.current == 1);
  CHECK(s.oversize_allocations.current == 0);
  CHECK(s.max_split_size == static_cast<std::int64_t>(20 * MiB));
}

TEST_CASE("max_split_size: an oversize request takes a cached block only within 20 MiB of its size") {
  SimDevice gpu;
  CachingAllocator a(gpu, Conf("max_split_size_mb:20"));
  const DevicePtr forty = MustMalloc(a, 40 * MiB);
  MustFree(a, forty);
  const DevicePtr p = MustMalloc(a, 25 * MiB);  // 40 < 25 + 20: reuse, unsplit
  CHECK(p == forty);
  CHECK(a.BlockSize(p) == 40 * MiB);
  CHECK(a.GetStats().oversize_allocations.current == 1);
  CHECK(a.GetStats().inactive_split_bytes[kAll].current == 0);
  MustFree(a, p);
  MustMalloc(a, 20 * MiB - 512);  // a request below max_split_size must not take it
  CHECK(a.memory_reserved() == 60 * MiB);
  const DevicePtr q = MustMalloc(a, 20 * MiB);  // 40 >= 20 + 20: too big, new 20 MiB segment
  CHECK(q != forty);
  CHECK(a.memory_reserved() == 80 * MiB);
  RequireInvariants(a);
}

TEST_CASE("max_split_size: with the device full, a cached oversize block is freed before anything else") {
  SimDevice gpu({.capacity = 100 * MiB});
  CachingAllocator a(gpu, Conf("max_split_size_mb:20"));
  MustFree(a, MustMalloc(a, 70 * MiB));
  MustMalloc(a, 45 * MiB);  // 70 >= 45 + 20: not reused; 70 + 46 > 100: release the 70 MiB block
  const DeviceStats s = a.GetStats();
  CHECK(s.num_alloc_retries == 0);
  CHECK(s.num_sync_all_streams == 0);
  CHECK(s.num_device_free == 1);
  CHECK(s.reserved_bytes[kAll].current == 46 * MiB);
  RequireInvariants(a);
}

TEST_CASE("max_split_size: oversize blocks are freed largest first until enough is free") {
  SimDevice gpu({.capacity = 110 * MiB});
  CachingAllocator a(gpu, Conf("max_split_size_mb:20"));
  const DevicePtr x = MustMalloc(a, 30 * MiB);
  const DevicePtr y = MustMalloc(a, 40 * MiB);
  const DevicePtr z = MustMalloc(a, 22 * MiB);
  MustFree(a, x);
  MustFree(a, y);
  MustFree(a, z);
  // 62 MiB: no cached block is >= 62 MiB, the device has 18 MiB free. Free
  // 40 (40 < 62), then 30 (70 >= 62) and stop: the 22 MiB block stays.
  MustMalloc(a, 62 * MiB);
  const DeviceStats s = a.GetStats();
  CHECK(s.num_device_free == 2);
  CHECK(s.num_alloc_retries == 0);
  CHECK(s.reserved_bytes[kAll].current == 84 * MiB);
  RequireInvariants(a);
}

TEST_CASE("free blocks are cached per stream") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr s0 = MustMalloc(a, 2 * MiB, /*stream=*/0);
  MustFree(a, s0);
  const DevicePtr s1 = MustMalloc(a, 2 * MiB, /*stream=*/1);
  CHECK(s1 != s0);
  CHECK(a.memory_reserved() == 40 * MiB);  // stream 1 cannot use stream 0's segment
  const DevicePtr again = MustMalloc(a, 2 * MiB, 0);
  CHECK(again == s0);
  const auto snap = a.Snapshot();
  REQUIRE(snap.size() == 2);
  CHECK(snap[0].stream != snap[1].stream);
  RequireInvariants(a);
}

TEST_CASE("freed blocks merge with free neighbours in the same segment") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr x = MustMalloc(a, 512 * 1024);
  const DevicePtr y = MustMalloc(a, 512 * 1024);
  const DevicePtr z = MustMalloc(a, 512 * 1024);
  CHECK(y == x + 512 * 1024);
  CHECK(z == y + 512 * 1024);
  DeviceStats s = a.GetStats();
  CHECK(s.inactive_split[kSmall].current == 1);
  CHECK(s.inactive_split_bytes[kSmall].current == 512 * 1024);
  MustFree(a, x);
  s = a.GetStats();
  CHECK(s.inactive_split[kSmall].current == 2);
  CHECK(s.inactive_split_bytes[kSmall].current == MiB);
  MustFree(a, z);  // merges with the free tail
  s = a.GetStats();
  CHECK(s.inactive_split[kSmall].current == 2);
  CHECK(s.inactive_split_bytes[kSmall].current == 1536 * 1024);
  REQUIRE(a.Snapshot()[0].blocks.size() == 3);
  MustFree(a, y);  // merges with both: one whole free block
  s = a.GetStats();
  CHECK(s.inactive_split[kSmall].current == 0);
  CHECK(s.inactive_split_bytes[kSmall].current == 0);
  const auto snap = a.Snapshot();
  REQUIRE(snap.size() == 1);
  REQUIRE(snap[0].blocks.size() == 1);
  CHECK(snap[0].blocks[0].size == 2 * MiB);
  CHECK(snap[0].blocks[0].state == BlockState::kInactive);
  RequireInvariants(a);
}

TEST_CASE("best fit: the smallest free block that fits, ties go to the lowest address") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr twelve = MustMalloc(a, 12 * MiB);
  const DevicePtr ten = MustMalloc(a, 10 * MiB);
  MustFree(a, twelve);
  MustFree(a, ten);
  CHECK(MustMalloc(a, 10 * MiB) == ten);
  const DevicePtr p = MustMalloc(a, 11 * MiB);
  CHECK(p == twelve);
  CHECK(a.BlockSize(p) == 12 * MiB);  // the 1 MiB remainder is not split off
  CHECK(a.GetStats().allocated_bytes[kAll].current == static_cast<std::int64_t>(22 * MiB));

  const DevicePtr low = MustMalloc(a, 12 * MiB);
  const DevicePtr high = MustMalloc(a, 12 * MiB);
  REQUIRE(low < high);
  MustFree(a, high);
  MustFree(a, low);
  CHECK(MustMalloc(a, 12 * MiB) == low);
}

TEST_CASE("garbage collection frees cached blocks older than average once reserved passes the threshold") {
  SimDevice gpu({.capacity = 200 * MiB});
  CachingAllocator a(gpu, Conf("garbage_collection_threshold:0.5"));
  REQUIRE(a.SetMemoryFraction(0.5).ok());  // allowed 100 MiB; GC above 50 MiB
  for (std::size_t mb : {10, 12, 14, 16}) MustFree(a, MustMalloc(a, mb * MiB));
  CHECK(a.memory_reserved() == 52 * MiB);
  MustMalloc(a, 18 * MiB);
  // Ages (free-block lookups since cached) 4, 3, 2, 1: average 2.5, so the
  // 10 and 12 MiB blocks go.
  const DeviceStats s = a.GetStats();
  CHECK(s.num_device_free == 2);
  CHECK(s.num_alloc_retries == 0);
  CHECK(a.memory_reserved() == 48 * MiB);
  std::vector<std::size_t> sizes;
  for (const auto& seg : a.Snapshot()) sizes.push_back(seg.total_size);
  std::sort(sizes.begin(), sizes.end());
  CHECK(sizes == std::vector<std::size_t>{14 * MiB, 16 * MiB, 18 * MiB});
  RequireInvariants(a);
}

TEST_CASE("garbage collection needs a memory fraction") {
  SimDevice gpu({.capacity = 200 * MiB});
  CachingAllocator a(gpu, Conf("garbage_collection_threshold:0.5"));
  for (std::size_t mb : {10, 12, 14, 16, 18, 20}) MustFree(a, MustMalloc(a, mb * MiB));
  CHECK(a.GetStats().num_device_free == 0);
}

TEST_CASE("a memory fraction caps reserved memory and the OOM message says how much is allowed") {
  SimDevice gpu({.capacity = 100 * MiB});
  CachingAllocator a(gpu);
  REQUIRE(a.SetMemoryFraction(0.5).ok());
  MustMalloc(a, 40 * MiB);
  auto r = a.Malloc(20 * MiB);
  REQUIRE_FALSE(r.ok());
  const auto oom = a.last_oom();
  REQUIRE(oom.has_value());
  CHECK(oom->message.find("of which 60.00 MiB is free. 50.00 MiB allowed; Of the allocated memory 40.00 MiB") !=
        std::string::npos);
  CHECK(oom->diagnosis.find("memory fraction") != std::string::npos);
  CHECK_FALSE(a.SetMemoryFraction(1.5).ok());
  CHECK_FALSE(a.SetMemoryFraction(-0.1).ok());
}

TEST_CASE("a failed device allocation is retried after freeing the cache (fault injection)") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  gpu.FailNthAllocation(1);
  MustMalloc(a, 4 * MiB);
  const DeviceStats s = a.GetStats();
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.num_ooms == 0);
  CHECK(s.num_device_alloc == 1);
  CHECK(gpu.allocation_calls() == 2);
}

TEST_CASE("bad frees are errors naming the address, size 0 is a null allocation") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  CHECK(*a.Malloc(0) == 0);
  CHECK(a.Free(0).ok());
  const DevicePtr p = MustMalloc(a, 100);
  MustFree(a, p);
  const absl::Status twice = a.Free(p);
  CHECK(absl::IsInvalidArgument(twice));
  CHECK(std::string(twice.message()).find("invalid device pointer: 0x") == 0);
  CHECK_FALSE(a.Free(12345).ok());
  CHECK_FALSE(a.RecordStream(12345, 1).ok());
  CHECK(a.Malloc(std::size_t{1} << 61).status().message() ==
        "CUDA out of memory. Tried to allocate more than 1EB memory.");
}

TEST_CASE("reset_peak_memory_stats sets every peak to current, accumulated counters reset too") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  MustFree(a, MustMalloc(a, 30 * MiB));
  CHECK(a.max_memory_allocated() == 30 * MiB);
  CHECK(a.max_memory_reserved() == 30 * MiB);
  a.ResetPeakStats();
  CHECK(a.max_memory_allocated() == 0);
  CHECK(a.max_memory_reserved() == 30 * MiB);  // still reserved
  a.ResetAccumulatedStats();
  const DeviceStats s = a.GetStats();
  CHECK(s.allocated_bytes[kAll].allocated == 0);
  CHECK(s.allocated_bytes[kAll].freed == 0);
  CHECK(s.num_device_alloc == 0);
  CHECK(s.reserved_bytes[kAll].current == static_cast<std::int64_t>(30 * MiB));
}

TEST_CASE("after reset_accumulated_memory_stats, frees count from zero and current values stay") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const DevicePtr big = MustMalloc(a, 3 * MiB);  // a 3 MiB block of a 20 MiB large segment
  MustFree(a, MustMalloc(a, 1000));              // 1024 B of the small pool, allocated and freed
  a.ResetAccumulatedStats();
  MustFree(a, big);
  MustFree(a, MustMalloc(a, 1000));
  const DeviceStats s = a.GetStats();
  CHECK(s.allocated_bytes[kLarge].allocated == 0);
  CHECK(s.allocated_bytes[kLarge].freed == static_cast<std::int64_t>(3 * MiB));
  CHECK(s.allocated_bytes[kSmall].allocated == 1024);
  CHECK(s.allocated_bytes[kSmall].freed == 1024);
  CHECK(s.allocated_bytes[kAll].allocated == 1024);
  CHECK(s.allocated_bytes[kAll].freed == static_cast<std::int64_t>(3 * MiB + 1024));
  CHECK(s.allocated_bytes[kAll].current == 0);
  CHECK(s.allocation[kAll].freed == 2);
  CHECK(s.requested_bytes[kAll].freed == static_cast<std::int64_t>(3 * MiB + 1000));
  // The cached segments stay: reserved moved neither way since the reset.
  CHECK(s.reserved_bytes[kAll].current == static_cast<std::int64_t>(22 * MiB));
  CHECK(s.reserved_bytes[kAll].allocated == 0);
  CHECK(s.reserved_bytes[kAll].freed == 0);
  CHECK(s.allocated_bytes[kAll].peak == static_cast<std::int64_t>(3 * MiB + 1024));
}

TEST_CASE("memory_stats keys are PyTorch's flattened names, sorted") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  MustMalloc(a, 1);
  const auto flat = FlattenStats(a.GetStats());
  CHECK(flat.size() == 9 * 3 * 4 + 2 * 4 + 6);
  CHECK(flat.at("allocated_bytes.all.current") == 512);
  CHECK(flat.at("allocated_bytes.small_pool.current") == 512);
  CHECK(flat.at("reserved_bytes.all.peak") == static_cast<std::int64_t>(2 * MiB));
  CHECK(flat.at("requested_bytes.all.allocated") == 1);
  CHECK(flat.at("max_split_size") == -1);
  CHECK(flat.at("num_device_alloc") == 1);
  CHECK(flat.at("oversize_allocations.current") == 0);
  CHECK(flat.begin()->first == "active.all.allocated");
}

namespace {
struct Recorder : AllocatorObserver {
  std::vector<TraceEvent> events;
  void OnEvent(const TraceEvent& e) override { events.push_back(e); }
};
}  // namespace

TEST_CASE("the observer sees every action in order with address, sizes and stream") {
  SimDevice gpu({.capacity = 30 * MiB});
  CachingAllocator a(gpu);
  Recorder rec;
  a.SetObserver(&rec);
  const DevicePtr p = MustMalloc(a, 1000, 3);
  MustFree(a, p);
  a.EmptyCache();
  (void)a.Malloc(40 * MiB);
  std::vector<std::string> names;
  for (const auto& e : rec.events) names.emplace_back(TraceActionName(e.action));
  CHECK(names == std::vector<std::string>{"segment_alloc", "alloc", "free_requested", "free_completed", "empty_cache",
                                          "sync_all_streams", "segment_free", "sync_all_streams", "alloc_retry",
                                          "oom"});
  CHECK(rec.events[0].size == 2 * MiB);
  CHECK(rec.events[0].small_pool);
  CHECK(rec.events[1].addr == p);
  CHECK(rec.events[1].size == 1024);
  CHECK(rec.events[1].requested_size == 1000);
  CHECK(rec.events[1].stream == 3);
  CHECK(rec.events[8].size == 40 * MiB);  // the retried device allocation
  CHECK(rec.events[9].addr == 30 * MiB);  // device free bytes at the OOM
  CHECK(rec.events[9].size == 40 * MiB);
  for (std::size_t i = 1; i < rec.events.size(); ++i) CHECK(rec.events[i].time_ns >= rec.events[i - 1].time_ns);
  a.SetObserver(nullptr);
  MustMalloc(a, 1);
  CHECK(rec.events.size() == 10);
}

TEST_CASE("destroying the allocator returns every segment to the device") {
  SimDevice gpu;
  {
    CachingAllocator a(gpu, Conf("expandable_segments:False"));
    MustMalloc(a, 1);
    MustMalloc(a, 30 * MiB);
  }
  CHECK(gpu.used_bytes() == 0);
  CHECK(gpu.live_allocations() == 0);
}

TEST_CASE("per_process_memory_fraction in the settings caps the allocator from the start, 1.0 removes the cap") {
  SimDevice gpu({.capacity = 100 * MiB});
  CachingAllocator a(gpu, Conf("per_process_memory_fraction:0.5"));
  CHECK(a.allowed_memory_maximum() == 50 * MiB);
  MustMalloc(a, 40 * MiB);
  REQUIRE_FALSE(a.Malloc(20 * MiB).ok());
  CHECK(a.last_oom()->message.find("50.00 MiB allowed; ") != std::string::npos);
  REQUIRE(a.SetMemoryFraction(1.0).ok());  // PyTorch 2.9: allowed_memory_maximum = nullopt
  CHECK(a.allowed_memory_maximum() == 0);
  CHECK(a.Malloc(20 * MiB).ok());
}

TEST_CASE("garbage collection with the fraction from the settings: the oldest cached blocks go first") {
  // 200 MiB GPU, fraction 0.5: 100 MiB allowed; GC once reserved passes 0.6 * 100 MiB = 60 MiB.
  SimDevice gpu({.capacity = 200 * MiB});
  CachingAllocator a(gpu, Conf("per_process_memory_fraction:0.5,garbage_collection_threshold:0.6"));
  for (std::size_t mb : {10, 12, 14, 16, 18}) MustFree(a, MustMalloc(a, mb * MiB));
  // The 18 MiB cudaMalloc came with 52 MiB reserved (<= 60): nothing collected.
  CHECK(a.memory_reserved() == 70 * MiB);
  CHECK(a.GetStats().num_device_free == 0);
  // 20 MiB: no cached block fits; 70 MiB > 60 MiB, so reclaim 10 MiB. Ages
  // (free-block lookups since cached) 5, 4, 3, 2, 1 for 10..18 MiB, average
  // 3: the 10, 12 and 14 MiB blocks (36 MiB) go in one pass.
  MustMalloc(a, 20 * MiB);
  CHECK(a.GetStats().num_device_free == 3);
  CHECK(a.memory_reserved() == 54 * MiB);
  std::vector<std::size_t> sizes;
  for (const auto& seg : a.Snapshot()) sizes.push_back(seg.total_size);
  std::sort(sizes.begin(), sizes.end());
  CHECK(sizes == std::vector<std::size_t>{16 * MiB, 18 * MiB, 20 * MiB});
  RequireInvariants(a);
}
