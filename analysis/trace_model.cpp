#include "analysis/trace_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "allocator/sizes.h"
#include "base/hex_address.h"

namespace memscope {
namespace {

// 1 TiB: larger than any GPU, small enough that millions of events cannot
// overflow a 64-bit running total.
constexpr std::uint64_t kMaxEventSize = std::uint64_t{1} << 40;

}  // namespace

TraceModel::TraceModel(const AllocatorConfig& config) : max_split_size_(config.max_split_size) {
  stats_.max_split_size = static_cast<std::int64_t>(config.max_split_size);
}

// Inlined: the apply functions call it up to seven times per event.
[[gnu::always_inline]] inline void TraceModel::Change(StatArray& a, bool small, std::int64_t delta) {
  Stat& all = a[static_cast<int>(StatType::kAll)];
  Stat& pool = a[static_cast<int>(small ? StatType::kSmallPool : StatType::kLargePool)];
  if (delta > 0) {
    all.Increase(delta);
    pool.Increase(delta);
  } else if (delta < 0) {
    all.Decrease(-delta);
    pool.Decrease(-delta);
  }
}

void SegmentRanges::Put(std::uint64_t start, std::uint64_t end, bool expandable) {
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), start,
                             [](const Range& r, std::uint64_t a) { return r.start < a; });
  if (it != ranges_.end() && it->start == start) {
    *it = Range{start, end, expandable};
  } else {
    ranges_.insert(it, Range{start, end, expandable});
  }
}

void SegmentRanges::Erase(std::uint64_t start) {
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), start,
                             [](const Range& r, std::uint64_t a) { return r.start < a; });
  if (it != ranges_.end() && it->start == start) ranges_.erase(it);
}

void TraceModel::PutSegment(std::uint64_t start, const Segment& seg) {
  segments_[start] = seg;
  seg_ranges_.Put(start, start + seg.size, seg.expandable);
}

void TraceModel::EraseSegment(SegmentMap::iterator it) {
  seg_ranges_.Erase(it->first);
  segments_.erase(it);
}

TraceModel::SegmentMap::iterator TraceModel::FindSegment(std::uint64_t addr, std::uint64_t size) {
  auto it = segments_.upper_bound(addr);
  if (it == segments_.begin()) return segments_.end();
  --it;
  if (addr + size > it->first + it->second.size) return segments_.end();
  return it;
}

// Inactive splits are the free gaps of segments that hold at least one block
// (each gap is one merged free block). A block [addr, addr+size) placed in, or
// taken out of, the free gap [lo, hi) around it changes only that gap: the
// whole gap (counted only if the segment holds other blocks) against the
// pieces left beside the block. Returns pieces - whole; the caller has the
// block out of blocks_ while this runs. O(log blocks), not O(blocks in the
// segment): small-pool segments hold up to 4096 blocks.
std::pair<std::int64_t, std::int64_t> TraceModel::InactiveDelta(const SegmentRanges::Range& seg, std::uint64_t addr,
                                                                std::uint64_t size, const BlockMap::value_type* prev,
                                                                BlockMap::const_iterator next) const {
  if (seg.expandable) return {0, 0};  // PyTorch leaves expandable segments out of inactive_split
  const std::uint64_t seg_addr = seg.start;
  const std::uint64_t seg_end = seg.end;
  const std::uint64_t hi = next != blocks_.end() && next->first < seg_end ? next->first : seg_end;
  const std::uint64_t lo = prev != nullptr && prev->first >= seg_addr ? prev->first + prev->second.size : seg_addr;
  const bool others = lo != seg_addr || hi != seg_end;
  const std::int64_t whole_count = others ? 1 : 0;
  const std::int64_t whole_bytes = others ? static_cast<std::int64_t>(hi - lo) : 0;
  const std::int64_t piece_count = (addr > lo ? 1 : 0) + (hi > addr + size ? 1 : 0);
  const std::int64_t piece_bytes = static_cast<std::int64_t>((addr - lo) + (hi - (addr + size)));
  return {piece_count - whole_count, piece_bytes - whole_bytes};
}

absl::Status TraceModel::ApplyAlloc(const Event& e, std::uint32_t stack) {
  const bool small = e.small_pool();
  const auto size = static_cast<std::int64_t>(e.size);
  const SegmentRanges::Range* seg = seg_ranges_.Find(e.addr, e.size);
  if (seg == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("alloc of ", e.size, " B at ", HexAddress(e.addr), " is outside every segment"));
  }
  auto next = blocks_.lower_bound(e.addr);
  if (next != blocks_.end() && next->first < e.addr + e.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("alloc at ", HexAddress(e.addr), " overlaps the block at ", HexAddress(next->first)));
  }
  const BlockMap::value_type* prev = next != blocks_.begin() ? &*std::prev(next) : nullptr;
  if (prev != nullptr && prev->first + prev->second.size > e.addr) {
    return absl::InvalidArgumentError(
        absl::StrCat("alloc at ", HexAddress(e.addr), " overlaps the block at ", HexAddress(prev->first)));
  }
  // `next` (the first block after the new one) serves both the gap and the insertion.
  const auto [split_delta, split_bytes_delta] = InactiveDelta(*seg, e.addr, e.size, prev, next);
  const Block block{e.size, e.requested_size, e.stream, e.category, e.name, false, stack};
  if (!spare_.node.empty()) {
    spare_.node.key() = e.addr;
    spare_.node.mapped() = block;
    blocks_.insert(next, std::move(spare_.node));
    spare_.node = {};
  } else {
    blocks_.emplace_hint(next, e.addr, block);
  }
  pending_hint_.valid = false;
  Change(stats_.inactive_split, small, split_delta);
  Change(stats_.inactive_split_bytes, small, split_bytes_delta);
  Change(stats_.allocation, small, 1);
  Change(stats_.allocated_bytes, small, size);
  Change(stats_.active, small, 1);
  Change(stats_.active_bytes, small, size);
  Change(stats_.requested_bytes, small, static_cast<std::int64_t>(e.requested_size));
  if (e.size >= max_split_size_) stats_.oversize_allocations.Increase(1);
  by_category_[static_cast<int>(e.category)] += size;
  by_owner_[e.name] += size;
  live_requested_ += e.requested_size;
  peak_live_requested_ = std::max(peak_live_requested_, live_requested_);
  return absl::OkStatus();
}

absl::Status TraceModel::ApplyFreeRequested(const Event& e) {
  const bool small = e.small_pool();
  auto it = blocks_.find(e.addr);
  if (it == blocks_.end() || it->second.pending_free) {
    return absl::InvalidArgumentError(
        absl::StrCat("free_requested of ", HexAddress(e.addr), ", which is not allocated"));
  }
  Block& b = it->second;
  b.pending_free = true;
  pending_hint_.valid = true;
  pending_hint_.addr = e.addr;
  pending_hint_.it = it;
  Change(stats_.allocation, small, -1);
  Change(stats_.allocated_bytes, small, -static_cast<std::int64_t>(b.size));
  if (b.size >= max_split_size_) stats_.oversize_allocations.Decrease(1);
  by_category_[static_cast<int>(b.category)] -= static_cast<std::int64_t>(b.size);
  by_owner_[b.owner] -= static_cast<std::int64_t>(b.size);  // (an owner at 0 stays: fewer inserts)
  live_requested_ -= b.requested;
  return absl::OkStatus();
}

absl::Status TraceModel::ApplyFreeCompleted(const Event& e) {
  const bool small = e.small_pool();
  auto it = pending_hint_.valid && pending_hint_.addr == e.addr ? pending_hint_.it : blocks_.find(e.addr);
  if (it == blocks_.end() || !it->second.pending_free) {
    return absl::InvalidArgumentError(absl::StrCat("free_completed of ", HexAddress(e.addr), ", which was not freed"));
  }
  const Block b = it->second;
  const SegmentRanges::Range* seg = seg_ranges_.Find(e.addr, b.size);
  const auto next = std::next(it);  // the first block after it: its gap's end
  const BlockMap::value_type* prev = it != blocks_.begin() ? &*std::prev(it) : nullptr;  // its gap's start
  spare_.node = blocks_.extract(it);
  pending_hint_.valid = false;
  Change(stats_.active, small, -1);
  Change(stats_.active_bytes, small, -static_cast<std::int64_t>(b.size));
  Change(stats_.requested_bytes, small, -static_cast<std::int64_t>(b.requested));
  if (seg != nullptr) {
    const auto [split_delta, split_bytes_delta] = InactiveDelta(*seg, e.addr, b.size, prev, next);
    Change(stats_.inactive_split, small, -split_delta);
    Change(stats_.inactive_split_bytes, small, -split_bytes_delta);
  }
  return absl::OkStatus();
}

absl::Status TraceModel::ApplySegmentAlloc(const Event& e) {
  const bool small = e.small_pool();
  const auto size = static_cast<std::int64_t>(e.size);
  auto next = segments_.lower_bound(e.addr);
  if ((next != segments_.end() && next->first < e.addr + e.size) ||
      (next != segments_.begin() && std::prev(next)->first + std::prev(next)->second.size > e.addr)) {
    return absl::InvalidArgumentError(absl::StrCat("segment_alloc at ", HexAddress(e.addr), " overlaps a segment"));
  }
  PutSegment(e.addr, Segment{e.size, e.stream, small, false, e.pool()});
  Change(stats_.segment, small, 1);
  Change(stats_.reserved_bytes, small, size);
  if (e.size >= max_split_size_) stats_.oversize_segments.Increase(1);
  ++stats_.num_device_alloc;
  return absl::OkStatus();
}

absl::Status TraceModel::ApplySegmentFree(const Event& e) {
  const bool small = e.small_pool();
  const auto size = static_cast<std::int64_t>(e.size);
  auto it = segments_.find(e.addr);
  if (it == segments_.end() || it->second.size != e.size || it->second.expandable) {
    return absl::InvalidArgumentError(absl::StrCat("segment_free of ", HexAddress(e.addr), ", which is not a segment"));
  }
  auto b = blocks_.lower_bound(e.addr);
  if (b != blocks_.end() && b->first < e.addr + e.size) {
    return absl::InvalidArgumentError(absl::StrCat("segment_free of ", HexAddress(e.addr), " while it holds blocks"));
  }
  Change(stats_.segment, small, -1);
  Change(stats_.reserved_bytes, small, -size);
  if (e.size >= max_split_size_) stats_.oversize_segments.Decrease(1);
  ++stats_.num_device_free;
  EraseSegment(it);
  return absl::OkStatus();
}

absl::Status TraceModel::ApplySegmentMap(const Event& e) {
  const bool small = e.small_pool();
  const auto size = static_cast<std::int64_t>(e.size);
  // A mapped range joins the mapped ranges right before and after it.
  std::uint64_t start = e.addr;
  std::uint64_t length = e.size;
  auto next = segments_.lower_bound(e.addr);
  if (next != segments_.end() && next->first < e.addr + e.size) {
    return absl::InvalidArgumentError(absl::StrCat("segment_map at ", HexAddress(e.addr), " overlaps a segment"));
  }
  if (next != segments_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > e.addr) {
      return absl::InvalidArgumentError(absl::StrCat("segment_map at ", HexAddress(e.addr), " overlaps a segment"));
    }
    if (prev->second.expandable && prev->first + prev->second.size == e.addr && prev->second.stream == e.stream &&
        prev->second.small == small && prev->second.pool == e.pool()) {
      start = prev->first;
      length += prev->second.size;
      EraseSegment(prev);
    }
  }
  next = segments_.lower_bound(e.addr + e.size);
  if (next != segments_.end() && next->first == e.addr + e.size && next->second.expandable &&
      next->second.stream == e.stream && next->second.small == small && next->second.pool == e.pool()) {
    length += next->second.size;
    EraseSegment(next);
  }
  PutSegment(start, Segment{length, e.stream, small, true, e.pool()});
  Change(stats_.reserved_bytes, small, size);
  ++stats_.num_device_alloc;
  return absl::OkStatus();
}

absl::Status TraceModel::ApplySegmentUnmap(const Event& e) {
  const bool small = e.small_pool();
  const auto size = static_cast<std::int64_t>(e.size);
  auto seg = FindSegment(e.addr, e.size);
  if (seg == segments_.end() || !seg->second.expandable) {
    return absl::InvalidArgumentError(absl::StrCat("segment_unmap of ", HexAddress(e.addr), ", which is not mapped"));
  }
  auto b = blocks_.lower_bound(e.addr);
  if (b != blocks_.end() && b->first < e.addr + e.size) {
    return absl::InvalidArgumentError(absl::StrCat("segment_unmap of ", HexAddress(e.addr), " while it holds blocks"));
  }
  const std::uint64_t start = seg->first;
  const Segment s = seg->second;
  EraseSegment(seg);
  if (e.addr > start) PutSegment(start, Segment{e.addr - start, s.stream, s.small, true, s.pool});
  const std::uint64_t end = start + s.size;
  if (e.addr + e.size < end) {
    PutSegment(e.addr + e.size, Segment{end - (e.addr + e.size), s.stream, s.small, true, s.pool});
  }
  Change(stats_.reserved_bytes, small, -size);
  ++stats_.num_device_free;
  return absl::OkStatus();
}

absl::Status TraceModel::Apply(const Event& e, std::uint32_t stack) {
  // Events come from files: sizes beyond any device, or address ranges that
  // wrap around, would overflow the stats arithmetic. Refuse them. Requests
  // that did not change memory (an OOM, a retry, of any size) are counted only.
  if (ChangesMemory(e.type) &&
      (e.size > kMaxEventSize || e.requested_size > kMaxEventSize || e.addr > UINT64_MAX - e.size)) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(EventTypeName(e.type)), " of ", e.size, " B at ",
                                                   HexAddress(e.addr), " is not a plausible device allocation"));
  }
  switch (e.type) {
    case EventType::kAlloc: return ApplyAlloc(e, stack);
    case EventType::kFreeRequested: return ApplyFreeRequested(e);
    case EventType::kFreeCompleted: return ApplyFreeCompleted(e);
    case EventType::kSegmentAlloc: return ApplySegmentAlloc(e);
    case EventType::kSegmentFree: return ApplySegmentFree(e);
    case EventType::kSegmentMap: return ApplySegmentMap(e);
    case EventType::kSegmentUnmap: return ApplySegmentUnmap(e);
    case EventType::kOom: ++stats_.num_ooms; return absl::OkStatus();
    case EventType::kAllocRetry: ++stats_.num_alloc_retries; return absl::OkStatus();
    case EventType::kSyncAllStreams: ++stats_.num_sync_all_streams; return absl::OkStatus();
    case EventType::kEmptyCache:
    case EventType::kPhaseBegin:
    case EventType::kPhaseEnd:
    case EventType::kMark:
    case EventType::kCollectiveBegin:
    case EventType::kCollectiveEnd: return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown event type ", static_cast<int>(e.type)));
}

std::vector<SegmentInfo> TraceModel::Snapshot(int device, const std::vector<PoolId>& pools) const {
  std::vector<SegmentInfo> result;
  for (const auto& [addr, seg] : segments_) {
    SegmentInfo& info = result.emplace_back();
    info.device = device;
    info.address = addr;
    info.total_size = seg.size;
    info.stream = seg.stream;
    info.is_large = !seg.small;
    info.is_expandable = seg.expandable;
    if (seg.pool != 0 && seg.pool < pools.size()) info.pool_id = pools[seg.pool];
    const std::uint64_t end = addr + seg.size;
    std::uint64_t cursor = addr;
    auto add_free = [&](std::uint64_t from, std::uint64_t to) {
      if (to > from) info.blocks.push_back(BlockInfo{from, to - from, 0, BlockState::kInactive});
    };
    for (auto it = blocks_.lower_bound(addr); it != blocks_.end() && it->first < end; ++it) {
      add_free(cursor, it->first);
      const Block& b = it->second;
      info.blocks.push_back(BlockInfo{it->first, b.size, b.requested,
                                      b.pending_free ? BlockState::kActivePendingFree : BlockState::kActiveAllocated});
      if (!b.pending_free) info.allocated_size += b.size;
      info.active_size += b.size;
      info.requested_size += b.requested;
      cursor = it->first + b.size;
    }
    add_free(cursor, end);
  }
  return result;
}

FragmentationInfo TraceModel::Fragmentation() const {
  FragmentationInfo f;
  f.reserved = reserved();
  f.allocated = allocated();
  f.reserved_minus_allocated = f.reserved - std::min(f.reserved, f.allocated);
  f.inactive_split_bytes = static_cast<std::uint64_t>(All(stats_.inactive_split_bytes).current);
  f.segments = segments_.size();
  for (const auto& [addr, seg] : segments_) {
    const std::uint64_t end = addr + seg.size;
    // An expandable segment's pages: release_blocks unmaps the whole pages of each free block.
    const std::uint64_t page = seg.small ? kSmallBuffer : kLargeBuffer;
    std::uint64_t cursor = addr, free = 0, releasable = 0;
    bool live = false;
    // (copies: clang 14, scripts/fuzz's compiler, cannot capture structured bindings)
    const std::uint64_t base = addr;
    const bool expandable = seg.expandable;
    auto gap = [&](std::uint64_t from, std::uint64_t to) {
      if (to <= from) return;
      free += to - from;
      f.largest_free_block = std::max(f.largest_free_block, to - from);
      ++f.free_blocks;
      if (!expandable) return;
      const std::uint64_t first = base + (from - base + page - 1) / page * page;
      const std::uint64_t last = base + (to - base) / page * page;
      if (last > first) releasable += last - first;
    };
    for (auto it = blocks_.lower_bound(addr); it != blocks_.end() && it->first < end; ++it) {
      gap(cursor, it->first);
      cursor = it->first + it->second.size;
      live = true;
    }
    gap(cursor, end);
    if (seg.pool != 0) {
      releasable = 0;  // a private pool's segments stay while the pool lives (its release frees them)
    } else if (!live) {
      releasable = seg.size;
      ++f.releasable_segments;
    }
    f.free_in_segments += free;
    f.releasable_bytes += releasable;
    f.fragmented_bytes += free - releasable;
    if (free > releasable) ++f.fragmented_segments;
  }
  if (f.free_in_segments > 0) {
    f.fragmentation = 1.0 - static_cast<double>(f.largest_free_block) / static_cast<double>(f.free_in_segments);
  }
  return f;
}

}  // namespace memscope
