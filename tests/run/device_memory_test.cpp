// A capture's device timeline merged with the rank's PyTorch snapshot
// (run/device_memory.h): the snapshot's segments matched by address, every
// other library beside them, the context from NVML.
#include "run/device_memory.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "devicemem/device_timeline.h"
#include "exporters/report.h"
#include "load/run_directory.h"
#include "recording/timeline.h"

namespace memscope {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kSegment0 = 0x7f0000000000, kSegment1 = 0x7f0001400000;

// What importing the rank's snapshot gives: its segments at their own addresses.
Timeline Snapshot() {
  Timeline t;
  for (const auto& [addr, size] : {std::pair{kSegment0, 20 * kMiB}, std::pair{kSegment1, 2 * kMiB}}) {
    Event e;
    e.type = EventType::kSegmentAlloc;
    e.addr = addr;
    e.size = size;
    t.events.push_back(e);
  }
  return t;
}

// What the injection library records for that rank on cuda:1.
Timeline Device() {
  Timeline t;
  t.device_index = 1;
  t.device_capacity = 80 * 1024 * kMiB;
  MemorySink sink(t);
  DeviceTimelineRecorder recorder(sink, 0);
  auto alloc = [&](std::uint64_t addr, std::uint64_t bytes, const Attribution* caller) {
    DeviceMemoryRecord r;
    r.kind = DeviceMemoryKind::kDevice;
    r.address = addr;
    r.bytes = bytes;
    recorder.Add(r, caller);
  };
  const Attribution torch{DeviceLibrary::kPytorchAllocator, "/venv/torch/lib/libc10_cuda.so"};
  const Attribution nccl{DeviceLibrary::kNccl, "/venv/nvidia/nccl/lib/libnccl.so.2"};
  const Attribution cublas{DeviceLibrary::kCublas, "/venv/nvidia/cublas/lib/libcublasLt.so.12"};
  const Attribution other{DeviceLibrary::kOtherLibrary, "/usr/lib/libfoo.so"};
  alloc(kSegment0, 20 * kMiB, &torch);
  alloc(kSegment1, 2 * kMiB, nullptr);  // its caller was lost: the snapshot's address says it is PyTorch's
  alloc(0x7f1000000000, 64 * kMiB, &nccl);
  alloc(0x7f2000000000, 8 * kMiB, &cublas);
  alloc(0x7f3000000000, kMiB, &other);
  recorder.Sample(0, (22 + 64 + 8 + 1 + 500) * kMiB, "end");
  return t;
}

TEST_CASE("segments matched by address are PyTorch's reserved, NCCL and cuBLAS stand apart, NVML gives the context") {
  const GpuProcess p = MergeDeviceMemory(Device(), Snapshot(), 3);
  CHECK(p.rank == 3);
  CHECK(p.ordinal == 1);
  CHECK(p.measured);
  CHECK(p.context_measured);
  CHECK(p.context_bytes == 500 * kMiB);
  CHECK(p.reserved_bytes == 22 * kMiB);
  CHECK(p.nccl_bytes == 64 * kMiB);
  CHECK(p.cublas_bytes == 8 * kMiB);
  CHECK(p.cudnn_bytes == 0);
  CHECK(p.other_bytes == kMiB);
  CHECK(p.segments == 2);
  CHECK(p.segments_matched == 2);
  CHECK(p.used_bytes() == 595 * kMiB);
}

TEST_CASE("a snapshot segment with no driver allocation at its address is counted unmatched") {
  Timeline snapshot = Snapshot();
  Event extra;
  extra.type = EventType::kSegmentAlloc;
  extra.addr = 0x7f0005000000;
  extra.size = 2 * kMiB;
  snapshot.events.push_back(extra);
  const GpuProcess p = MergeDeviceMemory(Device(), snapshot, 0);
  CHECK(p.segments == 3);
  CHECK(p.segments_matched == 2);
}

TEST_CASE("a measured GPU row reads back from report.json as written, and its table says measured") {
  GpuRow row;
  row.physical = 1;
  row.capacity = 80 * 1024 * kMiB;
  row.processes.push_back(MergeDeviceMemory(Device(), Snapshot(), 0));
  Report report;
  report.world_size = 1;
  report.gpus = {row};
  absl::StatusOr<Report> back = ReportFromJson(ReportToJson(report));
  REQUIRE(back.ok());
  CHECK(back->gpus == report.gpus);
  const std::string text = GpuTableText({row});
  INFO(text);
  CHECK(text.find("GPU   rank   source        context    reserved        NCCL      cuBLAS       cuDNN       other"
                  "        used\n") != std::string::npos);
  CHECK(text.find("1     0      measured   500.00 MiB   22.00 MiB   64.00 MiB    8.00 MiB     0 bytes 1024.00 KiB"
                  "  595.00 MiB\n") != std::string::npos);
  CHECK(text.find("      rank 0: 2 of the snapshot's 2 segments matched to their cudaMalloc by address\n") !=
        std::string::npos);
}

TEST_CASE("a capture directory's device timelines are found per rank, and one that does not read is a note") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("memscope-device-memory-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  REQUIRE(WriteTimelineFile((dir / RunDirectory::DeviceTimelineName(0, 1)).string(), Device()).ok());
  std::ofstream(dir / RunDirectory::DeviceTimelineName(0, 2)) << "not a timeline";
  REQUIRE(WriteTimelineFile((dir / RunDirectory::DeviceTimelineName(5, 1)).string(), Device()).ok());  // no such rank
  const Timeline snapshot = Snapshot();
  std::vector<std::string> notes;
  const std::vector<GpuRow> rows = MeasuredGpuTable(dir.string(), {&snapshot}, notes);
  fs::remove_all(dir);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].physical == 1);
  CHECK(rows[0].capacity == 80 * 1024 * kMiB);
  REQUIRE(rows[0].processes.size() == 1);
  CHECK(rows[0].processes[0].nccl_bytes == 64 * kMiB);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].starts_with("device timeline skipped: "));
}

}  // namespace
}  // namespace memscope
