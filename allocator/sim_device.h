// A simulated GPU: capacity, its own address space, 512-byte alignment,
// cudaMalloc-like failure when full, virtual reservations with mapped pages,
// per-stream events that complete when told to, and fault injection.
//
//   SimDevice gpu({.capacity = 16 * kGiB});
//   CachingAllocator allocator(gpu);
//   gpu.FailNthAllocation(3);   // the 3rd device allocation from now fails
//   gpu.CompleteAll();          // all queued stream work is done
//
// Ranks sharing a GPU share its capacity through a DeviceLedger
// (allocator/device_ledger.h): gpu.UseLedger(ledger, physical, rank).
//
// With host_backed, every device byte has a host byte behind it
// (HostPointer), so CPU kernels can run on "device" memory.
#ifndef MEMSCOPE_ALLOCATOR_SIM_DEVICE_H_
#define MEMSCOPE_ALLOCATOR_SIM_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include <memory>

#include "absl/container/flat_hash_map.h"
#include "allocator/device.h"
#include "allocator/device_ledger.h"

namespace memscope {

inline constexpr std::size_t kGiB = 1024ULL * 1024 * 1024;

// An address another device gave (a PyTorch snapshot's segment_alloc or the
// first segment_map of an expandable segment): a replay on a SimDevice hands
// it out again when its calls come in the same order (see PlanAddresses).
struct PlannedAddress {
  std::size_t size = 0;  // cudaMalloc: the size it must match; reservations: the bytes mapped from it (extent)
  DevicePtr addr = 0;
};

struct SimDeviceOptions {
  std::size_t capacity = 80 * kGiB;
  int index = 0;
  bool host_backed = false;
};

class SimDevice final : public Device {
 public:
  explicit SimDevice(SimDeviceOptions options = {});
  ~SimDevice() override;
  SimDevice(const SimDevice&) = delete;
  SimDevice& operator=(const SimDevice&) = delete;

  int index() const override { return options_.index; }
  absl::StatusOr<DevicePtr> Malloc(std::size_t size) override;
  absl::Status Free(DevicePtr ptr) override;
  DeviceMemoryInfo MemoryInfo() const override;
  absl::StatusOr<DevicePtr> ReserveAddress(std::size_t size) override;
  absl::Status ReleaseAddress(DevicePtr ptr, std::size_t size) override;
  absl::Status MapPage(DevicePtr ptr, std::size_t size) override;
  absl::Status UnmapPage(DevicePtr ptr, std::size_t size) override;
  EventId RecordEvent(StreamId stream) override;
  bool QueryEvent(EventId event) override;
  void SynchronizeEvent(EventId event) override;
  void ReleaseEvent(EventId event) override;

  // Shares physical GPU `physical`'s capacity through `ledger` with every
  // other device (in this process or another) on the same ledger line, as
  // process `process` (a rank): allocations are charged to it and fail when
  // the device's used bytes, all processes included, would exceed capacity();
  // MemoryInfo() reports the shared free bytes. Call before the first
  // allocation. The device credits what it still holds when destroyed (a
  // process's memory is freed when it exits). Errors: `physical` out of
  // range, or the device already allocated.
  absl::Status UseLedger(std::shared_ptr<DeviceLedger> ledger, int physical, int process);
  // The ledger line (physical GPU) this device charges, or -1 without a ledger.
  int physical() const { return ledger_device_; }
  // Memory on this GPU outside any allocator (a CUDA context, NCCL's
  // buffers): it counts against capacity (and the ledger) like allocations,
  // never leaves through Free. ResourceExhausted ("simulated GPU N is out of
  // memory") when it does not fit.
  absl::Status ChargeOutside(std::size_t bytes);
  std::size_t outside_bytes() const;
  // When the last failed allocation failed because the shared GPU was full
  // (the others' memory with its own exceeded the capacity): the bytes each
  // process held on the GPU then, {process, bytes} by process, this one
  // included; empty otherwise.
  std::vector<std::pair<int, std::uint64_t>> shared_oom_holders() const;

  // Makes the `n`-th device allocation from now (Malloc or MapPage, 1-based)
  // fail with ResourceExhausted, as if the device were full. 0 disables.
  void FailNthAllocation(std::uint64_t n);
  // The addresses to hand out, so that a replay of a PyTorch snapshot places
  // its segments (and so, by the allocator's splits, its blocks) where the
  // file says. The n-th Malloc takes the next planned malloc address when its
  // size equals the plan's and the range is free; a Malloc of another size
  // gets an address of the device's own and leaves the plan where it is (a
  // segment the trace did not record). ReserveAddress takes the next planned
  // reservation base the same way (sizes are the device's own). The device's
  // own addresses start above every planned range.
  void PlanAddresses(std::vector<PlannedAddress> mallocs, std::vector<PlannedAddress> reservations);
  // While paused, calls get the device's own addresses and leave the plan as it is.
  void PausePlan(bool paused);
  // Planned addresses handed out so far, and those the replay did not take.
  std::uint64_t planned_taken() const;
  std::uint64_t planned_missed() const;

  // Marks all work queued so far on `stream` (or on every stream) complete.
  void CompleteStream(StreamId stream);
  void CompleteAll();

  // Host memory behind a device address (host-backed devices only; else
  // nullptr). Valid for addresses inside a live allocation or mapped page.
  void* HostPointer(DevicePtr ptr) const;

  std::size_t capacity() const { return options_.capacity; }
  // Bytes currently allocated or mapped.
  std::size_t used_bytes() const;
  // Device allocation calls so far (Malloc + MapPage, failed ones included).
  std::uint64_t allocation_calls() const;
  // Live Malloc allocations + mapped pages, and live reservations.
  std::size_t live_allocations() const;
  std::size_t live_reservations() const;
  std::size_t pending_events() const;

 private:
  struct Region {
    std::size_t size = 0;
    void* host = nullptr;  // mmap'd when host-backed
    bool reservation = false;
  };
  struct Event {
    StreamId stream;
    std::uint64_t sequence;
  };
  bool ConsumeAllocationCall();  // false when fault injection says fail
  // Charges `size` (capacity check, then the ledger's); the out-of-memory error otherwise.
  absl::Status Charge(std::size_t size);
  void Uncharge(std::size_t size);
  DevicePtr BumpAddress(std::size_t size, std::size_t alignment);
  const Region* FindRegion(DevicePtr ptr, DevicePtr* base) const;
  bool Overlaps(DevicePtr ptr, std::size_t size) const;
  // The planned address for a call of `size` from `plan` at `*next`, or 0.
  DevicePtr TakePlanned(const std::vector<PlannedAddress>& plan, std::size_t* next, std::size_t size, bool match_size);

  const SimDeviceOptions options_;
  mutable std::mutex mutex_;
  DevicePtr next_address_;
  std::size_t used_ = 0;
  std::size_t outside_ = 0;  // ChargeOutside's bytes (not in used_)
  std::uint64_t allocation_calls_ = 0;
  std::uint64_t fail_at_call_ = 0;
  std::map<DevicePtr, Region> regions_;                     // Malloc'd ranges and reservations
  absl::flat_hash_map<DevicePtr, std::size_t> pages_;       // mapped pages: address -> size
  absl::flat_hash_map<StreamId, std::uint64_t> recorded_;   // events recorded per stream
  absl::flat_hash_map<StreamId, std::uint64_t> completed_;  // ... and completed
  absl::flat_hash_map<EventId, Event> events_;
  EventId next_event_ = 1;
  std::vector<PlannedAddress> planned_mallocs_, planned_reservations_;
  std::size_t next_planned_malloc_ = 0, next_planned_reservation_ = 0;
  std::uint64_t planned_taken_ = 0, planned_missed_ = 0;
  bool plan_paused_ = false;
  std::shared_ptr<DeviceLedger> ledger_;
  int ledger_device_ = -1, ledger_process_ = -1;
  std::vector<std::pair<int, std::uint64_t>> shared_oom_holders_;
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_SIM_DEVICE_H_
