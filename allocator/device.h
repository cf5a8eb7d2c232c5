// The device interface the caching allocator sits on.
//
// A Device hands out raw device memory the way the CUDA runtime and driver do:
// whole allocations (cudaMalloc / cudaFree), virtual address reservations with
// physical pages mapped into them (cuMemAddressReserve / cuMemCreate+cuMemMap /
// cuMemUnmap+cuMemRelease, used by expandable segments), free/total memory
// (cudaMemGetInfo) and stream-ordered events (cudaEventRecord / Query /
// Synchronize, used by record_stream).
//
// The allocator only calls a Device when its cache cannot serve a request, so
// these calls are virtual and may be slow; the cached path never reaches here.
//
// Implementations: SimDevice (simulated GPU, always built) and CudaDevice
// (real GPU, built when the CUDA toolkit is present).
#ifndef MEMSCOPE_ALLOCATOR_DEVICE_H_
#define MEMSCOPE_ALLOCATOR_DEVICE_H_

#include <compare>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace memscope {

// A device address. 0 is never a valid allocation.
using DevicePtr = std::uint64_t;

// A stream handle. 0 is the default stream; other values are whatever the
// device uses to name its streams (a cudaStream_t cast to an integer on CUDA).
using StreamId = std::uint64_t;

// An event recorded on a stream; opaque to the allocator.
using EventId = std::uint64_t;

// A memory pool, PyTorch's MempoolId_t: (0, 0) is the default pool; a CUDA
// graph's pool or a torch.cuda.MemPool has another id (PyTorch numbers graph
// pools (id, 0) and MemPools (0, id)).
struct PoolId {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  bool is_default() const { return first == 0 && second == 0; }
  bool operator==(const PoolId&) const = default;
  auto operator<=>(const PoolId&) const = default;
};

struct DeviceMemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // The device index printed in messages ("GPU 0").
  virtual int index() const = 0;

  // Allocates `size` bytes (cudaMalloc). Returns the address, or
  // ResourceExhausted when the device has no room (the allocator then frees
  // cached memory and retries). Other errors are not retried.
  virtual absl::StatusOr<DevicePtr> Malloc(std::size_t size) = 0;
  // Returns memory from Malloc (cudaFree).
  virtual absl::Status Free(DevicePtr ptr) = 0;

  // free/total bytes as cudaMemGetInfo reports them.
  virtual DeviceMemoryInfo MemoryInfo() const = 0;

  // --- Virtual memory (expandable segments) --------------------------------
  // Reserves `size` bytes of address space; no physical memory yet.
  virtual absl::StatusOr<DevicePtr> ReserveAddress(std::size_t size) = 0;
  // Releases a reservation made by ReserveAddress (all pages unmapped first).
  virtual absl::Status ReleaseAddress(DevicePtr ptr, std::size_t size) = 0;
  // Creates `size` bytes of physical memory and maps it at `ptr` inside a
  // reservation. ResourceExhausted when the device is full.
  virtual absl::Status MapPage(DevicePtr ptr, std::size_t size) = 0;
  // Unmaps and releases the physical memory mapped at `ptr` by MapPage.
  virtual absl::Status UnmapPage(DevicePtr ptr, std::size_t size) = 0;

  // --- Streams and events (record_stream) -----------------------------------
  // Records an event after the work currently queued on `stream`.
  virtual EventId RecordEvent(StreamId stream) = 0;
  // True when the event's work has completed (cudaEventQuery == success).
  virtual bool QueryEvent(EventId event) = 0;
  // Waits until the event's work has completed (cudaEventSynchronize).
  virtual void SynchronizeEvent(EventId event) = 0;
  // Returns the event to the device (cudaEventDestroy / back to a pool).
  virtual void ReleaseEvent(EventId event) = 0;
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_DEVICE_H_
