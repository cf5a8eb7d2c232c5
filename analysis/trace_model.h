// The state of a caching allocator rebuilt from its events: segments and
// their blocks, every memory_stats value, bytes per category and per owner.
// Every analysis and export reads the allocator through this one model,
// whether the events come from a memscope timeline, a replay or an imported
// PyTorch snapshot (which is replayed into events first).
//
//   TraceModel model(timeline.settings);   // the recording's allocator settings (parsed once)
//   for (const Event& e : timeline.events) {
//     if (absl::Status s = model.Apply(e); !s.ok()) ...  // inconsistent trace
//   }
//   model.stats();            // == the allocator's GetStats() after the same actions
//   model.Snapshot(device);   // segments with allocated, pending and free blocks
//   model.Fragmentation();
//
// Invariant: stats() equals, field by field, what CachingAllocator::GetStats()
// returned after the last applied event (tested on randomized traces).
#ifndef MEMSCOPE_ANALYSIS_TRACE_MODEL_H_
#define MEMSCOPE_ANALYSIS_TRACE_MODEL_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "allocator/config.h"
#include "allocator/snapshot.h"
#include "allocator/stats.h"
#include "recording/event.h"

namespace memscope {

// Fragmentation at one moment. fragmentation = 1 - largest_free_block /
// free_in_segments (TensorFlow's Memory Profile definition), 0 with no free
// bytes.
//
// The free bytes in two parts, as empty_cache() sees them: releasable (what
// it would return to the device: every wholly free segment of the default
// pool, and the whole free pages of its expandable segments, which
// release_blocks unmaps) and fragmented (the rest: free bytes inside
// segments that hold live blocks, and those of private pools, whose segments
// stay until the pool is released).
// A cache of wholly free segments reads as highly fragmented by the
// TensorFlow ratio (many free blocks, none large) though none of it is.
// releasable_bytes + fragmented_bytes == free_in_segments.
struct FragmentationInfo {
  std::uint64_t reserved = 0;
  std::uint64_t allocated = 0;
  std::uint64_t reserved_minus_allocated = 0;
  std::uint64_t inactive_split_bytes = 0;  // free blocks inside partly used segments
  std::uint64_t free_in_segments = 0;      // every free byte of every segment
  std::uint64_t largest_free_block = 0;
  double fragmentation = 0.0;
  std::uint64_t segments = 0;
  std::uint64_t free_blocks = 0;
  std::uint64_t releasable_bytes = 0;
  std::uint64_t releasable_segments = 0;  // default-pool segments with no live block
  std::uint64_t fragmented_bytes = 0;
  std::uint64_t fragmented_segments = 0;  // segments holding live blocks and fragmented bytes
  // Each as a fraction of reserved (0 with nothing reserved).
  double releasable_ratio() const { return Ratio(releasable_bytes); }
  double fragmented_ratio() const { return Ratio(fragmented_bytes); }

 private:
  double Ratio(std::uint64_t bytes) const {
    return reserved == 0 ? 0.0 : static_cast<double>(bytes) / static_cast<double>(reserved);
  }
};

// Allocated bytes per owner string id: the ids a recording gives (dense,
// from 0) in a vector, a larger one (a file may hold any id) in a map.
class OwnerBytes {
 public:
  static constexpr std::uint32_t kDense = 1u << 16;
  std::int64_t& operator[](std::uint32_t id) {
    if (id < kDense) [[likely]] {
      if (id >= dense_.size()) dense_.resize(std::min<std::size_t>(kDense, std::max<std::size_t>(id + 1, 2 * dense_.size())), 0);
      return dense_[id];
    }
    return sparse_[id];
  }
  // The bytes of `id` (0 for an owner never seen).
  std::int64_t at(std::uint32_t id) const {
    if (id < dense_.size()) return dense_[id];
    const auto it = sparse_.find(id);
    return it == sparse_.end() ? 0 : it->second;
  }
  // f(id, bytes) for every owner seen (some at 0 bytes), in no particular order.
  template <typename F>
  void ForEach(F&& f) const {
    for (std::size_t id = 0; id < dense_.size(); ++id) f(static_cast<std::uint32_t>(id), dense_[id]);
    for (const auto& [id, bytes] : sparse_) f(id, bytes);
  }

 private:
  std::vector<std::int64_t> dense_;
  absl::flat_hash_map<std::uint32_t, std::int64_t> sparse_;
};

// The address ranges of a model's segments, sorted by start, in one array:
// finding the segment that holds a block is a binary search over contiguous
// entries instead of a descent of the segment tree. Segments change rarely
// (segment events), blocks at every event. Plain values: a copy is valid.
class SegmentRanges {
 public:
  struct Range {
    std::uint64_t start = 0;
    std::uint64_t end = 0;    // one past the last byte
    bool expandable = false;  // a mapped range of an expandable segment
    bool operator==(const Range&) const = default;
  };
  // Adds the range beginning at `start`, or replaces the one there.
  void Put(std::uint64_t start, std::uint64_t end, bool expandable);
  // Removes the range beginning at `start` (nothing when there is none).
  void Erase(std::uint64_t start);
  // The range holding all of [addr, addr + size), or nullptr.
  const Range* Find(std::uint64_t addr, std::uint64_t size) const {
    // The last range starting at or before addr.
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), addr,
                               [](std::uint64_t a, const Range& r) { return a < r.start; });
    if (it == ranges_.begin()) return nullptr;
    --it;
    return addr + size > it->end ? nullptr : &*it;
  }
  const std::vector<Range>& ranges() const { return ranges_; }

 private:
  std::vector<Range> ranges_;
};

class TraceModel {
 public:
  struct Block {
    std::uint64_t size = 0;
    std::uint64_t requested = 0;
    std::uint64_t stream = 0;
    Category category = Category::kOther;
    std::uint32_t owner = 0;
    bool pending_free = false;  // free requested, waiting on stream events
    std::uint32_t stack = 0;    // Timeline::stacks index of an imported allocation (0: none)
  };
  struct Segment {
    std::uint64_t size = 0;
    std::uint64_t stream = 0;
    bool small = false;
    bool expandable = false;  // a mapped range of an expandable segment
    std::uint16_t pool = 0;   // Event::pool(): 0 the default pool, else an index into Timeline::pools
  };

  explicit TraceModel(const AllocatorConfig& config = {});

  // Applies one event. Phase marks and marks change nothing here. Errors
  // describe an inconsistent trace (e.g. a free of an address never
  // allocated); the model is unchanged by a failed Apply.
  // `stack` is the allocation's Timeline::stacks index (alloc events).
  absl::Status Apply(const Event& event, std::uint32_t stack = 0);

  const DeviceStats& stats() const { return stats_; }
  std::uint64_t allocated() const { return static_cast<std::uint64_t>(All(stats_.allocated_bytes).current); }
  std::uint64_t reserved() const { return static_cast<std::uint64_t>(All(stats_.reserved_bytes).current); }
  // Allocated bytes (block sizes) per category, and per owner string id (an
  // owner that held blocks and holds none now stays, at 0).
  const std::array<std::int64_t, kNumCategories>& allocated_by_category() const { return by_category_; }
  const OwnerBytes& allocated_by_owner() const { return by_owner_; }
  // Bytes the program asked for and still holds, and their peak: the lower
  // bound no allocator can beat.
  std::uint64_t live_requested() const { return live_requested_; }
  std::uint64_t peak_live_requested() const { return peak_live_requested_; }

  // Ordered by address. std::map, not a btree: an alloc inserts and a free
  // erases a block, and a node-based tree does that without moving the other
  // blocks or splitting nodes; its iterators also stay valid across other
  // changes.
  using SegmentMap = std::map<std::uint64_t, Segment>;
  using BlockMap = std::map<std::uint64_t, Block>;
  const SegmentMap& segments() const { return segments_; }
  const BlockMap& blocks() const { return blocks_; }
  // The ranges of segments(), in the same order (what the block events search).
  const SegmentRanges& segment_ranges() const { return seg_ranges_; }

  // Segments and blocks in the shape of memory._snapshot(): free gaps
  // appear as inactive blocks (the allocator merges free neighbours, so each
  // gap is one free block).
  // `pools` (Timeline::pools) names each segment's pool (segment_pool_id).
  std::vector<SegmentInfo> Snapshot(int device, const std::vector<PoolId>& pools = {}) const;
  FragmentationInfo Fragmentation() const;

 private:
  // Apply, one event type each.
  absl::Status ApplyAlloc(const Event& e, std::uint32_t stack);
  absl::Status ApplyFreeRequested(const Event& e);
  absl::Status ApplyFreeCompleted(const Event& e);
  absl::Status ApplySegmentAlloc(const Event& e);
  absl::Status ApplySegmentFree(const Event& e);
  absl::Status ApplySegmentMap(const Event& e);
  absl::Status ApplySegmentUnmap(const Event& e);
  // Applies `delta` to a stat array for the pool of `small`.
  void Change(StatArray& a, bool small, std::int64_t delta);
  // How placing a block in its free gap changes inactive_split (count, bytes);
  // removing it changes them by the opposite. The block must not be in
  // blocks_; `next` is blocks_.lower_bound(addr) and `prev` the block before
  // it (nullptr for none), which the caller has.
  std::pair<std::int64_t, std::int64_t> InactiveDelta(const SegmentRanges::Range& seg, std::uint64_t addr,
                                                      std::uint64_t size, const BlockMap::value_type* prev,
                                                      BlockMap::const_iterator next) const;
  // segments_[start] = seg, and the same in seg_ranges_.
  void PutSegment(std::uint64_t start, const Segment& seg);
  // segments_.erase(it), and the same in seg_ranges_.
  void EraseSegment(SegmentMap::iterator it);
  // The segment containing [addr, addr + size), or end().
  SegmentMap::iterator FindSegment(std::uint64_t addr, std::uint64_t size);

  std::size_t max_split_size_;
  DeviceStats stats_;
  SegmentMap segments_;
  SegmentRanges seg_ranges_;  // the ranges of segments_, for the lookups of every block event
  BlockMap blocks_;  // active blocks (allocated or pending)
  std::array<std::int64_t, kNumCategories> by_category_{};
  OwnerBytes by_owner_;
  std::uint64_t live_requested_ = 0;
  std::uint64_t peak_live_requested_ = 0;
  // The block of the last free_requested, for its free_completed (which
  // follows at once for a plain free): one tree descent instead of two.
  // Set by ApplyFreeRequested, dropped when blocks_ changes (an alloc, a
  // completed free). A copy or move of the model starts without it (it
  // points into this model's map).
  struct PendingHint {
    bool valid = false;
    std::uint64_t addr = 0;
    BlockMap::iterator it;
    PendingHint() = default;
    PendingHint(const PendingHint& /*other*/) {}
    PendingHint& operator=(const PendingHint& /*other*/) {
      valid = false;
      return *this;
    }
    ~PendingHint() = default;
  };
  PendingHint pending_hint_;
  // The node of the last block whose free completed, kept for the next
  // alloc (allocs and frees alternate: no heap allocation per block). A
  // copy of the model starts without one.
  struct SpareNode {
    BlockMap::node_type node;
    SpareNode() = default;
    SpareNode(const SpareNode& /*other*/) {}
    SpareNode& operator=(const SpareNode& /*other*/) {
      node = {};
      return *this;
    }
    SpareNode(SpareNode&&) = default;
    SpareNode& operator=(SpareNode&&) = default;
    ~SpareNode() = default;
  };
  SpareNode spare_;
};

}  // namespace memscope

#endif  // MEMSCOPE_ANALYSIS_TRACE_MODEL_H_
