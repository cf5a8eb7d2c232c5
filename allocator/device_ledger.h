// DeviceLedger: the memory in use on each simulated GPU, shared by every
// process (rank) that runs on it. Ranks on one GPU share its capacity as on a
// real device: a SimDevice with a ledger charges each Malloc / MapPage to its
// device's line of the ledger and fails (ResourceExhausted, so the allocator
// frees its cache and retries, as on cudaMalloc's out-of-memory) when the
// device's used bytes, every process included, plus the request would exceed
// its capacity. Free / UnmapPage credit it; MemoryInfo() reports the shared
// free bytes (cudaMemGetInfo counts every process's memory).
//
// The ledger is a small file mapped MAP_SHARED by every process that opens
// it: one 64-bit counter per device (its used bytes) and one per device and
// process (a rank's share, for the device table and messages). The counters
// are updated with lock-free 64-bit atomics (std::atomic_ref), which are
// address-free, so they work across processes. A charge is one
// compare-and-swap loop on the device's counter: two processes can never
// both take the last bytes.
//
//   // Each rank process (ranks 0 and 1 both on physical GPU 0):
//   absl::StatusOr<std::shared_ptr<DeviceLedger>> ledger = DeviceLedger::Open(store_dir + "/device-ledger");
//   SimDevice gpu({.capacity = 16 * kGiB, .index = 0});
//   gpu.UseLedger(*ledger, /*physical=*/0, /*process=*/rank);   // before its first allocation
//   CachingAllocator allocator(gpu);
//
//   // A second device in the same process (rank 2 loading a checkpoint onto cuda:0):
//   SimDevice cuda0({.capacity = 16 * kGiB, .index = 0});
//   cuda0.UseLedger(*ledger, /*physical=*/0, /*process=*/2);
//   CachingAllocator allocator0(cuda0);   // its allocations count against GPU 0, beside ranks 0 and 1
//
// Memory outside any allocator (a CUDA context, NCCL buffers) is charged with
// TryCharge / Credit directly, under the same capacity.
//
// Without a ledger a SimDevice is alone on its GPU, as before.
#ifndef MEMSCOPE_ALLOCATOR_DEVICE_LEDGER_H_
#define MEMSCOPE_ALLOCATOR_DEVICE_LEDGER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace memscope {

class DeviceLedger {
 public:
  // Physical device ids 0..kMaxDevices-1; processes (ranks) 0..kMaxProcesses-1
  // have their own line per device (a process beyond is counted in the
  // device's total only).
  static constexpr int kMaxDevices = 256;
  static constexpr int kMaxProcesses = 128;

  // Opens the ledger file at `path`, shared with every process that opens the
  // same file, creating it (all zero) when missing: written whole under a
  // temporary name, then linked into place, so that every block of the
  // mapping exists and a full disk is an error here, never a SIGBUS later.
  // The file must be fresh for each job (it lives in the job's rendezvous
  // store). Errors name the path: it cannot be created or written (a full
  // disk says so), opened or mapped, or it is not a ledger.
  static absl::StatusOr<std::shared_ptr<DeviceLedger>> Open(const std::string& path);
  // A ledger in this process's memory only (tests; devices of one process).
  static std::shared_ptr<DeviceLedger> InMemory();

  ~DeviceLedger();
  DeviceLedger(const DeviceLedger&) = delete;
  DeviceLedger& operator=(const DeviceLedger&) = delete;

  // Charges `bytes` to physical device `device` for `process` when the
  // device's used bytes plus `bytes` stay within `capacity`; returns false,
  // charging nothing, otherwise. A device out of range is never charged.
  bool TryCharge(int device, int process, std::uint64_t bytes, std::uint64_t capacity);
  // Returns bytes charged by TryCharge.
  void Credit(int device, int process, std::uint64_t bytes);

  // Bytes in use on `device`, every process included, and those of `process`.
  std::uint64_t Used(int device) const;
  std::uint64_t UsedBy(int device, int process) const;

 private:
  DeviceLedger(void* base, std::size_t size, bool mapped);
  std::uint64_t* Cell(std::size_t index) const;

  void* base_;
  std::size_t size_;
  bool mapped_;  // munmap on destruction (else heap)
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_DEVICE_LEDGER_H_
