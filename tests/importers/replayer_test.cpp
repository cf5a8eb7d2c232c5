// The replayer records each request's category and owner: with owners that
// alternate, repeat, are empty or come after strings the recorder already
// holds, every alloc event names its own request's owner.
#include "importers/replayer.h"

#include <catch2/catch.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "allocator/config.h"
#include "allocator/sizes.h"
#include "importers/request_trace.h"
#include "recording/recorder.h"
#include "recording/timeline.h"

using namespace memscope;

TEST_CASE("replayer: every alloc event carries its request's owner and category") {
  std::istringstream in(R"({"action":"alloc","id":"a","size":1024,"category":"ACTIVATION","owner":"enc"}
{"action":"alloc","id":"b","size":2048,"category":"PARAMETER","owner":"dec"}
{"action":"alloc","id":"c","size":512,"category":"GRADIENT","owner":"enc"}
{"action":"free","id":"a"}
{"action":"alloc","id":"d","size":4096}
{"action":"mark","text":"between"}
{"action":"alloc","id":"e","size":512,"category":"ACTIVATION","owner":"dec"}
{"action":"alloc","id":"f","size":0,"owner":"zero"}
{"action":"alloc","id":"g","size":512,"owner":"late"}
{"action":"alloc","id":"h","size":512,"category":"OPTIMIZER_STATE","owner":"enc"}
{"action":"alloc","id":"i","size":512,"category":"ACTIVATION","owner":"late"}
)");
  absl::StatusOr<RequestTrace> trace = ReadJsonlTrace(in, "t.jsonl");
  REQUIRE(trace.ok());
  Timeline timeline;
  MemorySink sink(timeline);
  Recorder recorder(sink);
  // Strings the recorder holds before the replay: the ids differ from the trace's.
  recorder.Mark("late");
  recorder.Mark("dec");
  absl::StatusOr<AllocatorConfig> config = AllocatorConfig::Parse("");
  REQUIRE(config.ok());
  absl::StatusOr<ReplayResult> r = Replay(*trace, *config, std::size_t{1} << 30, &recorder);
  REQUIRE(r.ok());
  std::vector<std::string> owners;
  std::vector<Category> categories;
  for (const Event& e : timeline.events) {
    if (e.type != EventType::kAlloc) continue;
    owners.push_back(timeline.str(e.name));
    categories.push_back(e.category);
  }
  CHECK(owners == std::vector<std::string>{"enc", "dec", "enc", "", "dec", "late", "enc", "late"});
  CHECK(categories == std::vector<Category>{Category::kActivation, Category::kParameter, Category::kGradient,
                                            Category::kOther, Category::kActivation, Category::kOther,
                                            Category::kOptimizerState, Category::kActivation});
  // Each owner interned once, the recorder's earlier strings kept.
  CHECK(timeline.strings == std::vector<std::string>{"", "late", "dec", "enc", "between"});
}

TEST_CASE("replayer: a trace without times puts request i at i microseconds, the same on every run") {
  const std::string text = R"({"action":"alloc","id":"a","size":1024}
{"action":"alloc","id":"b","size":2048}
{"action":"free","id":"a"}
{"action":"mark","text":"between"}
{"action":"alloc","id":"c","size":512}
)";
  absl::StatusOr<AllocatorConfig> config = AllocatorConfig::Parse("");
  REQUIRE(config.ok());
  std::vector<std::vector<std::pair<EventType, std::int64_t>>> runs;
  for (int run = 0; run < 2; ++run) {
    std::istringstream in(text);
    absl::StatusOr<RequestTrace> trace = ReadJsonlTrace(in, "t.jsonl");
    REQUIRE(trace.ok());
    REQUIRE(trace->time_origin_us == -1);
    Timeline timeline;
    MemorySink sink(timeline);
    Recorder recorder(sink, RecordClock::kTrace);
    absl::StatusOr<ReplayResult> r = Replay(*trace, *config, std::size_t{1} << 30, &recorder);
    REQUIRE(r.ok());
    auto& got = runs.emplace_back();
    for (const Event& e : timeline.events) got.emplace_back(e.type, e.time_ns);
  }
  const std::vector<std::pair<EventType, std::int64_t>> expected{
      {EventType::kSegmentAlloc, 0},     {EventType::kAlloc, 0},           {EventType::kAlloc, 1000},
      {EventType::kFreeRequested, 2000}, {EventType::kFreeCompleted, 2000}, {EventType::kMark, 3000},
      {EventType::kAlloc, 4000}};
  CHECK(runs[0] == expected);
  CHECK(runs[1] == expected);
}

namespace {

RequestTrace SixtyThenFifty() {
  std::istringstream in(R"({"action":"alloc","id":"weights","size":62914560}
{"action":"alloc","id":"act","size":52428800}
)");
  absl::StatusOr<RequestTrace> trace = ReadJsonlTrace(in, "t.jsonl");
  REQUIRE(trace.ok());
  return *trace;
}

}  // namespace

TEST_CASE("replayer: the smallest GPU for 60 MiB then 50 MiB is 110 MiB, each its own segment") {
  const RequestTrace trace = SixtyThenFifty();
  absl::StatusOr<std::optional<std::uint64_t>> min = MinDeviceMemory(trace, *AllocatorConfig::Parse(""));
  REQUIRE(min.ok());
  CHECK(*min == std::optional<std::uint64_t>(110 * kMiB));
}

TEST_CASE("replayer: under a memory fraction of 0.5 the smallest GPU is twice as large (220 MiB, not 110)") {
  const RequestTrace trace = SixtyThenFifty();
  AllocatorConfig half = *AllocatorConfig::Parse("");
  half.per_process_memory_fraction = 0.5;
  absl::StatusOr<std::optional<std::uint64_t>> min = MinDeviceMemory(trace, half);
  REQUIRE(min.ok());
  CHECK(*min == std::optional<std::uint64_t>(220 * kMiB));
  // The answer is exact: 220 MiB runs the trace, 219 MiB does not.
  CHECK(!Replay(trace, half, 220 * kMiB)->oom);
  CHECK(Replay(trace, half, 219 * kMiB)->oom);
}

TEST_CASE("replayer: a request over 1 TiB, or a memory fraction of 0, has no smallest GPU") {
  std::istringstream in(R"({"action":"alloc","id":"a","size":1099511627777}
)");
  absl::StatusOr<RequestTrace> huge = ReadJsonlTrace(in, "t.jsonl");
  REQUIRE(huge.ok());
  absl::StatusOr<std::optional<std::uint64_t>> min = MinDeviceMemory(*huge, *AllocatorConfig::Parse(""));
  REQUIRE(min.ok());
  CHECK(!min->has_value());
  AllocatorConfig none = *AllocatorConfig::Parse("");
  none.per_process_memory_fraction = 0.0;
  min = MinDeviceMemory(SixtyThenFifty(), none);
  REQUIRE(min.ok());
  CHECK(!min->has_value());
}
