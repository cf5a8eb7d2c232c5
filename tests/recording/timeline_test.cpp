// The timeline file: a versioned header, 48-byte records, strings in chunks;
// a torn tail is ignored and everything before it is kept.
#include "recording/timeline.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../allocator/test_util.h"
#include "recording/recorder.h"

using namespace memscope;
using namespace memscope::testing;

namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/memscope-test-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Records a small run into `path`; returns the in-memory recording of the same run.
Timeline RecordSample(const std::string& path) {
  Timeline header;
  header.rank = 3;
  header.world_size = 4;
  header.device_index = 1;
  header.device_capacity = 40 * MiB;
  header.wall_start_us = 1700000000000000;
  header.alloc_conf = "max_split_size_mb:20,expandable_segments:False";
  auto writer = TimelineWriter::Create(path, header);
  REQUIRE(writer.ok());
  Timeline memory = header;
  MemorySink mem_sink(memory);
  SimDevice gpu({.capacity = 40 * MiB, .index = 1});
  CachingAllocator a(gpu, Conf(header.alloc_conf));
  Recorder file_rec(**writer);
  Recorder mem_rec(mem_sink);
  struct Both : AllocatorObserver {
    Recorder* x;
    Recorder* y;
    void OnEvent(const TraceEvent& e) override {
      x->OnEvent(e);
      y->OnEvent(e);
    }
  } both;
  both.x = &file_rec;
  both.y = &mem_rec;
  a.SetObserver(&both);
  for (Recorder* r : {&file_rec, &mem_rec}) r->PhaseBegin(Phase::kForward, 0);
  {
    ScopedTag tag(Category::kActivation, "encoder.layers.11.self_attention.out_projection.weight_grad_buffer");
    MustFree(a, MustMalloc(a, 3 * MiB));
  }
  (void)a.Malloc(64 * MiB);  // OOM
  for (Recorder* r : {&file_rec, &mem_rec}) {
    r->PhaseEnd(Phase::kForward, 0);
    r->Mark("checkpoint saved");
  }
  a.SetObserver(nullptr);
  return memory;
}

}  // namespace

TEST_CASE("a timeline file reads back exactly what was recorded") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rank-3.timeline";
  const Timeline memory = RecordSample(path);
  auto read = ReadTimelineFile(path);
  REQUIRE(read.ok());
  CHECK(read->rank == 3);
  CHECK(read->world_size == 4);
  CHECK(read->device_index == 1);
  CHECK(read->device_capacity == 40 * MiB);
  CHECK(read->wall_start_us == 1700000000000000);
  CHECK(read->alloc_conf == "max_split_size_mb:20,expandable_segments:False");
  CHECK(read->torn_bytes == 0);
  REQUIRE(read->events.size() == memory.events.size());
  for (std::size_t i = 0; i < memory.events.size(); ++i) {
    const Event& x = read->events[i];
    const Event& y = memory.events[i];
    CHECK(x.type == y.type);
    CHECK(x.addr == y.addr);
    CHECK(x.size == y.size);
    CHECK(x.requested_size == y.requested_size);
    CHECK(x.category == y.category);
    CHECK(read->str(x.name) == memory.str(y.name));
  }
  CHECK(read->str(read->events[2].name) ==
        "encoder.layers.11.self_attention.out_projection.weight_grad_buffer");  // a string of 3 chunks
  CHECK(read->str(read->events.back().name) == "checkpoint saved");
  // header (64) + config + strings + events, all 48-byte records
  CHECK((std::filesystem::file_size(path) - 64) % 48 == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a version 1 file (flags byte undocumented, same records) reads as the version 2 file does") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rank-3.timeline";
  RecordSample(path);
  std::string bytes = ReadAll(path);
  REQUIRE(bytes[8] == 2);  // this memscope writes version 2
  auto v2 = ParseTimeline(bytes, "v2");
  bytes[8] = 1;
  auto v1 = ParseTimeline(bytes, "v1");
  REQUIRE(v2.ok());
  REQUIRE(v1.ok());
  REQUIRE(v1->events.size() == v2->events.size());
  for (std::size_t i = 0; i < v1->events.size(); ++i) {
    CHECK(std::memcmp(&v1->events[i], &v2->events[i], sizeof(Event)) == 0);
  }
  CHECK(v1->strings == v2->strings);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a timeline cut at any byte of its last records keeps every complete record") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rank-0.timeline";
  RecordSample(path);
  const std::string bytes = ReadAll(path);
  auto full = ParseTimeline(bytes, path);
  REQUIRE(full.ok());
  const std::size_t records_end = bytes.size();
  // Cut inside each of the last five records (and at their boundaries).
  for (std::size_t cut = records_end - 5 * 48; cut <= records_end; ++cut) {
    auto t = ParseTimeline(std::string_view(bytes).substr(0, cut), path);
    INFO("cut at " << cut);
    REQUIRE(t.ok());
    CHECK(t->torn_bytes == (cut - 64) % 48);
    const std::size_t complete_records = (cut - 64) / 48;
    const std::size_t lost = (records_end - 64) / 48 - complete_records;
    CHECK(t->events.size() + lost >= full->events.size());
    for (std::size_t i = 0; i < t->events.size(); ++i) CHECK(t->events[i].addr == full->events[i].addr);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("bad timeline files are one-line errors naming the file") {
  CHECK(ParseTimeline("hello", "x.timeline").status().message() == "x.timeline: not a memscope timeline (bad magic)");
  std::string header(64, '\0');
  std::memcpy(header.data(), kTimelineMagic, 8);
  CHECK(ParseTimeline(header.substr(0, 30), "x").status().message() == "x: timeline header is truncated (30 bytes)");
  std::string v3 = header;
  v3[8] = 3;
  CHECK(ParseTimeline(v3, "x").status().message() ==
        "x: timeline version 3 is not supported (this memscope reads versions 1 to 2)");
  std::string bad_type = header;
  bad_type[8] = 1;
  bad_type[12] = 48;
  bad_type[20] = 1;  // world_size 1
  bad_type += std::string(48, '\0');
  bad_type[64] = static_cast<char>(99);
  CHECK(ParseTimeline(bad_type, "x").status().message() == "x: record 0 has unknown type 99 (corrupt file)");
  CHECK(absl::IsNotFound(ReadTimelineFile("/nonexistent/rank-0.timeline").status()));
}

TEST_CASE("a timeline header beyond what a real run can hold is refused, field by field") {
  Timeline t;
  t.world_size = 2;
  t.rank = 1;
  t.device_index = 1;
  t.device_capacity = 80ULL << 30;
  t.wall_start_us = 1764000000000000;  // November 2025
  CHECK(ValidateTimelineHeader(t, "x").ok());
  Timeline bad = t;
  bad.device_index = 2147483647;  // made `snapshot` write 2^31 device lists
  CHECK(ValidateTimelineHeader(bad, "x").message() ==
        "x: header device_index 2147483647 is out of range (0 to 131071; corrupt file)");
  bad = t;
  bad.world_size = 0;
  CHECK(ValidateTimelineHeader(bad, "x").message() == "x: header world_size 0 is out of range (1 to 131072; corrupt file)");
  bad = t;
  bad.rank = -1;
  CHECK(ValidateTimelineHeader(bad, "x").message() == "x: header rank -1 is out of range (0 to 131071; corrupt file)");
  bad = t;
  bad.device_capacity = (1ULL << 50) + 1;
  CHECK(ValidateTimelineHeader(bad, "x").message() ==
        "x: header device_capacity 1125899906842625 is out of range (at most 1 PiB; corrupt file)");
  bad = t;
  bad.wall_start_us = std::int64_t{1} << 62;  // overflowed the snapshot's times
  CHECK(ValidateTimelineHeader(bad, "x").message() ==
        "x: header wall_start_us 4611686018427387904 is out of range (Unix microseconds between 1970 and 3000; "
        "corrupt file)");
  bad.wall_start_us = -1;
  CHECK_FALSE(ValidateTimelineHeader(bad, "x").ok());
}

TEST_CASE("a free that completes at once is one record in the file and two events when read") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rank-0.timeline";
  Timeline header;
  header.device_capacity = 80ULL << 30;
  {
    auto writer = TimelineWriter::Create(path, header);
    REQUIRE(writer.ok());
    SimDevice gpu;
    CachingAllocator a(gpu);
    Recorder rec(**writer);
    a.SetObserver(&rec);
    const DevicePtr p = MustMalloc(a, 4096);
    REQUIRE(a.RecordStream(p, 7).ok());
    MustFree(a, p);                    // waits for stream 7: free_completed comes later, not folded
    MustFree(a, MustMalloc(a, 8192));  // completes at once: folded
    gpu.CompleteAll();
    MustMalloc(a, 512);  // processes the event: p's free_completed
    a.SetObserver(nullptr);
  }
  // header + config + 6 records (segment_alloc, alloc, free_requested, alloc, folded free, free_completed, alloc)
  CHECK(std::filesystem::file_size(path) == 64 + 48 * (1 + 7));
  auto t = ReadTimelineFile(path);
  REQUIRE(t.ok());
  std::vector<std::string> names;
  for (const Event& e : t->events) names.emplace_back(EventTypeName(e.type));
  CHECK(names == std::vector<std::string>{"segment_alloc", "alloc", "free_requested", "alloc", "free_requested",
                                          "free_completed", "free_completed", "alloc"});
  CHECK(t->events[5].addr == t->events[4].addr);
  CHECK(t->events[5].small_pool());
  CHECK(t->events[4].small_pool());
  std::filesystem::remove_all(dir);
}
