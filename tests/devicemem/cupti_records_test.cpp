// Real CUPTI records (the structs of the toolkit's cupti_activity.h), filled
// here as CUPTI fills its activity buffers, parsed without libcupti.
#include "devicemem/cupti_records.h"

#include <catch2/catch.hpp>
#include <cstring>

namespace memscope {
namespace {

// A record as CUPTI leaves it in an activity buffer: its bytes.
struct InBuffer {
  template <typename Record>
  explicit InBuffer(const Record& r) {
    static_assert(sizeof(Record) <= sizeof(bytes));
    std::memcpy(bytes, &r, sizeof(Record));
  }
  const CUpti_Activity* record() const { return reinterpret_cast<const CUpti_Activity*>(bytes); }
  alignas(8) unsigned char bytes[256] = {};
};

CUpti_ActivityMemory4 MemoryRecord(CUpti_ActivityMemoryOperationType op) {
  CUpti_ActivityMemory4 m;
  std::memset(&m, 0, sizeof(m));
  m.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
  m.memoryOperationType = op;
  m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  m.correlationId = 4711;
  m.address = 0x7f3a00000000;
  m.bytes = 20971520;  // 20 MiB: the caching allocator's large-pool segment for a 12 MB tensor
  m.timestamp = 1700000000123456789;
  m.processId = 31337;
  m.deviceId = 1;
  m.contextId = 1;
  m.streamId = 7;
  return m;
}

TEST_CASE("a MEMORY2 allocation record parses field for field") {
  const CUpti_ActivityMemory4 m = MemoryRecord(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION);
  const std::optional<DeviceMemoryRecord> r = ParseActivity(InBuffer(m).record());
  REQUIRE(r.has_value());
  DeviceMemoryRecord want;
  want.op = DeviceMemoryOp::kAlloc;
  want.kind = DeviceMemoryKind::kDevice;
  want.address = 0x7f3a00000000;
  want.bytes = 20971520;
  want.timestamp_ns = 1700000000123456789;
  want.device = 1;
  want.stream = 7;
  want.correlation = 4711;
  want.process = 31337;
  CHECK(*r == want);
}

TEST_CASE("a MEMORY2 release from a local pool (cudaFreeAsync) keeps the pool's address and use") {
  CUpti_ActivityMemory4 m = MemoryRecord(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE);
  m.isAsync = 1;
  m.memoryPoolConfig.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
  m.memoryPoolConfig.address = 0x5555aaaa0000;
  m.memoryPoolConfig.releaseThreshold = 1 << 30;
  m.memoryPoolConfig.pool.size = 64 << 20;
  m.memoryPoolConfig.utilizedSize = 44 << 20;
  const std::optional<DeviceMemoryRecord> r = ParseActivity(InBuffer(m).record());
  REQUIRE(r.has_value());
  CHECK(r->op == DeviceMemoryOp::kFree);
  CHECK(r->async);
  CHECK(r->pool_address == 0x5555aaaa0000);
  CHECK(r->release_threshold == 1073741824);
  CHECK(r->utilized_bytes == 46137344);
  CHECK(r->address == 0x7f3a00000000);
}

TEST_CASE("pinned host memory keeps its kind (the device timeline leaves it out)") {
  CUpti_ActivityMemory4 m = MemoryRecord(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION);
  m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_PINNED;
  const std::optional<DeviceMemoryRecord> r = ParseActivity(InBuffer(m).record());
  REQUIRE(r.has_value());
  CHECK(r->kind == DeviceMemoryKind::kPinned);
  CHECK_FALSE(OnDevice(r->kind));
}

TEST_CASE("an INVALID operation and a record of another kind are not device-memory records") {
  const CUpti_ActivityMemory4 invalid = MemoryRecord(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_INVALID);
  CHECK_FALSE(ParseActivity(InBuffer(invalid).record()).has_value());
  CUpti_ActivityMemory4 other = MemoryRecord(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION);
  other.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  CHECK_FALSE(ParseActivity(InBuffer(other).record()).has_value());
}

TEST_CASE("MEMORY_POOL records: created, trimmed (with the bytes to keep), destroyed") {
  CUpti_ActivityMemoryPool3 p;
  std::memset(&p, 0, sizeof(p));
  p.kind = CUPTI_ACTIVITY_KIND_MEMORY_POOL;
  p.memoryPoolOperationType = CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_TRIMMED;
  p.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
  p.correlationId = 99;
  p.processId = 31337;
  p.deviceId = 0;
  p.minBytesToKeep = 8 << 20;
  p.address = 0x5555aaaa0000;
  p.size = 32 << 20;
  p.releaseThreshold = 0;
  p.timestamp = 5000;
  p.utilizedSize = 2 << 20;
  std::optional<DeviceMemoryRecord> r = ParseActivity(InBuffer(p).record());
  REQUIRE(r.has_value());
  DeviceMemoryRecord want;
  want.op = DeviceMemoryOp::kPoolTrimmed;
  want.kind = DeviceMemoryKind::kDevice;
  want.address = 0x5555aaaa0000;
  want.pool_address = 0x5555aaaa0000;
  want.bytes = 33554432;
  want.timestamp_ns = 5000;
  want.correlation = 99;
  want.process = 31337;
  want.utilized_bytes = 2097152;
  want.min_bytes_to_keep = 8388608;
  CHECK(*r == want);

  p.memoryPoolOperationType = CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED;
  r = ParseActivity(InBuffer(p).record());
  REQUIRE(r.has_value());
  CHECK(r->op == DeviceMemoryOp::kPoolCreated);
  CHECK(r->min_bytes_to_keep == 0);  // only a trim says it
  p.memoryPoolOperationType = CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_DESTROYED;
  CHECK(ParseActivity(InBuffer(p).record())->op == DeviceMemoryOp::kPoolDestroyed);
  p.memoryPoolOperationType = CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_INVALID;
  CHECK_FALSE(ParseActivity(InBuffer(p).record()).has_value());
}

}  // namespace
}  // namespace memscope
