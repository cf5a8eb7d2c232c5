#include "devicemem/cupti_records.h"

#include <cstring>

namespace memscope {
namespace {

std::optional<DeviceMemoryRecord> ParseMemory(const CUpti_ActivityMemory4& m) {
  DeviceMemoryRecord r;
  switch (m.memoryOperationType) {
    case CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION: r.op = DeviceMemoryOp::kAlloc; break;
    case CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE: r.op = DeviceMemoryOp::kFree; break;
    default: return std::nullopt;
  }
  const auto kind = static_cast<unsigned>(m.memoryKind);
  r.kind = kind <= static_cast<unsigned>(DeviceMemoryKind::kManagedStatic) ? static_cast<DeviceMemoryKind>(kind)
                                                                           : DeviceMemoryKind::kUnknown;
  r.address = m.address;
  r.bytes = m.bytes;
  r.timestamp_ns = m.timestamp;
  r.device = m.deviceId;
  r.stream = m.streamId;
  r.correlation = m.correlationId;
  r.process = m.processId;
  r.async = m.isAsync != 0;
  if (m.memoryPoolConfig.memoryPoolType != CUPTI_ACTIVITY_MEMORY_POOL_TYPE_INVALID) {
    r.pool_address = m.memoryPoolConfig.address;
    if (m.memoryPoolConfig.memoryPoolType == CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL) {
      r.release_threshold = m.memoryPoolConfig.releaseThreshold;
      r.utilized_bytes = m.memoryPoolConfig.utilizedSize;
    }
  }
  return r;
}

std::optional<DeviceMemoryRecord> ParsePool(const CUpti_ActivityMemoryPool3& p) {
  DeviceMemoryRecord r;
  switch (p.memoryPoolOperationType) {
    case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED: r.op = DeviceMemoryOp::kPoolCreated; break;
    case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_DESTROYED: r.op = DeviceMemoryOp::kPoolDestroyed; break;
    case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_TRIMMED: r.op = DeviceMemoryOp::kPoolTrimmed; break;
    default: return std::nullopt;
  }
  r.kind = DeviceMemoryKind::kDevice;
  r.address = p.address;
  r.pool_address = p.address;
  r.bytes = p.size;
  r.timestamp_ns = p.timestamp;
  r.device = p.deviceId;
  r.correlation = p.correlationId;
  r.process = p.processId;
  r.release_threshold = p.releaseThreshold;
  r.utilized_bytes = p.utilizedSize;
  if (r.op == DeviceMemoryOp::kPoolTrimmed) r.min_bytes_to_keep = p.minBytesToKeep;
  return r;
}

}  // namespace

std::optional<DeviceMemoryRecord> ParseActivity(const CUpti_Activity* record) {
  // Copied out of the buffer (as bytes: the buffer holds records of several
  // types, and CUPTI's records are packed).
  CUpti_ActivityKind kind;
  std::memcpy(&kind, record, sizeof(kind));
  if (kind == CUPTI_ACTIVITY_KIND_MEMORY2) {
    CUpti_ActivityMemory4 memory;
    std::memcpy(&memory, record, sizeof(memory));
    return ParseMemory(memory);
  }
  if (kind == CUPTI_ACTIVITY_KIND_MEMORY_POOL) {
    CUpti_ActivityMemoryPool3 pool;
    std::memcpy(&pool, record, sizeof(pool));
    return ParsePool(pool);
  }
  return std::nullopt;
}

}  // namespace memscope
