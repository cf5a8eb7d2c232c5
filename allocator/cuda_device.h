// CudaDevice: the Device interface on a real NVIDIA GPU.
//
// Whole allocations go through the CUDA runtime (cudaMalloc / cudaFree /
// cudaMemGetInfo), events through cudaEvent*, and expandable segments through
// the driver's virtual memory API (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree).
//
// The binary never links libcuda. The runtime (linked statically) loads the
// driver itself when it initialises, and the cuMem* functions are looked up
// through cudaGetDriverEntryPointByVersion once a device has been opened. This
// is what lets memscope start, and report a clean error, on machines that have
// no driver or no GPU at all.
//
// Every call first makes this device current on the calling thread and puts
// the caller's device back afterwards, so a CudaDevice can be used from any
// thread without the caller managing cudaSetDevice. (The caller's device is
// not "restored" on a thread that had no CUDA context yet: since CUDA 12 that
// would create a context, and use memory, on a GPU nobody asked for.)
//
// Thread-safe: the page-handle map and the event pool are guarded by a mutex.
//
// Example:
//   absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(0);
//   if (!device.ok()) {
//     std::cerr << device.status().message() << "\n";  // one line
//     return 1;
//   }
//   absl::StatusOr<DevicePtr> ptr = (*device)->Malloc(2 << 20);
#ifndef MEMSCOPE_ALLOCATOR_CUDA_DEVICE_H_
#define MEMSCOPE_ALLOCATOR_CUDA_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocator/device.h"

namespace memscope {

class CudaDevice final : public Device {
 public:
  // Opens CUDA device `device_index` (a runtime ordinal, after
  // CUDA_VISIBLE_DEVICES). Returns:
  //   - InvalidArgument when the index is negative or not below the number
  //     of visible devices;
  //   - FailedPrecondition when there is no usable driver or no GPU;
  //   - Unavailable when the GPU exists but cannot be opened now (for example
  //     it is in exclusive-process mode and owned by another process).
  // Every error message is a single line that starts with "CUDA device N",
  // e.g. "CUDA device 0 unavailable: CUDA driver version is insufficient for
  // CUDA runtime version (cudaErrorInsufficientDriver)". Never aborts.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int device_index);

  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  // Destroys pooled events. Pages still mapped are deliberately leaked: this
  // often runs during process exit, after the runtime may have unloaded the
  // driver, and calling through stale driver pointers would crash.
  ~CudaDevice() override;

  // Returns the device index passed to Create.
  int index() const override { return index_; }

  // Returns a cudaMalloc'd address (256-byte aligned or better), or
  // ResourceExhausted when the GPU is out of memory (the CUDA error is
  // cleared first, so the allocator can free its cache and retry).
  // InvalidArgument for size 0, because cudaMalloc(0) yields a null pointer
  // and 0 is never a valid DevicePtr.
  absl::StatusOr<DevicePtr> Malloc(std::size_t size) override;

  // Returns the result of cudaFree. Free(0) is OK and does nothing. Note that
  // cudaFree synchronises the device, which is why the allocator caches.
  absl::Status Free(DevicePtr ptr) override;

  // Returns free/total bytes from cudaMemGetInfo, or zeros if the query fails
  // (the interface has no error channel here; the error is cleared).
  DeviceMemoryInfo MemoryInfo() const override;

  // Returns the start of a new `size`-byte reservation (cuMemAddressReserve,
  // default alignment). ResourceExhausted when address space runs out;
  // Unimplemented when the driver or the GPU lacks virtual memory management.
  absl::StatusOr<DevicePtr> ReserveAddress(std::size_t size) override;

  // Returns the result of cuMemAddressFree. All pages must be unmapped first.
  absl::Status ReleaseAddress(DevicePtr ptr, std::size_t size) override;

  // Creates `size` bytes of pinned device memory (cuMemCreate), maps it at
  // `ptr` (cuMemMap) and makes it read/write for this device
  // (cuMemSetAccess). `ptr` and `size` must be multiples of the allocation
  // granularity (2 MiB on current GPUs). Returns ResourceExhausted when the
  // GPU is full, AlreadyExists when `ptr` is already mapped, Unimplemented
  // when the VMM API is missing. On failure nothing stays mapped.
  absl::Status MapPage(DevicePtr ptr, std::size_t size) override;

  // Waits for the device (like cudaFree does implicitly), then unmaps and
  // releases the page MapPage put at `ptr`. Returns NotFound when nothing
  // was mapped there and InvalidArgument when `size` differs from the
  // mapped size.
  absl::Status UnmapPage(DevicePtr ptr, std::size_t size) override;

  // Records an event after the work queued on `stream` (a cudaStream_t cast
  // to an integer; 0 is the default stream) and returns it as an EventId.
  // Events come from a small pool and are created with
  // cudaEventDisableTiming, which makes them cheap to record and query.
  // If the event cannot be created or recorded, the stream is synchronised
  // instead and 0 is returned: 0 stands for "already complete", so the
  // allocator stays correct (if slower) rather than reusing memory early.
  EventId RecordEvent(StreamId stream) override;

  // Returns true when the event's work has completed. Returns false while it
  // is pending (cudaErrorNotReady, which is cleared). Also returns true on
  // any other error: such errors are sticky, the event can then never
  // complete, and answering false would make the allocator hold the block
  // forever. QueryEvent(0) is true.
  bool QueryEvent(EventId event) override;

  // Waits for the event (cudaEventSynchronize). Errors are cleared and
  // ignored for the same reason as in QueryEvent. No-op for 0.
  void SynchronizeEvent(EventId event) override;

  // Returns the event to the pool (or destroys it when the pool is full).
  // No-op for 0.
  void ReleaseEvent(EventId event) override;

 private:
  // The driver entry points used for expandable segments. Defined in the .cpp
  // so that this header does not pull in <cuda.h>.
  struct DriverApi;

  // What MapPage created at an address; UnmapPage needs the handle back.
  struct Mapping {
    std::uint64_t handle = 0;  // CUmemGenericAllocationHandle
    std::size_t size = 0;
  };

  CudaDevice(int index, std::unique_ptr<DriverApi> driver);

  // Returns OK when the VMM functions can be called, else Unimplemented
  // naming the missing entry point (or the missing device support).
  absl::Status CheckVmm() const;

  // Returns the status for driver call `call` (e.g. "cuMemMap(0x..., 2097152
  // bytes)") that failed with CUresult `result`, named by the driver when it
  // can. An int because this header does not include <cuda.h>.
  absl::Status DriverError(absl::string_view call, int result) const;

  const int index_;
  const std::unique_ptr<const DriverApi> driver_;

  // About one event is outstanding per block freed while a side stream still
  // uses it. Pooling saves a cudaEventCreate per such free; the cap keeps a
  // burst from leaving many driver objects behind.
  static constexpr std::size_t kMaxPooledEvents = 64;

  mutable std::mutex mu_;
  absl::flat_hash_map<DevicePtr, Mapping> mappings_;  // Guarded by mu_.
  std::vector<EventId> event_pool_;                   // Guarded by mu_.
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_CUDA_DEVICE_H_
