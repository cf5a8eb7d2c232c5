// The phase table, peaks, fragmentation at an OOM and the lower bound, on
// recordings made by driving a real allocator.
#include "analysis/analysis.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

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
        "14.00 MiB free in segments but the largest free block is 8.00 MiB: fragmentation, not capacity, "
        "caused this OOM");
  CHECK(r->oom->fragmentation.free_blocks == 2);
  CHECK(r->stats.num_ooms == 1);
  CHECK(r->lower_bound == 12 * MiB);
  CHECK(r->overhead_bytes() == 8 * MiB);
}

TEST_CASE("moments: end (after the last step), exit (after teardown), peak, oom and PHASE:STEP") {
  Session s(1024 * MiB);
  s.rec.PhaseBegin(Phase::kForward, 0);
  const DevicePtr x = s.Alloc(40 * MiB, Category::kActivation, "a");
  s.rec.PhaseEnd(Phase::kForward, 0);
  const std::size_t last_step_end = s.t.events.size();
  MustFree(s.a, x);  // teardown, after the last step
  CHECK(EndOfLastStep(s.t) == last_step_end);
  auto end = ModelAt(s.t, *ParseMoment("end"));
  REQUIRE(end.ok());
  CHECK(end->first.allocated() == 40 * MiB);
  CHECK(end->second == last_step_end);
  auto exit = ModelAt(s.t, *ParseMoment("exit"));
  REQUIRE(exit.ok());
  CHECK(exit->first.allocated() == 0);
  CHECK(exit->second == s.t.events.size());
  // report.json's fragmentation at end and at exit are those two moments.
  auto r = AnalyzeRank(s.t);
  REQUIRE(r.ok());
  CHECK(r->fragmentation_at_end.allocated == 40 * MiB);
  CHECK(r->fragmentation_at_exit.allocated == 0);
  // The first walk kept the model at end: ModelAt takes it, with its events.
  CHECK(r->model_at_end_events == last_step_end);
  auto end_kept = ModelAt(s.t, *ParseMoment("end"), &*r);
  REQUIRE(end_kept.ok());
  CHECK(end_kept->first.allocated() == 40 * MiB);
  CHECK(end_kept->second == last_step_end);
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

TEST_CASE("moments: a recording without steps ends at its last event (end = exit)") {
  Session s(1024 * MiB);
  s.rec.PhaseBegin(Phase::kModel);
  const DevicePtr x = s.Alloc(4 * MiB, Category::kParameter, "w");
  s.rec.PhaseEnd(Phase::kModel);
  MustFree(s.a, x);
  CHECK(EndOfLastStep(s.t) == s.t.events.size());
  auto end = ModelAt(s.t, *ParseMoment("end"));
  REQUIRE(end.ok());
  CHECK(end->first.allocated() == 0);
  auto r = AnalyzeRank(s.t);
  REQUIRE(r.ok());
  REQUIRE(r->model_at_end != nullptr);
  CHECK(r->model_at_end_events == s.t.events.size());
  CHECK(r->fragmentation_at_end.allocated == 0);
  auto end_kept = ModelAt(s.t, *ParseMoment("end"), &*r);
  REQUIRE(end_kept.ok());
  CHECK(end_kept->first.allocated() == 0);
  CHECK(end_kept->second == s.t.events.size());
}

TEST_CASE("micro-batches: phases labelled STEP.MICRO, and --at PHASE:STEP.MICRO picks one") {
  Session s(1024 * MiB);
  std::vector<DevicePtr> grads;
  for (std::int64_t micro = 0; micro < 2; ++micro) {
    s.rec.PhaseBegin(Phase::kBackward, 0, {}, micro);
    grads.push_back(s.Alloc((micro + 1) * 10 * MiB, Category::kGradient, "fc"));
    s.rec.PhaseEnd(Phase::kBackward, 0, {}, micro);
  }
  s.rec.PhaseBegin(Phase::kStep, 0);
  s.rec.PhaseEnd(Phase::kStep, 0);
  auto r = AnalyzeRank(s.t);
  REQUIRE(r.ok());
  REQUIRE(r->phases.size() == 3);
  CHECK(PhaseRowName(r->phases[0]) == "backward:0.0");
  CHECK(PhaseRowName(r->phases[1]) == "backward:0.1");
  CHECK(PhaseRowName(r->phases[2]) == "step:0");
  CHECK(r->peak_allocated.phase == "backward:0.1");
  const std::string table = PhaseTableText(*r);
  CHECK(table.find("\n0.0   backward ") != std::string::npos);
  CHECK(table.find("\n0.1   backward ") != std::string::npos);
  CHECK(table.find("\n0     step ") != std::string::npos);

  const absl::StatusOr<Moment> first = ParseMoment("backward:0.0");
  REQUIRE(first.ok());
  CHECK(first->step == 0);
  CHECK(first->micro_batch == 0);
  auto at_first = ModelAt(s.t, *first);
  REQUIRE(at_first.ok());
  CHECK(at_first->first.allocated() == 10 * MiB);
  auto at_second = ModelAt(s.t, *ParseMoment("backward:0.1"));
  REQUIRE(at_second.ok());
  CHECK(at_second->first.allocated() == 30 * MiB);
  // Without a micro-batch: the phase's last end in that step.
  auto whole = ModelAt(s.t, *ParseMoment("backward:0"));
  REQUIRE(whole.ok());
  CHECK(whole->second == at_second->second);
  CHECK(absl::IsNotFound(ModelAt(s.t, *ParseMoment("backward:0.2")).status()));
  CHECK_FALSE(ParseMoment("backward:0.x").ok());
  CHECK_FALSE(ParseMoment("backward:0.-1").ok());
}

TEST_CASE("table units: the largest of G, M, K in which the table's largest value is at least 100") {
  CHECK(std::string(TableUnitFor(120 * MiB).suffix) == "M");
  CHECK(std::string(TableUnitFor(100 * MiB).suffix) == "M");
  CHECK(std::string(TableUnitFor(100 * MiB - 1).suffix) == "K");
  CHECK(std::string(TableUnitFor(100ULL << 30).suffix) == "G");
  CHECK(std::string(TableUnitFor(99).suffix) == "B");
  const TableUnit k = TableUnitFor(3 * MiB);
  CHECK(FormatInUnit(2586 * 1024 + 1000, k) == "2586K");
  CHECK(FormatDeltaInUnit(-2048, k) == "-2K");
  CHECK(FormatDeltaInUnit(0, k) == "0K");
  CHECK(FormatDeltaInUnit(1000, k) == "+0K");

  // A small run's phase table shows its differences in KiB, not "0M"/"1M".
  Session s(1024 * MiB);
  s.rec.PhaseBegin(Phase::kForward, 0);
  s.Alloc(600 * 1024, Category::kActivation, "a");
  s.rec.PhaseEnd(Phase::kForward, 0);
  s.rec.PhaseBegin(Phase::kBackward, 0);
  s.Alloc(700 * 1024, Category::kGradient, "a");
  s.rec.PhaseEnd(Phase::kBackward, 0);
  auto r = AnalyzeRank(s.t);
  REQUIRE(r.ok());
  const std::string table = PhaseTableText(*r);
  CHECK(table.find("0     forward              600K           600K      2048K         2048K           600K\n") !=
        std::string::npos);
  CHECK(table.find("0     backward            1300K          1300K      2048K         2048K          1300K\n") !=
        std::string::npos);
  const std::string by_category = PhaseCategoryTableText(*r);
  CHECK(by_category ==
        "step  phase               ACTIVATION        GRADIENT\n"
        "0     forward                   600K              0K\n"
        "0     backward                  600K            700K\n");
}

namespace {

// AnalyzeRank (one walk; the states at the peaks rebuilt from checkpoints)
// against RankAnalysis's two walks (the second applies every event up to the
// later peak) on a random recording of `operations` allocator calls, whose
// live bytes drift up by `drift` per mille of the operations (a late peak).
void RequirePeaksAsTwoWalks(std::uint64_t seed, int operations, unsigned drift, const std::string& conf = "") {
  Session s(4096 * MiB, conf);
  std::mt19937_64 rng(seed);
  std::vector<DevicePtr> live;
  static const char* const kOwners[] = {"embed", "attn", "mlp", "head", "opt", "loss", "norm"};
  for (int i = 0; i < operations; ++i) {
    if (i % 997 == 0) s.rec.PhaseBegin(Phase::kForward, i / 997);
    const unsigned op = static_cast<unsigned>(rng() % 1000);
    if (op < 500 + drift || live.empty()) {
      const std::size_t size = rng() % 3 == 0 ? 1 + rng() % (1 << 20) : 512 * 1024 + rng() % (4 * MiB);
      live.push_back(s.Alloc(size, static_cast<Category>(rng() % kNumCategories), kOwners[rng() % 7]));
    } else if (op < 995) {
      const std::size_t k = rng() % live.size();
      MustFree(s.a, live[k]);
      live[k] = live.back();
      live.pop_back();
    } else {
      s.a.EmptyCache();
    }
    if (i % 997 == 996) s.rec.PhaseEnd(Phase::kForward, i / 997);
  }
  absl::StatusOr<RankReport> one = AnalyzeRank(s.t);
  REQUIRE(one.ok());
  RankAnalysis two(s.t);  // without checkpoints: the second walk takes the peaks
  TimelineWalk first(s.t);
  REQUIRE(first.Run({&two.first_walk()}).ok());
  REQUIRE(two.second_walk_end() ==
          std::max(two.report().peak_allocated.event_index, two.report().peak_reserved.event_index) + 1);
  TimelineWalk second(s.t);
  REQUIRE(second.Run({&two.second_walk()}, two.second_walk_end()).ok());
  const RankReport& r = two.report();
  INFO("seed " << seed << ", " << s.t.events.size() << " events, peaks at events " << r.peak_allocated.event_index
               << " and " << r.peak_reserved.event_index);
  // Far enough into the recording that the peaks are rebuilt from a copy
  // taken on the way, not from the start.
  REQUIRE(r.peak_allocated.event_index > 8192);
  REQUIRE_FALSE(r.peak_allocated.top_sites.empty());
  REQUIRE_FALSE(r.peak_allocated.top_owners.empty());
  CHECK(one->peak_allocated.event_index == r.peak_allocated.event_index);
  CHECK(one->peak_allocated.top_owners == r.peak_allocated.top_owners);
  CHECK(one->peak_allocated.top_sites == r.peak_allocated.top_sites);
  CHECK(one->peak_reserved.event_index == r.peak_reserved.event_index);
  CHECK(one->peak_reserved.top_owners == r.peak_reserved.top_owners);
  CHECK(one->peak_reserved.top_sites == r.peak_reserved.top_sites);
  const FragmentationInfo& a = one->fragmentation_at_peak;
  const FragmentationInfo& b = r.fragmentation_at_peak;
  CHECK(a.reserved == b.reserved);
  CHECK(a.allocated == b.allocated);
  CHECK(a.allocated == r.peak_allocated.bytes);
  CHECK(a.inactive_split_bytes == b.inactive_split_bytes);
  CHECK(a.free_in_segments == b.free_in_segments);
  CHECK(a.largest_free_block == b.largest_free_block);
  CHECK(a.fragmentation == b.fragmentation);
  CHECK(a.segments == b.segments);
  CHECK(a.free_blocks == b.free_blocks);
  // The sum of the top owners at the peak of allocated is the peak when there are at most five.
  std::int64_t owned = 0;
  for (const auto& [owner, bytes] : one->peak_allocated.top_owners) owned += bytes;
  if (one->peak_allocated.top_owners.size() < 5) CHECK(owned == static_cast<std::int64_t>(r.peak_allocated.bytes));
}

}  // namespace

TEST_CASE("one walk: the peaks' owners, sites and fragmentation from checkpoints equal the second walk's") {
  RequirePeaksAsTwoWalks(1, 30000, 3);  // a slow rise: the peak near the end
  RequirePeaksAsTwoWalks(2, 30000, 1);
  RequirePeaksAsTwoWalks(3, 24000, 2, "expandable_segments:True");
  RequirePeaksAsTwoWalks(4, 24000, 2, "max_split_size_mb:24");
}
