// libmemscope-cupti.so: the CUPTI injection library of `memscope capture
// --all-device-memory`. The CUDA driver loads it at cuInit when
// CUDA_INJECTION64_PATH names it and calls InitializeInjection, which:
//   - enables CUPTI's MEMORY2 (every device allocation and release) and
//     MEMORY_POOL (stream-ordered pools created, trimmed, destroyed)
//     activities, into at most kMaxActivityBuffers buffers of
//     kActivityBufferBytes (8 MiB each, 32 MiB in all): when all are with
//     CUPTI and none is back yet, CUPTI drops records and counts them
//     (written as a mark "cupti_dropped_records N" at the end);
//   - subscribes to the driver's and runtime's allocation calls, and at
//     each call's entry names the calling library from the thread's stack
//     (backtrace, dladdr; devicemem/library.h), kept by the call's
//     correlation id (at most kMaxPendingCallers waiting for their record);
//   - samples NVML's used memory of the process on each GPU at its first
//     allocation there ("start"), whenever the job calls
//     memscope_device_sample(label) (the start-up module does at each phase
//     end), and at exit ("end");
//   - writes each GPU's records as a device timeline
//     (devicemem/device_timeline.h) in $MEMSCOPE_CAPTURE_DIR/.memscope-capture/.
// Anything that fails is one line on stderr, never a failure of the job.
// Untested on a GPU.
#include <cuda.h>
#include <cupti.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "devicemem/cupti_records.h"
#include "devicemem/device_timeline.h"
#include "devicemem/gpu_memory_probe.h"
#include "devicemem/library.h"
#include "recording/timeline.h"

namespace memscope {
namespace {

constexpr std::size_t kActivityBufferBytes = std::size_t{8} << 20;
constexpr int kMaxActivityBuffers = 4;
constexpr std::size_t kMaxPendingCallers = std::size_t{1} << 16;
constexpr int kStackFrames = 48;

struct DeviceFile {
  std::unique_ptr<TimelineWriter> writer;
  std::unique_ptr<DeviceTimelineRecorder> recorder;
  std::string pci_bus_id;
};

struct State {
  std::mutex mu;
  std::string dir;
  std::string self;  // this library's path (its frames are not the caller)
  std::uint64_t start_ns = 0;
  std::int64_t wall_start_us = 0;
  std::map<std::uint32_t, DeviceFile> devices;  // by CUDA ordinal
  absl::flat_hash_map<std::uint32_t, Attribution> callers;  // by correlation id
  std::unique_ptr<GpuMemoryProbe> nvml;
  std::atomic<int> buffers_out{0};
  std::atomic<std::uint64_t> dropped{0};
  bool finished = false;
};

// Never destroyed: CUPTI's threads may call in while the process exits.
State& state() {
  static State* s = new State;
  return *s;
}

void Note(const std::string& line) { std::fprintf(stderr, "memscope capture: %s\n", line.c_str()); }

std::uint64_t Now() {
  std::uint64_t ts = 0;
  cuptiGetTimestamp(&ts);
  return ts;
}

// The file of device `ordinal`, created at its first use (under state().mu).
DeviceFile* DeviceFor(std::uint32_t ordinal, const std::string& pci_bus_id, std::uint64_t capacity) {
  State& s = state();
  if (auto it = s.devices.find(ordinal); it != s.devices.end()) return &it->second;
  Timeline header;
  header.device_index = static_cast<int>(ordinal);
  header.device_capacity = capacity;
  header.wall_start_us = s.wall_start_us;
  const std::string path = absl::StrCat(s.dir, "/device-pid-", ::getpid(), ".gpu-", ordinal, ".timeline");
  absl::StatusOr<std::unique_ptr<TimelineWriter>> writer = TimelineWriter::Create(path, header);
  if (!writer.ok()) {
    Note(std::string(writer.status().message()));
    return nullptr;
  }
  DeviceFile& f = s.devices[ordinal];
  f.writer = std::move(*writer);
  f.recorder = std::make_unique<DeviceTimelineRecorder>(*f.writer, s.start_ns);
  f.pci_bus_id = pci_bus_id;
  return &f;
}

// NVML samples of every known device, or only of `only` (under state().mu).
void SampleLocked(std::string_view label, std::optional<std::uint32_t> only = std::nullopt) {
  State& s = state();
  if (s.nvml == nullptr) return;
  std::vector<SampledDevice> devices;
  for (auto& [ordinal, f] : s.devices) {
    if (!f.pci_bus_id.empty() && (!only || *only == ordinal)) devices.push_back({f.pci_bus_id, f.recorder.get()});
  }
  SampleDevices(*s.nvml, static_cast<std::uint32_t>(::getpid()), Now(), label, devices);
}

// The driver's device queries, found in the process (the driver that
// loaded this library) rather than linked: the library itself then loads
// without a driver, as `memscope capture` checks it before the job.
struct DriverCalls {
  decltype(&cuCtxGetDevice) ctx_get_device = nullptr;
  decltype(&cuDeviceGetPCIBusId) pci_bus_id = nullptr;
  decltype(&cuDeviceTotalMem) total_mem = nullptr;
};
const DriverCalls& Driver() {
  static const DriverCalls calls = [] {
    DriverCalls c;
    c.ctx_get_device = reinterpret_cast<decltype(&cuCtxGetDevice)>(dlsym(RTLD_DEFAULT, "cuCtxGetDevice"));
    c.pci_bus_id = reinterpret_cast<decltype(&cuDeviceGetPCIBusId)>(dlsym(RTLD_DEFAULT, "cuDeviceGetPCIBusId"));
    c.total_mem = reinterpret_cast<decltype(&cuDeviceTotalMem)>(dlsym(RTLD_DEFAULT, "cuDeviceTotalMem_v2"));
    return c;
  }();
  return calls;
}

// At an allocation call's exit: the current device, its timeline made and
// first sampled when new.
void NoteCurrentDevice() {
  const DriverCalls& driver = Driver();
  CUdevice device = 0;
  if (driver.ctx_get_device == nullptr || driver.ctx_get_device(&device) != CUDA_SUCCESS) return;
  State& s = state();
  const auto ordinal = static_cast<std::uint32_t>(device);
  const auto known = [&] {
    const auto it = s.devices.find(ordinal);
    return it != s.devices.end() && !it->second.pci_bus_id.empty();
  };
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (known()) return;
  }
  char pci[32] = {};
  if (driver.pci_bus_id == nullptr || driver.pci_bus_id(pci, sizeof(pci), device) != CUDA_SUCCESS) return;
  std::size_t capacity = 0;
  if (driver.total_mem == nullptr || driver.total_mem(&capacity, device) != CUDA_SUCCESS) capacity = 0;
  std::lock_guard<std::mutex> lock(s.mu);
  if (known()) return;
  // (Its timeline may exist already, made by a record that came first.)
  DeviceFile* f = DeviceFor(ordinal, pci, capacity);
  if (f == nullptr) return;
  f->pci_bus_id = pci;
  SampleLocked("start", ordinal);
}

// The calling library of the allocation being made on this thread.
Attribution CallerOfThisCall() {
  void* frames[kStackFrames];
  const int n = backtrace(frames, kStackFrames);
  std::vector<std::string> objects;
  objects.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    Dl_info info{};
    objects.emplace_back(dladdr(frames[i], &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : "");
  }
  return AttributeFrames(objects, state().self);
}

void CUPTIAPI OnApiCall(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  const auto* call = static_cast<const CUpti_CallbackData*>(data);
  if (call->callbackSite == CUPTI_API_EXIT) {
    NoteCurrentDevice();
    return;
  }
  Attribution caller = CallerOfThisCall();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.callers.size() >= kMaxPendingCallers) s.callers.clear();  // records lost: those allocations' owner is ""
  s.callers[call->correlationId] = std::move(caller);
}

void CUPTIAPI OnBufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  State& s = state();
  *max_records = 0;
  if (s.buffers_out.fetch_add(1) >= kMaxActivityBuffers) {
    s.buffers_out.fetch_sub(1);
    *buffer = nullptr;  // CUPTI drops the records and counts them
    *size = 0;
    return;
  }
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kActivityBufferBytes));
  *size = *buffer != nullptr ? kActivityBufferBytes : 0;
  if (*buffer == nullptr) s.buffers_out.fetch_sub(1);
}

void AddRecord(const DeviceMemoryRecord& r) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  DeviceFile* f = DeviceFor(r.device, "", 0);
  if (f == nullptr) return;
  const auto caller = s.callers.find(r.correlation);
  f->recorder->Add(r, caller != s.callers.end() ? &caller->second : nullptr);
  if (caller != s.callers.end() && r.op == DeviceMemoryOp::kAlloc) s.callers.erase(caller);
}

void CUPTIAPI OnBufferCompleted(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  if (buffer == nullptr) return;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (const std::optional<DeviceMemoryRecord> r = ParseActivity(record)) AddRecord(*r);
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS) state().dropped += dropped;
  std::free(buffer);
  state().buffers_out.fetch_sub(1);
}

void Finish() {
  State& s = state();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.finished) return;
  s.finished = true;
  SampleLocked("end");
  for (auto& [ordinal, f] : s.devices) {
    if (s.dropped > 0) {
      Event e;
      e.time_ns = static_cast<std::int64_t>(Now() - s.start_ns);
      e.name = f.writer->Intern(absl::StrCat("cupti_dropped_records ", s.dropped.load()));
      f.writer->Append(e);
    }
    if (absl::Status st = f.writer->Flush(); !st.ok()) Note(std::string(st.message()));
  }
}

// The allocation calls whose callers are named (driver and runtime: a
// record's correlation id may be either's).
constexpr CUpti_CallbackId kDriverCalls[] = {
    CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2,          CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged,      CUPTI_DRIVER_TRACE_CBID_cuMemCreate,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync,        CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync, CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz};
constexpr CUpti_CallbackId kRuntimeCalls[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020,           CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000,    CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020, CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_ptsz_v11020};

bool Check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  Note(absl::StrCat(what, " failed (", text != nullptr ? text : "unknown CUPTI error",
                    "): device memory outside PyTorch is not recorded"));
  return false;
}

bool Start() {
  State& s = state();
  if (!Check(cuptiActivityRegisterCallbacks(OnBufferRequested, OnBufferCompleted), "cuptiActivityRegisterCallbacks") ||
      !Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMORY2), "enabling CUPTI's MEMORY2 activity") ||
      !Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMORY_POOL), "enabling CUPTI's MEMORY_POOL activity")) {
    return false;
  }
  CUpti_SubscriberHandle subscriber = nullptr;
  if (!Check(cuptiSubscribe(&subscriber, OnApiCall, nullptr), "cuptiSubscribe")) return false;
  for (CUpti_CallbackId id : kDriverCalls) cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id);
  for (CUpti_CallbackId id : kRuntimeCalls) cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, id);
  s.start_ns = Now();
  return true;
}

}  // namespace
}  // namespace memscope

extern "C" {

// Called by the CUDA driver (CUDA_INJECTION64_PATH). Returns 1 (success)
// whatever happens: the job runs on, recorded or not.
__attribute__((visibility("default"))) int InitializeInjection() {
  using namespace memscope;
  const char* run_dir = std::getenv("MEMSCOPE_CAPTURE_DIR");
  if (run_dir == nullptr || *run_dir == '\0') return 1;
  State& s = state();
  s.dir = absl::StrCat(run_dir, "/.memscope-capture");
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&InitializeInjection), &self) != 0 && self.dli_fname != nullptr) {
    s.self = self.dli_fname;
  }
  s.wall_start_us = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  if (!Start()) return 1;
  if (absl::StatusOr<std::unique_ptr<GpuMemoryProbe>> nvml = OpenNvml(); nvml.ok()) {
    s.nvml = std::move(*nvml);
  } else {
    Note(absl::StrCat(nvml.status().message(), ": the context's memory is not measured"));
  }
  std::atexit(Finish);
  return 1;
}

// An NVML sample of every GPU the process uses, named `label` (a phase's
// name); the start-up module calls it at each phase end through ctypes.
__attribute__((visibility("default"))) void memscope_device_sample(const char* label) {
  using namespace memscope;
  cuptiActivityFlushAll(0);  // the allocations so far, before the sample they are subtracted from
  std::lock_guard<std::mutex> lock(state().mu);
  if (!state().finished) SampleLocked(label != nullptr ? label : "");
}

}  // extern "C"
