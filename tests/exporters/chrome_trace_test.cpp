// The Chrome trace export: counters, phases and instants of recorded runs,
// and thinning that never loses a maximum.
#include "exporters/chrome_trace.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../allocator/test_util.h"
#include "analysis/trace_model.h"
#include "recording/recorder.h"
#include "recording/timeline.h"

using namespace memscope;
using namespace memscope::testing;
using nlohmann::json;

namespace {

// A recording of a real allocator on a simulated GPU.
struct Run {
  explicit Run(std::size_t capacity, int rank = 0) : gpu({.capacity = capacity}), a(gpu), sink(tl), rec(sink) {
    tl.rank = rank;
    tl.device_capacity = capacity;
    a.SetObserver(&rec);
  }
  SimDevice gpu;
  CachingAllocator a;
  Timeline tl;
  MemorySink sink;
  Recorder rec;
};

json Export(const std::vector<const Timeline*>& ranks, const ChromeTraceOptions& options = {}) {
  std::ostringstream out;
  const absl::Status s = WriteChromeTrace(ranks, options, out);
  INFO(s.ToString());
  REQUIRE(s.ok());
  json j = json::parse(out.str());  // throws (fails the test) on invalid JSON
  REQUIRE(j.contains("traceEvents"));
  return j;
}

// The events of one process with a given name (and phase, if given), in file order.
std::vector<json> Select(const json& trace, int pid, const std::string& name, const std::string& ph = "") {
  std::vector<json> out;
  if (name == "memory" && ph == "C") {
    // The three counter tracks "allocated", "reserved", "active" ({"bytes"}),
    // sampled at the same times, read back as one sample with three values.
    const std::vector<json> allocated = Select(trace, pid, "allocated", "C");
    const std::vector<json> reserved = Select(trace, pid, "reserved", "C");
    const std::vector<json> active = Select(trace, pid, "active", "C");
    REQUIRE(reserved.size() == allocated.size());
    REQUIRE(active.size() == allocated.size());
    for (std::size_t i = 0; i < allocated.size(); ++i) {
      REQUIRE(reserved[i]["ts"] == allocated[i]["ts"]);
      REQUIRE(active[i]["ts"] == allocated[i]["ts"]);
      REQUIRE(allocated[i]["args"].size() == 1);
      json m = allocated[i];
      m["args"] = {{"allocated", allocated[i]["args"]["bytes"]},
                   {"reserved", reserved[i]["args"]["bytes"]},
                   {"active", active[i]["args"]["bytes"]}};
      out.push_back(std::move(m));
    }
    return out;
  }
  for (const json& e : trace["traceEvents"]) {
    if (e["pid"] == pid && e["name"] == name && (ph.empty() || e["ph"] == ph)) out.push_back(e);
  }
  return out;
}

struct Expected {
  std::vector<std::uint64_t> allocated, reserved, active;
  std::vector<std::array<std::int64_t, kNumCategories>> by_category;
  std::int64_t peak_allocated = 0, peak_reserved = 0;
  DeviceStats final_stats;
};

// What a TraceModel says after each event that moves memory.
Expected Replay(const Timeline& tl) {
  Expected x;
  TraceModel model;
  for (const Event& e : tl.events) {
    REQUIRE(model.Apply(e).ok());
    if (ChangesMemory(e.type)) {  // the events the exporter samples after
      x.allocated.push_back(model.allocated());
      x.reserved.push_back(model.reserved());
      x.active.push_back(static_cast<std::uint64_t>(All(model.stats().active_bytes).current));
      x.by_category.push_back(model.allocated_by_category());
    }
  }
  x.peak_allocated = All(model.stats().allocated_bytes).peak;
  x.peak_reserved = All(model.stats().reserved_bytes).peak;
  x.final_stats = model.stats();
  return x;
}

// Rank 0 of the small known run: two allocations in forward, an OOM (with
// its alloc retry) in backward, then empty_cache; an unfinished phase.
void RecordRank0(Run& r) {
  r.rec.PhaseBegin(Phase::kModel);
  r.rec.PhaseEnd(Phase::kModel);
  r.rec.PhaseBegin(Phase::kForward, 0);
  DevicePtr p1 = 0, p2 = 0;
  {
    ScopedTag tag(Category::kActivation, "fc1");
    p1 = MustMalloc(r.a, MiB);  // small pool: a 2 MiB segment
  }
  {
    ScopedTag tag(Category::kParameter, "fc1.weight");
    p2 = MustMalloc(r.a, 8 * MiB);  // large pool: a 20 MiB segment
  }
  r.rec.Mark("checkpoint \"saved\"\n\xff");
  MustFree(r.a, p1);
  r.rec.PhaseEnd(Phase::kForward, 0);
  r.rec.PhaseBegin(Phase::kBackward, 0);
  REQUIRE_FALSE(r.a.Malloc(64 * MiB).ok());  // frees the cached 2 MiB segment, retries, OOM
  MustFree(r.a, p2);
  r.rec.PhaseEnd(Phase::kBackward, 0);
  r.rec.PhaseBegin(Phase::kUser, kNoStep, "eval");
  r.a.EmptyCache();
  r.rec.PhaseEnd(Phase::kUser, kNoStep, "eval");
  r.rec.PhaseBegin(Phase::kStep, 0);  // never ends
}

void RecordRank1(Run& r) {
  r.rec.PhaseBegin(Phase::kForward, 0);
  const DevicePtr p = MustMalloc(r.a, 3 * MiB);
  const DevicePtr q = MustMalloc(r.a, 5 * MiB);
  MustFree(r.a, p);
  MustFree(r.a, q);
  r.rec.PhaseEnd(Phase::kForward, 0);
}

void RequireCountersMatch(const json& trace, int pid, const Expected& x) {
  const auto memory = Select(trace, pid, "memory", "C");
  const auto categories = Select(trace, pid, "memory by category", "C");
  REQUIRE(memory.size() == x.allocated.size());
  REQUIRE(categories.size() == x.allocated.size());
  for (std::size_t i = 0; i < memory.size(); ++i) {
    INFO("sample " << i);
    REQUIRE(memory[i]["args"]["allocated"] == x.allocated[i]);
    REQUIRE(memory[i]["args"]["reserved"] == x.reserved[i]);
    REQUIRE(memory[i]["args"]["active"] == x.active[i]);
    REQUIRE(categories[i]["ts"] == memory[i]["ts"]);
    REQUIRE(categories[i]["args"].size() == kNumCategories);
    for (int c = 0; c < kNumCategories; ++c) {
      const std::string name(CategoryName(static_cast<Category>(c)));
      REQUIRE(categories[i]["args"][name] == x.by_category[i][static_cast<std::size_t>(c)]);
    }
  }
}

std::int64_t MaxArg(const std::vector<json>& samples, const char* key) {
  std::int64_t m = 0;
  for (const json& s : samples) m = std::max(m, s["args"][key].get<std::int64_t>());
  return m;
}

}  // namespace

TEST_CASE("chrome trace of a small two-rank run", "[chrome_trace]") {
  Run r0(40 * MiB, 0);
  RecordRank0(r0);
  Run r1(40 * MiB, 1);
  RecordRank1(r1);
  const json trace = Export({&r0.tl, &r1.tl});

  REQUIRE(trace["displayTimeUnit"] == "ms");
  REQUIRE(trace["otherData"]["generator"] == "memscope");

  // One process per rank, named and sorted; two named threads.
  for (int rank : {0, 1}) {
    const auto names = Select(trace, rank, "process_name", "M");
    REQUIRE(names.size() == 1);
    REQUIRE(names[0]["args"]["name"] == "rank " + std::to_string(rank));
    const auto sort = Select(trace, rank, "process_sort_index", "M");
    REQUIRE(sort.size() == 1);
    REQUIRE(sort[0]["args"]["sort_index"] == rank);
    const auto threads = Select(trace, rank, "thread_name", "M");
    REQUIRE(threads.size() == 2);
    for (const json& t : threads) REQUIRE(t["args"]["name"] == (t["tid"] == 0 ? "phases" : "allocator"));
  }

  // Counters: exact bytes at known points.
  const auto memory = Select(trace, 0, "memory", "C");
  REQUIRE(memory.size() >= 4);
  // segment_alloc of the small pool's 2 MiB segment, then the 1 MiB block.
  CHECK(memory[0]["args"] == json({{"allocated", 0}, {"reserved", 2 * MiB}, {"active", 0}}));
  CHECK(memory[1]["args"] == json({{"allocated", MiB}, {"reserved", 2 * MiB}, {"active", MiB}}));
  // The 8 MiB block in a 20 MiB segment.
  CHECK(memory[3]["args"] == json({{"allocated", 9 * MiB}, {"reserved", 22 * MiB}, {"active", 9 * MiB}}));
  const auto categories = Select(trace, 0, "memory by category", "C");
  REQUIRE(categories.size() == memory.size());
  CHECK(categories[1]["args"]["ACTIVATION"] == MiB);
  CHECK(categories[1]["args"]["PARAMETER"] == 0);
  CHECK(categories[3]["args"]["ACTIVATION"] == MiB);
  CHECK(categories[3]["args"]["PARAMETER"] == 8 * MiB);
  // The final state: everything freed and the cache emptied.
  CHECK(memory.back()["args"] == json({{"allocated", 0}, {"reserved", 0}, {"active", 0}}));

  // Every sample equals the model's state, and the maxima are the peaks.
  for (const Run* r : {&r0, &r1}) {
    INFO("rank " << r->tl.rank);
    const Expected x = Replay(r->tl);
    RequireCountersMatch(trace, r->tl.rank, x);
    const auto samples = Select(trace, r->tl.rank, "memory", "C");
    CHECK(MaxArg(samples, "allocated") == x.peak_allocated);
    CHECK(MaxArg(samples, "reserved") == x.peak_reserved);
    CHECK(x.peak_allocated == All(r->a.GetStats().allocated_bytes).peak);
    for (std::size_t i = 1; i < samples.size(); ++i) REQUIRE(samples[i - 1]["ts"] <= samples[i]["ts"]);
  }
  CHECK(MaxArg(Select(trace, 1, "memory", "C"), "allocated") == 8 * MiB);

  // Phase slices on thread 0.
  const auto forward = Select(trace, 0, "forward:0", "X");
  REQUIRE(forward.size() == 1);
  CHECK(forward[0]["tid"] == 0);
  CHECK(forward[0]["args"]["step"] == 0);
  CHECK(forward[0]["dur"].get<double>() >= 0);
  CHECK_FALSE(forward[0]["args"].contains("unfinished"));
  CHECK(Select(trace, 0, "backward:0", "X").size() == 1);
  const auto model = Select(trace, 0, "model", "X");
  REQUIRE(model.size() == 1);
  CHECK(model[0]["args"]["step"] == -1);
  CHECK(Select(trace, 0, "eval", "X").size() == 1);
  const auto unfinished = Select(trace, 0, "step:0", "X");
  REQUIRE(unfinished.size() == 1);
  CHECK(unfinished[0]["args"]["unfinished"] == true);
  CHECK(Select(trace, 1, "forward:0", "X").size() == 1);
  // The forward slice contains the samples recorded in it.
  const double fwd_begin = forward[0]["ts"].get<double>();
  const double fwd_end = fwd_begin + forward[0]["dur"].get<double>();
  CHECK(memory[1]["ts"].get<double>() >= fwd_begin);
  CHECK(memory[1]["ts"].get<double>() <= fwd_end + 0.001);

  // The mark, escaped (the invalid byte became U+FFFD).
  const auto marks = Select(trace, 0, "checkpoint \"saved\"\n\xEF\xBF\xBD", "i");
  REQUIRE(marks.size() == 1);
  CHECK(marks[0]["tid"] == 0);
  CHECK(marks[0]["s"] == "t");

  // Allocator instants on thread 1: exactly one OOM, one retry, one empty_cache.
  const auto oom = Select(trace, 0, "OOM");
  REQUIRE(oom.size() == 1);
  CHECK(oom[0]["ph"] == "i");
  CHECK(oom[0]["s"] == "p");
  CHECK(oom[0]["tid"] == 1);
  const auto info = r0.a.last_oom();
  REQUIRE(info.has_value());
  CHECK(oom[0]["args"]["requested_size"] == 64 * MiB);
  CHECK(oom[0]["args"]["rounded_size"] == 64 * MiB);
  CHECK(oom[0]["args"]["device_free"] == info->device_free);
  CHECK(oom[0]["args"]["device_free"] == 20 * MiB);  // 40 MiB - the 20 MiB segment kept
  CHECK(oom[0]["args"]["allocated"] == 8 * MiB);
  CHECK(oom[0]["args"]["reserved"] == 20 * MiB);  // the 2 MiB segment was freed before the retry
  CHECK(oom[0]["args"]["allocated"] == info->allocated);
  CHECK(oom[0]["args"]["reserved"] == info->reserved);
  const auto retry = Select(trace, 0, "alloc retry");
  REQUIRE(retry.size() == 1);
  CHECK(retry[0]["ph"] == "i");
  CHECK(retry[0]["tid"] == 1);
  CHECK(retry[0]["args"]["size"] == 64 * MiB);
  CHECK(retry[0]["ts"] <= oom[0]["ts"]);
  const auto empty = Select(trace, 0, "empty_cache");
  REQUIRE(empty.size() == 1);
  CHECK(empty[0]["ph"] == "i");
  CHECK(empty[0]["tid"] == 1);
  CHECK(empty[0]["args"]["reserved"] == 20 * MiB);
  CHECK(Select(trace, 1, "OOM").empty());
  CHECK(Select(trace, 1, "empty_cache").empty());

  // ts is microseconds: the last event of rank 0 is within its recording.
  const double last_us = static_cast<double>(r0.tl.events.back().time_ns) / 1000.0;
  CHECK(unfinished[0]["ts"].get<double>() == Approx(last_us).margin(0.001));
}

TEST_CASE("chrome trace: layout for Perfetto's streaming reader", "[chrome_trace]") {
  Run r(40 * MiB, 0);
  RecordRank0(r);
  r.rec.Mark("\x01 control");  // written as \u0001
  std::ostringstream out;
  REQUIRE(WriteChromeTrace({&r.tl}, {}, out).ok());
  const std::string text = out.str();
  REQUIRE(text.rfind("{\"displayTimeUnit\":\"ms\",", 0) == 0);
  REQUIRE(text.find("\"traceEvents\":[") != std::string::npos);
  // One event per line, "ts" first.
  std::istringstream lines(text.substr(text.find("\"traceEvents\":[")));
  std::string line;
  std::getline(lines, line);
  int events = 0;
  while (std::getline(lines, line) && line != "]}") {
    INFO(line);
    REQUIRE(line.rfind("{\"ts\":", 0) == 0);
    ++events;
  }
  CHECK(line == "]}");
  CHECK(events == static_cast<int>(json::parse(text)["traceEvents"].size()));
  CHECK(Select(json::parse(text), 0, "\x01 control", "i").size() == 1);
}

TEST_CASE("chrome trace: otherData describes each rank", "[chrome_trace]") {
  Run r(40 * MiB, 2);
  r.tl.SetAllocConf("expandable_segments:False");
  RecordRank1(r);
  const json trace = Export({&r.tl});
  const json& other = trace["otherData"];
  CHECK(other["ranks"] == 1);
  CHECK(other["rank 2 events"] == r.tl.events.size());
  CHECK(other["rank 2 counter samples"] == Replay(r.tl).allocated.size());
  CHECK(other["rank 2 counter samples written"] == Replay(r.tl).allocated.size());
  CHECK(other["rank 2 device_capacity"] == 40 * MiB);
  CHECK(other["rank 2 alloc_conf"] == "expandable_segments:False");
}

TEST_CASE("chrome trace: an inconsistent timeline is an error and writes nothing", "[chrome_trace]") {
  Run good(40 * MiB, 0);
  RecordRank1(good);
  Timeline bad;
  bad.rank = 3;
  Event mark;
  mark.type = EventType::kMark;
  bad.events.push_back(mark);
  Event free;
  free.type = EventType::kFreeRequested;
  free.addr = 0x1000;
  bad.events.push_back(free);

  std::ostringstream out;
  const absl::Status s = WriteChromeTrace({&good.tl, &bad}, {}, out);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()) == "rank 3: event 1: free_requested of 0x1000, which is not allocated");
  CHECK(out.str().empty());

  // A rank given twice, and a null timeline.
  CHECK(WriteChromeTrace({&good.tl, &good.tl}, {}, out).code() == absl::StatusCode::kInvalidArgument);
  CHECK(WriteChromeTrace({nullptr}, {}, out).code() == absl::StatusCode::kInvalidArgument);
  CHECK(out.str().empty());

  // No ranks: an empty but valid trace.
  std::ostringstream empty;
  REQUIRE(WriteChromeTrace({}, {}, empty).ok());
  CHECK(json::parse(empty.str())["traceEvents"].empty());
}

namespace {

// A long run: a random walk of sizes and of the number of live blocks.
void RecordLongRun(Run& r, std::uint64_t seed, int operations) {
  std::mt19937_64 rng(seed);
  std::vector<DevicePtr> live;
  std::int64_t size = 4 * MiB;
  std::size_t target = 100;
  for (int i = 0; i < operations; ++i) {
    if (i % 5000 == 0) target = rng() % 300;
    if (i % 1000 == 0) r.rec.PhaseBegin(Phase::kForward, i / 1000);
    const bool alloc = live.empty() || rng() % 100 < (live.size() < target ? 60u : 40u);
    if (alloc) {
      size += static_cast<std::int64_t>(rng() % (2 * MiB)) - static_cast<std::int64_t>(MiB);
      size = std::clamp<std::int64_t>(size, 512, 16 * MiB);
      ScopedTag tag(static_cast<Category>(rng() % kNumCategories), "layer");
      auto p = r.a.Malloc(static_cast<std::size_t>(size));
      if (p.ok()) live.push_back(*p);
    } else {
      const std::size_t k = rng() % live.size();
      MustFree(r.a, live[k]);
      live[k] = live.back();
      live.pop_back();
    }
    if (i % 20000 == 19999) r.a.EmptyCache();
    if (i % 1000 == 999) r.rec.PhaseEnd(Phase::kForward, i / 1000);
  }
  // Evenly spaced times (1 us apart): thinning works on time, and the
  // recorder's wall clock bunches events when the machine is loaded (the test
  // then kept fewer samples than it asks for).
  for (std::size_t i = 0; i < r.tl.events.size(); ++i) r.tl.events[i].time_ns = i * 1000;
}

void RequireThinned(const json& trace, const Timeline& tl, const Expected& x, std::size_t max_samples) {
  INFO("rank " << tl.rank);
  REQUIRE(x.allocated.size() > max_samples);  // thinning happened
  const auto memory = Select(trace, tl.rank, "memory", "C");
  const auto categories = Select(trace, tl.rank, "memory by category", "C");
  CHECK(memory.size() <= max_samples);
  CHECK(memory.size() >= max_samples / 4);  // the budget is used, not wasted
  REQUIRE(categories.size() == memory.size());
  // No maximum lost.
  CHECK(MaxArg(memory, "allocated") == x.peak_allocated);
  CHECK(MaxArg(memory, "reserved") == x.peak_reserved);
  // In time order, categories at the same points.
  for (std::size_t i = 0; i < memory.size(); ++i) {
    REQUIRE(categories[i]["ts"] == memory[i]["ts"]);
    if (i > 0) REQUIRE(memory[i - 1]["ts"] <= memory[i]["ts"]);
  }
  // The last sample is the final state.
  const json& last = memory.back()["args"];
  CHECK(last["allocated"] == All(x.final_stats.allocated_bytes).current);
  CHECK(last["reserved"] == All(x.final_stats.reserved_bytes).current);
  CHECK(last["active"] == All(x.final_stats.active_bytes).current);
  CHECK(categories.back()["args"]["ACTIVATION"] == x.by_category.back()[static_cast<int>(Category::kActivation)]);
  // Each kept sample is a real state: its values appear, in order, among the model's samples.
  std::size_t j = 0;
  for (const json& m : memory) {
    const auto allocated = m["args"]["allocated"].get<std::uint64_t>();
    const auto reserved = m["args"]["reserved"].get<std::uint64_t>();
    const auto active = m["args"]["active"].get<std::uint64_t>();
    while (j < x.allocated.size() &&
           !(x.allocated[j] == allocated && x.reserved[j] == reserved && x.active[j] == active)) {
      ++j;
    }
    REQUIRE(j < x.allocated.size());
    ++j;
  }
}

}  // namespace

TEST_CASE("chrome trace: long runs are thinned without losing a maximum", "[chrome_trace]") {
  Run r0(64 * kGiB, 0);
  RecordLongRun(r0, 1, 300000);
  Run r1(64 * kGiB, 1);
  RecordLongRun(r1, 2, 50000);
  const Expected x0 = Replay(r0.tl);
  const Expected x1 = Replay(r1.tl);
  REQUIRE(All(r0.a.GetStats().allocated_bytes).peak == x0.peak_allocated);
  REQUIRE(All(r0.a.GetStats().reserved_bytes).peak == x0.peak_reserved);

  ChromeTraceOptions options;
  options.max_counter_samples_per_rank = 1000;
  const json trace = Export({&r0.tl, &r1.tl}, options);
  RequireThinned(trace, r0.tl, x0, 1000);
  RequireThinned(trace, r1.tl, x1, 1000);
  CHECK(trace["otherData"]["rank 0 counter samples"] == x0.allocated.size());
  CHECK(trace["otherData"]["rank 0 counter samples written"] == Select(trace, 0, "memory", "C").size());
  // Phases and instants are not thinned.
  CHECK(Select(trace, 0, "forward:299", "X").size() == 1);
  CHECK(Select(trace, 0, "empty_cache").size() == 15);
}

TEST_CASE("chrome trace: thinning keeps both maxima, the final state and drops", "[chrome_trace]") {
  // At t = 0: the allocated peak (A), then the reserved peak (B on another
  // stream while A's segment is cached), then empty_cache. At t = 1 us: a
  // smaller plateau that is the final state.
  Run r(kGiB, 0);
  const DevicePtr a = MustMalloc(r.a, 100 * MiB);
  MustFree(r.a, a);
  const DevicePtr b = MustMalloc(r.a, 60 * MiB, 1);
  MustFree(r.a, b);
  r.a.EmptyCache();
  const std::size_t second = r.tl.events.size();
  const DevicePtr c = MustMalloc(r.a, 50 * MiB);
  const DevicePtr d = MustMalloc(r.a, MiB);
  MustFree(r.a, d);
  (void)c;
  for (std::size_t i = 0; i < r.tl.events.size(); ++i) r.tl.events[i].time_ns = i < second ? 0 : 1000;
  REQUIRE(Replay(r.tl).allocated.size() == 16);

  using Sample = std::array<std::uint64_t, 3>;  // ts in ns, allocated, reserved
  const auto kept = [&](std::size_t limit) {
    ChromeTraceOptions options;
    options.max_counter_samples_per_rank = limit;
    std::vector<Sample> out;
    for (const json& m : Select(Export({&r.tl}, options), 0, "memory", "C")) {
      out.push_back({static_cast<std::uint64_t>(m["ts"].get<double>() * 1000 + 0.5),
                     m["args"]["allocated"].get<std::uint64_t>() / MiB,
                     m["args"]["reserved"].get<std::uint64_t>() / MiB});
    }
    return out;
  };
  // One bucket: its two maxima and the final state.
  CHECK(kept(3) == std::vector<Sample>{{0, 100, 100}, {0, 0, 160}, {1000, 50, 52}});
  // Two buckets: four maxima and the final state, no room for more.
  CHECK(kept(5) == std::vector<Sample>{{0, 100, 100}, {0, 0, 160}, {1000, 50, 52}, {1000, 51, 52}, {1000, 50, 52}});
  // Room for one more: the level after the first bucket's drop.
  CHECK(kept(6) ==
        std::vector<Sample>{{0, 100, 100}, {0, 0, 160}, {0, 0, 0}, {1000, 50, 52}, {1000, 51, 52}, {1000, 50, 52}});
}

TEST_CASE("chrome trace: thinning edge cases", "[chrome_trace]") {
  Run r(64 * kGiB, 0);
  RecordLongRun(r, 3, 5000);
  const Expected x = Replay(r.tl);

  SECTION("every sample at the same time") {
    for (Event& e : r.tl.events) e.time_ns = 42000;
    for (std::size_t limit : {3u, 10u, 101u}) {
      ChromeTraceOptions options;
      options.max_counter_samples_per_rank = limit;
      const json trace = Export({&r.tl}, options);
      const auto memory = Select(trace, 0, "memory", "C");
      INFO("limit " << limit);
      CHECK(memory.size() <= limit);
      CHECK(MaxArg(memory, "allocated") == x.peak_allocated);
      CHECK(MaxArg(memory, "reserved") == x.peak_reserved);
      CHECK(memory.back()["args"]["allocated"] == x.allocated.back());
      CHECK(memory.back()["ts"] == 42.0);
    }
  }
  SECTION("times out of order and at the extremes") {
    constexpr std::int64_t kTimes[] = {std::numeric_limits<std::int64_t>::min(), -1500, 0,
                                       std::numeric_limits<std::int64_t>::max()};
    for (std::size_t i = 0; i < r.tl.events.size(); ++i) r.tl.events[i].time_ns = kTimes[(i * 7) % 4];
    ChromeTraceOptions options;
    options.max_counter_samples_per_rank = 10;
    const json trace = Export({&r.tl}, options);
    const auto memory = Select(trace, 0, "memory", "C");
    CHECK(memory.size() <= 10);
    CHECK(MaxArg(memory, "allocated") == x.peak_allocated);
    CHECK(MaxArg(memory, "reserved") == x.peak_reserved);
    CHECK(memory.back()["args"]["allocated"] == x.allocated.back());
    bool negative = false;
    for (const json& e : trace["traceEvents"]) negative |= e["ts"].get<double>() == -1.5;
    CHECK(negative);
  }
  SECTION("a limit below 3 counts as 3") {
    for (std::size_t limit : {0u, 1u, 2u}) {
      ChromeTraceOptions options;
      options.max_counter_samples_per_rank = limit;
      const auto memory = Select(Export({&r.tl}, options), 0, "memory", "C");
      CHECK(memory.size() <= 3);
      CHECK(MaxArg(memory, "allocated") == x.peak_allocated);
      CHECK(MaxArg(memory, "reserved") == x.peak_reserved);
      CHECK(memory.back()["args"]["reserved"] == x.reserved.back());
    }
  }
  SECTION("at or below the limit nothing is dropped") {
    for (std::size_t limit : {x.allocated.size(), x.allocated.size() + 1000}) {
      ChromeTraceOptions options;
      options.max_counter_samples_per_rank = limit;
      RequireCountersMatch(Export({&r.tl}, options), 0, x);
    }
  }
}

TEST_CASE("chrome trace: a phase stays open until its own end, even when an outer phase ends around it",
          "[chrome_trace]") {
  Run r(40 * MiB);
  r.rec.PhaseBegin(Phase::kUser, 0, "outer");
  r.rec.PhaseBegin(Phase::kUser, 0, "inner");
  r.rec.PhaseEnd(Phase::kUser, 0, "outer");  // inner is still open
  r.rec.PhaseEnd(Phase::kUser, 0, "inner");
  // The same phase begun twice: an end closes the latest begin, even one an
  // outer end went past.
  r.rec.PhaseBegin(Phase::kUser, 1, "x");
  r.rec.PhaseBegin(Phase::kUser, 1, "y");
  r.rec.PhaseBegin(Phase::kUser, 1, "x");
  r.rec.PhaseEnd(Phase::kUser, 1, "y");
  r.rec.PhaseEnd(Phase::kUser, 1, "x");
  const json trace = Export({&r.tl});
  const auto begin_of = [&](std::size_t i) { return r.tl.events[i].time_ns / 1000.0; };
  const auto outer = Select(trace, 0, "outer:0", "X");
  const auto inner = Select(trace, 0, "inner:0", "X");
  REQUIRE(outer.size() == 1);
  REQUIRE(inner.size() == 1);
  CHECK_FALSE(inner[0]["args"].contains("unfinished"));
  CHECK(inner[0]["ts"].get<double>() == Approx(begin_of(1)).margin(0.001));
  CHECK(inner[0]["dur"].get<double>() == Approx(begin_of(3) - begin_of(1)).margin(0.001));
  const auto xs = Select(trace, 0, "x:1", "X");
  REQUIRE(xs.size() == 2);
  // The second begin of x closes at x's end; the first is left unfinished.
  CHECK(xs[0]["ts"].get<double>() == Approx(begin_of(6)).margin(0.001));
  CHECK_FALSE(xs[0]["args"].contains("unfinished"));
  CHECK(xs[1]["ts"].get<double>() == Approx(begin_of(4)).margin(0.001));
  CHECK(xs[1]["args"]["unfinished"] == true);
}

TEST_CASE("chrome trace: a phase end closes only the phase of its own micro-batch, as the timeline walk does",
          "[chrome_trace]") {
  Run r(40 * MiB);
  r.rec.PhaseBegin(Phase::kBackward, 0, {}, 0);
  r.rec.PhaseBegin(Phase::kBackward, 0, {}, 1);
  r.rec.PhaseEnd(Phase::kBackward, 0, {}, 0);  // micro-batch 1 stays open
  r.rec.PhaseEnd(Phase::kBackward, 0, {}, 1);
  const json trace = Export({&r.tl});
  const auto begin_of = [&](std::size_t i) { return r.tl.events[i].time_ns / 1000.0; };
  const auto first = Select(trace, 0, "backward:0.0", "X");
  const auto second = Select(trace, 0, "backward:0.1", "X");
  REQUIRE(first.size() == 1);
  REQUIRE(second.size() == 1);
  CHECK(first[0]["ts"].get<double>() == Approx(begin_of(0)).margin(0.001));
  CHECK(first[0]["dur"].get<double>() == Approx(begin_of(2) - begin_of(0)).margin(0.001));
  CHECK(second[0]["ts"].get<double>() == Approx(begin_of(1)).margin(0.001));
  CHECK(second[0]["dur"].get<double>() == Approx(begin_of(3) - begin_of(1)).margin(0.001));
  CHECK_FALSE(first[0]["args"].contains("unfinished"));
  CHECK_FALSE(second[0]["args"].contains("unfinished"));
}

TEST_CASE("chrome trace: every rank on the run's common clock, allocated, reserved, active as three tracks",
          "[chrome_trace]") {
  Run r0(40 * MiB, 0);
  RecordRank0(r0);
  Run r1(40 * MiB, 1);
  RecordRank1(r1);
  // Rank 1 started at the same time as rank 0, then 1 s after it.
  r0.tl.wall_start_us = 1'700'000'000'000'000;
  r1.tl.wall_start_us = r0.tl.wall_start_us;
  const json together = Export({&r0.tl, &r1.tl});
  r1.tl.wall_start_us = r0.tl.wall_start_us + 1'000'000;
  const json trace = Export({&r0.tl, &r1.tl});
  auto times = [](const json& t, int pid) {
    std::vector<double> ts;
    for (const json& e : t["traceEvents"]) {
      if (e["pid"] == pid && e["ph"] != "M") ts.push_back(e["ts"].get<double>());
    }
    return ts;
  };
  const std::vector<double> rank0 = times(trace, 0), rank1 = times(trace, 1);
  const std::vector<double> rank1_together = times(together, 1);
  REQUIRE(rank1.size() == rank1_together.size());
  REQUIRE_FALSE(rank1.empty());
  CHECK(rank0 == times(together, 0));  // the earliest rank's clock is the run's
  for (std::size_t i = 0; i < rank1.size(); ++i) CHECK(rank1[i] == Approx(rank1_together[i] + 1'000'000).margin(1e-3));
  CHECK(rank1.front() >= 1'000'000);
  // Not one "memory" counter whose three series a viewer stacks.
  CHECK(Select(trace, 0, "memory").empty());
  for (const char* track : {"allocated", "reserved", "active"}) {
    const auto samples = Select(trace, 0, track, "C");
    REQUIRE_FALSE(samples.empty());
    CHECK(samples[0]["args"].size() == 1);
    CHECK(samples[0]["args"].contains("bytes"));
  }
}

TEST_CASE("chrome trace: the run's GPU table as a process \"GPUs\", a counter per physical GPU", "[chrome_trace]") {
  Run r0(40 * MiB, 0);
  RecordRank0(r0);
  Run r1(40 * MiB, 1);
  RecordRank1(r1);
  r0.tl.wall_start_us = 1'700'000'000'000'000;
  r1.tl.wall_start_us = r0.tl.wall_start_us + 1'000'000;  // rank 1 started 1 s later
  // report.json's "gpus": GPU 0 holds rank 0 and rank 1's stray context; GPU 1 rank 1 (no "nccl_bytes": 0).
  const json gpus = json::parse(R"([
    {"physical": 0, "capacity_bytes": 1000, "used_bytes": 360, "shared_by_ranks": [],
     "processes": [{"rank": 0, "cuda": 0, "context_bytes": 100, "reserved_bytes": 200, "nccl_bytes": 10, "used_bytes": 310},
                   {"rank": 1, "cuda": null, "context_bytes": 50, "reserved_bytes": 0, "nccl_bytes": 0, "used_bytes": 50}]},
    {"physical": 1, "capacity_bytes": 1000, "used_bytes": 170, "shared_by_ranks": [],
     "processes": [{"rank": 1, "cuda": 0, "context_bytes": 100, "reserved_bytes": 70, "used_bytes": 170}]}])");
  std::ostringstream out;
  ChromeTraceWriter writer({}, out);
  for (const Timeline* t : {&r0.tl, &r1.tl}) {
    TimelineWalk walk(*t);
    REQUIRE(walk.Run({&writer.Plan(*t)}).ok());
  }
  for (const Timeline* t : {&r0.tl, &r1.tl}) {
    TimelineWalk walk(*t);
    REQUIRE(walk.Run({&writer.Write(*t)}).ok());
  }
  writer.WriteGpuTable(gpus);
  REQUIRE(writer.Finish().ok());
  const json trace = json::parse(out.str());
  const int pid = ChromeTraceWriter::kGpusPid;
  // The run's end: rank 1's last event, 1 s after rank 0's start.
  const double end_us = 1'000'000 + static_cast<double>(r1.tl.events.back().time_ns) / 1000;
  std::vector<json> meta = Select(trace, pid, "process_name", "M");
  REQUIRE(meta.size() == 1);
  CHECK(meta[0]["args"]["name"] == "GPUs");
  CHECK(Select(trace, pid, "process_sort_index", "M")[0]["args"]["sort_index"] == pid);
  const std::vector<json> gpu0 = Select(trace, pid, "GPU 0", "C");
  const std::vector<json> gpu1 = Select(trace, pid, "GPU 1", "C");
  REQUIRE(gpu0.size() == 2);
  REQUIRE(gpu1.size() == 2);
  CHECK(gpu0[0]["ts"].get<double>() == 0);
  CHECK(gpu0[1]["ts"].get<double>() == Approx(end_us).margin(1e-3));
  for (const json& e : gpu0) CHECK(e["args"] == json{{"context", 150}, {"reserved", 200}, {"nccl", 10}});
  for (const json& e : gpu1) CHECK(e["args"] == json{{"context", 100}, {"reserved", 70}, {"nccl", 0}});
  const std::vector<json> rows = Select(trace, pid, "GPU 1 processes", "i");
  REQUIRE(rows.size() == 1);
  CHECK(rows[0]["s"] == "p");
  CHECK(rows[0]["ts"].get<double>() == Approx(end_us).margin(1e-3));
  CHECK(rows[0]["args"] == gpus[1]);
  // Without a table, no such process.
  const json plain = Export({&r0.tl, &r1.tl});
  for (const json& e : plain["traceEvents"]) CHECK(e["pid"] != pid);
}
