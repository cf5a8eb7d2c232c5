// The timeline file: a versioned header, then (version 3) variable-length,
// delta-encoded records, or (versions 1 and 2, still read) 48-byte records
// with strings in chunks; a torn tail is ignored and everything before it is
// kept.
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

// `t` as a version 2 file (48-byte records, strings in 40-byte chunks), as
// memscope wrote them before version 3.
std::string EncodeVersion2(const Timeline& t) {
  std::string out(64, '\0');
  std::memcpy(out.data(), kTimelineMagic, 8);
  auto put = [&](std::size_t at, auto v) { std::memcpy(out.data() + at, &v, sizeof(v)); };
  put(8, std::uint32_t{2});
  put(12, std::uint32_t{48});
  put(16, std::int32_t{t.rank});
  put(20, std::int32_t{t.world_size});
  put(24, std::int32_t{t.device_index});
  put(32, t.device_capacity);
  put(40, t.wall_start_us);
  for (std::uint32_t id = 1; id < t.strings.size(); ++id) {
    const std::string& text = t.strings[id];
    for (std::size_t offset = 0; offset < text.size(); offset += 40) {
      char raw[48] = {};
      const std::size_t n = std::min<std::size_t>(40, text.size() - offset);
      raw[0] = 40;
      raw[2] = offset + n == text.size() ? 1 : 0;
      raw[3] = static_cast<char>(n);
      std::memcpy(raw + 4, &id, 4);
      std::memcpy(raw + 8, text.data() + offset, n);
      out.append(raw, 48);
    }
  }
  for (const Event& e : t.events) out.append(reinterpret_cast<const char*>(&e), sizeof(Event));
  return out;
}

// `with_times`: false for two Recorders of the same run, whose clocks start apart.
void CheckSameEvents(const Timeline& x, const Timeline& y, std::size_t count, bool with_times = true) {
  for (std::size_t i = 0; i < count; ++i) {
    INFO("event " << i);
    const Event& a = x.events[i];
    const Event& b = y.events[i];
    CHECK(a.type == b.type);
    CHECK(a.flags == b.flags);
    CHECK(a.category == b.category);
    CHECK(a.phase == b.phase);
    CHECK(x.str(a.name) == y.str(b.name));
    if (with_times) CHECK(a.time_ns == b.time_ns);
    CHECK(a.addr == b.addr);
    CHECK(a.size == b.size);
    CHECK(a.requested_size == b.requested_size);
    CHECK(a.stream == b.stream);
  }
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
  CheckSameEvents(*read, memory, memory.events.size(), /*with_times=*/false);
  CHECK(read->str(read->events[2].name) == "encoder.layers.11.self_attention.out_projection.weight_grad_buffer");
  CHECK(read->str(read->events.back().name) == "checkpoint saved");
  const std::string bytes = ReadAll(path);
  CHECK(bytes[8] == 3);   // version 3
  CHECK(bytes[12] == 0);  // variable-length records
  std::filesystem::remove_all(dir);
}

TEST_CASE("version 3 records: the bytes of an alloc and its free that completes at once") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rank-0.timeline";
  Timeline header;
  header.device_capacity = 1024;
  {
    auto writer = TimelineWriter::Create(path, header);
    REQUIRE(writer.ok());
    Event alloc;
    alloc.type = EventType::kAlloc;
    alloc.time_ns = 5;
    alloc.addr = 4096;
    alloc.size = 512;
    alloc.requested_size = 500;
    alloc.category = Category::kActivation;
    (*writer)->Append(alloc);
    Event free = alloc;
    free.type = EventType::kFreeRequested;
    free.category = Category::kOther;
    (*writer)->Append(free);
    free.type = EventType::kFreeCompleted;
    (*writer)->Append(free);
  }
  const std::string bytes = ReadAll(path);
  // config: tag 41, settings id 0, capacity 1024 (varint 80 08), device 0.
  // alloc: tag 0, lengths 0x01001221 (time 1 byte, addr 2, size 2, requested 1, kinds 1),
  //   zigzag(5) = 0a, zigzag(4096) = 8192 (00 20), zigzag(512) = 1024 (00 04), zigzag(500 - 512) = 23 (17),
  //   ACTIVATION (3) | phase user (7) << 4 = 73.
  // free_requested, folded (bit 7): tag 81, lengths 0x1000 (requested 1 byte), 17.
  const std::string want(
      "\x29\x00\x80\x08\x00"
      "\x00\x21\x12\x00\x01\x0a\x00\x20\x00\x04\x17\x73"
      "\x81\x00\x10\x00\x00\x17",
      23);
  CHECK(bytes.substr(64) == want);
  auto t = ParseTimeline(bytes, "x");
  REQUIRE(t.ok());
  REQUIRE(t->events.size() == 3);
  CHECK(t->events[0].category == Category::kActivation);
  CHECK(t->events[2].type == EventType::kFreeCompleted);
  CHECK(t->events[2].requested_size == 500);
  CHECK(t->events[2].addr == 4096);
  CHECK(t->events[2].time_ns == 5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("version 1 and 2 files (48-byte records) read as the version 3 file of the same recording") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rank-3.timeline";
  RecordSample(path);
  auto v3 = ReadTimelineFile(path);
  REQUIRE(v3.ok());
  std::string bytes = EncodeVersion2(*v3);
  auto v2 = ParseTimeline(bytes, "v2");
  bytes[8] = 1;
  auto v1 = ParseTimeline(bytes, "v1");
  for (const auto* old : {&v2, &v1}) {
    REQUIRE(old->ok());
    REQUIRE((*old)->events.size() == v3->events.size());
    CheckSameEvents(**old, *v3, v3->events.size());
    CHECK((*old)->rank == 3);
    CHECK((*old)->device_capacity == 40 * MiB);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a timeline cut at any byte of its last records keeps every complete record") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rank-0.timeline";
  RecordSample(path);
  const std::string bytes = ReadAll(path);
  auto full = ParseTimeline(bytes, path);
  REQUIRE(full.ok());
  CHECK(full->torn_bytes == 0);
  // Cut at every byte after the header: each prefix reads, its events are
  // the full file's first ones, and the bytes not read are only the torn
  // last record (shorter than the longest event record, 58 bytes; a
  // string's is its text's length plus at most 21).
  std::size_t previous_events = 0;
  for (std::size_t cut = 64; cut <= bytes.size(); ++cut) {
    auto t = ParseTimeline(std::string_view(bytes).substr(0, cut), path);
    INFO("cut at " << cut);
    REQUIRE(t.ok());
    REQUIRE(t->events.size() <= full->events.size());
    CheckSameEvents(*t, *full, t->events.size());
    CHECK(t->events.size() >= previous_events);
    CHECK(t->torn_bytes < 90);
    previous_events = t->events.size();
  }
  // Cutting one byte off the end tears the last record (the mark: tag, lengths, time, name).
  auto cut1 = ParseTimeline(std::string_view(bytes).substr(0, bytes.size() - 1), path);
  REQUIRE(cut1.ok());
  CHECK(cut1->events.size() == full->events.size() - 1);
  CHECK(cut1->torn_bytes >= 5);
  CHECK(cut1->torn_bytes < 80);
  std::filesystem::remove_all(dir);
}

TEST_CASE("bad timeline files are one-line errors naming the file") {
  CHECK(ParseTimeline("hello", "x.timeline").status().message() == "x.timeline: not a memscope timeline (bad magic)");
  std::string header(64, '\0');
  std::memcpy(header.data(), kTimelineMagic, 8);
  CHECK(ParseTimeline(header.substr(0, 30), "x").status().message() == "x: timeline header is truncated (30 bytes)");
  std::string v4 = header;
  v4[8] = 4;
  CHECK(ParseTimeline(v4, "x").status().message() ==
        "x: timeline version 4 is not supported (this memscope reads versions 1 to 3)");
  std::string v3 = header;
  v3[8] = 3;
  v3[20] = 1;  // world_size 1
  CHECK(ParseTimeline(v3 + "\x0f\x00", "x").status().message() == "x: record 0 has unknown type 15 (corrupt file)");
  CHECK(ParseTimeline(v3 + "\x2a\x00", "x").status().message() == "x: record 0 has unknown type 42 (corrupt file)");
  CHECK(ParseTimeline(v3 + std::string("\x00\x09\x00\x00\x00", 5), "x").status().message() ==
        "x: record 0 has a bad field length (corrupt file)");  // 9 bytes for the time
  CHECK(ParseTimeline(v3 + std::string("\x00\x00\x00\x00\x20", 5), "x").status().message() ==
        "x: record 0 has a bad field length (corrupt file)");  // bits 28-31 set
  CHECK(ParseTimeline(v3 + "\x28" + std::string(11, '\x80') + "\x01", "x").status().message() ==
        "x: record 0 has an overlong varint (corrupt file)");  // a string's id
  v3[12] = 48;
  CHECK(ParseTimeline(v3, "x").status().message() == "x: record size 48, expected 0 in version 3");
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
  CHECK(ValidateTimelineHeader(bad, "x").message() ==
        "x: header world_size 0 is out of range (1 to 131072; corrupt file)");
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
