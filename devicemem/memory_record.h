// One device-memory activity of a process, as CUPTI reports it, in plain
// C++ (no CUPTI type): an allocation or a release (CUPTI's MEMORY2 activity,
// CUpti_ActivityMemory4) or a stream-ordered memory pool created,
// destroyed or trimmed (MEMORY_POOL, CUpti_ActivityMemoryPool3).
// devicemem/cupti_records.h turns CUPTI's records into these; the device
// timeline (devicemem/device_timeline.h) is written from them, so both can
// be tested without CUPTI at run time.
#ifndef MEMSCOPE_DEVICEMEM_MEMORY_RECORD_H_
#define MEMSCOPE_DEVICEMEM_MEMORY_RECORD_H_

#include <cstdint>

namespace memscope {

enum class DeviceMemoryOp : unsigned char {
  kAlloc,        // MEMORY2, CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION
  kFree,         // MEMORY2, ..._RELEASE
  kPoolCreated,  // MEMORY_POOL, CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED
  kPoolDestroyed,
  kPoolTrimmed,
};

// Where the memory lives: CUpti_ActivityMemoryKind's values, value for value.
enum class DeviceMemoryKind : unsigned char {
  kUnknown = 0,
  kPageable = 1,
  kPinned = 2,  // page-locked host memory (cudaHostAlloc): not on the GPU
  kDevice = 3,
  kArray = 4,
  kManaged = 5,
  kDeviceStatic = 6,
  kManagedStatic = 7,
};
// Whether memory of `kind` takes the GPU's own memory (device, array,
// device-static; managed memory counts too, as nvidia-smi counts it once it
// is resident): pageable and pinned memory are the host's.
inline bool OnDevice(DeviceMemoryKind kind) {
  return kind == DeviceMemoryKind::kDevice || kind == DeviceMemoryKind::kArray ||
         kind == DeviceMemoryKind::kDeviceStatic || kind == DeviceMemoryKind::kManaged ||
         kind == DeviceMemoryKind::kManagedStatic;
}

struct DeviceMemoryRecord {
  DeviceMemoryOp op = DeviceMemoryOp::kAlloc;
  DeviceMemoryKind kind = DeviceMemoryKind::kUnknown;  // alloc / free
  std::uint64_t address = 0;      // the allocation's, or the pool's
  std::uint64_t bytes = 0;        // alloc / free: its size; pool: the pool's size
  std::uint64_t timestamp_ns = 0; // CUPTI's clock (cuptiGetTimestamp)
  std::uint32_t device = 0;       // the CUDA device ordinal
  std::uint32_t stream = 0;       // alloc / free: CUPTI's stream id (0 when none)
  std::uint32_t correlation = 0;  // the API call that made it (its callback's correlation id)
  std::uint32_t process = 0;
  bool async = false;                // alloc / free: stream-ordered (cudaMallocAsync / cudaFreeAsync)
  std::uint64_t pool_address = 0;    // alloc / free from a pool, and pool records: the pool
  std::uint64_t release_threshold = 0;  // pool records (and pooled allocs)
  std::uint64_t utilized_bytes = 0;     // pool records (and pooled allocs): the pool's bytes in use
  std::uint64_t min_bytes_to_keep = 0;  // kPoolTrimmed
  bool operator==(const DeviceMemoryRecord&) const = default;
};

}  // namespace memscope

#endif  // MEMSCOPE_DEVICEMEM_MEMORY_RECORD_H_
