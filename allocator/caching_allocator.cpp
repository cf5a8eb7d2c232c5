// The caching allocator. The policy is described in caching_allocator.h; the
// functions below keep PyTorch's names (get_free_block, alloc_block,
// release_available_cached_blocks, free_block, ...) in CamelCase so that a
// reader can hold this file next to CUDACachingAllocator.cpp.
#include "allocator/caching_allocator.h"

#include <algorithm>
#include <compare>
#include <deque>
#include <mutex>
#include <utility>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "allocator/address_map.h"
#include "allocator/expandable_segment.h"
#include "allocator/free_block_set.h"
#include "allocator/record_sink.h"
#include "allocator/ska_map.h"
#include "base/clock.h"

namespace memscope {

std::string_view BlockStateName(BlockState state) {
  switch (state) {
    case BlockState::kActiveAllocated: return "active_allocated";
    case BlockState::kActivePendingFree: return "active_pending_free";
    case BlockState::kInactive: return "inactive";
  }
  return "unknown";
}

namespace {

struct BlockPool;

struct Block {
  DevicePtr ptr = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;
  StreamId stream = 0;
  BlockPool* pool = nullptr;
  Block* prev = nullptr;  // neighbours in the same segment, address order
  Block* next = nullptr;
  ExpandableSegment* expandable = nullptr;
  std::vector<StreamId> stream_uses;  // other streams that used it (distinct)
  std::int64_t gc_count_base = 0;     // pool's free-block lookups when cached
  int event_count = 0;                // outstanding stream events
  bool allocated = false;
  bool mapped = true;  // false only for unmapped ranges of expandable segments
  // The record id of its alloc in the attached RecordSink (0: not recorded there).
  std::uint64_t record_id = 0;
  // Where the block was put in its pool's FreeBlockSet (a hint for FindNear).
  std::uint32_t pool_chunk = 0;
  std::uint32_t pool_index = 0;

  template <typename It>
  void set_pool_position(const It& it) {
    pool_chunk = it.chunk();
    pool_index = it.index();
  }

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// Free blocks are ordered by (stream, size, address), PyTorch's order: the
// first block not below (stream, size, 0) is the best fit on that stream.
// Each stream has its own FreeBlockSet ordered by (size, address), so a
// search reads only that stream's keys, stored by value.
struct AddressKey {
  StreamId stream;
  DevicePtr ptr;
  auto operator<=>(const AddressKey&) const = default;
};

using FreeBlocks = FreeBlockSet<Block*>;

inline FreeKey KeyOf(const Block* b) { return FreeKey{b->size, b->ptr}; }

struct BlockPool {
  explicit BlockPool(bool small, std::uint16_t pool_index = 0) : is_small(small), index(pool_index) {}
  // Free, mapped blocks: one set per stream, in stream order.
  std::vector<std::pair<StreamId, std::unique_ptr<FreeBlocks>>> streams;
  absl::btree_map<AddressKey, Block*> unmapped;  // unmapped expandable ranges
  const bool is_small;
  const std::uint16_t index;                    // 0: the default pool; else its private pool's index
  std::int64_t get_free_blocks_call_count = 0;  // ages blocks for GC

  // The free blocks of `stream`, or nullptr if it never had any.
  FreeBlocks* Find(StreamId stream) const {
    if (!streams.empty() && streams.front().first == stream) return streams.front().second.get();  // the usual case
    for (const auto& [s, set] : streams) {
      if (s == stream) return set.get();
    }
    return nullptr;
  }
  FreeBlocks& Get(StreamId stream) {
    if (FreeBlocks* set = Find(stream)) return *set;
    return AddStream(stream);
  }
  FreeBlocks& AddStream(StreamId stream) {
    auto it = std::lower_bound(streams.begin(), streams.end(), stream,
                               [](const auto& entry, StreamId s) { return entry.first < s; });
    return *streams.emplace(it, stream, std::make_unique<FreeBlocks>())->second;
  }

  // Invariant: a block's key is taken from its fields, so a block must be
  // erased before its size or address changes and inserted again after.
  [[gnu::always_inline]] void Insert(Block* b) {
    b->gc_count_base = get_free_blocks_call_count;
    b->set_pool_position(Get(b->stream).Insert(KeyOf(b), b));
  }
  void Erase(Block* b) {
    FreeBlocks* set = Find(b->stream);
    if (set == nullptr) return;
    auto it = set->FindNear(KeyOf(b), b->pool_chunk, b->pool_index);
    if (it != set->end()) set->Erase(it);
  }
  bool Contains(const Block* b) const {
    const FreeBlocks* set = Find(b->stream);
    if (set == nullptr) return false;
    auto it = set->Find(KeyOf(b));
    return it != set->end() && it->value == b;
  }
  std::size_t size() const {
    std::size_t n = 0;
    for (const auto& entry : streams) n += entry.second->size();
    return n;
  }
  // Calls f(Block*) for every free block in (stream, size, address) order.
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& entry : streams) {
      for (const auto& e : *entry.second) f(e.value);
    }
  }
  void InsertUnmapped(Block* b) { unmapped.emplace(AddressKey{b->stream, b->ptr}, b); }
  void EraseUnmapped(Block* b) { unmapped.erase(AddressKey{b->stream, b->ptr}); }
};

// Recycles Block objects so that splitting a block does not call the heap.
class BlockArena {
 public:
  [[gnu::always_inline]] Block* New() {
    if (free_.empty()) Grow();
    Block* b = free_.back();
    free_.pop_back();
    return b;
  }
  void Delete(Block* b) {
    // Field by field: keeps stream_uses' buffer (empty) for the next user.
    b->ptr = 0;
    b->size = 0;
    b->requested_size = 0;
    b->stream = 0;
    b->pool = nullptr;
    b->prev = b->next = nullptr;
    b->expandable = nullptr;
    b->stream_uses.clear();
    b->gc_count_base = 0;
    b->event_count = 0;
    b->allocated = false;
    b->mapped = true;
    b->pool_chunk = b->pool_index = 0;
    b->record_id = 0;
    free_.push_back(b);
  }

 private:
  [[gnu::noinline]] void Grow() {
    chunks_.push_back(std::make_unique<Block[]>(kChunk));
    for (std::size_t i = 0; i < kChunk; ++i) free_.push_back(&chunks_.back()[kChunk - 1 - i]);
  }

  static constexpr std::size_t kChunk = 256;
  std::vector<std::unique_ptr<Block[]>> chunks_;
  std::vector<Block*> free_;
};

void Splice(Block* b, Block* before, Block* after) {
  if (before != nullptr) before->next = b;
  b->prev = before;
  if (after != nullptr) after->prev = b;
  b->next = after;
}

constexpr std::size_t kOneExaByte = 1152921504606846976ULL;

// PyTorch's PrivatePool: a CUDA graph's or a MemPool's own cached blocks.
struct PrivatePool {
  PrivatePool(PoolId pool_id, std::uint16_t index)
      : id(pool_id), large_blocks(false, index), small_blocks(true, index) {}
  PoolId id;
  BlockPool large_blocks;
  BlockPool small_blocks;
  // Released (use_count 0, graph_pools_freeable): empty_cache frees its segments.
  bool freeable = false;
};

}  // namespace

struct CachingAllocator::Impl {
  Impl(Device& d, const AllocatorConfig& c) : device(d), config(c) {
    stats.max_split_size = static_cast<std::int64_t>(config.max_split_size);
    plain_rounding = std::all_of(config.roundup_power2_divisions.begin(), config.roundup_power2_divisions.end(),
                                 [](std::size_t divisions) { return divisions <= 1; });
  }
  ~Impl();

  struct AllocParams {
    StreamId stream;
    std::size_t size;  // rounded
    BlockPool* pool;
    std::size_t alloc_size;
    Block* block = nullptr;
    // Where GetFreeBlock found `block`: it stays in its pool until
    // AllocFoundBlock erases it or replaces it by the split remainder.
    FreeBlocks* found_in = nullptr;
    FreeBlocks::Iterator found_at;
    absl::Status err;
    // A device error other than out-of-memory ends the request at once.
    bool fatal() const { return !err.ok() && !absl::IsResourceExhausted(err); }
  };

  Device& device;
  const AllocatorConfig& config;
  DeviceStats stats;
  BlockPool large_blocks{false};
  BlockPool small_blocks{true};
  std::vector<std::unique_ptr<PrivatePool>> private_pools;  // pool index i at [i - 1]
  // f(BlockPool&) for the default pools, then each private pool's.
  template <typename F>
  void ForEachPool(F&& f) const {
    f(small_blocks);
    f(large_blocks);
    for (const auto& pp : private_pools) {
      f(pp->small_blocks);
      f(pp->large_blocks);
    }
  }
  // The small or large side of private pool `index` for a rounded request of `size`.
  [[gnu::cold]] [[gnu::noinline]] BlockPool& PrivateBlockPool(std::uint16_t index, std::size_t size) {
    PrivatePool& pp = *private_pools[index - 1];
    return size <= kSmallSize ? pp.small_blocks : pp.large_blocks;
  }
  PoolId IdOf(const BlockPool& pool) const { return pool.index == 0 ? PoolId{} : private_pools[pool.index - 1]->id; }
  AddressMap<Block> allocated_blocks;
  absl::flat_hash_set<Block*> pending_free;  // freed, waiting on stream events
  // PyTorch's cuda_events: pending events by stream, walked in its
  // ska::flat_hash_map's slot order (allocator/ska_map.h).
  SkaMap<std::deque<std::pair<EventId, Block*>>> events{CudaStreamHash{static_cast<std::uint64_t>(device.index())}};
  absl::flat_hash_map<DevicePtr, std::size_t> segments;  // cudaMalloc'd: base -> size
  std::vector<std::unique_ptr<ExpandableSegment>> expandable_segments;
  std::size_t total_allocated_memory = 0;  // device memory held
  std::size_t allowed_memory_maximum = 0;
  bool set_fraction = false;
  // Garbage collection is on (a threshold and a memory fraction): lookups age blocks.
  bool count_free_block_lookups = false;
  AllocatorObserver* observer = nullptr;
  bool observer_wants_time = false;  // observer->wants_time(), read at SetObserver
  RecordSink* sink = nullptr;        // observer->record_sink(), read at SetObserver
  // `sink` while there is no private pool, else null: the sink's records
  // have no pool, so with private pools every event takes the slow way.
  RecordSink* fast_sink = nullptr;
  std::optional<OutOfMemoryInfo> last_oom;
  BlockArena arena;

  // config.max_split_size, read on every request: a copy saves a load.
  const std::size_t max_split_size = config.max_split_size;
  bool large_split_limit(std::size_t size) const { return size >= max_split_size; }

  // No roundup_power2_divisions: round_size is plain 512 B rounding, without
  // the table lookup.
  bool plain_rounding = true;
  std::size_t RoundSize(std::size_t size) const {
    if (!plain_rounding) return config.RoundSize(size);
    return size < kMinBlockSize ? kMinBlockSize : (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
  }

  // The time of the public call in progress, read once on its first event:
  // the events of one call (free_requested + free_completed, segment_alloc +
  // alloc) share it, and the clock is read once per call, not per event.
  std::int64_t call_time = 0;

  void Trace(TraceAction action, const BlockPool& pool, DevicePtr addr, std::size_t size, std::size_t requested,
             StreamId stream, std::uint64_t record_id = 0) {
    if (observer == nullptr) return;
    if (observer_wants_time && call_time == 0) call_time = FastNowNs();
    observer->OnEvent(
        TraceEvent{action, pool.is_small, addr, size, requested, stream, call_time, record_id, pool.index});
  }
  // The alloc of `block` (an observer is attached) that the sink could not write.
  [[gnu::cold]] [[gnu::noinline]] void TraceAllocSlow(Block* block, const BlockPool& pool) {
    const std::uint64_t seq = sink != nullptr ? sink->seq : 0;
    Trace(TraceAction::kAlloc, pool, block->ptr, block->size, block->requested_size, block->stream);
    block->record_id = sink != nullptr && sink->seq != seq ? sink->seq : 0;
  }
  // The free of `block`, completing at once, that the sink could not write.
  [[gnu::cold]] [[gnu::noinline]] void TraceFreeAtOnceSlow(const Block* block, const BlockPool& pool) {
    if (observer_wants_time && call_time == 0) call_time = FastNowNs();
    observer->OnFreeAtOnce(TraceEvent{TraceAction::kFreeRequested, pool.is_small, block->ptr, block->size,
                                      block->requested_size, block->stream, call_time, block->record_id, pool.index});
  }

  // `stats` keeps of each pool's Stat its current value, peak and
  // allocated total, and in `freed` the current value at the last
  // ResetAccumulatedStats (so freed = allocated - (current - that)); of the
  // aggregate ("all") only its peak: its current value and totals are the
  // sums of the pools'. Stats() fills all of them in. An increase touches
  // one Stat and, when it grows, the aggregate's peak; a decrease one value.
  [[gnu::always_inline]] static void Increase(StatArray& a, const BlockPool& pool, std::int64_t amount) {
    a[static_cast<int>(pool.is_small ? StatType::kSmallPool : StatType::kLargePool)].Increase(amount);
    Stat& all = a[static_cast<int>(StatType::kAll)];
    const std::int64_t current = AllCurrent(a);
    if (current > all.peak) all.peak = current;
  }
  [[gnu::always_inline]] static void Decrease(StatArray& a, const BlockPool& pool, std::int64_t amount) {
    a[static_cast<int>(pool.is_small ? StatType::kSmallPool : StatType::kLargePool)].current -= amount;
  }
  static std::int64_t AllCurrent(const StatArray& a) {
    return a[static_cast<int>(StatType::kSmallPool)].current + a[static_cast<int>(StatType::kLargePool)].current;
  }
  template <typename S, typename F>
  static void ForEachStatArray(S& s, F&& f) {
    for (auto* a : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes, &s.reserved_bytes,
                    &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
      f(*a);
    }
  }
  // torch.cuda.memory_stats(): `stats` with the aggregates filled in.
  DeviceStats Stats() const {
    DeviceStats s = stats;
    ForEachStatArray(s, [](StatArray& a) {
      Stat& all = a[static_cast<int>(StatType::kAll)];
      Stat& small = a[static_cast<int>(StatType::kSmallPool)];
      Stat& large = a[static_cast<int>(StatType::kLargePool)];
      for (Stat* pool : {&small, &large}) pool->freed = pool->allocated - (pool->current - pool->freed);
      all.current = small.current + large.current;
      all.allocated = small.allocated + large.allocated;
      all.freed = small.freed + large.freed;
    });
    return s;
  }

  [[gnu::always_inline]] inline absl::StatusOr<DevicePtr> Malloc(std::size_t orig_size, StreamId stream,
                                                                 std::uint16_t pool_index = 0);
  [[gnu::always_inline]] inline absl::Status Free(DevicePtr ptr);
  Block* AllocFoundBlock(AllocParams& p, std::size_t orig_size, bool split_remainder);
  bool ShouldSplit(const Block* block, std::size_t size) const;
  [[gnu::always_inline]] inline bool GetFreeBlock(AllocParams& p);
  void GarbageCollectCachedBlocks();
  bool AllocBlock(AllocParams& p, bool is_retry);
  bool ReleaseAvailableCachedBlocks(const AllocParams& p);
  void ReleaseCachedBlocks();
  void ReleaseBlocks(BlockPool& pool);
  void ReleaseBlock(Block* block);
  void ReleaseExpandableSegment(Block* block);
  // `traced`: the caller has reported its free_completed (Free, through OnFreeAtOnce).
  [[gnu::always_inline]] inline void FreeBlock(Block* block, bool traced = false);
  std::size_t TryMergeBlocks(Block* dst, Block* src, BlockPool& pool);
  static bool CanMerge(const Block* dst, const Block* src);
  [[gnu::always_inline]] inline std::size_t MergeBlocks(Block* dst, Block* src);
  void InsertEvents(Block* block);
  void ProcessEvents();
  void SynchronizeAndFreeEvents();
  Block* FindExpandableBlock(StreamId stream, BlockPool& pool, std::size_t size);
  bool MapBlock(Block* to_map, std::size_t size);
  Block* TryAllocateExpandableBlock(StreamId stream, BlockPool& pool, std::size_t size);
  void UnmapBlock(Block* block);
  absl::Status OutOfMemory(const AllocParams& p, std::size_t orig_size);
  std::vector<const Block*> AllBlocks() const;
  std::vector<SegmentInfo> Snapshot() const;
  absl::Status CheckInvariants() const;
  absl::Status CheckStatsMatch(const DeviceStats& recount) const;
};

CachingAllocator::Impl::~Impl() {
  for (std::size_t i = events.Begin(); i != events.End(); i = events.Next(i)) {
    for (auto& [event, block] : events.Value(i)) device.ReleaseEvent(event);
  }
  for (const auto& [ptr, size] : segments) (void)device.Free(ptr);
  expandable_segments.clear();  // unmaps pages and releases reservations
}

absl::StatusOr<DevicePtr> CachingAllocator::Impl::Malloc(std::size_t orig_size, StreamId stream,
                                                         std::uint16_t pool_index) {
  // (A request in a private pool runs while captures_underway is not empty:
  // no event processing, no release-all retry.)
  if (pool_index == 0) ProcessEvents();
  const std::size_t size = RoundSize(orig_size);
  BlockPool& pool =
      pool_index == 0 ? (size <= kSmallSize ? small_blocks : large_blocks) : PrivateBlockPool(pool_index, size);
  AllocParams p{stream, size, &pool, AllocationSize(size), nullptr, nullptr, {}, absl::OkStatus()};

  bool found = GetFreeBlock(p);
  if (!found) {
    if (set_fraction && config.garbage_collection_threshold > 0.0) GarbageCollectCachedBlocks();
    found = AllocBlock(p, /*is_retry=*/false);
    if (!found && p.fatal()) return p.err;
    if (!found && ReleaseAvailableCachedBlocks(p)) {
      found = AllocBlock(p, false);
      if (!found && p.fatal()) return p.err;
    }
    if (!found && pool_index == 0) {
      ReleaseCachedBlocks();
      found = AllocBlock(p, /*is_retry=*/true);
      if (!found && p.fatal()) return p.err;
    }
  }
  if (!found) return OutOfMemory(p, orig_size);

  Block* block = AllocFoundBlock(p, orig_size, ShouldSplit(p.block, size));
  return block->ptr;
}

Block* CachingAllocator::Impl::AllocFoundBlock(AllocParams& p, std::size_t orig_size, bool split_remainder) {
  const std::size_t size = p.size;
  BlockPool& pool = *p.pool;
  Block* block = p.block;
  const bool already_split = block->is_split();
  if (!split_remainder && p.found_in != nullptr) p.found_in->Erase(p.found_at);
  if (split_remainder) {
    Block* remaining = block;
    block = arena.New();
    block->ptr = remaining->ptr;
    block->size = size;
    block->stream = p.stream;
    block->pool = &pool;
    block->expandable = remaining->expandable;
    block->prev = remaining->prev;
    if (block->prev != nullptr) block->prev->next = block;
    block->next = remaining;
    remaining->prev = block;
    remaining->ptr += size;
    remaining->size -= size;
    if (p.found_in != nullptr) {
      // The remainder takes the found block's place in the pool.
      remaining->gc_count_base = pool.get_free_blocks_call_count;
      remaining->set_pool_position(p.found_in->Replace(p.found_at, KeyOf(remaining), remaining));
    } else {
      pool.Insert(remaining);
    }
    if (already_split && block->expandable == nullptr) {
      // An inactive split shrinks by `size`.
      Decrease(stats.inactive_split_bytes, pool, static_cast<std::int64_t>(size));
    } else if (block->expandable == nullptr) {
      // A new inactive split is carved out of a whole block.
      Increase(stats.inactive_split_bytes, pool, static_cast<std::int64_t>(remaining->size));
      Increase(stats.inactive_split, pool, 1);
    }
  } else if (already_split && block->expandable == nullptr) {
    // An inactive split becomes active.
    Decrease(stats.inactive_split_bytes, pool, static_cast<std::int64_t>(block->size));
    Decrease(stats.inactive_split, pool, 1);
  }

  block->allocated = true;
  block->requested_size = orig_size;
  allocated_blocks.Insert(block->ptr, block);
  // The sink first (the recorded path tests one pointer; the plain path two).
  if (fast_sink != nullptr) {  // (then an observer is attached)
    if (fast_sink->TryAlloc(block->ptr, block->size, orig_size, block->stream, pool.is_small)) {
      block->record_id = fast_sink->seq;
    } else {
      TraceAllocSlow(block, pool);
    }
  } else if (observer != nullptr) {
    TraceAllocSlow(block, pool);
  } else {
    block->record_id = 0;
  }

  Increase(stats.allocation, pool, 1);
  Increase(stats.allocated_bytes, pool, static_cast<std::int64_t>(block->size));
  Increase(stats.active, pool, 1);
  Increase(stats.active_bytes, pool, static_cast<std::int64_t>(block->size));
  Increase(stats.requested_bytes, pool, static_cast<std::int64_t>(block->requested_size));
  if (large_split_limit(block->size)) stats.oversize_allocations.Increase(1);
  return block;
}

bool CachingAllocator::Impl::ShouldSplit(const Block* block, std::size_t size) const {
  const std::size_t remaining = block->size - size;
  if (block->pool->is_small || config.expandable_segments) return remaining >= kMinBlockSize;
  return size < max_split_size && remaining > kSmallSize;
}

bool CachingAllocator::Impl::GetFreeBlock(AllocParams& p) {
  BlockPool& pool = *p.pool;
  if (count_free_block_lookups) ++pool.get_free_blocks_call_count;
  FreeBlocks* set = pool.Find(p.stream);
  if (set == nullptr) return false;
  auto it = set->LowerBoundSize(p.size);
  if (it == set->end()) return false;

  if (it->value->expandable != nullptr) {
    if (config.expandable_segments) {
      // A free block at the end of an expandable segment can grow into the
      // unmapped range after it: best fit compares what blocks can become.
      auto expandable_size = [](const Block* b) {
        return b->size + (b->next != nullptr && !b->next->mapped ? b->next->size : 0);
      };
      auto next = std::next(it);
      while (it->value->expandable != nullptr && next != set->end() &&
             expandable_size(next->value) < expandable_size(it->value)) {
        it = next++;
      }
    } else {
      // Expandable segments were turned off after some were made: skip them.
      do {
        ++it;
      } while (it != set->end() && it->value->expandable != nullptr);
      if (it == set->end()) return false;
    }
  }

  const std::size_t block_size = it->value->size;
  // Do not return an oversize block for a request below max_split_size...
  if (p.size < max_split_size && block_size >= max_split_size) return false;
  // ...and round an oversize request up only within max_non_split_rounding.
  if (p.size >= max_split_size && block_size >= p.size + config.max_non_split_rounding_size) return false;
  p.block = it->value;
  p.found_in = set;
  p.found_at = it;
  return true;
}

void CachingAllocator::Impl::GarbageCollectCachedBlocks() {
  // Free unsplit cached large blocks that have waited for at least the
  // average number of free-block lookups, oldest first, until reserved memory
  // is back under the threshold (computed from the allowed maximum).
  const auto gc_threshold =
      static_cast<std::size_t>(config.garbage_collection_threshold * static_cast<double>(allowed_memory_maximum));
  if (total_allocated_memory <= gc_threshold) return;
  const std::size_t target_size = total_allocated_memory - gc_threshold;
  std::size_t gc_reclaimed = 0;
  auto age = [&](const Block* b) { return large_blocks.get_free_blocks_call_count - b->gc_count_base; };
  auto freeable = [](const Block* b) { return !b->is_split() && b->expandable == nullptr; };

  std::int64_t total_age = 0;
  int freeable_block_count = 0;
  large_blocks.ForEach([&](const Block* b) {
    if (freeable(b)) {
      total_age += age(b);
      ++freeable_block_count;
    }
  });
  if (freeable_block_count == 0) return;

  bool block_freed = true;
  while (gc_reclaimed < target_size && block_freed && freeable_block_count > 0) {
    const double age_threshold = static_cast<double>(total_age) / freeable_block_count;
    block_freed = false;
    std::vector<Block*> victims;
    large_blocks.ForEach([&](Block* b) {
      if (freeable(b) && static_cast<double>(age(b)) >= age_threshold) victims.push_back(b);
    });
    for (Block* b : victims) {
      block_freed = true;
      gc_reclaimed += b->size;
      total_age -= age(b);
      --freeable_block_count;
      ReleaseBlock(b);
    }
  }
}

bool CachingAllocator::Impl::AllocBlock(AllocParams& p, bool is_retry) {
  const std::size_t size = p.alloc_size;
  if (is_retry) {
    ++stats.num_alloc_retries;
    Trace(TraceAction::kAllocRetry, *p.pool, 0, p.alloc_size, p.size, p.stream);
  }

  if (set_fraction && total_allocated_memory + size > allowed_memory_maximum) {
    p.err = absl::ResourceExhaustedError("over the per-process memory fraction");
    return false;
  }
  if (config.expandable_segments) {
    p.block = TryAllocateExpandableBlock(p.stream, *p.pool, p.size);
    p.err = p.block != nullptr ? absl::OkStatus() : absl::ResourceExhaustedError("cannot map pages");
    return p.block != nullptr;
  }
  absl::StatusOr<DevicePtr> ptr = device.Malloc(size);
  if (!ptr.ok()) {
    p.err = ptr.status();
    return false;
  }
  p.err = absl::OkStatus();
  total_allocated_memory += size;
  Block* block = arena.New();
  block->ptr = *ptr;
  block->size = size;
  block->stream = p.stream;
  block->pool = p.pool;
  p.block = block;
  segments.emplace(*ptr, size);
  Increase(stats.segment, *p.pool, 1);
  Increase(stats.reserved_bytes, *p.pool, static_cast<std::int64_t>(size));
  if (large_split_limit(size)) stats.oversize_segments.Increase(1);
  ++stats.num_device_alloc;
  Trace(TraceAction::kSegmentAlloc, *p.pool, *ptr, size, 0, p.stream);
  return true;
}

bool CachingAllocator::Impl::ReleaseAvailableCachedBlocks(const AllocParams& p) {
  // Free one cached oversize block big enough for the request, or else
  // oversize blocks from the largest down until enough is freed.
  if (config.max_split_size_unlimited()) return false;
  BlockPool& pool = *p.pool;
  const std::size_t key_size = std::max(p.size, config.max_split_size);
  auto releasable = [](const Block* b) { return !b->is_split() && b->expandable == nullptr; };
  FreeBlocks* set = pool.Find(p.stream);
  if (set == nullptr) return false;
  auto it = set->LowerBound(FreeKey{key_size, 0});
  if (it == set->end()) {
    if (it == set->begin()) return false;
    std::size_t total_released = 0;
    std::vector<Block*> victims;  // collected first: erasing invalidates iterators
    --it;
    while (total_released < key_size && it->value->size >= config.max_split_size && releasable(it->value)) {
      total_released += it->value->size;
      victims.push_back(it->value);
      if (it == set->begin()) break;
      --it;
    }
    for (Block* b : victims) ReleaseBlock(b);
    return total_released >= key_size;
  }
  if (!releasable(it->value)) return false;
  ReleaseBlock(it->value);
  return true;
}

void CachingAllocator::Impl::ReleaseCachedBlocks() {
  SynchronizeAndFreeEvents();
  ReleaseBlocks(large_blocks);
  ReleaseBlocks(small_blocks);
  // graph_pools_freeable: released private pools, small blocks first.
  for (const auto& pp : private_pools) {
    if (!pp->freeable) continue;
    ReleaseBlocks(pp->small_blocks);
    ReleaseBlocks(pp->large_blocks);
  }
}

void CachingAllocator::Impl::ReleaseBlocks(BlockPool& pool) {
  std::vector<Block*> to_release;
  std::vector<Block*> to_unmap;
  pool.ForEach([&](Block* b) {
    if (b->expandable != nullptr) {
      to_unmap.push_back(b);
    } else if (!b->is_split()) {
      to_release.push_back(b);
    }
  });
  for (Block* b : to_release) ReleaseBlock(b);
  for (Block* b : to_unmap) {
    UnmapBlock(b);
    if (b->prev == nullptr && b->next == nullptr) ReleaseExpandableSegment(b);
  }
}

void CachingAllocator::Impl::ReleaseBlock(Block* block) {
  BlockPool& pool = *block->pool;
  ++stats.num_device_free;
  Trace(TraceAction::kSegmentFree, pool, block->ptr, block->size, 0, block->stream);
  (void)device.Free(block->ptr);
  segments.erase(block->ptr);
  total_allocated_memory -= block->size;
  Decrease(stats.segment, pool, 1);
  Decrease(stats.reserved_bytes, pool, static_cast<std::int64_t>(block->size));
  if (large_split_limit(block->size)) stats.oversize_segments.Decrease(1);
  pool.Erase(block);
  arena.Delete(block);
}

void CachingAllocator::Impl::ReleaseExpandableSegment(Block* block) {
  block->pool->EraseUnmapped(block);
  auto it = std::find_if(expandable_segments.begin(), expandable_segments.end(),
                         [&](const auto& es) { return es.get() == block->expandable; });
  if (it != expandable_segments.end()) expandable_segments.erase(it);
  arena.Delete(block);
}

absl::Status CachingAllocator::Impl::Free(DevicePtr ptr) {
  Block* block = allocated_blocks.Erase(ptr);
  if (block == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("invalid device pointer: 0x", absl::Hex(ptr)));
  }
  block->allocated = false;
  BlockPool& pool = *block->pool;
  Decrease(stats.allocation, pool, 1);
  Decrease(stats.allocated_bytes, pool, static_cast<std::int64_t>(block->size));
  if (large_split_limit(block->size)) stats.oversize_allocations.Decrease(1);
  if (!block->stream_uses.empty()) {
    Trace(TraceAction::kFreeRequested, pool, block->ptr, block->size, block->requested_size, block->stream,
          block->record_id);
    InsertEvents(block);
  } else {
    // free_requested and free_completed at once: one observer call.
    if (fast_sink != nullptr) {  // (then an observer is attached)
      if (!fast_sink->TryFreeAtOnce(block->ptr, block->size, block->stream, block->record_id))
        TraceFreeAtOnceSlow(block, pool);
    } else if (observer != nullptr) {
      TraceFreeAtOnceSlow(block, pool);
    }
    FreeBlock(block, /*traced=*/true);
  }
  return absl::OkStatus();
}

void CachingAllocator::Impl::FreeBlock(Block* block, bool traced) {
  BlockPool& pool = *block->pool;
  if (!traced) Trace(TraceAction::kFreeCompleted, pool, block->ptr, block->size, block->requested_size, block->stream);
  const std::size_t original_block_size = block->size;
  const std::size_t requested_size = block->requested_size;
  std::int64_t net_inactive_blocks = 0;
  std::int64_t net_inactive_bytes = 0;
  // The merged block takes the place of the first neighbour it absorbs in
  // the pool (one move instead of an erase and an insert).
  bool replaces = false;
  FreeKey replaced_key;  // the absorbed neighbour's key and place (it is recycled by the merge)
  std::uint32_t replaced_chunk = 0;
  std::uint32_t replaced_index = 0;
  Block* const merge_candidates[2] = {block->prev, block->next};
  for (Block* candidate : merge_candidates) {
    if (!CanMerge(block, candidate)) continue;
    if (replaces) {
      pool.Erase(candidate);
    } else {
      replaces = true;
      replaced_key = KeyOf(candidate);
      replaced_chunk = candidate->pool_chunk;
      replaced_index = candidate->pool_index;
    }
    const std::size_t subsumed = MergeBlocks(block, candidate);
    net_inactive_blocks -= 1;
    net_inactive_bytes -= static_cast<std::int64_t>(subsumed);
  }
  if (!pending_free.empty()) pending_free.erase(block);  // a hash lookup saved on the common path
  if (replaces) {
    FreeBlocks& set = pool.Get(block->stream);
    block->gc_count_base = pool.get_free_blocks_call_count;
    auto at = set.FindNear(replaced_key, replaced_chunk, replaced_index);
    block->set_pool_position(set.Replace(at, KeyOf(block), block));
  } else {
    pool.Insert(block);
  }
  if (block->is_split()) {
    net_inactive_blocks += 1;
    net_inactive_bytes += static_cast<std::int64_t>(block->size);
  }
  // Wholly free pages of expandable segments can always be released, so
  // PyTorch leaves them out of inactive_split; so do we.
  if (block->expandable == nullptr) {
    if (net_inactive_blocks > 0) Increase(stats.inactive_split, pool, net_inactive_blocks);
    if (net_inactive_blocks < 0) Decrease(stats.inactive_split, pool, -net_inactive_blocks);
    if (net_inactive_bytes > 0) Increase(stats.inactive_split_bytes, pool, net_inactive_bytes);
    if (net_inactive_bytes < 0) Decrease(stats.inactive_split_bytes, pool, -net_inactive_bytes);
  }
  Decrease(stats.active, pool, 1);
  Decrease(stats.active_bytes, pool, static_cast<std::int64_t>(original_block_size));
  Decrease(stats.requested_bytes, pool, static_cast<std::int64_t>(requested_size));
}

bool CachingAllocator::Impl::CanMerge(const Block* dst, const Block* src) {
  return src != nullptr && !src->allocated && src->event_count == 0 && src->stream_uses.empty() &&
         dst->mapped == src->mapped;
}

std::size_t CachingAllocator::Impl::TryMergeBlocks(Block* dst, Block* src, BlockPool& pool) {
  if (!CanMerge(dst, src)) return 0;
  if (src->mapped) {
    pool.Erase(src);
  } else {
    pool.EraseUnmapped(src);
  }
  return MergeBlocks(dst, src);
}

// Absorbs free neighbour `src` (already out of its pool) into `dst`; returns its size.
std::size_t CachingAllocator::Impl::MergeBlocks(Block* dst, Block* src) {
  if (dst->prev == src) {  // [src dst]
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev != nullptr) dst->prev->next = dst;
  } else {  // [dst src]
    dst->next = src->next;
    if (dst->next != nullptr) dst->next->prev = dst;
  }
  const std::size_t subsumed = src->size;
  dst->size += subsumed;
  arena.Delete(src);
  return subsumed;
}

void CachingAllocator::Impl::InsertEvents(Block* block) {
  // In the order of PyTorch's stream_uses (a ska::flat_hash_set, filled in
  // record_stream order): it decides which stream's queue each event joins
  // first, and so the slots of cuda_events.
  const auto insert = [&](StreamId stream) {
    events[stream].emplace_back(device.RecordEvent(stream), block);
    ++block->event_count;
  };
  if (block->stream_uses.size() == 1) {
    insert(block->stream_uses[0]);
  } else {
    SkaMap<char> uses(CudaStreamHash{static_cast<std::uint64_t>(device.index())});
    for (StreamId stream : block->stream_uses) uses[stream] = 1;
    for (std::size_t i = uses.Begin(); i != uses.End(); i = uses.Next(i)) insert(uses.Key(i));
  }
  block->stream_uses.clear();
  pending_free.insert(block);
}

void CachingAllocator::Impl::ProcessEvents() {
  if (events.empty()) return;
  for (std::size_t it = events.Begin(); it != events.End();) {
    auto& queue = events.Value(it);
    while (!queue.empty()) {
      auto [event, block] = queue.front();
      if (!device.QueryEvent(event)) break;
      device.ReleaseEvent(event);
      queue.pop_front();
      if (--block->event_count == 0) FreeBlock(block);
    }
    it = queue.empty() ? events.Erase(it) : events.Next(it);
  }
}

void CachingAllocator::Impl::SynchronizeAndFreeEvents() {
  ++stats.num_sync_all_streams;
  Trace(TraceAction::kSyncAllStreams, large_blocks, 0, 0, 0, 0);
  for (std::size_t i = events.Begin(); i != events.End(); i = events.Next(i)) {
    for (auto& [event, block] : events.Value(i)) {
      device.SynchronizeEvent(event);
      device.ReleaseEvent(event);
      if (--block->event_count == 0) FreeBlock(block);
    }
  }
  events.clear();
}

Block* CachingAllocator::Impl::FindExpandableBlock(StreamId stream, BlockPool& pool, std::size_t size) {
  // The lowest address in any segment of this stream where `size` bytes of
  // free and unmapped blocks follow each other.
  auto allocatable = [](const Block* b) {
    return b != nullptr && !b->allocated && b->event_count == 0 && b->stream_uses.empty();
  };
  auto has_available_address_space = [&](const Block* b) {
    std::size_t bytes = 0;
    while (bytes < size && allocatable(b)) {
      bytes += b->size;
      b = b->next;
    }
    return bytes >= size;
  };
  for (auto it = pool.unmapped.lower_bound(AddressKey{stream, 0});
       it != pool.unmapped.end() && it->first.stream == stream; ++it) {
    Block* c = it->second;
    if (allocatable(c->prev)) c = c->prev;
    if (has_available_address_space(c)) return c;
  }
  absl::StatusOr<std::unique_ptr<ExpandableSegment>> es =
      ExpandableSegment::Create(device, stream, pool.is_small ? kSmallBuffer : kLargeBuffer);
  if (!es.ok()) return nullptr;
  Block* candidate = arena.New();
  candidate->ptr = (*es)->ptr();
  candidate->size = (*es)->size();
  candidate->stream = stream;
  candidate->pool = &pool;
  candidate->mapped = false;
  candidate->expandable = es->get();
  expandable_segments.push_back(std::move(*es));
  pool.InsertUnmapped(candidate);
  return candidate;
}

bool CachingAllocator::Impl::MapBlock(Block* to_map, std::size_t size) {
  const SegmentRange mapped = to_map->expandable->Map(SegmentRange{to_map->ptr, size});
  if (mapped.size == 0) return false;
  BlockPool& pool = *to_map->pool;
  pool.EraseUnmapped(to_map);
  to_map->mapped = true;
  if (mapped.size < to_map->size) {
    Block* remaining = arena.New();
    remaining->ptr = to_map->ptr + mapped.size;
    remaining->size = to_map->size - mapped.size;
    remaining->stream = to_map->stream;
    remaining->pool = &pool;
    remaining->mapped = false;
    remaining->expandable = to_map->expandable;
    Splice(remaining, to_map, to_map->next);
    pool.InsertUnmapped(remaining);
    to_map->size = mapped.size;
  }
  TryMergeBlocks(to_map, to_map->prev, pool);
  TryMergeBlocks(to_map, to_map->next, pool);
  pool.Insert(to_map);

  total_allocated_memory += mapped.size;
  Increase(stats.reserved_bytes, pool, static_cast<std::int64_t>(mapped.size));
  ++stats.num_device_alloc;
  Trace(TraceAction::kSegmentMap, pool, mapped.ptr, mapped.size, 0, to_map->stream);
  return true;
}

Block* CachingAllocator::Impl::TryAllocateExpandableBlock(StreamId stream, BlockPool& pool, std::size_t size) {
  Block* candidate = FindExpandableBlock(stream, pool, size);
  if (candidate == nullptr) return nullptr;
  // candidate is now: unmapped -> null, unmapped -> free -> *, or free -> unmapped -> *
  if (!candidate->mapped && !MapBlock(candidate, std::min(candidate->size, size))) return nullptr;
  while (candidate->size < size) {
    // free -> unmapped -> *: map some of the unmapped range; it merges with candidate.
    Block* next = candidate->next;
    if (!MapBlock(next, std::min(size - candidate->size, next->size))) return nullptr;
    candidate = next;
  }
  pool.Erase(candidate);
  return candidate;
}

void CachingAllocator::Impl::UnmapBlock(Block* block) {
  const SegmentRange unmapped = block->expandable->Unmap(SegmentRange{block->ptr, block->size});
  if (unmapped.size == 0) return;
  BlockPool& pool = *block->pool;
  pool.Erase(block);
  const std::size_t before_size = unmapped.ptr - block->ptr;
  if (before_size > 0) {
    Block* before_free = arena.New();
    before_free->ptr = block->ptr;
    before_free->size = before_size;
    before_free->stream = block->stream;
    before_free->pool = &pool;
    before_free->expandable = block->expandable;
    Splice(before_free, block->prev, block);
    pool.Insert(before_free);
  }
  const std::size_t after_size = block->size - (before_size + unmapped.size);
  if (after_size > 0) {
    Block* after_free = arena.New();
    after_free->ptr = unmapped.ptr + unmapped.size;
    after_free->size = after_size;
    after_free->stream = block->stream;
    after_free->pool = &pool;
    after_free->expandable = block->expandable;
    Splice(after_free, block, block->next);
    pool.Insert(after_free);
  }
  block->ptr = unmapped.ptr;
  block->size = unmapped.size;
  block->mapped = false;
  TryMergeBlocks(block, block->prev, pool);
  TryMergeBlocks(block, block->next, pool);
  pool.InsertUnmapped(block);

  total_allocated_memory -= unmapped.size;
  Decrease(stats.reserved_bytes, pool, static_cast<std::int64_t>(unmapped.size));
  ++stats.num_device_free;
  Trace(TraceAction::kSegmentUnmap, pool, unmapped.ptr, unmapped.size, 0, block->stream);
}

absl::Status CachingAllocator::Impl::OutOfMemory(const AllocParams& p, std::size_t orig_size) {
  const DeviceMemoryInfo mem = device.MemoryInfo();
  Trace(TraceAction::kOom, *p.pool, mem.free_bytes, p.size, orig_size, p.stream);
  ++stats.num_ooms;

  OutOfMemoryInfo info;
  info.requested = orig_size;
  info.rounded = p.size;
  info.alloc_size = p.alloc_size;
  info.stream = p.stream;
  info.small_pool = p.pool->is_small;
  info.device_free = mem.free_bytes;
  info.device_total = mem.total_bytes;
  info.allocated = static_cast<std::size_t>(AllCurrent(stats.allocated_bytes));
  info.reserved = static_cast<std::size_t>(AllCurrent(stats.reserved_bytes));
  info.inactive_split = static_cast<std::size_t>(AllCurrent(stats.inactive_split_bytes));
  // The cache the request could have used: its own pool's small and large
  // blocks (the default pool's, or its private pool's).
  std::size_t free_blocks = 0;
  std::size_t in_private_pools = 0;  // PyTorch's "allocated in private pools": their cached free bytes
  ForEachPool([&](const BlockPool& pool) {
    pool.ForEach([&](const Block* b) {
      if (pool.index != 0) in_private_pools += b->size;
      if (pool.index != p.pool->index) return;
      info.cached_free += b->size;
      info.largest_free_block = std::max(info.largest_free_block, b->size);
      ++free_blocks;
    });
  });
  const std::string private_pool_msg =
      in_private_pools > 0
          ? absl::StrCat("with ", FormatSize(in_private_pools), " allocated in private pools (e.g., CUDA Graphs), ")
          : std::string();
  const std::string allowed_info =
      set_fraction ? absl::StrCat(FormatSize(allowed_memory_maximum), " allowed; ") : std::string();
  info.message = absl::StrCat(
      "CUDA out of memory. Tried to allocate ", FormatSize(p.alloc_size), ". GPU ", device.index(),
      " has a total capacity of ", FormatSize(mem.total_bytes), " of which ", FormatSize(mem.free_bytes), " is free. ",
      allowed_info, "Of the allocated memory ", FormatSize(info.allocated), " is allocated by PyTorch, ",
      private_pool_msg, "and ", FormatSize(info.reserved - info.allocated - in_private_pools),
      " is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.");
  info.diagnosis = absl::StrCat("memscope: the request of ", orig_size, " B needs a ", FormatSize(p.size), " block (",
                                p.pool->is_small ? "small" : "large", " pool, stream ", p.stream, "); the cache holds ",
                                FormatSize(info.cached_free), " free in ", Counted(free_blocks, "block"),
                                ", the largest ", FormatSize(info.largest_free_block), ", and ",
                                FormatSize(info.inactive_split), " of it is non-releasable (inactive split).");
  if (info.cached_free >= p.size) {
    absl::StrAppend(&info.diagnosis, " Fragmentation, not capacity: enough bytes are free but no free block fits.");
  } else if (set_fraction && mem.free_bytes >= p.alloc_size) {
    absl::StrAppend(&info.diagnosis, " The per-process memory fraction, not the device, is the limit.");
  }
  last_oom = info;
  return absl::ResourceExhaustedError(absl::StrCat(info.message, "\n", info.diagnosis));
}

std::vector<const Block*> CachingAllocator::Impl::AllBlocks() const {
  std::vector<const Block*> all;
  ForEachPool([&](const BlockPool& pool) { pool.ForEach([&](const Block* b) { all.push_back(b); }); });
  allocated_blocks.ForEach([&](DevicePtr, const Block* b) { all.push_back(b); });
  for (const Block* b : pending_free) all.push_back(b);
  return all;
}

std::vector<SegmentInfo> CachingAllocator::Impl::Snapshot() const {
  std::vector<SegmentInfo> result;
  for (const Block* head : AllBlocks()) {
    // Expandable segments report one segment per contiguous mapped range.
    if (head->prev != nullptr && head->prev->mapped) continue;
    SegmentInfo& seg = result.emplace_back();
    seg.device = device.index();
    seg.address = head->ptr;
    seg.stream = head->stream;
    seg.is_large = !head->pool->is_small;
    seg.is_expandable = head->expandable != nullptr;
    seg.pool_id = IdOf(*head->pool);
    for (const Block* b = head; b != nullptr && b->mapped; b = b->next) {
      BlockInfo& info = seg.blocks.emplace_back();
      info.address = b->ptr;
      info.size = b->size;
      info.requested_size = b->requested_size;
      const bool active = b->allocated || b->event_count > 0 || !b->stream_uses.empty();
      info.state = b->allocated ? BlockState::kActiveAllocated
                   : active     ? BlockState::kActivePendingFree
                                : BlockState::kInactive;
      seg.total_size += b->size;
      if (b->allocated) seg.allocated_size += b->size;
      if (active) {
        seg.active_size += b->size;
        seg.requested_size += b->requested_size;
      }
    }
  }
  std::sort(result.begin(), result.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) { return a.address < b.address; });
  return result;
}

absl::Status CachingAllocator::Impl::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  DeviceStats recount;
  std::size_t reserved = 0;
  // Walk every segment from its first block.
  absl::flat_hash_set<const Block*> seen;
  std::vector<const Block*> heads;
  for (const Block* b : AllBlocks()) {
    const Block* h = b;
    while (h->prev != nullptr) h = h->prev;
    if (seen.insert(h).second) heads.push_back(h);
  }
  absl::flat_hash_set<const ExpandableSegment*> expandables_seen;
  for (const Block* head : heads) {
    const int pool_index = head->pool->is_small ? 1 : 2;
    std::size_t total = 0;
    std::size_t mapped = 0;
    for (const Block* b = head; b != nullptr; b = b->next) {
      if (b->next != nullptr && (b->next->prev != b || b->next->ptr != b->ptr + b->size)) {
        return fail("blocks do not tile: block at 0x", absl::Hex(b->ptr), " size ", b->size, " is followed by 0x",
                    absl::Hex(b->next->ptr));
      }
      if (b->pool != head->pool || b->stream != head->stream || b->expandable != head->expandable) {
        return fail("block at 0x", absl::Hex(b->ptr), " disagrees with its segment");
      }
      total += b->size;
      if (b->mapped) mapped += b->size;
      const bool active = b->allocated || b->event_count > 0 || !b->stream_uses.empty();
      if (b->mapped && !active) {
        if (!b->pool->Contains(b)) {
          return fail("free block at 0x", absl::Hex(b->ptr), " is missing from its pool");
        }
        if (b->next != nullptr && b->next->mapped && !b->next->allocated && b->next->event_count == 0 &&
            b->next->stream_uses.empty()) {
          return fail("free neighbours not merged at 0x", absl::Hex(b->ptr));
        }
        if (b->is_split() && b->expandable == nullptr) {
          for (int t : {0, pool_index}) {
            recount.inactive_split[t].current += 1;
            recount.inactive_split_bytes[t].current += static_cast<std::int64_t>(b->size);
          }
        }
      }
      if (!b->mapped && b->pool->unmapped.find(AddressKey{b->stream, b->ptr}) == b->pool->unmapped.end()) {
        return fail("unmapped range at 0x", absl::Hex(b->ptr), " is missing from its pool");
      }
      for (int t : {0, pool_index}) {
        if (b->allocated) {
          recount.allocation[t].current += 1;
          recount.allocated_bytes[t].current += static_cast<std::int64_t>(b->size);
        }
        if (active) {
          recount.active[t].current += 1;
          recount.active_bytes[t].current += static_cast<std::int64_t>(b->size);
          recount.requested_bytes[t].current += static_cast<std::int64_t>(b->requested_size);
        }
      }
      if (b->allocated && b->size >= config.max_split_size) recount.oversize_allocations.current += 1;
    }
    if (head->expandable != nullptr) {
      expandables_seen.insert(head->expandable);
      if (total != head->expandable->size()) return fail("expandable segment blocks do not cover its reservation");
      if (mapped != head->expandable->mapped_bytes()) return fail("expandable segment: mapped blocks != mapped pages");
      for (int t : {0, pool_index}) recount.reserved_bytes[t].current += static_cast<std::int64_t>(mapped);
      reserved += mapped;
    } else {
      auto it = segments.find(head->ptr);
      if (it == segments.end() || it->second != total) {
        return fail("segment at 0x", absl::Hex(head->ptr), ": blocks cover ", total, " bytes, segment has ",
                    it == segments.end() ? 0 : it->second);
      }
      for (int t : {0, pool_index}) {
        recount.segment[t].current += 1;
        recount.reserved_bytes[t].current += static_cast<std::int64_t>(total);
      }
      if (total >= config.max_split_size) recount.oversize_segments.current += 1;
      reserved += total;
    }
  }
  // Expandable segments with nothing mapped have only an unmapped block, which
  // AllBlocks() does not list: count them from the pools.
  absl::Status lone = absl::OkStatus();
  ForEachPool([&](const BlockPool& pool) {
    for (const auto& [key, b] : pool.unmapped) {
      if (b->prev == nullptr && b->next == nullptr && b->size != b->expandable->size()) {
        lone = fail("lone unmapped range does not cover its reservation");
      }
    }
  });
  if (!lone.ok()) return lone;
  // Every cudaMalloc'd segment must have been reached from some block.
  if (segments.size() + expandables_seen.size() != heads.size()) return fail("a segment has no blocks");
  std::size_t pool_entries = 0;
  ForEachPool([&](const BlockPool& pool) { pool_entries += pool.size(); });
  std::size_t free_blocks = 0;
  for (const Block* head : heads) {
    for (const Block* b = head; b != nullptr; b = b->next) {
      if (b->mapped && !b->allocated && b->event_count == 0 && b->stream_uses.empty()) ++free_blocks;
    }
  }
  if (pool_entries != free_blocks) return fail("pools hold ", pool_entries, " blocks but ", free_blocks, " are free");
  if (reserved != total_allocated_memory) return fail("reserved recount ", reserved, " != ", total_allocated_memory);

  return CheckStatsMatch(recount);
}

// The allocator's stats against a recount from its blocks: every current
// value equal, no peak below its current value.
absl::Status CachingAllocator::Impl::CheckStatsMatch(const DeviceStats& recount) const {
  const DeviceStats mine = Stats();
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  auto check_array = [&](const char* name, const StatArray& actual, const StatArray& expected) -> absl::Status {
    for (std::size_t t = 0; t < kNumStatTypes; ++t) {
      if (actual[t].current != expected[t].current) {
        return fail("stat ", name, "[", t, "].current is ", actual[t].current, ", recount ", expected[t].current);
      }
      if (actual[t].current < 0 || actual[t].peak < actual[t].current) {
        return fail("stat ", name, "[", t, "] peak below current");
      }
    }
    return absl::OkStatus();
  };
  for (auto [name, a, e] :
       {std::tuple{"allocation", &mine.allocation, &recount.allocation},
        std::tuple{"segment", &mine.segment, &recount.segment}, std::tuple{"active", &mine.active, &recount.active},
        std::tuple{"inactive_split", &mine.inactive_split, &recount.inactive_split},
        std::tuple{"allocated_bytes", &mine.allocated_bytes, &recount.allocated_bytes},
        std::tuple{"reserved_bytes", &mine.reserved_bytes, &recount.reserved_bytes},
        std::tuple{"active_bytes", &mine.active_bytes, &recount.active_bytes},
        std::tuple{"inactive_split_bytes", &mine.inactive_split_bytes, &recount.inactive_split_bytes},
        std::tuple{"requested_bytes", &mine.requested_bytes, &recount.requested_bytes}}) {
    if (absl::Status s = check_array(name, *a, *e); !s.ok()) return s;
  }
  if (mine.oversize_allocations.current != recount.oversize_allocations.current) {
    return fail("oversize_allocations ", mine.oversize_allocations.current,
                " != ", recount.oversize_allocations.current);
  }
  if (mine.oversize_segments.current != recount.oversize_segments.current) {
    return fail("oversize_segments ", mine.oversize_segments.current, " != ", recount.oversize_segments.current);
  }
  return absl::OkStatus();
}

// --- public interface: take the lock, forward ---------------------------------

CachingAllocator::CachingAllocator(Device& device, AllocatorConfig config)
    : device_(device), config_(std::move(config)), impl_(std::make_unique<Impl>(device_, config_)) {
  // DeviceCachingAllocator's constructor: setMemoryFraction(per_process_memory_fraction()).
  if (config_.per_process_memory_fraction < 1.0) (void)SetMemoryFraction(config_.per_process_memory_fraction);
}

CachingAllocator::~CachingAllocator() = default;

absl::StatusOr<DevicePtr> CachingAllocator::Malloc(std::size_t size, StreamId stream, std::uint16_t pool) {
  if (size == 0) return DevicePtr{0};
  if (size >= kOneExaByte) {
    return absl::ResourceExhaustedError("CUDA out of memory. Tried to allocate more than 1EB memory.");
  }
  std::lock_guard<FastMutex> lock(mutex_);
  if (pool > impl_->private_pools.size()) [[unlikely]] {
    return absl::InvalidArgumentError(absl::StrCat("no memory pool with index ", pool));
  }
  impl_->call_time = 0;
  return impl_->Malloc(size, stream, pool);
}

absl::StatusOr<std::uint16_t> CachingAllocator::PoolIndex(PoolId id) {
  if (id.is_default()) return std::uint16_t{0};
  std::lock_guard<FastMutex> lock(mutex_);
  auto& pools = impl_->private_pools;
  for (std::size_t i = 0; i < pools.size(); ++i) {
    if (pools[i]->id == id) return static_cast<std::uint16_t>(i + 1);
  }
  if (pools.size() >= kMaxPrivatePools) {
    return absl::ResourceExhaustedError(
        absl::StrCat("more than ", kMaxPrivatePools, " private memory pools on one allocator"));
  }
  const auto index = static_cast<std::uint16_t>(pools.size() + 1);
  pools.push_back(std::make_unique<PrivatePool>(id, index));
  impl_->fast_sink = nullptr;
  return index;
}

void CachingAllocator::ReleasePool(PoolId id) {
  std::lock_guard<FastMutex> lock(mutex_);
  impl_->call_time = 0;
  for (auto& pp : impl_->private_pools) {
    if (pp->id != id) continue;
    pp->freeable = true;
    impl_->ReleaseBlocks(pp->small_blocks);
    impl_->ReleaseBlocks(pp->large_blocks);
  }
}

std::vector<PoolId> CachingAllocator::pool_ids() const {
  std::lock_guard<FastMutex> lock(mutex_);
  std::vector<PoolId> ids{PoolId{}};
  for (const auto& pp : impl_->private_pools) ids.push_back(pp->id);
  return ids;
}

absl::Status CachingAllocator::Free(DevicePtr ptr) {
  if (ptr == 0) return absl::OkStatus();
  std::lock_guard<FastMutex> lock(mutex_);
  impl_->call_time = 0;
  return impl_->Free(ptr);
}

absl::Status CachingAllocator::RecordStream(DevicePtr ptr, StreamId stream) {
  std::lock_guard<FastMutex> lock(mutex_);
  Block* block = impl_->allocated_blocks.Find(ptr);
  if (block == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("record_stream: invalid device pointer: 0x", absl::Hex(ptr)));
  }
  if (stream == block->stream) return absl::OkStatus();  // uses on the allocation stream need no event
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) == block->stream_uses.end()) {
    block->stream_uses.push_back(stream);
  }
  return absl::OkStatus();
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<FastMutex> lock(mutex_);
  impl_->call_time = 0;
  impl_->Trace(TraceAction::kEmptyCache, impl_->large_blocks, 0, 0, 0, 0);
  impl_->ReleaseCachedBlocks();
}

void CachingAllocator::ProcessEvents() {
  std::lock_guard<FastMutex> lock(mutex_);
  impl_->call_time = 0;
  impl_->ProcessEvents();
}

absl::Status CachingAllocator::SetMemoryFraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid memory fraction ", fraction, ": must be in [0, 1]"));
  }
  std::lock_guard<FastMutex> lock(mutex_);
  // PyTorch 2.9+: a fraction of 1.0 removes the cap (allowed_memory_maximum = nullopt).
  impl_->set_fraction = fraction < 1.0;
  impl_->allowed_memory_maximum =
      impl_->set_fraction ? static_cast<std::size_t>(fraction * static_cast<double>(device_.MemoryInfo().total_bytes))
                          : 0;
  impl_->count_free_block_lookups = impl_->set_fraction && config_.garbage_collection_threshold > 0.0;
  return absl::OkStatus();
}

DeviceStats CachingAllocator::GetStats() const {
  std::lock_guard<FastMutex> lock(mutex_);
  return impl_->Stats();
}

std::size_t CachingAllocator::memory_allocated() const {
  std::lock_guard<FastMutex> lock(mutex_);
  return static_cast<std::size_t>(Impl::AllCurrent(impl_->stats.allocated_bytes));
}
std::size_t CachingAllocator::max_memory_allocated() const {
  std::lock_guard<FastMutex> lock(mutex_);
  return static_cast<std::size_t>(All(impl_->stats.allocated_bytes).peak);
}
std::size_t CachingAllocator::allowed_memory_maximum() const {
  std::lock_guard<FastMutex> lock(mutex_);
  return impl_->set_fraction ? impl_->allowed_memory_maximum : 0;
}

std::size_t CachingAllocator::memory_reserved() const {
  std::lock_guard<FastMutex> lock(mutex_);
  return static_cast<std::size_t>(Impl::AllCurrent(impl_->stats.reserved_bytes));
}
std::size_t CachingAllocator::max_memory_reserved() const {
  std::lock_guard<FastMutex> lock(mutex_);
  return static_cast<std::size_t>(All(impl_->stats.reserved_bytes).peak);
}

void CachingAllocator::ResetPeakStats() {
  std::lock_guard<FastMutex> lock(mutex_);
  DeviceStats& s = impl_->stats;
  Impl::ForEachStatArray(s, [](StatArray& a) {
    for (Stat& stat : a) stat.ResetPeak();
    All(a).peak = Impl::AllCurrent(a);  // the aggregate's current value is not kept
  });
  s.oversize_allocations.ResetPeak();
  s.oversize_segments.ResetPeak();
}

void CachingAllocator::ResetAccumulatedStats() {
  std::lock_guard<FastMutex> lock(mutex_);
  DeviceStats& s = impl_->stats;
  Impl::ForEachStatArray(s, [](StatArray& a) {
    for (Stat& stat : a) {
      stat.allocated = 0;
      stat.freed = stat.current;  // see Impl::Increase: the base that freed is derived from
    }
  });
  s.oversize_allocations.ResetAccumulated();
  s.oversize_segments.ResetAccumulated();
  s.num_alloc_retries = s.num_ooms = s.num_sync_all_streams = s.num_device_alloc = s.num_device_free = 0;
}

std::string CachingAllocator::MemorySummary(bool abbreviated) const {
  return memscope::MemorySummary(GetStats(), device_.index(), abbreviated);
}

std::vector<SegmentInfo> CachingAllocator::Snapshot() const {
  std::lock_guard<FastMutex> lock(mutex_);
  return impl_->Snapshot();
}

std::optional<OutOfMemoryInfo> CachingAllocator::last_oom() const {
  std::lock_guard<FastMutex> lock(mutex_);
  return impl_->last_oom;
}

std::size_t CachingAllocator::BlockSize(DevicePtr ptr) const {
  std::lock_guard<FastMutex> lock(mutex_);
  const Block* block = impl_->allocated_blocks.Find(ptr);
  return block == nullptr ? 0 : block->size;
}

void CachingAllocator::SetObserver(AllocatorObserver* observer) {
  std::lock_guard<FastMutex> lock(mutex_);
  impl_->observer = observer;
  impl_->observer_wants_time = observer != nullptr && observer->wants_time();
  impl_->sink = observer != nullptr ? observer->record_sink() : nullptr;
  impl_->fast_sink = impl_->private_pools.empty() ? impl_->sink : nullptr;
}

absl::Status CachingAllocator::CheckInvariants() const {
  std::lock_guard<FastMutex> lock(mutex_);
  return impl_->CheckInvariants();
}

// ---- Adopting a state (a rebuilt snapshot's start): additive, beside the allocator's own paths.

absl::StatusOr<DevicePtr> CachingAllocator::AdoptSegment(std::size_t size, StreamId stream, std::uint16_t pool,
                                                         bool small) {
  std::lock_guard<FastMutex> lock(mutex_);
  Impl& im = *impl_;
  if (config_.expandable_segments) {
    return absl::FailedPreconditionError("expandable segments are not adopted: their pages are mapped on demand");
  }
  if (pool > im.private_pools.size())
    return absl::InvalidArgumentError(absl::StrCat("no memory pool with index ", pool));
  if (size == 0 || size % kMinBlockSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a segment of ", size, " B (not a positive multiple of 512 B)"));
  }
  im.call_time = 0;
  BlockPool& bp = pool == 0
                      ? (small ? im.small_blocks : im.large_blocks)
                      : (small ? im.private_pools[pool - 1]->small_blocks : im.private_pools[pool - 1]->large_blocks);
  Impl::AllocParams p{stream, size, &bp, size, nullptr, nullptr, {}, absl::OkStatus()};
  if (!im.AllocBlock(p, /*is_retry=*/false)) {
    return p.err.ok() ? absl::ResourceExhaustedError("the device refused the segment") : p.err;
  }
  bp.Insert(p.block);  // cached whole: not split, so no inactive split
  return p.block->ptr;
}

absl::Status CachingAllocator::AdoptBlock(DevicePtr ptr, std::size_t size, std::size_t requested_size) {
  std::lock_guard<FastMutex> lock(mutex_);
  Impl& im = *impl_;
  if (size == 0 || size % kMinBlockSize != 0 || ptr > ~DevicePtr{0} - size) {
    return absl::InvalidArgumentError(absl::StrCat("a block of ", size, " B at ", ptr));
  }
  Block* f = nullptr;  // the cached free block holding [ptr, ptr + size)
  im.ForEachPool([&](const BlockPool& pool) {
    pool.ForEach([&](Block* b) {
      if (f == nullptr && b->expandable == nullptr && b->ptr <= ptr && ptr + size <= b->ptr + b->size) f = b;
    });
  });
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("no cached free block holds ", size, " B at ", ptr));
  }
  im.call_time = 0;
  BlockPool& pool = *f->pool;
  pool.Erase(f);
  if (f->is_split()) {
    Impl::Decrease(im.stats.inactive_split_bytes, pool, static_cast<std::int64_t>(f->size));
    Impl::Decrease(im.stats.inactive_split, pool, 1);
  }
  // A free piece of f beside the allocation: cached, an inactive split.
  const auto piece = [&](DevicePtr at, std::size_t bytes, Block* before, Block* after) {
    Block* b = im.arena.New();
    b->ptr = at;
    b->size = bytes;
    b->stream = f->stream;
    b->pool = &pool;
    Splice(b, before, after);
    pool.Insert(b);
    Impl::Increase(im.stats.inactive_split_bytes, pool, static_cast<std::int64_t>(bytes));
    Impl::Increase(im.stats.inactive_split, pool, 1);
  };
  if (ptr > f->ptr) {
    const std::size_t left = ptr - f->ptr;
    f->ptr = ptr;
    f->size -= left;
    piece(ptr - left, left, f->prev, f);
  }
  if (f->size > size) {
    const std::size_t right = f->size - size;
    f->size = size;
    piece(ptr + size, right, f, f->next);
  }
  f->allocated = true;
  f->requested_size = requested_size;
  im.allocated_blocks.Insert(f->ptr, f);
  if (im.observer != nullptr) {
    im.TraceAllocSlow(f, pool);
  } else {
    f->record_id = 0;
  }
  Impl::Increase(im.stats.allocation, pool, 1);
  Impl::Increase(im.stats.allocated_bytes, pool, static_cast<std::int64_t>(f->size));
  Impl::Increase(im.stats.active, pool, 1);
  Impl::Increase(im.stats.active_bytes, pool, static_cast<std::int64_t>(f->size));
  Impl::Increase(im.stats.requested_bytes, pool, static_cast<std::int64_t>(requested_size));
  if (im.large_split_limit(f->size)) im.stats.oversize_allocations.Increase(1);
  return absl::OkStatus();
}

}  // namespace memscope
