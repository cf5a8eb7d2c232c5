#include "devicemem/device_timeline.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <map>

#include "devicemem/gpu_memory_probe.h"

namespace memscope {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kStart = 1000000;  // CUPTI's clock at the recording's start

const Attribution kTorch{DeviceLibrary::kPytorchAllocator, "/venv/torch/lib/libc10_cuda.so"};
const Attribution kNccl{DeviceLibrary::kNccl, "/venv/nvidia/nccl/lib/libnccl.so.2"};
const Attribution kCublas{DeviceLibrary::kCublas, "/venv/nvidia/cublas/lib/libcublasLt.so.12"};

DeviceMemoryRecord Record(DeviceMemoryOp op, std::uint64_t addr, std::uint64_t bytes, std::uint64_t at_ns,
                          DeviceMemoryKind kind = DeviceMemoryKind::kDevice) {
  DeviceMemoryRecord r;
  r.op = op;
  r.kind = kind;
  r.address = addr;
  r.bytes = bytes;
  r.timestamp_ns = kStart + at_ns;
  r.stream = 7;
  return r;
}

// NVML's answers, by PCI bus id and pid.
class FakeProbe final : public GpuMemoryProbe {
 public:
  std::map<std::pair<std::string, std::uint32_t>, std::uint64_t> used;
  std::optional<std::uint64_t> ProcessUsedBytes(const std::string& pci, std::uint32_t pid) override {
    const auto it = used.find({pci, pid});
    return it == used.end() ? std::nullopt : std::optional<std::uint64_t>(it->second);
  }
};

TEST_CASE("driver allocations become segment events owned by the calling library's path") {
  Timeline t;
  MemorySink sink(t);
  DeviceTimelineRecorder recorder(sink, kStart);
  CHECK(recorder.Add(Record(DeviceMemoryOp::kAlloc, 0x7f0000000000, 20 * kMiB, 100), &kTorch));
  CHECK(recorder.Add(Record(DeviceMemoryOp::kAlloc, 0x7f1000000000, 4 * kMiB, 200), &kNccl));
  CHECK_FALSE(recorder.Add(Record(DeviceMemoryOp::kAlloc, 0x1000, kMiB, 250, DeviceMemoryKind::kPinned), &kTorch));
  CHECK(recorder.Add(Record(DeviceMemoryOp::kFree, 0x7f0000000000, 20 * kMiB, 300), nullptr));
  CHECK_FALSE(recorder.Add(Record(DeviceMemoryOp::kFree, 0x7f2000000000, kMiB, 400), nullptr));  // never seen
  CHECK(recorder.live_bytes() == 4 * kMiB);

  REQUIRE(t.events.size() == 3);
  CHECK(t.events[0].type == EventType::kSegmentAlloc);
  CHECK(t.events[0].addr == 0x7f0000000000);
  CHECK(t.events[0].size == 20 * kMiB);
  CHECK(t.events[0].stream == 7);
  CHECK(t.events[0].time_ns == 100);
  CHECK(t.str(t.events[0].name) == "/venv/torch/lib/libc10_cuda.so");
  CHECK(t.str(t.events[1].name) == "/venv/nvidia/nccl/lib/libnccl.so.2");
  CHECK(t.events[2].type == EventType::kSegmentFree);
  CHECK(t.events[2].time_ns == 300);
  CHECK(t.str(t.events[2].name) == "/venv/torch/lib/libc10_cuda.so");  // the free keeps its allocation's owner
}

TEST_CASE("an allocation from a stream-ordered pool is a block, freed in two events, and pools are marks") {
  Timeline t;
  MemorySink sink(t);
  DeviceTimelineRecorder recorder(sink, kStart);
  DeviceMemoryRecord created = Record(DeviceMemoryOp::kPoolCreated, 0x5000, 32 * kMiB, 10);
  created.release_threshold = 1024;
  recorder.Add(created, nullptr);
  DeviceMemoryRecord alloc = Record(DeviceMemoryOp::kAlloc, 0x7e0000000000, 2 * kMiB, 20);
  alloc.pool_address = 0x5000;
  recorder.Add(alloc, &kCublas);
  alloc.op = DeviceMemoryOp::kFree;
  recorder.Add(alloc, nullptr);
  REQUIRE(t.events.size() == 4);
  CHECK(t.events[0].type == EventType::kMark);
  CHECK(t.str(t.events[0].name) == "cuda_pool created 0x5000 bytes 33554432 release_threshold 1024 utilized 0");
  CHECK(t.events[1].type == EventType::kAlloc);
  CHECK(t.events[2].type == EventType::kFreeRequested);
  CHECK(t.events[3].type == EventType::kFreeCompleted);
  CHECK(t.str(t.events[3].name) == "/venv/nvidia/cublas/lib/libcublasLt.so.12");
}

// The injection library's path: a TimelineWriter, read back as a file.
TEST_CASE("a device timeline file reads back as each library's bytes and the NVML overhead") {
  const std::string path = "/tmp/memscope-device-timeline-" + std::to_string(::getpid()) + ".timeline";
  Timeline header;
  header.device_index = 3;
  header.device_capacity = 80 * 1024 * kMiB;
  {
    absl::StatusOr<std::unique_ptr<TimelineWriter>> writer = TimelineWriter::Create(path, header);
    REQUIRE(writer.ok());
    DeviceTimelineRecorder recorder(**writer, kStart);
    FakeProbe probe;
    probe.used[{"0000:3B:00.0", 4242}] = 500 * kMiB;  // context alone
    const std::vector<SampledDevice> devices = {{"0000:3B:00.0", &recorder}, {"0000:86:00.0", nullptr}};
    CHECK(SampleDevices(probe, 4242, kStart, "start", devices) == 1);
    recorder.Add(Record(DeviceMemoryOp::kAlloc, 0x7f0000000000, 20 * kMiB, 100), &kTorch);
    recorder.Add(Record(DeviceMemoryOp::kAlloc, 0x7f1000000000, 64 * kMiB, 200), &kNccl);
    recorder.Add(Record(DeviceMemoryOp::kAlloc, 0x7f2000000000, 32 * kMiB, 300), &kCublas);
    recorder.Add(Record(DeviceMemoryOp::kAlloc, 0x7f3000000000, 2 * kMiB, 350), nullptr);
    probe.used[{"0000:3B:00.0", 4242}] = 630 * kMiB;  // 118 MiB recorded + 512 MiB context and driver
    CHECK(SampleDevices(probe, 4242, kStart + 400, "backward:0", devices) == 1);
    CHECK(SampleDevices(probe, 9999, kStart + 450, "other process", devices) == 0);
    recorder.Add(Record(DeviceMemoryOp::kFree, 0x7f1000000000, 64 * kMiB, 500), nullptr);
    REQUIRE((*writer)->Flush().ok());
  }
  absl::StatusOr<Timeline> read = ReadTimelineFile(path);
  std::remove(path.c_str());
  REQUIRE(read.ok());
  const DeviceUsage usage = ReadDeviceUsage(*read);
  CHECK(usage.device == 3);
  CHECK(usage.samples == 2);
  CHECK(usage.used_bytes == 630 * kMiB);
  CHECK(usage.overhead_bytes == 512 * kMiB);  // the later sample's 630 - 118 beats the start's 500 - 0
  CHECK(usage.peak_bytes == 118 * kMiB);
  CHECK(usage.peak_by_library[static_cast<int>(DeviceLibrary::kNccl)] == 64 * kMiB);
  CHECK(usage.end_by_library[static_cast<int>(DeviceLibrary::kNccl)] == 0);
  CHECK(usage.end_by_library[static_cast<int>(DeviceLibrary::kPytorchAllocator)] == 20 * kMiB);
  CHECK(usage.end_by_library[static_cast<int>(DeviceLibrary::kCublas)] == 32 * kMiB);
  CHECK(usage.end_by_library[static_cast<int>(DeviceLibrary::kOtherLibrary)] == 2 * kMiB);
  REQUIRE(usage.ever.size() == 4);
  CHECK(usage.ever[1] == DeviceAllocation{0x7f1000000000, 64 * kMiB, "/venv/nvidia/nccl/lib/libnccl.so.2",
                                          DeviceLibrary::kNccl, false});
  CHECK(usage.ever[3].owner.empty());
}

TEST_CASE("a device timeline without NVML samples has no used bytes and no overhead") {
  Timeline t;
  MemorySink sink(t);
  DeviceTimelineRecorder recorder(sink, kStart);
  recorder.Add(Record(DeviceMemoryOp::kAlloc, 0x7f0000000000, 20 * kMiB, 100), &kTorch);
  const DeviceUsage usage = ReadDeviceUsage(t);
  CHECK(usage.samples == 0);
  CHECK_FALSE(usage.used_bytes.has_value());
  CHECK_FALSE(usage.overhead_bytes.has_value());
  CHECK(usage.peak_bytes == 20 * kMiB);
}

}  // namespace
}  // namespace memscope
