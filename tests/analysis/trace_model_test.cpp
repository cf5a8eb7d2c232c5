// The trace model rebuilds the allocator's state from its events alone.
#include "analysis/trace_model.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "../allocator/test_util.h"
#include "recording/recorder.h"
#include "recording/timeline.h"

using namespace memscope;
using namespace memscope::testing;

namespace {

// Records into memory and applies each event to a model as it arrives.
struct ModelFollower {
  explicit ModelFollower(const AllocatorConfig& config) : sink(timeline), recorder(sink), model(config) {}
  absl::Status CatchUp() {
    for (; applied < timeline.events.size(); ++applied) {
      if (absl::Status s = model.Apply(timeline.events[applied]); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  Timeline timeline;
  MemorySink sink;
  Recorder recorder;
  TraceModel model;
  std::size_t applied = 0;
};

void RequireSameStats(const DeviceStats& model, const DeviceStats& allocator) {
  const auto m = FlattenStats(model);
  const auto a = FlattenStats(allocator);
  for (const auto& [key, value] : a) {
    INFO(key);
    REQUIRE(m.at(key) == value);
  }
}

// segment_ranges() holds the ranges of segments(), in order.
void RequireRangesOfSegments(const TraceModel& m) {
  std::vector<SegmentRanges::Range> expected;
  for (const auto& [addr, seg] : m.segments()) expected.push_back({addr, addr + seg.size, seg.expandable});
  REQUIRE(m.segment_ranges().ranges() == expected);
}

void RunRandomized(const std::string& conf, std::uint64_t seed, int operations) {
  INFO("alloc_conf " << conf);
  const AllocatorConfig config = Conf(conf);
  SimDevice gpu({.capacity = 512 * MiB});
  CachingAllocator a(gpu, config);
  ModelFollower f(config);
  a.SetObserver(&f.recorder);
  std::mt19937_64 rng(seed);
  std::vector<DevicePtr> live;
  for (int i = 0; i < operations; ++i) {
    const unsigned op = rng() % 100;
    if (op < 50 || live.empty()) {
      const std::size_t size = rng() % 3 == 0 ? 1 + rng() % (1 << 20) : MiB + rng() % (40 * MiB);
      ScopedTag tag(static_cast<Category>(rng() % kNumCategories), rng() % 2 ? "layer1" : "layer2");
      auto p = a.Malloc(size, rng() % 2);
      if (p.ok()) {
        live.push_back(*p);
        if (rng() % 8 == 0) REQUIRE(a.RecordStream(*p, 5).ok());
      }
    } else if (op < 97) {
      const std::size_t k = rng() % live.size();
      MustFree(a, live[k]);
      live[k] = live.back();
      live.pop_back();
    } else if (op < 99) {
      gpu.CompleteAll();
    } else {
      a.EmptyCache();
    }
    const absl::Status s = f.CatchUp();
    INFO("operation " << i << ": " << s.ToString());
    REQUIRE(s.ok());
    RequireSameStats(f.model.stats(), a.GetStats());
    RequireRangesOfSegments(f.model);
  }
  // The model's snapshot agrees with the allocator's own.
  const auto mine = f.model.Snapshot(0);
  const auto theirs = a.Snapshot();
  REQUIRE(mine.size() == theirs.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    CHECK(mine[i].address == theirs[i].address);
    CHECK(mine[i].total_size == theirs[i].total_size);
    CHECK(mine[i].allocated_size == theirs[i].allocated_size);
    CHECK(mine[i].active_size == theirs[i].active_size);
    CHECK(mine[i].is_expandable == theirs[i].is_expandable);
    REQUIRE(mine[i].blocks.size() == theirs[i].blocks.size());
    for (std::size_t j = 0; j < mine[i].blocks.size(); ++j) {
      CHECK(mine[i].blocks[j].address == theirs[i].blocks[j].address);
      CHECK(mine[i].blocks[j].size == theirs[i].blocks[j].size);
      CHECK(mine[i].blocks[j].state == theirs[i].blocks[j].state);
    }
  }
}

}  // namespace

TEST_CASE("the trace model's stats equal the allocator's after every operation (defaults)") {
  RunRandomized("", 11, 20000);
}
TEST_CASE("the trace model's stats equal the allocator's after every operation (max_split_size_mb)") {
  RunRandomized("max_split_size_mb:24", 12, 20000);
}
TEST_CASE("the trace model's stats equal the allocator's after every operation (expandable segments)") {
  RunRandomized("expandable_segments:True", 13, 20000);
}

TEST_CASE("bytes per category and owner, and the lower bound of live requested bytes") {
  const AllocatorConfig config;
  SimDevice gpu;
  CachingAllocator a(gpu, config);
  ModelFollower f(config);
  a.SetObserver(&f.recorder);
  DevicePtr w, x;
  {
    ScopedTag tag(Category::kParameter, "fc1");
    w = MustMalloc(a, 3 * MiB);
  }
  {
    ScopedTag tag(Category::kActivation, "fc1");
    x = MustMalloc(a, 1000);
    ScopedTag inner(Category::kTemporary, "fc1.workspace");
    MustFree(a, MustMalloc(a, 5 * MiB));
  }
  REQUIRE(f.CatchUp().ok());
  const auto& cat = f.model.allocated_by_category();
  CHECK(cat[static_cast<int>(Category::kParameter)] == static_cast<std::int64_t>(3 * MiB));
  CHECK(cat[static_cast<int>(Category::kActivation)] == 1024);
  CHECK(cat[static_cast<int>(Category::kTemporary)] == 0);
  CHECK(f.model.allocated_by_owner().at(f.sink.Intern("fc1")) == static_cast<std::int64_t>(3 * MiB + 1024));
  CHECK(f.model.live_requested() == 3 * MiB + 1000);
  CHECK(f.model.peak_live_requested() == 8 * MiB + 1000);
  (void)w;
  (void)x;
}

TEST_CASE("owner bytes: dense ids in a vector, any other id in a map, every owner seen visited") {
  OwnerBytes o;
  CHECK(o.at(0) == 0);
  CHECK(o.at(7) == 0);
  o[3] += 100;
  o[0] += 5;
  o[OwnerBytes::kDense] += 7;  // the first id past the vector
  o[0xffffffffu] += 9;
  o[3] -= 100;  // back to 0: still seen
  CHECK(o.at(3) == 0);
  CHECK(o.at(0) == 5);
  CHECK(o.at(OwnerBytes::kDense) == 7);
  CHECK(o.at(0xffffffffu) == 9);
  CHECK(o.at(4) == 0);
  std::map<std::uint32_t, std::int64_t> seen;
  o.ForEach([&](std::uint32_t id, std::int64_t bytes) {
    if (bytes != 0 || id == 3) seen[id] = bytes;
  });
  CHECK(seen == std::map<std::uint32_t, std::int64_t>{{0, 5}, {3, 0}, {OwnerBytes::kDense, 7}, {0xffffffffu, 9}});
}

TEST_CASE("segment ranges: sorted by start, put replaces, find needs the whole range inside one") {
  SegmentRanges r;
  CHECK(r.Find(0, 1) == nullptr);
  r.Put(0x3000, 0x4000, false);
  r.Put(0x1000, 0x2000, true);
  r.Put(0x2000, 0x3000, false);  // adjacent to both
  using R = SegmentRanges::Range;
  CHECK(r.ranges() == std::vector<R>{{0x1000, 0x2000, true}, {0x2000, 0x3000, false}, {0x3000, 0x4000, false}});
  CHECK(r.Find(0x0fff, 1) == nullptr);                         // before the first
  CHECK(*r.Find(0x1000, 0x1000) == R{0x1000, 0x2000, true});   // exactly the first
  CHECK(*r.Find(0x1fff, 1) == R{0x1000, 0x2000, true});        // its last byte
  CHECK(*r.Find(0x2000, 0) == R{0x2000, 0x3000, false});       // the next one's start
  CHECK(r.Find(0x1800, 0x1000) == nullptr);                    // across two ranges
  CHECK(*r.Find(0x3ff0, 0x10) == R{0x3000, 0x4000, false});
  CHECK(r.Find(0x3ff0, 0x11) == nullptr);                      // past the last
  CHECK(r.Find(0x4000, 1) == nullptr);
  r.Put(0x2000, 0x2800, true);  // the same start: replaced
  CHECK(r.ranges() == std::vector<R>{{0x1000, 0x2000, true}, {0x2000, 0x2800, true}, {0x3000, 0x4000, false}});
  CHECK(r.Find(0x2800, 1) == nullptr);  // now a hole
  r.Erase(0x1000);
  r.Erase(0x1800);  // no range starts there: nothing
  CHECK(r.ranges() == std::vector<R>{{0x2000, 0x2800, true}, {0x3000, 0x4000, false}});
  CHECK(r.Find(0x1000, 1) == nullptr);
}

TEST_CASE("segment ranges follow segment maps and unmaps, which merge and split expandable segments") {
  TraceModel m(Conf("expandable_segments:True"));
  auto seg = [](EventType type, std::uint64_t addr, std::uint64_t size) {
    Event e;
    e.type = type;
    e.addr = addr;
    e.size = size;
    return e;
  };
  using R = SegmentRanges::Range;
  REQUIRE(m.Apply(seg(EventType::kSegmentMap, 0x200000, 0x200000)).ok());
  REQUIRE(m.Apply(seg(EventType::kSegmentMap, 0x600000, 0x200000)).ok());
  CHECK(m.segment_ranges().ranges() == std::vector<R>{{0x200000, 0x400000, true}, {0x600000, 0x800000, true}});
  REQUIRE(m.Apply(seg(EventType::kSegmentMap, 0x400000, 0x200000)).ok());  // joins both
  CHECK(m.segment_ranges().ranges() == std::vector<R>{{0x200000, 0x800000, true}});
  REQUIRE(m.Apply(seg(EventType::kSegmentUnmap, 0x400000, 0x100000)).ok());  // splits it
  CHECK(m.segment_ranges().ranges() == std::vector<R>{{0x200000, 0x400000, true}, {0x500000, 0x800000, true}});
  REQUIRE(m.Apply(seg(EventType::kSegmentAlloc, 0x1000000, 0x200000)).ok());
  REQUIRE(m.Apply(seg(EventType::kSegmentUnmap, 0x200000, 0x200000)).ok());  // all of the first
  CHECK(m.segment_ranges().ranges() == std::vector<R>{{0x500000, 0x800000, true}, {0x1000000, 0x1200000, false}});
  REQUIRE(m.Apply(seg(EventType::kSegmentFree, 0x1000000, 0x200000)).ok());
  CHECK(m.segment_ranges().ranges() == std::vector<R>{{0x500000, 0x800000, true}});
  RequireRangesOfSegments(m);
  const TraceModel copy = m;  // plain values: the copy's ranges are its own and equal
  CHECK(copy.segment_ranges().ranges() == m.segment_ranges().ranges());
}

TEST_CASE("fragmentation: 1 - largest free block / free bytes in segments") {
  const AllocatorConfig config;
  SimDevice gpu;
  CachingAllocator a(gpu, config);
  ModelFollower f(config);
  a.SetObserver(&f.recorder);
  const DevicePtr x = MustMalloc(a, 6 * MiB);  // [x 6][free 14] in a 20 MiB segment
  MustMalloc(a, 6 * MiB);                      // [x 6][y 6][free 8]
  MustFree(a, x);                              // [free 6][y 6][free 8]
  REQUIRE(f.CatchUp().ok());
  const FragmentationInfo fr = f.model.Fragmentation();
  CHECK(fr.reserved == 20 * MiB);
  CHECK(fr.allocated == 6 * MiB);
  CHECK(fr.reserved_minus_allocated == 14 * MiB);
  CHECK(fr.inactive_split_bytes == 14 * MiB);
  CHECK(fr.free_in_segments == 14 * MiB);
  CHECK(fr.largest_free_block == 8 * MiB);
  CHECK(fr.fragmentation == Approx(1.0 - 8.0 / 14.0));
  CHECK(fr.segments == 1);
  CHECK(fr.free_blocks == 2);
}

TEST_CASE("fragmentation: free bytes split into releasable (wholly free segments, free pages) and fragmented") {
  // A hand-built state: A, a 20 MiB segment with nothing in it; B, a 20 MiB
  // segment holding 6 MiB at its start; C, a 60 MiB expandable range of the
  // large pool (20 MiB pages) holding 10 MiB at offset 30 MiB; P, a 20 MiB
  // segment of a private pool (a CUDA graph's, a MemPool's) with nothing in it.
  TraceModel m(Conf("expandable_segments:True"));
  auto ev = [](EventType type, std::uint64_t addr, std::uint64_t size) {
    Event e;
    e.type = type;
    e.addr = addr;
    e.size = size;
    e.requested_size = size;
    return e;
  };
  const std::uint64_t a = 0x7f0000000000, b = a + 64 * MiB, c = a + 1024 * MiB;
  REQUIRE(m.Apply(ev(EventType::kSegmentAlloc, a, 20 * MiB)).ok());
  REQUIRE(m.Apply(ev(EventType::kSegmentAlloc, b, 20 * MiB)).ok());
  REQUIRE(m.Apply(ev(EventType::kAlloc, b, 6 * MiB)).ok());
  REQUIRE(m.Apply(ev(EventType::kSegmentMap, c, 60 * MiB)).ok());
  REQUIRE(m.Apply(ev(EventType::kAlloc, c + 30 * MiB, 10 * MiB)).ok());
  Event p = ev(EventType::kSegmentAlloc, a + 2048 * MiB, 20 * MiB);
  p.set_pool(1);
  REQUIRE(m.Apply(p).ok());
  const FragmentationInfo f = m.Fragmentation();
  CHECK(f.reserved == 120 * MiB);
  CHECK(f.free_in_segments == 20 * MiB + 14 * MiB + 50 * MiB + 20 * MiB);
  // Releasable: all of A, and C's free pages [0, 20) and [40, 60) MiB
  // (release_blocks unmaps the whole pages inside each free block).
  CHECK(f.releasable_bytes == 20 * MiB + 40 * MiB);
  CHECK(f.releasable_segments == 1);
  // Fragmented: B's 14 MiB, C's [20, 30) MiB (a page shared with the live
  // block) and P, which empty_cache() keeps while its pool lives.
  CHECK(f.fragmented_bytes == 14 * MiB + 10 * MiB + 20 * MiB);
  CHECK(f.fragmented_segments == 3);
  CHECK(f.releasable_ratio() == 0.5);
  CHECK(f.fragmented_ratio() == 44.0 / 120.0);
  // The TensorFlow ratio of the same state: largest free block 30 MiB of 104.
  CHECK(f.fragmentation == Approx(1.0 - 30.0 / 104.0));
}

TEST_CASE("fragmentation: releasable bytes are what the allocator's empty_cache() returns") {
  for (const std::string conf : {"", "expandable_segments:True"}) {
    INFO("alloc_conf " << conf);
    const AllocatorConfig config = Conf(conf);
    SimDevice gpu;
    CachingAllocator alloc(gpu, config);
    ModelFollower follower(config);
    alloc.SetObserver(&follower.recorder);
    std::vector<DevicePtr> held;
    for (const std::size_t size : {6 * MiB, 30 * MiB, 1 * MiB, 70 * MiB, 3 * MiB, 45 * MiB}) {
      held.push_back(MustMalloc(alloc, size));
    }
    for (const std::size_t k : {1u, 3u, 4u}) MustFree(alloc, held[k]);  // 30, 70 and 3 MiB
    REQUIRE(follower.CatchUp().ok());
    const FragmentationInfo before = follower.model.Fragmentation();
    CHECK(before.releasable_bytes + before.fragmented_bytes == before.free_in_segments);
    CHECK(before.releasable_bytes > 0);
    alloc.EmptyCache();
    REQUIRE(follower.CatchUp().ok());
    const FragmentationInfo after = follower.model.Fragmentation();
    CHECK(before.reserved - after.reserved == before.releasable_bytes);
    CHECK(after.releasable_bytes == 0);
    CHECK(after.fragmented_bytes == before.fragmented_bytes);
  }
}

TEST_CASE("inconsistent events are errors and leave the model unchanged") {
  TraceModel m;
  Event alloc;
  alloc.type = EventType::kAlloc;
  alloc.addr = 0x1000;
  alloc.size = 512;
  CHECK_FALSE(m.Apply(alloc).ok());  // no segment
  Event seg;
  seg.type = EventType::kSegmentAlloc;
  seg.addr = 0x1000;
  seg.size = 2 * MiB;
  seg.set_small_pool(true);
  REQUIRE(m.Apply(seg).ok());
  alloc.set_small_pool(true);
  REQUIRE(m.Apply(alloc).ok());
  CHECK_FALSE(m.Apply(alloc).ok());  // overlaps
  Event free_completed;
  free_completed.type = EventType::kFreeCompleted;
  free_completed.addr = 0x1000;
  CHECK_FALSE(m.Apply(free_completed).ok());  // not requested yet
  Event seg_free = seg;
  seg_free.type = EventType::kSegmentFree;
  CHECK_FALSE(m.Apply(seg_free).ok());  // still holds a block
  CHECK(m.allocated() == 512);
  CHECK(All(m.stats().segment).current == 1);
}
