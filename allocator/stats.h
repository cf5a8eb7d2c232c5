// The allocator's statistics, with the names and meanings of
// torch.cuda.memory_stats().
#ifndef MEMSCOPE_ALLOCATOR_STATS_H_
#define MEMSCOPE_ALLOCATOR_STATS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace memscope {

// One statistic: its value now, its high-water mark, and the running totals
// of increases and decreases. Invariant: current == allocated - freed (until
// reset_accumulated), peak >= current.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void Increase(std::int64_t amount) {
    current += amount;
    if (current > peak) peak = current;
    allocated += amount;
  }
  void Decrease(std::int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void ResetPeak() { peak = current; }
  void ResetAccumulated() { allocated = freed = 0; }
  bool operator==(const Stat&) const = default;
};

// Index into a StatArray: the aggregate and each pool.
enum class StatType : int { kAll = 0, kSmallPool = 1, kLargePool = 2 };
inline constexpr std::size_t kNumStatTypes = 3;
using StatArray = std::array<Stat, kNumStatTypes>;

// The aggregate of both pools ("all" in memory_stats() keys):
// All(stats.allocated_bytes).peak is torch.cuda.max_memory_allocated().
inline Stat& All(StatArray& a) { return a[static_cast<std::size_t>(StatType::kAll)]; }
inline const Stat& All(const StatArray& a) { return a[static_cast<std::size_t>(StatType::kAll)]; }

// PyTorch's DeviceStats.
struct DeviceStats {
  StatArray allocation;      // number of allocated blocks
  StatArray segment;         // number of device allocations (cudaMalloc)
  StatArray active;          // allocated or waiting on stream events
  StatArray inactive_split;  // free blocks inside partly used segments
  StatArray allocated_bytes;
  StatArray reserved_bytes;  // device memory held (segments + mapped pages)
  StatArray active_bytes;
  StatArray inactive_split_bytes;      // "Non-releasable memory"
  StatArray requested_bytes;           // sizes as requested, before rounding
  Stat oversize_allocations;           // allocated blocks >= max_split_size
  Stat oversize_segments;              // segments >= max_split_size
  std::int64_t num_alloc_retries = 0;  // device allocations retried after freeing the cache
  std::int64_t num_ooms = 0;
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;
  std::int64_t max_split_size = -1;  // -1 when unlimited

  bool operator==(const DeviceStats&) const = default;
};

// The flattened dict torch.cuda.memory_stats() returns, keys sorted:
// "active.all.current", ..., "num_ooms", "oversize_allocations.peak", ...
std::map<std::string, std::int64_t> FlattenStats(const DeviceStats& stats);

// The inverse of FlattenStats, one key at a time: sets the field `key` names
// ("active_bytes.all.peak") to `value`. False, changing nothing, for a key
// FlattenStats does not write.
bool SetFlatStat(DeviceStats& stats, std::string_view key, std::int64_t value);

// torch.cuda.memory_summary(device, abbreviated): the PyTorch 2.x table,
// character for character.
std::string MemorySummary(const DeviceStats& stats, int device, bool abbreviated = false);

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_STATS_H_
