// The allocator's state at one moment, in the shape of PyTorch's
// torch.cuda.memory._snapshot()["segments"].
#ifndef MEMSCOPE_ALLOCATOR_SNAPSHOT_H_
#define MEMSCOPE_ALLOCATOR_SNAPSHOT_H_

#include <cstddef>
#include <string_view>
#include <vector>

#include "allocator/device.h"

namespace memscope {

enum class BlockState { kActiveAllocated, kActivePendingFree, kInactive };

// "active_allocated", "active_pending_free" or "inactive".
std::string_view BlockStateName(BlockState state);

struct BlockInfo {
  DevicePtr address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;  // 0 for blocks that were never handed out
  BlockState state = BlockState::kInactive;
};

// One device allocation, or one contiguous mapped range of an expandable
// segment. Blocks are in address order and tile [address, address+total_size).
struct SegmentInfo {
  int device = 0;
  DevicePtr address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;
  std::size_t active_size = 0;
  std::size_t requested_size = 0;
  StreamId stream = 0;
  bool is_large = false;  // segment_type "large" / "small"
  bool is_expandable = false;
  PoolId pool_id;  // segment_pool_id: (0, 0) for the default pool
  std::vector<BlockInfo> blocks;
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_SNAPSHOT_H_
