#include "allocator/sim_device.h"

#include <sys/mman.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "allocator/sizes.h"

namespace memscope {
namespace {

// Simulated addresses start where CUDA's often do, far from 0 so that a
// stray 0 or small integer is never a valid address.
constexpr DevicePtr kAddressBase = 0x7f0000000000ULL;

void* MapHost(std::size_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

SimDevice::SimDevice(SimDeviceOptions options) : options_(options), next_address_(kAddressBase) {}

SimDevice::~SimDevice() {
  if (ledger_ != nullptr && used_ + outside_ > 0) ledger_->Credit(ledger_device_, ledger_process_, used_ + outside_);
  for (auto& [base, region] : regions_) {
    if (region.host != nullptr) munmap(region.host, region.size);
  }
}

bool SimDevice::ConsumeAllocationCall() {
  ++allocation_calls_;
  if (fail_at_call_ != 0 && allocation_calls_ == fail_at_call_) {
    fail_at_call_ = 0;
    return false;
  }
  return true;
}

DevicePtr SimDevice::BumpAddress(std::size_t size, std::size_t alignment) {
  next_address_ = (next_address_ + alignment - 1) / alignment * alignment;
  const DevicePtr p = next_address_;
  next_address_ += (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
  return p;
}

absl::Status SimDevice::UseLedger(std::shared_ptr<DeviceLedger> ledger, int physical, int process) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (physical < 0 || physical >= DeviceLedger::kMaxDevices) {
    return absl::InvalidArgumentError(
        absl::StrCat("physical GPU ", physical, ": the simulation has GPUs 0 to ", DeviceLedger::kMaxDevices - 1));
  }
  if (used_ + outside_ > 0 || ledger_ != nullptr) {
    return absl::FailedPreconditionError("UseLedger: the device already allocated or has a ledger");
  }
  ledger_ = std::move(ledger);
  ledger_device_ = physical;
  ledger_process_ = process;
  return absl::OkStatus();
}

absl::Status SimDevice::Charge(std::size_t size) {
  if (size > options_.capacity - used_ - outside_) {
    shared_oom_holders_.clear();
    return absl::ResourceExhaustedError(absl::StrCat("simulated GPU ", options_.index, " is out of memory"));
  }
  if (ledger_ != nullptr && !ledger_->TryCharge(ledger_device_, ledger_process_, size, options_.capacity)) {
    shared_oom_holders_.clear();
    for (int p = 0; p < DeviceLedger::kMaxProcesses; ++p) {
      if (const std::uint64_t held = ledger_->UsedBy(ledger_device_, p); held > 0) {
        shared_oom_holders_.emplace_back(p, held);
      }
    }
    return absl::ResourceExhaustedError(absl::StrCat("simulated GPU ", options_.index, " is out of memory"));
  }
  used_ += size;
  return absl::OkStatus();
}

absl::Status SimDevice::ChargeOutside(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (absl::Status s = Charge(bytes); !s.ok()) return s;
  used_ -= bytes;  // Charge counted it as an allocation
  outside_ += bytes;
  return absl::OkStatus();
}

std::size_t SimDevice::outside_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outside_;
}

std::vector<std::pair<int, std::uint64_t>> SimDevice::shared_oom_holders() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shared_oom_holders_;
}

void SimDevice::Uncharge(std::size_t size) {
  used_ -= size;
  if (ledger_ != nullptr) ledger_->Credit(ledger_device_, ledger_process_, size);
}

absl::StatusOr<DevicePtr> SimDevice::Malloc(std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!ConsumeAllocationCall()) return absl::ResourceExhaustedError("injected device allocation failure");
  if (absl::Status s = Charge(size); !s.ok()) return s;
  Region region{size, nullptr, false};
  if (options_.host_backed && size > 0) {
    region.host = MapHost(size);
    if (region.host == nullptr) {
      Uncharge(size);
      return absl::ResourceExhaustedError("host backing: mmap failed");
    }
  }
  DevicePtr p = TakePlanned(planned_mallocs_, &next_planned_malloc_, size, /*match_size=*/true);
  if (p == 0) p = BumpAddress(size, kMinBlockSize);
  regions_.emplace(p, region);
  return p;
}

absl::Status SimDevice::Free(DevicePtr ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(ptr);
  if (it == regions_.end() || it->second.reservation) {
    return absl::InvalidArgumentError(absl::StrCat("cudaFree: 0x", absl::Hex(ptr), " was not allocated"));
  }
  if (it->second.host != nullptr) munmap(it->second.host, it->second.size);
  Uncharge(it->second.size);
  regions_.erase(it);
  return absl::OkStatus();
}

DeviceMemoryInfo SimDevice::MemoryInfo() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ledger_ != nullptr) {
    const std::uint64_t used = ledger_->Used(ledger_device_);
    return {used < options_.capacity ? options_.capacity - used : 0, options_.capacity};
  }
  return {options_.capacity - used_ - outside_, options_.capacity};
}

absl::StatusOr<DevicePtr> SimDevice::ReserveAddress(std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  Region region{size, nullptr, true};
  if (options_.host_backed && size > 0) {
    // Address space only: pages become usable when mapped (PROT_NONE until then).
    region.host = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region.host == MAP_FAILED) return absl::ResourceExhaustedError("host backing: mmap failed");
  }
  DevicePtr p = TakePlanned(planned_reservations_, &next_planned_reservation_, size, /*match_size=*/false);
  if (p == 0) p = BumpAddress(size, kSmallBuffer);
  regions_.emplace(p, region);
  return p;
}

absl::Status SimDevice::ReleaseAddress(DevicePtr ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(ptr);
  if (it == regions_.end() || !it->second.reservation || it->second.size != size) {
    return absl::InvalidArgumentError(absl::StrCat("cuMemAddressFree: 0x", absl::Hex(ptr), " is not a reservation"));
  }
  for (auto p = pages_.begin(); p != pages_.end();) {
    if (p->first >= ptr && p->first < ptr + size) {
      Uncharge(p->second);
      pages_.erase(p++);
    } else {
      ++p;
    }
  }
  if (it->second.host != nullptr) munmap(it->second.host, it->second.size);
  regions_.erase(it);
  return absl::OkStatus();
}

bool SimDevice::Overlaps(DevicePtr ptr, std::size_t size) const {
  auto it = regions_.lower_bound(ptr + (size == 0 ? 1 : size));
  if (it == regions_.begin()) return false;
  --it;
  return it->first + std::max<std::size_t>(it->second.size, 1) > ptr;
}

DevicePtr SimDevice::TakePlanned(const std::vector<PlannedAddress>& plan, std::size_t* next, std::size_t size,
                                 bool match_size) {
  if (plan_paused_ || *next >= plan.size() || (match_size && plan[*next].size != size)) return 0;
  const DevicePtr p = plan[(*next)++].addr;
  // A range already in use (the replay went its own way) or one that wraps: the device's own address.
  if (p == 0 || p > ~DevicePtr{0} - size || Overlaps(p, size)) {
    ++planned_missed_;
    return 0;
  }
  ++planned_taken_;
  const DevicePtr end = p + (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
  if (end > next_address_) next_address_ = end;
  return p;
}

void SimDevice::PlanAddresses(std::vector<PlannedAddress> mallocs, std::vector<PlannedAddress> reservations) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A reservation's size is the device's choice (expandable segments reserve
  // more than the device holds): room for twice the capacity after its base.
  const std::size_t reservation_room = std::max<std::size_t>(options_.capacity, kSmallBuffer) * 2;
  for (const std::vector<PlannedAddress>* plan : {&mallocs, &reservations}) {
    for (const PlannedAddress& a : *plan) {
      const std::size_t size = plan == &mallocs ? a.size : std::max(a.size, reservation_room);
      if (a.addr <= ~DevicePtr{0} - size - kSmallBuffer) {
        next_address_ =
            std::max<DevicePtr>(next_address_, (a.addr + size + kSmallBuffer) / kSmallBuffer * kSmallBuffer);
      }
    }
  }
  planned_mallocs_ = std::move(mallocs);
  planned_reservations_ = std::move(reservations);
  next_planned_malloc_ = next_planned_reservation_ = 0;
  planned_taken_ = planned_missed_ = 0;
  plan_paused_ = false;
}

void SimDevice::PausePlan(bool paused) {
  std::lock_guard<std::mutex> lock(mutex_);
  plan_paused_ = paused;
}

std::uint64_t SimDevice::planned_taken() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return planned_taken_;
}

std::uint64_t SimDevice::planned_missed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return planned_missed_ + (planned_mallocs_.size() - next_planned_malloc_) +
         (planned_reservations_.size() - next_planned_reservation_);
}

const SimDevice::Region* SimDevice::FindRegion(DevicePtr ptr, DevicePtr* base) const {
  auto it = regions_.upper_bound(ptr);
  if (it == regions_.begin()) return nullptr;
  --it;
  if (ptr >= it->first + it->second.size) return nullptr;
  *base = it->first;
  return &it->second;
}

absl::Status SimDevice::MapPage(DevicePtr ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  DevicePtr base = 0;
  const Region* region = FindRegion(ptr, &base);
  if (region == nullptr || !region->reservation || ptr + size > base + region->size) {
    return absl::InvalidArgumentError(absl::StrCat("cuMemMap: 0x", absl::Hex(ptr), " is outside any reservation"));
  }
  if (pages_.contains(ptr)) return absl::FailedPreconditionError("cuMemMap: page already mapped");
  if (!ConsumeAllocationCall()) return absl::ResourceExhaustedError("injected device allocation failure");
  if (absl::Status s = Charge(size); !s.ok()) return s;
  if (region->host != nullptr) {
    void* host = static_cast<char*>(region->host) + (ptr - base);
    if (mprotect(host, size, PROT_READ | PROT_WRITE) != 0) {
      Uncharge(size);
      return absl::ResourceExhaustedError("host backing: mprotect failed");
    }
  }
  pages_.emplace(ptr, size);
  return absl::OkStatus();
}

absl::Status SimDevice::UnmapPage(DevicePtr ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pages_.find(ptr);
  if (it == pages_.end() || it->second != size) {
    return absl::InvalidArgumentError(absl::StrCat("cuMemUnmap: 0x", absl::Hex(ptr), " is not a mapped page"));
  }
  DevicePtr base = 0;
  const Region* region = FindRegion(ptr, &base);
  if (region != nullptr && region->host != nullptr) {
    void* host = static_cast<char*>(region->host) + (ptr - base);
    madvise(host, size, MADV_DONTNEED);
    mprotect(host, size, PROT_NONE);
  }
  Uncharge(size);
  pages_.erase(it);
  return absl::OkStatus();
}

EventId SimDevice::RecordEvent(StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  const EventId id = next_event_++;
  events_.emplace(id, Event{stream, ++recorded_[stream]});
  return id;
}

bool SimDevice::QueryEvent(EventId event) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = events_.find(event);
  if (it == events_.end()) return true;
  return it->second.sequence <= completed_[it->second.stream];
}

void SimDevice::SynchronizeEvent(EventId event) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = events_.find(event);
  if (it == events_.end()) return;
  std::uint64_t& done = completed_[it->second.stream];
  if (done < it->second.sequence) done = it->second.sequence;
}

void SimDevice::ReleaseEvent(EventId event) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.erase(event);
}

void SimDevice::FailNthAllocation(std::uint64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_at_call_ = n == 0 ? 0 : allocation_calls_ + n;
}

void SimDevice::CompleteStream(StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  completed_[stream] = recorded_[stream];
}

void SimDevice::CompleteAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [stream, n] : recorded_) completed_[stream] = n;
}

void* SimDevice::HostPointer(DevicePtr ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  DevicePtr base = 0;
  const Region* region = FindRegion(ptr, &base);
  if (region == nullptr || region->host == nullptr) return nullptr;
  return static_cast<char*>(region->host) + (ptr - base);
}

std::size_t SimDevice::used_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

std::uint64_t SimDevice::allocation_calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocation_calls_;
}

std::size_t SimDevice::live_allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t n = pages_.size();
  for (const auto& [base, region] : regions_) n += region.reservation ? 0 : 1;
  return n;
}

std::size_t SimDevice::live_reservations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t n = 0;
  for (const auto& [base, region] : regions_) n += region.reservation ? 1 : 0;
  return n;
}

std::size_t SimDevice::pending_events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

}  // namespace memscope
