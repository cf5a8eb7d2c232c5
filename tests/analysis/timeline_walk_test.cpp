// The timeline walk (one TraceModel, the phase stack, the error context) and
// counter thinning, on recordings made by driving a real allocator.
#include "analysis/timeline_walk.h"

#include <catch2/catch.hpp>

#include "../recording/recording_session.h"
#include "analysis/counter_thinning.h"

using namespace memscope;
using namespace memscope::testing;

namespace {

// Records, after every event, the walk's view of it.
struct Log final : WalkListener {
  void OnStart(const TimelineWalk& walk) override { starts.push_back(walk.applied()); }
  void OnEvent(const TimelineWalk& walk, const Event& e) override {
    innermost.push_back(walk.InnermostPhaseName());
    allocated.push_back(walk.model().allocated());
    if (e.type == EventType::kPhaseEnd) ends.push_back(walk.phase_end());
  }
  void OnFinish(const TimelineWalk& walk) override { finishes.push_back(walk.applied()); }
  std::vector<std::size_t> starts, finishes;
  std::vector<std::string> innermost;
  std::vector<std::uint64_t> allocated;
  std::vector<PhaseEnd> ends;
};

}  // namespace

TEST_CASE("the walk: listeners see the model and the phases after each event, a phase's running peak, once") {
  Session s(1024 * MiB);
  s.rec.PhaseBegin(Phase::kForward, 0);
  const DevicePtr act = s.Alloc(40 * MiB, Category::kActivation, "fc");
  s.rec.PhaseBegin(Phase::kUser, 0, "attention");
  const DevicePtr tmp = s.Alloc(50 * MiB, Category::kTemporary, "fc");
  MustFree(s.a, tmp);
  s.rec.PhaseEnd(Phase::kUser, 0, "attention");
  s.rec.PhaseEnd(Phase::kForward, 0);
  MustFree(s.a, act);

  TimelineWalk walk(s.t);
  Log log;
  REQUIRE(walk.Run({&log}).ok());
  CHECK(log.starts == std::vector<std::size_t>{0});
  CHECK(log.finishes == std::vector<std::size_t>{s.t.events.size()});
  CHECK(log.innermost.front() == "forward:0");  // the begin event already opened it
  CHECK(walk.applied() == s.t.events.size());
  CHECK(walk.model().allocated() == 0);
  CHECK(walk.open_phases().empty());
  REQUIRE(log.ends.size() == 2);
  CHECK(log.ends[0].matched);
  CHECK(log.ends[0].depth == 1);
  CHECK(walk.PhaseName(log.ends[0].phase) == "attention:0");
  CHECK(log.ends[0].phase.peak_allocated == 90 * MiB);
  CHECK(log.ends[1].depth == 0);
  CHECK(log.ends[1].phase.peak_allocated == 90 * MiB);
  CHECK(log.ends[1].cut.empty());
}

TEST_CASE("the walk: an end closes its phase and any phase left open inside it, an unmatched end closes nothing") {
  Session s(1024 * MiB);
  s.rec.PhaseBegin(Phase::kBackward, 1);
  s.rec.PhaseBegin(Phase::kUser, 1, "left open");
  s.rec.PhaseEnd(Phase::kBackward, 1);
  s.rec.PhaseEnd(Phase::kStep, 1);

  TimelineWalk walk(s.t);
  Log log;
  REQUIRE(walk.Run({&log}).ok());
  REQUIRE(log.ends.size() == 2);
  CHECK(log.ends[0].matched);
  REQUIRE(log.ends[0].cut.size() == 1);
  CHECK(walk.PhaseName(log.ends[0].cut[0]) == "left open:1");
  CHECK_FALSE(log.ends[1].matched);
  CHECK(log.ends[1].depth == 0);
  CHECK(log.innermost.back().empty());
}

TEST_CASE("the walk: stops at a moment and goes on from there, a bad event is 'rank R: event N: ...'") {
  Session s(1024 * MiB);
  const DevicePtr a = s.Alloc(10 * MiB, Category::kOther, "");
  s.Alloc(20 * MiB, Category::kOther, "");
  MustFree(s.a, a);
  const std::size_t n = s.t.events.size();

  TimelineWalk walk(s.t);
  Log log;
  REQUIRE(walk.Run({&log}, 2).ok());
  CHECK(walk.applied() == 2);
  CHECK(log.finishes.empty());
  REQUIRE(walk.Run({&log}).ok());
  CHECK(log.starts.size() == 1);
  CHECK(log.finishes == std::vector<std::size_t>{n});
  CHECK(log.allocated.size() == n);

  Timeline bad;
  bad.rank = 3;
  bad.events.push_back(Event{});
  bad.events.back().type = EventType::kMark;
  bad.events.push_back(Event{});
  bad.events.back().type = EventType::kFreeRequested;
  bad.events.back().addr = 0x1000;
  TimelineWalk bad_walk(bad);
  const absl::Status st = bad_walk.Run({});
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(st.message()) == "rank 3: event 1: free_requested of 0x1000, which is not allocated");
  CHECK(bad_walk.applied() == 1);
}

TEST_CASE("counter thinning: every sample under the limit, over it, at most M (Chrome) and the maxima survive") {
  struct None {};
  SampleSpan span{1000, 0, 999};
  CounterThinning<None> all(ThinningPolicy::ChromeTrace(1000), span);
  for (int i = 0; i < 1000; ++i) all.Observe(i, 0, 0);
  CHECK_FALSE(all.thinned());
  CHECK(all.Kept().size() == 1000);

  for (const ThinningPolicy& policy : {ThinningPolicy::ChromeTrace(21), ThinningPolicy::Viewer(50)}) {
    CounterThinning<int> thin(policy, span);
    for (int i = 0; i < 1000; ++i) {
      const std::uint64_t allocated = i == 437 ? 5000 : static_cast<std::uint64_t>(i % 100);
      const std::uint64_t reserved = i == 812 ? 9000 : 100;
      thin.Observe(i, allocated, reserved, i);
    }
    CHECK(thin.thinned());
    CHECK(thin.observed() == 1000);
    const auto kept = thin.Kept();
    CHECK(kept.size() <= policy.max_samples);
    bool has_437 = false, has_812 = false;
    for (std::size_t k = 0; k < kept.size(); ++k) {
      CHECK(kept[k].payload == static_cast<int>(kept[k].ordinal));
      if (k > 0) CHECK(kept[k - 1].ordinal < kept[k].ordinal);
      has_437 = has_437 || kept[k].ordinal == 437;
      has_812 = has_812 || kept[k].ordinal == 812;
    }
    CHECK(has_437);
    CHECK(has_812);
    CHECK(kept.back().ordinal == 999);  // the final state
  }
}
