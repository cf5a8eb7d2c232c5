// The phase table, peaks, fragmentation at an OOM and the lower bound, on
// recordings made by driving a real allocator.
#include "analysis/analysis.h"

#include <catch2/catch.hpp>

#include "../recording/recording_session.h"

using namespace memscope;
using namespace memscope::testing;

TEST_CASE("the phase table: allocated, max allocated, reserved, max reserved and the peak inside each phase") {
  Session s(1024 * MiB);
  s.rec.PhaseBegin(Phase::kModel);
  const DevicePtr w = s.Alloc(30 * MiB, Category::kParameter, "fc");
  s.rec.PhaseEnd(Phase::kModel);
  for (int step = 0; step < 2; ++step) {
    s.rec.PhaseBegin(Phase::kForward, step);
    const DevicePtr act = s.Alloc(40 * MiB, Category::kActivation, "fc");
    const DevicePtr tmp = s.Alloc(50 * MiB, Category::kTemporary, "fc");
    MustFree(s.a, tmp);
    s.rec.PhaseEnd(Phase::kForward, step);
    s.rec.PhaseBegin(Phase::kBackward, step);
    const DevicePtr grad = s.Alloc(30 * MiB, Category::kGradient, "fc");
    MustFree(s.a, act);
    s.rec.PhaseEnd(Phase::kBackward, step);
    MustFree(s.a, grad);
  }
  auto r = AnalyzeRank(s.t);
  REQUIRE(r.ok());
  REQUIRE(r->phases.size() == 5);
  const PhaseRow& model = r->phases[0];
  CHECK(PhaseRowName(model) == "model");
  CHECK(model.allocated == 30 * MiB);
  CHECK(model.reserved == 30 * MiB);
  const PhaseRow& fwd0 = r->phases[1];
  CHECK(PhaseRowName(fwd0) == "forward:0");
  CHECK(fwd0.allocated == 70 * MiB);
  CHECK(fwd0.max_allocated == 120 * MiB);
  CHECK(fwd0.peak_allocated_in_phase == 120 * MiB);
  CHECK(fwd0.reserved == 120 * MiB);
  CHECK(fwd0.by_category[static_cast<int>(Category::kActivation)] == static_cast<std::int64_t>(40 * MiB));
  const PhaseRow& bwd0 = r->phases[2];
  CHECK(bwd0.allocated == 60 * MiB);
  CHECK(bwd0.peak_allocated_in_phase == 100 * MiB);
  CHECK(bwd0.max_allocated == 120 * MiB);
  const PhaseRow& fwd1 = r->phases[3];
  CHECK(PhaseRowName(fwd1) == "forward:1");
  CHECK(fwd1.reserved == 120 * MiB);  // the cached 40 + 50 MiB blocks are reused
  CHECK(r->peak_allocated.bytes == 120 * MiB);
  CHECK(r->peak_allocated.phase == "forward:0");
  CHECK(r->peak_allocated.by_category[static_cast<int>(Category::kTemporary)] == static_cast<std::int64_t>(50 * MiB));
  REQUIRE(r->peak_allocated.top_owners.size() == 1);
  CHECK(r->peak_allocated.top_owners[0] == std::pair<std::string, std::int64_t>{"fc", 120 * MiB});
  CHECK(r->lower_bound == 120 * MiB);
  CHECK(r->peak_reserved.bytes == 120 * MiB);
  CHECK(r->overhead_bytes() == 0);
  CHECK_FALSE(r->oom.has_value());
  const std::string table = PhaseTableText(*r);
  CHECK(table.find("step  phase           allocated  max allocated   reserved  max reserved  peak in phase\n") == 0);
  CHECK(table.find("-     model                 30M            30M        30M           30M            30M\n") !=
        std::string::npos);
  CHECK(table.find("0     forward               70M           120M       120M          120M           120M\n") !=
        std::string::npos);
  (void)w;
}

TEST_CASE("an OOM caused by fragmentation is named as such, with the numbers") {
  Session s(30 * MiB);
  s.rec.PhaseBegin(Phase::kForward, 0);
  const DevicePtr x = s.Alloc(6 * MiB, Category::kActivation, "a");
  s.Alloc(6 * MiB, Category::kActivation, "b");
  MustFree(s.a, x);
  CHECK_FALSE(s.a.Malloc(12 * MiB).ok());
  s.rec.PhaseEnd(Phase::kForward, 0);
  auto r = AnalyzeRank(s.t);
  REQUIRE(r.ok());
  REQUIRE(r->oom.has_value());
  CHECK(r->oom->phase == "forward:0");
  CHECK(r->oom->requested == 12 * MiB);
  CHECK(r->oom->caused_by_fragmentation);
  CHECK(r->oom->verdict ==
        "14680064 bytes free in segments but the largest free block is 8388608: fragmentation, not capacity, "
        "caused this OOM");
  CHECK(r->oom->fragmentation.free_blocks == 2);
  CHECK(r->stats.num_ooms == 1);
  CHECK(r->lower_bound == 12 * MiB);
  CHECK(r->overhead_bytes() == 8 * MiB);
}

TEST_CASE("moments: end, peak, oom and PHASE:STEP") {
  Session s(1024 * MiB);
  s.rec.PhaseBegin(Phase::kForward, 0);
  const DevicePtr x = s.Alloc(40 * MiB, Category::kActivation, "a");
  s.rec.PhaseEnd(Phase::kForward, 0);
  MustFree(s.a, x);
  auto end = ModelAt(s.t, *ParseMoment("end"));
  REQUIRE(end.ok());
  CHECK(end->first.allocated() == 0);
  CHECK(end->second == s.t.events.size());
  auto peak = ModelAt(s.t, *ParseMoment("peak"));
  REQUIRE(peak.ok());
  CHECK(peak->first.allocated() == 40 * MiB);
  auto fwd = ModelAt(s.t, *ParseMoment("forward:0"));
  REQUIRE(fwd.ok());
  CHECK(fwd->first.allocated() == 40 * MiB);
  CHECK(absl::IsNotFound(ModelAt(s.t, *ParseMoment("oom")).status()));
  CHECK(absl::IsNotFound(ModelAt(s.t, *ParseMoment("backward:0")).status()));
  CHECK_FALSE(ParseMoment("sideways:1").ok());
  CHECK_FALSE(ParseMoment("forward:x").ok());
  CHECK(ParseMoment("model")->phase == Phase::kModel);
}
