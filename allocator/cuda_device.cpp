#include "allocator/cuda_device.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

#if CUDART_VERSION < 11030
#error "CudaDevice needs CUDA 11.3 or newer (cudaGetDriverEntryPoint)"
#endif

namespace memscope {

// Function pointers into the driver (libcuda), looked up at run time. Any of
// them may be null when the installed driver lacks the symbol.
struct CudaDevice::DriverApi {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;

  // Empty when expandable segments can be used; otherwise the reason they
  // cannot (a missing entry point, or a GPU without VMM support), returned as
  // Unimplemented by every VMM method.
  std::string vmm_unavailable;
};

namespace {

#if CUDART_VERSION >= 12050
// The driver ABI requested from cudaGetDriverEntryPointByVersion. The cuMem*
// functions still have the ABI they got in CUDA 10.2 (the *_v10020 typedefs),
// so asking for 12.0 returns exactly those versions. Pinning it (rather than
// passing CUDART_VERSION) keeps the typedefs and the returned functions in
// agreement across toolkits, and 12.0 is old enough for every driver that a
// 12.5+ runtime accepts; a version newer than the driver is an error.
constexpr unsigned int kDriverAbiVersion = 12000;
#endif

// Returns the driver function named `symbol` (the base name, e.g.
// "cuMemCreate"), or null when the driver does not provide it.
void* LookUpDriverFunction(const char* symbol) {
  void* fn = nullptr;
#if CUDART_VERSION >= 12050
  // CUDA 13 marks cudaGetDriverEntryPoint deprecated (an error under
  // -Werror) in favour of this variant with an explicit ABI version.
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &fn, kDriverAbiVersion, cudaEnableDefault, &found);
#elif CUDART_VERSION >= 12000
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &found);
#else
  // CUDA 11.3 - 11.8 have no query result; `fn` stays null when not found.
  const cudaError_t err = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault);
#endif
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // Do not leave the error for the next call.
    return nullptr;
  }
#if CUDART_VERSION >= 12000
  if (found != cudaDriverEntryPointSuccess) return nullptr;
#endif
  return fn;
}

// Looks `symbol` up into `fn`. Returns false when it is missing.
template <typename Fn>
bool LookUp(const char* symbol, Fn& fn) {
  // Object-to-function pointer casts are conditionally supported; every
  // platform CUDA runs on supports them (dlsym relies on the same thing).
  fn = reinterpret_cast<Fn>(LookUpDriverFunction(symbol));
  return fn != nullptr;
}

// Returns `text` with line breaks replaced by spaces, so that every status
// message stays on one line whatever the CUDA library returns.
std::string OneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
  return text;
}

// Returns "<description> (<cudaErrorName>)" for a runtime error.
std::string RuntimeErrorText(cudaError_t err) {
  return OneLine(absl::StrFormat("%s (%s)", cudaGetErrorString(err), cudaGetErrorName(err)));
}

absl::StatusCode RuntimeErrorCode(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation: return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle: return absl::StatusCode::kInvalidArgument;
    // The machine lacks a (new enough) driver or a GPU: retrying cannot help.
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorInitializationError: return absl::StatusCode::kFailedPrecondition;
    // The GPU is there but taken (exclusive-process mode) or busy: this can
    // change, so it is worth retrying later.
    case cudaErrorDevicesUnavailable: return absl::StatusCode::kUnavailable;
    default: return absl::StatusCode::kInternal;
  }
}

absl::StatusCode DriverErrorCode(CUresult result) {
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY: return absl::StatusCode::kResourceExhausted;
    case CUDA_ERROR_INVALID_VALUE: return absl::StatusCode::kInvalidArgument;
    case CUDA_ERROR_NOT_SUPPORTED: return absl::StatusCode::kUnimplemented;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_INVALID_CONTEXT: return absl::StatusCode::kFailedPrecondition;
    default: return absl::StatusCode::kInternal;
  }
}

// Returns a status for a failed runtime call and clears the error, because
// the runtime otherwise reports it again from the next unrelated call.
absl::Status RuntimeError(int index, absl::string_view call, cudaError_t err) {
  (void)cudaGetLastError();
  return absl::Status(RuntimeErrorCode(err),
                      absl::StrFormat("CUDA device %d: %s failed: %s", index, call, RuntimeErrorText(err)));
}

// Returns the status for a device that cannot be opened. Unknown runtime
// errors become Unavailable rather than Internal: from the caller's point of
// view the GPU simply cannot be used, and a retry may succeed.
absl::Status OpenError(int index, cudaError_t err) {
  (void)cudaGetLastError();
  absl::StatusCode code = RuntimeErrorCode(err);
  if (code == absl::StatusCode::kInternal) {
    code = absl::StatusCode::kUnavailable;
  }
  return absl::Status(code, absl::StrFormat("CUDA device %d unavailable: %s", index, RuntimeErrorText(err)));
}

// Makes a device current for the lifetime of the object, then puts the
// caller's device back.
//
// The previous device is only restored when the thread had a context current
// on entry. On a thread that never used CUDA, cudaGetDevice still reports
// device 0, and since CUDA 12 cudaSetDevice(0) would create a primary context
// on GPU 0 (hundreds of MiB) just to "restore" it -- exactly the kind of
// phantom usage a memory profiler must not cause.
class ScopedDevice {
 public:
  // `get_current` may be null (unknown driver state): then the previous
  // device is restored whenever it differs, like a plain device guard.
  ScopedDevice(int index, PFN_cuCtxGetCurrent_v4000 get_current) {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) {
      (void)cudaGetLastError();
      previous = -1;
    }
    bool had_context = true;
    if (get_current != nullptr) {
      CUcontext context = nullptr;
      had_context = get_current(&context) == CUDA_SUCCESS && context != nullptr;
    }
    // Always call cudaSetDevice, even when `previous == index`: only it
    // guarantees that the primary context is current on this thread, which
    // the driver (cuMem*) calls need.
    error_ = cudaSetDevice(index);
    if (error_ != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (had_context && previous >= 0 && previous != index) {
      previous_ = previous;
    }
  }

  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  ~ScopedDevice() {
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }

  // Returns cudaSuccess when the device was made current.
  cudaError_t error() const { return error_; }

 private:
  cudaError_t error_ = cudaSuccess;
  int previous_ = -1;
};

cudaStream_t ToStream(StreamId stream) { return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(stream)); }

cudaEvent_t ToEvent(EventId event) { return reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(event)); }

EventId FromEvent(cudaEvent_t event) { return static_cast<EventId>(reinterpret_cast<std::uintptr_t>(event)); }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int device_index) {
  if (device_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA device %d unavailable: device index must be >= 0", device_index));
  }
  // Also loads the driver. With no driver (or no GPU) this is where it shows.
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return OpenError(device_index, err);
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("CUDA device %d unavailable: no CUDA-capable device is detected", device_index));
  }
  if (device_index >= count) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA device %d unavailable: only %d CUDA device(s) visible", device_index, count));
  }

  // Look the driver functions up before touching any device, so that the
  // device guard below can already ask whether a context is current.
  auto driver = std::make_unique<DriverApi>();
  LookUp("cuGetErrorName", driver->get_error_name);
  LookUp("cuGetErrorString", driver->get_error_string);
  LookUp("cuCtxGetCurrent", driver->ctx_get_current);
  struct Required {
    const char* symbol;
    bool found;
  };
  const Required required[] = {
      {"cuMemAddressReserve", LookUp("cuMemAddressReserve", driver->mem_address_reserve)},
      {"cuMemAddressFree", LookUp("cuMemAddressFree", driver->mem_address_free)},
      {"cuMemCreate", LookUp("cuMemCreate", driver->mem_create)},
      {"cuMemRelease", LookUp("cuMemRelease", driver->mem_release)},
      {"cuMemMap", LookUp("cuMemMap", driver->mem_map)},
      {"cuMemUnmap", LookUp("cuMemUnmap", driver->mem_unmap)},
      {"cuMemSetAccess", LookUp("cuMemSetAccess", driver->mem_set_access)},
  };
  for (const Required& r : required) {
    if (!r.found) {
      driver->vmm_unavailable = absl::StrFormat(
          "CUDA device %d: driver entry point %s not found; expandable "
          "segments need a driver with the virtual memory management API",
          device_index, r.symbol);
      break;
    }
  }

  // Open the device now (cudaSetDevice creates its primary context), so that
  // a GPU that exists but cannot be used fails here, not on the first Malloc.
  ScopedDevice guard(device_index, driver->ctx_get_current);
  if (guard.error() != cudaSuccess) {
    return OpenError(device_index, guard.error());
  }

  // Some GPUs (and some virtualised setups) have the functions but not the
  // feature. Ask once instead of failing on every MapPage.
  if (driver->vmm_unavailable.empty()) {
    PFN_cuDeviceGet_v2000 device_get = nullptr;
    PFN_cuDeviceGetAttribute_v2000 get_attribute = nullptr;
    CUdevice device = 0;
    int supported = 0;
    if (LookUp("cuDeviceGet", device_get) && LookUp("cuDeviceGetAttribute", get_attribute) &&
        device_get(&device, device_index) == CUDA_SUCCESS &&
        get_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) == CUDA_SUCCESS &&
        supported == 0) {
      driver->vmm_unavailable = absl::StrFormat(
          "CUDA device %d does not support virtual memory management "
          "(needed by expandable segments)",
          device_index);
    }
  }

  return std::unique_ptr<CudaDevice>(new CudaDevice(device_index, std::move(driver)));
}

CudaDevice::CudaDevice(int index, std::unique_ptr<DriverApi> driver) : index_(index), driver_(std::move(driver)) {}

CudaDevice::~CudaDevice() {
  std::lock_guard<std::mutex> lock(mu_);
  if (event_pool_.empty()) return;
  // No driver pointers here (see the header). If the runtime is already
  // shutting down these calls just return cudaErrorCudartUnloading.
  ScopedDevice guard(index_, /*get_current=*/nullptr);
  for (EventId event : event_pool_) {
    if (cudaEventDestroy(ToEvent(event)) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }
  event_pool_.clear();
}

absl::StatusOr<DevicePtr> CudaDevice::Malloc(std::size_t size) {
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("CUDA device %d: cannot allocate 0 bytes", index_));
  }
  ScopedDevice guard(index_, driver_->ctx_get_current);
  if (guard.error() != cudaSuccess) {
    return RuntimeError(index_, "cudaSetDevice", guard.error());
  }
  void* ptr = nullptr;
  if (cudaError_t err = cudaMalloc(&ptr, size); err != cudaSuccess) {
    return RuntimeError(index_, absl::StrFormat("cudaMalloc(%u bytes)", size), err);
  }
  return static_cast<DevicePtr>(reinterpret_cast<std::uintptr_t>(ptr));
}

absl::Status CudaDevice::Free(DevicePtr ptr) {
  if (ptr == 0) return absl::OkStatus();
  ScopedDevice guard(index_, driver_->ctx_get_current);
  if (guard.error() != cudaSuccess) {
    return RuntimeError(index_, "cudaSetDevice", guard.error());
  }
  void* p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr));
  if (cudaError_t err = cudaFree(p); err != cudaSuccess) {
    return RuntimeError(index_, absl::StrFormat("cudaFree(0x%x)", ptr), err);
  }
  return absl::OkStatus();
}

DeviceMemoryInfo CudaDevice::MemoryInfo() const {
  ScopedDevice guard(index_, driver_->ctx_get_current);
  DeviceMemoryInfo info;
  if (guard.error() != cudaSuccess) return info;
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return info;
  }
  info.free_bytes = free_bytes;
  info.total_bytes = total_bytes;
  return info;
}

absl::Status CudaDevice::CheckVmm() const {
  if (!driver_->vmm_unavailable.empty()) {
    return absl::UnimplementedError(driver_->vmm_unavailable);
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::DriverError(absl::string_view call, int result) const {
  const CUresult code = static_cast<CUresult>(result);
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver_->get_error_name == nullptr || driver_->get_error_name(code, &name) != CUDA_SUCCESS) {
    name = nullptr;
  }
  if (driver_->get_error_string == nullptr || driver_->get_error_string(code, &text) != CUDA_SUCCESS) {
    text = nullptr;
  }
  const std::string description = name == nullptr ? absl::StrFormat("CUresult %d", result)
                                                  : absl::StrFormat("%s (%s)", text != nullptr ? text : name, name);
  return absl::Status(DriverErrorCode(code),
                      OneLine(absl::StrFormat("CUDA device %d: %s failed: %s", index_, call, description)));
}

absl::StatusOr<DevicePtr> CudaDevice::ReserveAddress(std::size_t size) {
  if (absl::Status vmm = CheckVmm(); !vmm.ok()) return vmm;
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA device %d: cannot reserve 0 bytes of address space", index_));
  }
  ScopedDevice guard(index_, driver_->ctx_get_current);
  if (guard.error() != cudaSuccess) {
    return RuntimeError(index_, "cudaSetDevice", guard.error());
  }
  CUdeviceptr ptr = 0;
  // Alignment 0 means the allocation granularity, which MapPage needs.
  if (CUresult result = driver_->mem_address_reserve(&ptr, size, /*alignment=*/0, /*addr=*/0, /*flags=*/0);
      result != CUDA_SUCCESS) {
    return DriverError(absl::StrFormat("cuMemAddressReserve(%u bytes)", size), result);
  }
  return static_cast<DevicePtr>(ptr);
}

absl::Status CudaDevice::ReleaseAddress(DevicePtr ptr, std::size_t size) {
  if (absl::Status vmm = CheckVmm(); !vmm.ok()) return vmm;
  ScopedDevice guard(index_, driver_->ctx_get_current);
  if (guard.error() != cudaSuccess) {
    return RuntimeError(index_, "cudaSetDevice", guard.error());
  }
  if (CUresult result = driver_->mem_address_free(static_cast<CUdeviceptr>(ptr), size); result != CUDA_SUCCESS) {
    return DriverError(absl::StrFormat("cuMemAddressFree(0x%x, %u bytes)", ptr, size), result);
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::MapPage(DevicePtr ptr, std::size_t size) {
  if (absl::Status vmm = CheckVmm(); !vmm.ok()) return vmm;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (mappings_.contains(ptr)) {
      return absl::AlreadyExistsError(absl::StrFormat("CUDA device %d: a page is already mapped at 0x%x", index_, ptr));
    }
  }
  ScopedDevice guard(index_, driver_->ctx_get_current);
  if (guard.error() != cudaSuccess) {
    return RuntimeError(index_, "cudaSetDevice", guard.error());
  }
  const std::string args = absl::StrFormat("(0x%x, %u bytes)", ptr, size);

  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = index_;
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult result = driver_->mem_create(&handle, size, &prop, 0); result != CUDA_SUCCESS) {
    return DriverError(absl::StrCat("cuMemCreate", args), result);
  }
  const CUdeviceptr address = static_cast<CUdeviceptr>(ptr);
  if (CUresult result = driver_->mem_map(address, size, 0, handle, 0); result != CUDA_SUCCESS) {
    (void)driver_->mem_release(handle);
    return DriverError(absl::StrCat("cuMemMap", args), result);
  }
  // Mapped memory cannot be touched until access is granted explicitly.
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult result = driver_->mem_set_access(address, size, &access, 1); result != CUDA_SUCCESS) {
    (void)driver_->mem_unmap(address, size);
    (void)driver_->mem_release(handle);
    return DriverError(absl::StrCat("cuMemSetAccess", args), result);
  }

  std::lock_guard<std::mutex> lock(mu_);
  mappings_[ptr] = Mapping{static_cast<std::uint64_t>(handle), size};
  return absl::OkStatus();
}

absl::Status CudaDevice::UnmapPage(DevicePtr ptr, std::size_t size) {
  if (absl::Status vmm = CheckVmm(); !vmm.ok()) return vmm;
  Mapping mapping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mappings_.find(ptr);
    if (it == mappings_.end()) {
      return absl::NotFoundError(absl::StrFormat("CUDA device %d: no page mapped at 0x%x", index_, ptr));
    }
    if (it->second.size != size) {
      return absl::InvalidArgumentError(absl::StrFormat("CUDA device %d: page at 0x%x has %u bytes, asked to unmap %u",
                                                        index_, ptr, it->second.size, size));
    }
    mapping = it->second;
    mappings_.erase(it);
  }
  // On failure the page is still mapped: put the handle back so that a
  // retry can still release it.
  auto restore = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    mappings_[ptr] = mapping;
  };
  ScopedDevice guard(index_, driver_->ctx_get_current);
  if (guard.error() != cudaSuccess) {
    restore();
    return RuntimeError(index_, "cudaSetDevice", guard.error());
  }
  // cudaFree waits for the device before freeing; cuMemUnmap does not, and
  // unmapping memory a queued kernel still touches is an illegal-address
  // fault. The interface names no stream, so wait for the whole device, as
  // cudaFree would. Once the device is idle, the next page's wait is cheap.
  if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
    restore();
    return RuntimeError(index_, "cudaDeviceSynchronize before cuMemUnmap", err);
  }
  if (CUresult result = driver_->mem_unmap(static_cast<CUdeviceptr>(ptr), size); result != CUDA_SUCCESS) {
    restore();
    return DriverError(absl::StrFormat("cuMemUnmap(0x%x, %u bytes)", ptr, size), result);
  }
  // The physical memory goes back to the GPU once it is both unmapped and
  // released.
  if (CUresult result = driver_->mem_release(static_cast<CUmemGenericAllocationHandle>(mapping.handle));
      result != CUDA_SUCCESS) {
    return DriverError(absl::StrFormat("cuMemRelease(page at 0x%x)", ptr), result);
  }
  return absl::OkStatus();
}

EventId CudaDevice::RecordEvent(StreamId stream) {
  ScopedDevice guard(index_, driver_->ctx_get_current);
  cudaEvent_t event = nullptr;
  if (guard.error() == cudaSuccess) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!event_pool_.empty()) {
        event = ToEvent(event_pool_.back());
        event_pool_.pop_back();
      }
    }
    if (event == nullptr && cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      event = nullptr;
    }
    if (event != nullptr) {
      if (cudaEventRecord(event, ToStream(stream)) == cudaSuccess) {
        return FromEvent(event);
      }
      (void)cudaGetLastError();
      ReleaseEvent(FromEvent(event));
    }
  }
  // No event: wait for the stream here instead, so that "0 = complete" is
  // true and the allocator never hands out memory the stream still uses.
  if (cudaStreamSynchronize(ToStream(stream)) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  return 0;
}

bool CudaDevice::QueryEvent(EventId event) {
  if (event == 0) return true;
  ScopedDevice guard(index_, driver_->ctx_get_current);
  cudaError_t err = cudaEventQuery(ToEvent(event));
  if (err == cudaSuccess) return true;
  (void)cudaGetLastError();
  return err != cudaErrorNotReady;
}

void CudaDevice::SynchronizeEvent(EventId event) {
  if (event == 0) return;
  ScopedDevice guard(index_, driver_->ctx_get_current);
  if (cudaEventSynchronize(ToEvent(event)) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

void CudaDevice::ReleaseEvent(EventId event) {
  if (event == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (event_pool_.size() < kMaxPooledEvents) {
      event_pool_.push_back(event);
      return;
    }
  }
  ScopedDevice guard(index_, driver_->ctx_get_current);
  if (cudaEventDestroy(ToEvent(event)) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

}  // namespace memscope
