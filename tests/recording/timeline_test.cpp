// The timeline file: a versioned header, then (versions 3 and 4)
// variable-length, delta-encoded records (version 4 adds the lean free, the
// compact alloc and the time record), or (versions 1 and 2, still read) 48-byte records
// with strings in chunks; a torn tail is ignored and everything before it is
// kept.
#include "recording/timeline.h"

#include <catch2/catch.hpp>
#include <limits>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "../allocator/test_util.h"
#include "base/clock.h"
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
  CHECK(bytes[8] == 4);   // version 4
  CHECK(bytes[12] == 0);  // variable-length records
  std::filesystem::remove_all(dir);
}

TEST_CASE("version 4 records: the bytes of an alloc and its free that completes at once") {
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
  // time: tag 42, zigzag(5) = 0a.
  // compact alloc: tag 0x40 | ACTIVATION (3); addr delta 4096 / 512 = 8 (int32),
  //   size 512 / 512 = 1 (uint32), slack 512 - 500 = 12 (3 bytes).
  // lean free, folded (bit 6): slot of 4096 = (4096 * 0x9E3779B97F4A7C15 mod 2^64) >> 52 = 0x779:
  //   tag 0x80 | 0x40 | 0x7, then 0x79.
  const std::string want(
      "\x29\x00\x80\x08\x00"
      "\x2a\x0a"
      "\x43\x08\x00\x00\x00\x01\x00\x00\x00\x0c\x00\x00"
      "\xc7\x79",
      21);
  CHECK(bytes.substr(64) == want);
  auto t = ParseTimeline(bytes, "x");
  REQUIRE(t.ok());
  REQUIRE(t->events.size() == 3);
  CHECK(t->events[0].category == Category::kActivation);
  CHECK(t->events[0].requested_size == 500);
  CHECK(t->events[0].time_ns == 5);
  CHECK(t->events[1].type == EventType::kFreeRequested);
  CHECK(t->events[1].category == Category::kOther);
  CHECK(t->events[2].type == EventType::kFreeCompleted);
  CHECK(t->events[2].requested_size == 500);
  CHECK(t->events[2].addr == 4096);
  CHECK(t->events[2].time_ns == 5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("version 3 records (as memscope wrote them before version 4) still read") {
  // The alloc and folded free of the test above, in version 3: alloc tag 0,
  // lengths 0x01001221 (time 1 byte, addr 2, size 2, requested 1, kinds 1),
  // zigzag(5) = 0a, zigzag(4096) = 00 20, zigzag(512) = 00 04, zigzag(500 -
  // 512) = 17, ACTIVATION | user << 4 = 73; free_requested, folded (tag bit
  // 7): tag 81, lengths 0x1000 (requested 1 byte), 17.
  std::string v3(64, '\0');
  std::memcpy(v3.data(), kTimelineMagic, 8);
  v3[8] = 3;
  v3[20] = 1;  // world_size 1
  v3 += std::string(
      "\x29\x00\x80\x08\x00"
      "\x00\x21\x12\x00\x01\x0a\x00\x20\x00\x04\x17\x73"
      "\x81\x00\x10\x00\x00\x17",
      23);
  auto t = ParseTimeline(v3, "x");
  REQUIRE(t.ok());
  REQUIRE(t->events.size() == 3);
  CHECK(t->events[0].type == EventType::kAlloc);
  CHECK(t->events[0].category == Category::kActivation);
  CHECK(t->events[0].addr == 4096);
  CHECK(t->events[0].size == 512);
  CHECK(t->events[0].requested_size == 500);
  CHECK(t->events[1].type == EventType::kFreeRequested);
  CHECK_FALSE(t->events[1].small_pool());
  CHECK(t->events[2].type == EventType::kFreeCompleted);
  CHECK(t->events[2].requested_size == 500);
  CHECK(t->events[2].time_ns == 5);
  // In version 3 a tag of 0x2a (42) is no record; in version 4 it is a time.
  CHECK(ParseTimeline(v3 + "\x2a\x00", "x").status().message() == "x: record 3 has unknown type 42 (corrupt file)");
}

namespace {

// Events of every type and shape, each written through a TimelineWriter:
// compact allocs, lean frees (folded or not), and every escape to a general
// record. Returns them as a reader must give them back.
std::vector<Event> WriteEveryShape(TimelineWriter& w, std::uint32_t owner_a, std::uint32_t owner_b) {
  std::vector<Event> out;
  std::int64_t time = 0;
  auto add = [&](Event e) {
    e.time_ns = time;
    w.Append(e);  // a free_completed folded or not, the reader gives the same events
    e.flags &= kEventSmallPool;
    out.push_back(e);
  };
  auto alloc = [&](std::uint64_t addr, std::uint64_t size, std::uint64_t requested, Category c, std::uint32_t owner,
                   bool small = false, std::uint64_t stream = 0, Phase phase = Phase::kUser) {
    Event e;
    e.type = EventType::kAlloc;
    e.addr = addr;
    e.size = size;
    e.requested_size = requested;
    e.category = c;
    e.name = owner;
    e.stream = stream;
    e.phase = phase;
    e.set_small_pool(small);
    add(e);
    return e;
  };
  auto free_of = [&](Event e, bool completes = true) {
    e.type = EventType::kFreeRequested;
    e.category = Category::kOther;
    e.phase = Phase::kUser;
    e.name = 0;
    add(e);
    if (completes) {
      e.type = EventType::kFreeCompleted;
      add(e);
    }
  };
  // Compact allocs and lean frees (folded), in both pools, forward and back.
  const Event a = alloc(1 << 30, 2 << 20, (2 << 20) - 7, Category::kActivation, owner_a);
  const Event b = alloc((1 << 30) + (2 << 20), 512, 1, Category::kActivation, owner_a, /*small=*/true);
  free_of(b);
  free_of(a);
  // Times that move (time records), backwards too.
  time = 1000000;
  const Event c = alloc(4096, 1024, 1000, Category::kParameter, owner_b);
  time = 999;
  free_of(c, /*completes=*/false);  // a lean free, not folded
  time = 1000;
  Event c_done = c;
  c_done.type = EventType::kFreeCompleted;
  c_done.category = Category::kOther;
  c_done.name = 0;
  add(c_done);  // later: a general record
  // Escapes of the alloc: unaligned addr, unaligned size, slack of 16 MiB,
  // requested > size, another stream, a phase, an addr 2^41 away, a 2 TiB size.
  const Event e1 = alloc(4096 + 8, 1024, 1000, Category::kOther, owner_b);
  const Event e2 = alloc(8192, 1000, 1000, Category::kOther, owner_b);
  const Event e3 = alloc(16 << 20, 32 << 20, 100, Category::kGradient, owner_b);
  const Event e4 = alloc(1 << 20, 512, 513, Category::kGradient, owner_b);
  const Event e5 = alloc(2 << 20, 512, 512, Category::kGradient, owner_b, false, /*stream=*/7);
  const Event e6 = alloc(3 << 20, 512, 512, Category::kGradient, owner_b, false, 7, Phase::kForward);
  const Event e7 = alloc((std::uint64_t{1} << 41) + 512, 512, 512, Category::kInput, owner_b, false, 7);
  const Event e8 = alloc(0, std::uint64_t{1} << 41, 1, Category::kInput, owner_b, false, 7);
  // Escapes of the free: a slot that holds another block (745984 has 4096's
  // slot), fields that differ from the alloc's, a name or category on a free.
  const Event d = alloc(4096, 512, 512, Category::kOther, 0, false, 7);
  const Event d2 = alloc(745984, 512, 512, Category::kOther, 0, false, 7);
  free_of(d);  // slot now holds 745984: general
  free_of(d2);  // lean
  Event odd = e1;
  odd.requested_size = 3;
  free_of(odd);
  Event named = e2;
  named.type = EventType::kFreeRequested;
  named.name = owner_a;
  add(named);
  for (const Event& e : {e3, e4, e5, e6, e7, e8}) free_of(e);
  // Every other type.
  for (EventType type : {EventType::kSegmentAlloc, EventType::kSegmentFree, EventType::kSegmentMap,
                         EventType::kSegmentUnmap, EventType::kOom, EventType::kEmptyCache, EventType::kAllocRetry,
                         EventType::kSyncAllStreams, EventType::kPhaseBegin, EventType::kPhaseEnd, EventType::kMark,
                         EventType::kCollectiveBegin, EventType::kCollectiveEnd}) {
    ++time;
    Event e;
    e.type = type;
    e.addr = 123456789;
    e.size = 2 << 20;
    e.requested_size = 77;
    e.stream = 3;
    e.name = owner_a;
    e.phase = Phase::kBackward;
    e.set_small_pool(type == EventType::kSegmentAlloc);
    add(e);
  }
  return out;
}

}  // namespace

TEST_CASE("version 4: every event type and every record form reads back as written") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rank-0.timeline";
  Timeline header;
  header.device_capacity = 80ULL << 30;
  std::vector<Event> want;
  {
    auto writer = TimelineWriter::Create(path, header);
    REQUIRE(writer.ok());
    const std::uint32_t a = (*writer)->Intern("encoder.layers.0");
    const std::uint32_t b = (*writer)->Intern("decoder");
    want = WriteEveryShape(**writer, a, b);
  }
  const std::string bytes = ReadAll(path);
  auto t = ParseTimeline(bytes, "x");
  REQUIRE(t.ok());
  CHECK(t->torn_bytes == 0);
  REQUIRE(t->events.size() == want.size());
  Timeline expected;
  expected.strings = {"", "encoder.layers.0", "decoder"};
  expected.events = want;
  CheckSameEvents(*t, expected, want.size());
  // The forms used: the first alloc is a general record (its owner is not
  // the previous alloc's, none), the second compact (tag 0x50 | ACTIVATION:
  // small pool; addr delta 2 MiB / 512 = 4096, size 1, slack 511), then the
  // two lean frees, folded (tag 0xc_).
  const std::size_t at = bytes.find(std::string("\x53\x00\x10\x00\x00\x01\x00\x00\x00\xff\x01\x00", 12));
  REQUIRE(at != std::string::npos);
  CHECK(static_cast<std::uint8_t>(bytes[at - 1]) == 0x73);  // the end of a's general record: ACTIVATION | user << 4
  CHECK((static_cast<std::uint8_t>(bytes[at + 12]) & 0xf0) == 0xc0);  // b's lean free, folded
  CHECK((static_cast<std::uint8_t>(bytes[at + 14]) & 0xf0) == 0xc0);  // a's
  // Every cut of the file reads: the events of each prefix are the full
  // file's first ones, and what is left is at most one record.
  std::size_t previous = 0;
  for (std::size_t cut = 64; cut <= bytes.size(); ++cut) {
    auto part = ParseTimeline(std::string_view(bytes).substr(0, cut), "x");
    INFO("cut at " << cut);
    REQUIRE(part.ok());
    REQUIRE(part->events.size() <= want.size());
    REQUIRE(part->events.size() >= previous);
    CheckSameEvents(*part, *t, part->events.size());
    CHECK(part->torn_bytes <= 5 + 7 * 8);
    previous = part->events.size();
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a sampled clock stays monotonic and on time once it reads the TSC (after 20 ms)") {
  // The recorder reads steady_clock until 20 ms of it calibrate the TSC,
  // then the TSC from the last steady reading: marks over 60 ms (a mark
  // reads the clock) must never go back, and the last must be steady_clock's
  // time since the start to within 0.5 ms.
  Timeline t;
  MemorySink sink(t);
  const std::int64_t start = SteadyNs();
  Recorder rec(sink, RecordClock::kSampled);
  std::int64_t before_end = 0;
  while ((before_end = SteadyNs() - start) < 60'000'000) {
    rec.Mark("tick");
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  rec.Mark("end");
  const std::int64_t after_end = SteadyNs() - start;
  REQUIRE(t.events.size() >= 3);
  for (std::size_t i = 1; i < t.events.size(); ++i) CHECK(t.events[i].time_ns >= t.events[i - 1].time_ns);
  CHECK(t.events.back().time_ns >= before_end - 500'000);
  CHECK(t.events.back().time_ns <= after_end + 500'000);
}

TEST_CASE("version 4: a Recorder's sampled clock reads no clock in the allocator and keeps times monotonic") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rank-0.timeline";
  Timeline header;
  header.device_capacity = 80ULL << 30;
  {
    auto writer = TimelineWriter::Create(path, header);
    REQUIRE(writer.ok());
    SimDevice gpu;
    CachingAllocator a(gpu);
    Recorder rec(**writer, RecordClock::kSampled);
    CHECK_FALSE(rec.wants_time());
    a.SetObserver(&rec);
    rec.PhaseBegin(Phase::kForward, 0);
    for (int i = 0; i < 200; ++i) {
      ScopedTag tag(Category::kActivation, i % 2 == 0 ? "even" : "odd");
      MustFree(a, MustMalloc(a, 4096 + 512 * static_cast<std::size_t>(i % 5)));
    }
    rec.PhaseEnd(Phase::kForward, 0);
    a.SetObserver(nullptr);
  }
  auto t = ReadTimelineFile(path);
  REQUIRE(t.ok());
  REQUIRE(t->events.size() == 2 + 1 + 200 * 3);  // marks, a segment, 200 pairs
  // The clock is read at the two marks and every 64th allocator event: the
  // 601 allocator events have at most 1 + 601 / 64 + 1 distinct times.
  std::set<std::int64_t> times;
  for (std::size_t i = 1; i < t->events.size(); ++i) {
    CHECK(t->events[i].time_ns >= t->events[i - 1].time_ns);
    if (i + 1 < t->events.size()) times.insert(t->events[i].time_ns);
  }
  CHECK(times.size() <= 11);
  std::size_t evens = 0;
  for (const Event& e : t->events) {
    if (e.type == EventType::kAlloc) evens += t->str(e.name) == "even" ? 1 : 0;
  }
  CHECK(evens == 100);
  // The owner changes at every alloc here, so the allocs are general records
  // (about 11 bytes: no time bytes), the frees lean (2 bytes, folded); version 3
  // took about 28 bytes a pair.
  const auto file_bytes = std::filesystem::file_size(path);
  CHECK(file_bytes < 64 + 200 * 16);
  std::filesystem::remove_all(dir);
}

namespace {

// Forwards to a Recorder and counts the calls; hands the allocator the
// Recorder's RecordSink only when `fast`.
struct CountingObserver final : AllocatorObserver {
  CountingObserver(Recorder& r, bool f) : rec(r), fast(f) {}
  void OnEvent(const TraceEvent& e) override {
    ++calls;
    rec.OnEvent(e);
  }
  void OnFreeAtOnce(const TraceEvent& e) override {
    ++calls;
    rec.OnFreeAtOnce(e);
  }
  bool wants_time() const override { return rec.wants_time(); }
  RecordSink* record_sink() override { return fast ? rec.record_sink() : nullptr; }
  Recorder& rec;
  bool fast;
  std::size_t calls = 0;
};

// A sampled-clock recording of a fixed workload (tags that change, two
// streams, frees that wait on another stream, large and small blocks, an
// empty_cache, phases, an observer detached and attached again), the
// allocator writing the hot records itself (`fast`) or not. The header is
// not flagged as sampled: the times read back as recorded.
Timeline RecordWorkload(const std::string& path, bool fast, std::size_t* calls) {
  {
    Timeline header;
    header.device_capacity = 8ULL << 30;
    auto writer = TimelineWriter::Create(path, header);
    REQUIRE(writer.ok());
    SimDevice gpu({.capacity = 8ULL << 30});
    CachingAllocator a(gpu);
    Recorder rec(**writer, RecordClock::kSampled);
    CountingObserver obs(rec, fast);
    a.SetObserver(&obs);
    std::vector<DevicePtr> live;
    std::uint64_t x = 12345;
    auto next = [&] { return x = x * 6364136223846793005ULL + 1442695040888963407ULL; };
    DevicePtr kept = 0;
    for (int step = 0; step < 6; ++step) {
      rec.PhaseBegin(Phase::kForward, step);
      std::optional<ScopedTag> tag;  // one for 70 allocations (a tag's begin and end make a new tag)
      for (int i = 0; i < 700; ++i) {
        if (i % 70 == 0) {
          tag.reset();
          tag.emplace(i % 140 == 0 ? Category::kActivation : Category::kTemporary, i % 280 < 140 ? "a" : "b");
        }
        const std::uint64_t r = next() >> 33;
        const std::size_t size = r % 7 == 0 ? (3 << 20) + (r % 1000) * 512 : 512 + (r % 2000) * 64;
        const StreamId stream = r % 53 == 0 ? 1 : 0;
        live.push_back(MustMalloc(a, size, stream));
        if (r % 41 == 0) REQUIRE(a.RecordStream(live.back(), 2).ok());  // its free waits
        if (live.size() > 40 || r % 3 == 0) {
          const std::size_t k = (next() >> 33) % live.size();
          MustFree(a, live[k]);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
      rec.PhaseEnd(Phase::kForward, step);
      if (step == 2) a.EmptyCache();
      if (step == 3) {
        // Detached: a free and an alloc the recording does not see; the
        // block freed after attaching again must not read as the old one.
        kept = live.back();
        live.pop_back();
        a.SetObserver(nullptr);
        MustFree(a, kept);
        kept = MustMalloc(a, 1536);
        a.SetObserver(&obs);
      }
    }
    MustFree(a, kept);
    for (DevicePtr p : live) MustFree(a, p);
    a.SetObserver(nullptr);
    *calls = obs.calls;
  }
  auto t = ReadTimelineFile(path);
  REQUIRE(t.ok());
  return *std::move(t);
}

}  // namespace

TEST_CASE("version 4: the allocator's own records read back as the Recorder's, with the same clock reads") {
  const std::string dir = TempDir();
  std::size_t slow_calls = 0, fast_calls = 0;
  const Timeline slow = RecordWorkload(dir + "/slow.timeline", false, &slow_calls);
  const Timeline fast = RecordWorkload(dir + "/fast.timeline", true, &fast_calls);
  REQUIRE(fast.events.size() == slow.events.size());
  CheckSameEvents(fast, slow, slow.events.size(), /*with_times=*/false);
  // The same events read the clock (every 64th allocator event and the
  // marks): the times change at the same events.
  std::size_t changes = 0;
  for (std::size_t i = 1; i < slow.events.size(); ++i) {
    INFO("event " << i);
    CHECK(fast.events[i].time_ns >= fast.events[i - 1].time_ns);
    CHECK((fast.events[i].time_ns != fast.events[i - 1].time_ns) ==
          (slow.events[i].time_ns != slow.events[i - 1].time_ns));
    changes += slow.events[i].time_ns != slow.events[i - 1].time_ns ? 1 : 0;
  }
  CHECK(changes >= slow.events.size() / 100);
  // Without the sink every allocator event is a call; with it, only the
  // ones the fast records cannot be (a new tag, another stream, a free
  // that waits, a slot taken, a segment).
  CHECK(slow_calls > 4000);
  CHECK(fast_calls < slow_calls / 4);
  // The same records, bar the time deltas' lengths.
  const auto slow_bytes = std::filesystem::file_size(dir + "/slow.timeline");
  const auto fast_bytes = std::filesystem::file_size(dir + "/fast.timeline");
  CHECK(fast_bytes <= slow_bytes + changes);
  CHECK(fast_bytes + changes >= slow_bytes);
  std::filesystem::remove_all(dir);
}

TEST_CASE("SpreadSampledTimes spreads each run sharing a reading up to the next later time") {
  auto at = [](std::vector<std::int64_t> times) {
    std::vector<Event> events(times.size());
    for (std::size_t i = 0; i < times.size(); ++i) events[i].time_ns = times[i];
    return events;
  };
  auto times = [](const std::vector<Event>& events) {
    std::vector<std::int64_t> out;
    for (const Event& e : events) out.push_back(e.time_ns);
    return out;
  };
  // 4 events at 100 then 200: 100, 125, 150, 175; 3 at 200 then 203: 200, 201, 202;
  // the last run (2 at 203) at the mean rate of the spread ones, 103 ns / 7 events = 14 ns.
  std::vector<Event> e = at({100, 100, 100, 100, 200, 200, 200, 203, 203});
  SpreadSampledTimes(e);
  CHECK(times(e) == std::vector<std::int64_t>{100, 125, 150, 175, 200, 201, 202, 203, 217});
  // Nothing spread before the last run: 1 us per event.
  e = at({5, 5, 5});
  SpreadSampledTimes(e);
  CHECK(times(e) == std::vector<std::int64_t>{5, 1005, 2005});
  // A span shorter than the run: integer steps, never past the next time; distinct times untouched.
  e = at({0, 0, 0, 0, 2, 7, 9});
  SpreadSampledTimes(e);
  CHECK(times(e) == std::vector<std::int64_t>{0, 0, 1, 1, 2, 7, 9});
  // From an index on: earlier events are left alone.
  e = at({0, 0, 10, 10, 20});
  SpreadSampledTimes(e, 2);
  CHECK(times(e) == std::vector<std::int64_t>{0, 0, 10, 15, 20});
  // Times a file may hold at the ends of the range (the timeline fuzzer's
  // finding: the arithmetic overflowed): a span wider than INT64_MAX spread
  // exactly, and the last run's spread saturated at INT64_MAX.
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  e = at({kMin, kMin, kMax});  // span 2^64 - 1, half of it: -1 (rounded down)
  SpreadSampledTimes(e);
  CHECK(times(e) == std::vector<std::int64_t>{kMin, -1, kMax});
  e = at({kMax - 1500, kMax - 1500, kMax - 1500});  // 1 us per event, then nothing past the end
  SpreadSampledTimes(e);
  CHECK(times(e) == std::vector<std::int64_t>{kMax - 1500, kMax - 500, kMax});
  e = at({0, 0, kMax / 2, kMax / 2, kMax / 2, kMax / 2});  // the rate kMax / 4 per event, then saturated
  SpreadSampledTimes(e);
  CHECK(times(e) ==
        std::vector<std::int64_t>{0, kMax / 4, kMax / 2, kMax / 2 + kMax / 4, kMax / 2 + 2 * (kMax / 4), kMax});
}

TEST_CASE("version 4: a file flagged as sampled-clock is read with its runs spread between the readings") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rank-0.timeline";
  Timeline header;
  header.device_capacity = 80ULL << 30;
  header.sampled_clock = true;
  {
    auto writer = TimelineWriter::Create(path, header);
    REQUIRE(writer.ok());
    SimDevice gpu;
    CachingAllocator a(gpu);
    Recorder rec(**writer, RecordClock::kSampled);
    a.SetObserver(&rec);
    rec.PhaseBegin(Phase::kForward, 0);
    for (int i = 0; i < 10; ++i) MustFree(a, MustMalloc(a, 4096));
    rec.PhaseEnd(Phase::kForward, 0);
    a.SetObserver(nullptr);
  }
  auto t = ReadTimelineFile(path);
  REQUIRE(t.ok());
  CHECK(t->sampled_clock);
  REQUIRE(t->events.size() == 2 + 1 + 10 * 3);
  const Event& begin = t->events.front();
  const Event& end = t->events.back();
  REQUIRE(begin.type == EventType::kPhaseBegin);
  REQUIRE(end.type == EventType::kPhaseEnd);
  // The allocator events lie strictly between the two marks, in order and apart
  // (the clock was read at the marks and at the first allocator event only).
  for (std::size_t i = 1; i + 1 < t->events.size(); ++i) {
    CHECK(t->events[i].time_ns > t->events[i - 1].time_ns - (i == 1 ? 1 : 0));
    CHECK(t->events[i].time_ns < end.time_ns);
  }
  // Unflagged (as the same bytes with flag bit 0 cleared), the reader keeps the readings as written.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes[28] = 0;
  auto raw = ParseTimeline(bytes, "unflagged");
  REQUIRE(raw.ok());
  CHECK_FALSE(raw->sampled_clock);
  std::set<std::int64_t> distinct;
  for (const Event& e : raw->events) distinct.insert(e.time_ns);
  CHECK(distinct.size() <= 4);  // the two marks' readings and the allocator's few
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
  std::string v5 = header;
  v5[8] = 5;
  CHECK(ParseTimeline(v5, "x").status().message() ==
        "x: timeline version 5 is not supported (this memscope reads versions 1 to 4)");
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
