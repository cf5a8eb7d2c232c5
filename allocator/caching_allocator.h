// A caching device allocator that makes the decisions PyTorch's CUDA caching
// allocator (c10/cuda/CUDACachingAllocator.cpp, 2.x) makes, on any Device.
//
// The policy, in plain words:
//
// - Every request is rounded (512 B steps, or roundup_power2_divisions).
//   Rounded requests <= 1 MiB are served from the small pool, larger ones
//   from the large pool. Free blocks are cached per pool and per stream: a
//   block freed on stream S is reused only by requests on stream S.
// - A request takes the best-fit cached block: the smallest free block of its
//   stream that is large enough (ties by address). Only that one candidate is
//   tested against the oversize rules (max_split_size): a request below
//   max_split_size never takes a block >= max_split_size, and a request at or
//   above it takes a cached block only if the block is smaller than request +
//   max_non_split_rounding_size.
// - The chosen block is split when what remains is worth keeping: >= 512 B
//   in the small pool (and with expandable segments), > 1 MiB in the large
//   pool and only for requests below max_split_size. A free block inside a
//   segment that still has other blocks is an "inactive split": it cannot be
//   returned to the device and is the classic fragmentation signal.
// - With no cached block, the allocator asks the device for a new segment
//   (2 MiB small, 20 MiB for large requests < 10 MiB, else the request
//   rounded to 2 MiB). If that fails it (1) with garbage_collection_threshold
//   and a memory fraction, first frees old unsplit cached blocks; (2) with
//   max_split_size set, frees cached oversize blocks and retries; (3) frees
//   every cached whole segment (as empty_cache) and retries once more, counted
//   in num_alloc_retries; (4) reports out-of-memory. Like PyTorch, the pools
//   are not searched again after step 3 (a known quirk, kept on purpose).
// - Freed blocks merge with free neighbours of the same segment. A block
//   used on other streams (RecordStream) stays "active" until events
//   recorded on those streams at free time have completed.
// - expandable_segments:True replaces per-request segments by one growing
//   virtual range per (pool, stream): pages (2 MiB small, 20 MiB large) are
//   mapped at the lowest address that fits and unmapped when wholly free on
//   empty_cache or before an OOM.
//
// Thread safety: one mutex per allocator (PyTorch has one per device); every
// public method takes it (a FastMutex: one atomic instruction when uncontended). An attached observer is called under
// it.
#ifndef MEMSCOPE_ALLOCATOR_CACHING_ALLOCATOR_H_
#define MEMSCOPE_ALLOCATOR_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "allocator/device.h"
#include "allocator/fast_mutex.h"
#include "allocator/observer.h"
#include "allocator/snapshot.h"
#include "allocator/stats.h"

namespace memscope {

// What the allocator knew when it ran out of memory.
struct OutOfMemoryInfo {
  std::size_t requested = 0;   // bytes asked for
  std::size_t rounded = 0;     // round_size(requested)
  std::size_t alloc_size = 0;  // segment size asked of the device
  StreamId stream = 0;
  bool small_pool = false;
  std::size_t device_free = 0;  // cudaMemGetInfo at the time
  std::size_t device_total = 0;
  std::size_t allocated = 0;           // allocated_bytes.all.current
  std::size_t reserved = 0;            // reserved_bytes.all.current
  std::size_t inactive_split = 0;      // inactive_split_bytes.all.current
  std::size_t cached_free = 0;         // bytes in free cached blocks (all pools and streams)
  std::size_t largest_free_block = 0;  // largest of those
  std::string message;                 // PyTorch's wording
  std::string diagnosis;               // memscope's one-line explanation
};

class CachingAllocator {
 public:
  // The allocator borrows `device`, which must outlive it.
  explicit CachingAllocator(Device& device, AllocatorConfig config = {});
  // Returns every segment to the device.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Allocates `size` bytes usable on `stream`. Returns the address (0 for
  // size 0, like PyTorch), ResourceExhausted with PyTorch's OOM message plus a
  // memscope diagnosis line when the device is full, or the device's own
  // error for any other device failure.
  absl::StatusOr<DevicePtr> Malloc(std::size_t size, StreamId stream = 0) { return Malloc(size, stream, 0); }

  // Private pools (CUDA graphs, torch.cuda.MemPool). A request in a private
  // pool (`pool`, an index from PoolIndex) is served only from that pool's
  // cached blocks and new segments, and its blocks are never handed to any
  // other pool, as in PyTorch while a capture or `with use_mem_pool(...)`
  // routes a stream's allocations there. Blocks return to their own pool on
  // free. empty_cache() and the out-of-memory release leave a private pool's
  // segments alone until the pool is released. ReleasePool is what deleting
  // a MemPool does (releasePool, use_count 0, then emptyCache(id)): the
  // pool's wholly free segments are freed at once, and every later
  // empty_cache() frees those that become free, as release_cached_blocks
  // frees graph_pools_freeable.
  // While a request goes to a private pool, PyTorch's captures_underway is
  // not empty: such a request neither processes pending stream events first
  // nor frees the whole cache to retry before running out of memory.
  // Index 0 is the default pool; PoolIndex(id) makes a pool on first use, at
  // most kMaxPrivatePools of them (ResourceExhausted after).
  static constexpr std::uint16_t kMaxPrivatePools = 63;
  absl::StatusOr<DevicePtr> Malloc(std::size_t size, StreamId stream, std::uint16_t pool);
  absl::StatusOr<std::uint16_t> PoolIndex(PoolId id);
  void ReleasePool(PoolId id);
  // The id of each pool index: [0] is the default pool (0, 0).
  std::vector<PoolId> pool_ids() const;

  // Adopting a state the allocator did not make itself: the state at the
  // start of a PyTorch snapshot's trace when the trace begins after the
  // program did (a ring buffer that dropped its head), rebuilt from the
  // file. AdoptSegment asks the device for a segment of `size` bytes as a
  // new segment is asked for (the same stats, a segment_alloc event) and
  // caches it whole, one free block of `stream` in private pool `pool`'s (0:
  // the default pool's) small or large side. AdoptBlock then makes [ptr, ptr
  // + size) of a cached free block an allocation of `requested_size` bytes,
  // as if Malloc had given it out: the free block is split around it, the
  // free pieces left beside it count as inactive splits, and allocated /
  // active / requested bytes grow as on Malloc (an alloc event). Errors:
  // InvalidArgument for a pool index that does not exist or a range no one
  // free block holds; FailedPrecondition under expandable_segments (its
  // segments are not adopted); the device's error for a segment it refuses.
  //
  //   DevicePtr base = *allocator.AdoptSegment(20 << 20, /*stream=*/0, 0, /*small=*/false);
  //   CHECK_OK(allocator.AdoptBlock(base + (6 << 20), 4 << 20, 4000000));
  absl::StatusOr<DevicePtr> AdoptSegment(std::size_t size, StreamId stream, std::uint16_t pool, bool small);
  absl::Status AdoptBlock(DevicePtr ptr, std::size_t size, std::size_t requested_size);

  // Frees an address returned by Malloc (0 is ignored). InvalidArgument for
  // an address that is not allocated.
  absl::Status Free(DevicePtr ptr);

  // Marks an allocation as used on `stream` (Tensor.record_stream): when it
  // is freed, it is not reused until the work queued on `stream` completes.
  absl::Status RecordStream(DevicePtr ptr, StreamId stream);

  // Returns every cached segment that is wholly free to the device, after
  // waiting for pending stream events (torch.cuda.empty_cache()).
  void EmptyCache();

  // PyTorch's process_events, which every Malloc in the default pool runs
  // first: frees the blocks whose stream events have all completed, walking
  // the streams in the order of PyTorch's map of them (allocator/ska_map.h).
  // A replay calls it where a snapshot's free_completed says a block was freed.
  void ProcessEvents();

  // Caps this process at `fraction` of the device's total memory
  // (torch.cuda.set_per_process_memory_fraction). Fraction in [0, 1]; 1.0
  // removes the cap, as in PyTorch 2.9+. The config's
  // per_process_memory_fraction is applied at construction.
  absl::Status SetMemoryFraction(double fraction);
  // The cap in bytes, 0 when there is none.
  std::size_t allowed_memory_maximum() const;

  // torch.cuda.memory_stats() as a struct, and its usual shortcuts.
  DeviceStats GetStats() const;
  std::size_t memory_allocated() const;
  std::size_t max_memory_allocated() const;
  std::size_t memory_reserved() const;
  std::size_t max_memory_reserved() const;
  void ResetPeakStats();
  void ResetAccumulatedStats();

  // torch.cuda.memory_summary() for this allocator's device.
  std::string MemorySummary(bool abbreviated = false) const;

  // Segments and their blocks in address order (memory._snapshot()).
  std::vector<SegmentInfo> Snapshot() const;

  // The last out-of-memory, if any happened.
  std::optional<OutOfMemoryInfo> last_oom() const;

  // Size of the block behind an allocated address; 0 if not allocated.
  std::size_t BlockSize(DevicePtr ptr) const;

  // Attaches (or, with nullptr, detaches) the observer of every action.
  void SetObserver(AllocatorObserver* observer);

  const AllocatorConfig& config() const { return config_; }
  Device& device() const { return device_; }

  // Checks the allocator's internal invariants (blocks tile their segments,
  // pools hold exactly the free blocks, every stat equals a recount). Returns
  // the first violation. For tests; O(number of blocks).
  absl::Status CheckInvariants() const;

  struct Impl;

 private:
  Device& device_;
  const AllocatorConfig config_;
  mutable FastMutex mutex_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_CACHING_ALLOCATOR_H_
