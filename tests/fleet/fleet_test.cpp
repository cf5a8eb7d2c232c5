// The fleet analysis (fleet/fleet.h) on hand-built rank reports: the spread,
// the modified z-score of Iglewicz and Hoaglin (Engineering Statistics
// Handbook 1.3.5.17: M = 0.6745 (x - median) / MAD, outlier when |M| > 3.5;
// 1 / 0.6745 = 1.4826) with its mean-absolute-deviation fallback (scale
// 1.2533 MeanAD when MAD is 0), and what an outlier's explanation names.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "catch2/catch.hpp"
#include "exporters/snapshot_export.h"
#include "fleet/fleet.h"
#include "fleet/fleet_load.h"
#include "importers/request_trace.h"
#include "load/record_replay.h"

namespace memscope {
namespace {

constexpr std::uint64_t MiB = std::uint64_t{1} << 20;

FleetRank Rank(int rank, std::uint64_t peak_allocated, std::uint64_t peak_reserved) {
  FleetRank r;
  r.source = "rank-" + std::to_string(rank);
  r.kind = "timeline";
  r.report.rank = rank;
  r.report.peak_allocated.bytes = peak_allocated;
  r.report.peak_reserved.bytes = peak_reserved;
  return r;
}

PhaseRow Row(std::int64_t step, Phase phase, std::uint64_t allocated, std::uint64_t reserved,
             std::uint64_t max_reserved) {
  PhaseRow row;
  row.step = step;
  row.phase = phase;
  row.allocated = allocated;
  row.max_allocated = allocated;
  row.reserved = reserved;
  row.max_reserved = max_reserved;
  row.peak_allocated_in_phase = allocated;
  return row;
}

// A scratch directory, removed when the test ends, passed or not.
struct ScratchDir {
  explicit ScratchDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path path;
};

std::vector<FleetRank> Uniform(int n, std::uint64_t bytes) {
  std::vector<FleetRank> ranks;
  for (int i = 0; i < n; ++i) ranks.push_back(Rank(i, bytes, bytes));
  return ranks;
}

TEST_CASE("the modified z-score: (x - median) / (1.4826 MAD) - 500 MiB among 100-106 MiB scores 133.5") {
  std::vector<FleetRank> ranks;
  const std::uint64_t mib[] = {100, 102, 104, 106, 500};
  for (int i = 0; i < 5; ++i) ranks.push_back(Rank(i, mib[i] * MiB, mib[i] * MiB));
  const FleetResult fleet = AnalyzeFleet(ranks);
  // Deviations from the median 104: 4, 2, 0, 2, 396; their median (MAD) is 2 MiB.
  const double scale = 1.4826 * 2 * MiB;
  CHECK(fleet.scales[0] == Approx(scale).epsilon(1e-12));
  REQUIRE(fleet.outliers.size() == 1);
  CHECK(fleet.outliers[0].rank == 4);
  CHECK(fleet.outliers[0].scores[0] == Approx(396 * MiB / scale).epsilon(1e-12));  // 133.55
  CHECK(fleet.outliers[0].flagged ==
        std::vector<FleetMetric>{FleetMetric::kPeakAllocated, FleetMetric::kPeakReserved});
  const FleetSpread& s = fleet.spreads[0];
  CHECK(s.min == static_cast<std::int64_t>(100 * MiB));
  CHECK(s.median == static_cast<std::int64_t>(104 * MiB));
  CHECK(s.max == static_cast<std::int64_t>(500 * MiB));
  CHECK(s.min_rank == 0);
  CHECK(s.max_rank == 4);
  CHECK(s.skew == Approx(400.0 / 104.0));
  CHECK(fleet.median_rank == 2);
}

TEST_CASE("with more than half the ranks alike (MAD 0), the scale is 1.2533 times the mean absolute deviation") {
  std::vector<FleetRank> ranks = Uniform(39, 1536 * MiB);
  ranks.push_back(Rank(39, 3584 * MiB, 3584 * MiB));  // 2 GiB more
  const FleetResult fleet = AnalyzeFleet(ranks);
  const double scale = 1.2533 * (2048.0 * MiB / 40);  // one deviation of 2 GiB over 40 ranks
  CHECK(fleet.scales[1] == Approx(scale).epsilon(1e-12));
  REQUIRE(fleet.outliers.size() == 1);
  CHECK(fleet.outliers[0].rank == 39);
  CHECK(fleet.outliers[0].scores[1] == Approx(40 / 1.2533).epsilon(1e-12));  // 31.9
}

TEST_CASE("identical ranks have no outlier, and neither does a rank 0.1% above them (the 1% floor of the scale)") {
  CHECK(AnalyzeFleet(Uniform(16, 1000 * MiB)).outliers.empty());
  std::vector<FleetRank> ranks = Uniform(15, 1000 * MiB);
  ranks.push_back(Rank(15, 1001 * MiB, 1001 * MiB));
  const FleetResult fleet = AnalyzeFleet(ranks);
  // MeanAD is 1/16 MiB, 1.2533 of it is under the floor: 1% of the median, 10 MiB.
  CHECK(fleet.scales[0] == Approx(10.0 * MiB));
  CHECK(fleet.outliers.empty());
}

TEST_CASE("the median of an even count is the mean of the two middle values, rounded down") {
  std::vector<FleetRank> ranks = {Rank(0, 10, 10), Rank(1, 21, 21), Rank(2, 30, 30), Rank(3, 40, 40)};
  const FleetResult fleet = AnalyzeFleet(ranks);
  CHECK(fleet.spreads[0].median == 25);  // (21 + 30) / 2 = 25.5
  CHECK(fleet.median_rank == 1);         // the lower middle by peak reserved
}

TEST_CASE("a step's peak reserved is the max_memory_reserved it raised, else its largest reserved at a phase end") {
  RankReport r;
  r.phases = {Row(kNoStep, Phase::kModel, 100, 100, 100),
              Row(0, Phase::kForward, 300, 400, 400),   // raised to 400
              Row(0, Phase::kBackward, 200, 400, 450),  // raised to 450 inside backward
              Row(1, Phase::kForward, 350, 300, 450),   // empty_cache before: 300 at the end
              Row(1, Phase::kBackward, 250, 350, 450),
              Row(2, Phase::kForward, 500, 500, 500)};
  const FleetRankFigures f = FiguresOf(r);
  CHECK(f.steps == std::vector<std::int64_t>{0, 1, 2});
  CHECK(f.step_peak_reserved == std::vector<std::uint64_t>{450, 350, 500});
  // Allocated at the step ends: 200, 250, 500: (500 - 200) / 2 per step.
  CHECK(f.growth_per_step == 150);
}

TEST_CASE("an outlier's explanation: categories, sites and phases that differ from the median rank by 1 MiB or more") {
  std::vector<FleetRank> ranks = Uniform(9, 1024 * MiB);
  for (FleetRank& r : ranks) {
    r.report.peak_allocated.by_category[static_cast<int>(Category::kParameter)] = 1024 * MiB;
    r.report.peak_allocated.top_sites = {{"PARAMETER model", 1024 * MiB, 1}};
    r.report.phases = {Row(0, Phase::kForward, 1024 * MiB, 1024 * MiB, 1024 * MiB)};
  }
  FleetRank& odd = ranks[7];
  odd.report.peak_allocated.bytes = odd.report.peak_reserved.bytes = 3072 * MiB;
  odd.report.peak_allocated.by_category[static_cast<int>(Category::kOptimizerState)] = 2048 * MiB;
  odd.report.peak_allocated.by_category[static_cast<int>(Category::kTemporary)] = 512 * 1024;  // under 1 MiB
  odd.report.peak_allocated.top_sites.push_back({"OPTIMIZER_STATE adam", 2048 * MiB, 2});
  odd.report.phases.push_back(Row(0, Phase::kStep, 3072 * MiB, 3072 * MiB, 3072 * MiB));
  const FleetResult fleet = AnalyzeFleet(ranks);
  REQUIRE(fleet.outliers.size() == 1);
  const FleetOutlier& o = fleet.outliers[0];
  CHECK(o.rank == 7);
  REQUIRE(o.categories.size() == 1);
  CHECK(o.categories[0].what == "OPTIMIZER_STATE");
  CHECK(o.categories[0].delta() == static_cast<std::int64_t>(2048 * MiB));
  REQUIRE(o.sites.size() == 1);
  CHECK(o.sites[0].what == "OPTIMIZER_STATE adam");
  REQUIRE(o.phases.size() == 1);
  CHECK(o.phases[0].what == "step");
  CHECK(o.phases[0].outlier_bytes == static_cast<std::int64_t>(3072 * MiB));
  CHECK(o.phases[0].median_bytes == 0);
}

TEST_CASE("an OOM on a rank when most ranks had none makes it an outlier - memory_stats counts OOMs and retries") {
  std::vector<FleetRank> ranks = Uniform(5, 1024 * MiB);
  ranks[2].report.stats.num_ooms = 2;
  ranks[2].report.stats.num_alloc_retries = 3;
  const FleetResult fleet = AnalyzeFleet(ranks);
  REQUIRE(fleet.outliers.size() == 1);
  CHECK(fleet.outliers[0].rank == 2);
  CHECK(fleet.outliers[0].oom);
  CHECK(fleet.outliers[0].flagged.empty());
  CHECK(fleet.ranks[2].figures.ooms == 2);
  CHECK(fleet.ranks[2].figures.retries == 3);
}

TEST_CASE("a file's name gives its rank: rank-R, rank_R, rankR, the last one in the name") {
  CHECK(RankInFileName("run/snapshot-rank-37.pickle") == 37);
  CHECK(RankInFileName("node3/RANK_12.json") == 12);
  CHECK(RankInFileName("rank7.json") == 7);
  CHECK(RankInFileName("rank-1-of-rank-5.pickle") == 5);
  CHECK(RankInFileName("snapshot.pickle") == std::nullopt);
  CHECK(RankInFileName("ranking.json") == std::nullopt);
  CHECK(RankInFileName("rank-99999999999.pickle") == std::nullopt);  // beyond any world size
}

TEST_CASE("LoadFleet reads every file with its workers: the same ranks with 1 and 4 of them - an error names the first bad file") {
  const ScratchDir scratch("memscope-fleet-load-");
  const std::filesystem::path& dir = scratch.path;
  for (int i = 0; i < 24; ++i) {
    RankReport r;
    r.peak_allocated.bytes = (100 + static_cast<std::uint64_t>(i)) * MiB;
    r.peak_reserved.bytes = (200 + static_cast<std::uint64_t>(i)) * MiB;
    std::ofstream(dir / ("rank-" + std::to_string(i) + ".json")) << ReportToJson(MakeReport(1, {r})).dump();
  }
  FleetLoadOptions options;
  for (const int jobs : {1, 4}) {
    options.jobs = jobs;
    absl::StatusOr<FleetInputs> in = LoadFleet({dir.string()}, options);
    REQUIRE(in.ok());
    const FleetResult fleet = AnalyzeFleet(std::move(in->ranks));
    REQUIRE(fleet.ranks.size() == 24);
    for (int i = 0; i < 24; ++i) {
      CHECK(fleet.ranks[static_cast<std::size_t>(i)].report.rank == i);  // from the file's name
      CHECK(fleet.ranks[static_cast<std::size_t>(i)].figures.peak_reserved == (200 + static_cast<std::uint64_t>(i)) * MiB);
    }
  }
  std::ofstream(dir / "rank-7.json") << "{";  // rank 7 and 9 broken: rank 7 is named, whichever worker saw 9 first
  std::ofstream(dir / "rank-9.json") << "[";
  absl::StatusOr<FleetInputs> bad = LoadFleet({dir.string()}, options);
  CHECK(bad.status().message() == "'" + (dir / "rank-7.json").string() + "' is not valid JSON");
}


// A PyTorch snapshot of one step: 256 MiB of parameters, 512 MiB of
// activations, then 512 MiB (+ `extra`) of Adam state (a replay recorded in
// memory, written by exporters/).
void WriteRankSnapshot(const std::string& path, std::uint64_t extra) {
  std::ostringstream jsonl;
  jsonl << R"({"action":"alloc","id":"w","size":268435456,"category":"PARAMETER","owner":"model"})" << "\n"
        << R"({"action":"phase_begin","phase":"forward","step":0})" << "\n"
        << R"({"action":"alloc","id":"a","size":536870912,"category":"ACTIVATION","owner":"encoder"})" << "\n"
        << R"({"action":"phase_end","phase":"forward","step":0})" << "\n"
        << R"({"action":"phase_begin","phase":"step","step":0})" << "\n"
        << R"({"action":"free","id":"a"})" << "\n"
        << R"({"action":"alloc","id":"m","size":)" << 512 * MiB + extra
        << R"(,"category":"OPTIMIZER_STATE","owner":"adam"})" << "\n"
        << R"({"action":"phase_end","phase":"step","step":0})" << "\n";
  std::istringstream in(jsonl.str());
  absl::StatusOr<RequestTrace> trace = ReadJsonlTrace(in, "rank");
  REQUIRE(trace.ok());
  absl::StatusOr<Timeline> t = RecordReplay(*trace, AllocatorConfig{}, 80ull << 30, 0);
  REQUIRE(t.ok());
  absl::StatusOr<std::pair<TraceModel, std::size_t>> end = ModelAt(*t, *ParseMoment("exit"));
  REQUIRE(end.ok());
  std::ofstream out(path, std::ios::binary);
  REQUIRE(WriteSnapshot(*t, end->first, end->second, SnapshotFormat::kPickle, out).ok());
}

TEST_CASE("LoadFleet replays snapshots on 4 workers as on 1: rank 5 with 2 GiB more of Adam state is the outlier") {
  const ScratchDir scratch("memscope-fleet-snap-");
  const std::filesystem::path& dir = scratch.path;
  for (int r = 0; r < 8; ++r) {
    WriteRankSnapshot((dir / ("snapshot-rank-" + std::to_string(r) + ".pickle")).string(), r == 5 ? 2048 * MiB : 0);
  }
  FleetLoadOptions options;
  std::vector<std::uint64_t> peaks[2];
  for (const int jobs : {1, 4}) {
    options.jobs = jobs;
    absl::StatusOr<FleetInputs> in = LoadFleet({dir.string()}, options);
    REQUIRE(in.ok());
    const FleetResult fleet = AnalyzeFleet(std::move(in->ranks));
    REQUIRE(fleet.outliers.size() == 1);
    CHECK(fleet.outliers[0].rank == 5);
    // Rank 5 peaks holding Adam's 2.5 GiB, the others at the end of forward (the first time they hold 768 MiB).
    const std::vector<FleetDifference>& cats = fleet.outliers[0].categories;
    REQUIRE(cats.size() == 2);
    CHECK(cats[0].what == "OPTIMIZER_STATE");
    CHECK(cats[0].delta() == static_cast<std::int64_t>(2560 * MiB));
    CHECK(cats[1].what == "ACTIVATION");
    CHECK(cats[1].delta() == -static_cast<std::int64_t>(512 * MiB));
    for (const FleetRank& r : fleet.ranks) peaks[jobs == 4].push_back(r.figures.peak_allocated);
  }
  // Parameters and activations (768 MiB) at the end of forward; parameters and Adam's state after it.
  CHECK(peaks[0] == std::vector<std::uint64_t>{768 * MiB, 768 * MiB, 768 * MiB, 768 * MiB, 768 * MiB,
                                               2816 * MiB, 768 * MiB, 768 * MiB});
  CHECK(peaks[1] == peaks[0]);
}

}  // namespace
}  // namespace memscope
