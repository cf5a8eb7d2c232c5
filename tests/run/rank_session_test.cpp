#include <catch2/catch.hpp>

#include <filesystem>

#include "allocator/alloc_tag.h"
#include "recording/timeline.h"
#include "run/rank_session.h"
#include "load/record_replay.h"
#include "run/run.h"

namespace memscope {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

RankSessionOptions Options(std::uint64_t device_memory, std::string timeline_path = "", int rank = 0) {
  RankSessionOptions o;
  o.rank = rank;
  o.device_memory = device_memory;
  o.timeline_path = std::move(timeline_path);
  return o;
}

std::size_t Count(const Timeline& t, EventType type) {
  std::size_t n = 0;
  for (const Event& e : t.events) n += e.type == type;
  return n;
}

TEST_CASE("RankSession records its allocator in memory, from Start to Finish") {
  RankSessionOptions options = Options(256 * kMiB, "", 2);
  options.world_size = 4;
  RankSession session(options);
  REQUIRE(session.device().capacity() == 256 * kMiB);
  // Before Start nothing is recorded.
  absl::StatusOr<DevicePtr> early = session.allocator().Malloc(kMiB, 0);
  REQUIRE(early.ok());
  REQUIRE(session.Start().ok());
  session.recorder().PhaseBegin(Phase::kForward, 0);
  absl::StatusOr<DevicePtr> p = session.allocator().Malloc(3 * kMiB, 0);
  REQUIRE(p.ok());
  session.recorder().PhaseEnd(Phase::kForward, 0);
  REQUIRE(session.Finish().ok());
  // After Finish the recorder is detached.
  REQUIRE(session.allocator().Free(*p).ok());
  REQUIRE(session.allocator().Free(*early).ok());
  const Timeline& t = session.timeline();
  CHECK(t.rank == 2);
  CHECK(t.world_size == 4);
  CHECK(t.device_index == 2);
  CHECK(t.device_capacity == 256 * kMiB);
  CHECK(t.wall_start_us == 0);
  CHECK(Count(t, EventType::kAlloc) == 1);
  CHECK(Count(t, EventType::kFreeRequested) == 0);
  CHECK(Count(t, EventType::kPhaseBegin) == 1);
  CHECK(session.Finish().ok());  // idempotent
}

TEST_CASE("RankSession writes a timeline file that holds everything once it is destroyed") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "memscope-rank-session-test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "rank-0.timeline").string();
  {
    RankSessionOptions options = Options(512 * kMiB, path);
    options.config = *AllocatorConfig::Parse("expandable_segments:True");
    RankSession session(options);
    REQUIRE(session.Start().ok());
    CHECK(session.allocator().config().expandable_segments);
    absl::StatusOr<DevicePtr> p = session.allocator().Malloc(5 * kMiB, 0);
    REQUIRE(p.ok());
    REQUIRE(session.allocator().Free(*p).ok());
    // No Finish: the destructor detaches and flushes.
  }
  absl::StatusOr<Timeline> t = ReadTimelineFile(path);
  REQUIRE(t.ok());
  CHECK(t->alloc_conf == "expandable_segments:True");
  CHECK(t->device_capacity == 512 * kMiB);
  CHECK(t->wall_start_us > 0);
  CHECK(Count(*t, EventType::kAlloc) == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("RankSession opens its file before recording, and names a file it cannot create") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "memscope-rank-session-open-test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "rank-1.timeline").string();
  {
    RankSession session(Options(kMiB, path, 1));
    REQUIRE(session.Open().ok());
    CHECK(std::filesystem::exists(path));
  }
  absl::StatusOr<Timeline> t = ReadTimelineFile(path);
  REQUIRE(t.ok());
  CHECK(t->rank == 1);
  CHECK(t->events.empty());
  RankSession bad(Options(kMiB, (dir / "missing" / "rank-0.timeline").string()));
  const absl::Status s = bad.Start();
  CHECK_FALSE(s.ok());
  CHECK(std::string(s.message()).find("missing/rank-0.timeline") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("RankSession on a host-backed device gives tensors real bytes") {
  RankSessionOptions options = Options(64 * kMiB);
  options.exec = ExecMode::kCpu;
  RankSession session(options);
  REQUIRE(session.Start().ok());
  CHECK(session.context().computes());
  absl::StatusOr<DevicePtr> p = session.allocator().Malloc(kMiB, 0);
  REQUIRE(p.ok());
  CHECK(session.context().HostPointer(*p) != nullptr);
  REQUIRE(session.allocator().Free(*p).ok());
}

TEST_CASE("RecordReplayTakingStacks gives the timeline RecordReplay's stacks, moved out of the trace") {
  RequestTrace trace;
  trace.ids = {"a", "b", "c"};
  trace.stacks.push_back(AllocStack{{}, "train.py:10 forward"});
  trace.stacks.push_back(AllocStack{{}, "train.py:20 backward"});
  trace.requests.push_back(Request{.op = RequestOp::kAlloc, .slot = 0, .size = kMiB, .stack = 2});
  trace.requests.push_back(Request{.op = RequestOp::kAlloc, .slot = 1, .size = 3 * kMiB});
  trace.requests.push_back(Request{.op = RequestOp::kFree, .slot = 0});
  trace.requests.push_back(Request{.op = RequestOp::kAlloc, .slot = 2, .size = 2 * kMiB, .stack = 1});
  absl::StatusOr<Timeline> copied = RecordReplay(trace, AllocatorConfig{}, 256 * kMiB, 0);
  REQUIRE(copied.ok());
  REQUIRE(trace.stacks.size() == 3);  // the const one copies
  absl::StatusOr<Timeline> moved = RecordReplayTakingStacks(trace, AllocatorConfig{}, 256 * kMiB, 0);
  REQUIRE(moved.ok());
  CHECK(trace.stacks.empty());
  REQUIRE(moved->stacks.size() == 3);
  CHECK(moved->stacks[1].site == "train.py:10 forward");
  CHECK(moved->stacks[2].site == "train.py:20 backward");
  CHECK(moved->event_stacks == copied->event_stacks);
  std::vector<std::uint32_t> alloc_stacks;
  for (std::size_t i = 0; i < moved->events.size(); ++i) {
    if (moved->events[i].type == EventType::kAlloc) alloc_stacks.push_back(moved->event_stacks[i]);
  }
  CHECK(alloc_stacks == std::vector<std::uint32_t>{2, 0, 1});
}

}  // namespace
}  // namespace memscope
