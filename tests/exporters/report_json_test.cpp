// report.json both ways: what memscope writes reads back to the same
// document, a report from an older memscope (no ddp, no status) still reads,
// and a report that is not usable is an error naming the rank and the field.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "../recording/recording_session.h"
#include "exporters/report.h"

using namespace memscope;
using namespace memscope::testing;
using nlohmann::json;

namespace {

// A training step with a user phase, a fragmentation OOM and phase marks:
// every part of the schema that an analysis fills.
Timeline Recording(int rank, std::int64_t wall_start_us) {
  Session s(30 * MiB, "max_split_size_mb:20");
  s.t.rank = rank;
  s.t.world_size = 2;
  s.t.device_index = rank;
  s.t.wall_start_us = wall_start_us;
  s.rec.PhaseBegin(Phase::kModel);
  s.Alloc(2 * MiB, Category::kParameter, "fc.weight");
  s.rec.PhaseEnd(Phase::kModel);
  s.rec.PhaseBegin(Phase::kForward, 0);
  const DevicePtr x = s.Alloc(6 * MiB, Category::kActivation, "a");
  s.Alloc(6 * MiB, Category::kActivation, "b");
  MustFree(s.a, x);
  CHECK_FALSE(s.a.Malloc(12 * MiB).ok());
  s.rec.PhaseEnd(Phase::kForward, 0);
  return std::move(s.t);
}

RankReport Analyzed(const Timeline& t) {
  absl::StatusOr<RankReport> r = AnalyzeRank(t);
  REQUIRE(r.ok());
  return std::move(*r);
}

// What `memscope run` adds to a DDP rank.
void AddRunFields(RankReport& r) {
  r.status = "oom";
  r.ddp = DdpBuckets{"copy",
                     {{0, 2 * MiB, "float32", {"fc.weight", "fc.bias"}}},
                     {{0, MiB, "float32", {"fc.bias"}}, {1, MiB, "float32", {"fc.weight"}}},
                     ZeroShards{true, {{"fc.weight"}, {"fc.bias"}}, {2 * MiB - 4096, 4096}}};
}

std::string ReadError(const json& j) {
  absl::StatusOr<Report> r = ReportFromJson(j);
  REQUIRE_FALSE(r.ok());
  return std::string(r.status().message());
}

}  // namespace

TEST_CASE("report.json: what memscope writes reads back to the same document") {
  // With a wall clock (Unix time in microseconds) and without one (0).
  for (const std::int64_t wall_start_us : {std::int64_t{1764000000123456}, std::int64_t{0}}) {
    std::vector<RankReport> ranks = {Analyzed(Recording(0, wall_start_us)), Analyzed(Recording(1, wall_start_us))};
    REQUIRE(ranks[0].oom.has_value());
    AddRunFields(ranks[1]);
    ranks[1].losses = {2.5f, std::numeric_limits<float>::quiet_NaN()};
    Report report = MakeReport(2, ranks);
    report.failure = ReportFailure{1, "rank 1 ran out of memory"};
    const json written = ReportToJson(report);
    CHECK(written["ranks"][1]["losses"] == json::array({2.5, nullptr}));
    CHECK_FALSE(written["ranks"][0].contains("losses"));
    CHECK(written["failure"] == json{{"rank", 1}, {"message", "rank 1 ran out of memory"}});
    CHECK(written["ranks"][1]["status"] == "oom");
    CHECK_FALSE(written["ranks"][0].contains("status"));

    // Through text, as a file would.
    absl::StatusOr<Report> read = ReportFromJson(json::parse(written.dump(1)));
    INFO(read.status().ToString());
    REQUIRE(read.ok());
    CHECK(ReportToJson(*read) == written);
    CHECK(read->world_size == 2);
    CHECK(read->generator == kMemscopeVersion);
    const RankReport& r1 = read->ranks[1];
    CHECK(read->failure == ReportFailure{1, "rank 1 ran out of memory"});
    REQUIRE(r1.losses.size() == 2);
    CHECK(r1.losses[0] == 2.5f);
    CHECK(std::isnan(r1.losses[1]));
    CHECK(read->ranks[0].losses.empty());
    REQUIRE(r1.ddp.has_value());
    CHECK(r1.ddp->rebuilt_buckets[1].params == std::vector<std::string>{"fc.weight"});
    CHECK(r1.ddp->zero == ranks[1].ddp->zero);
    CHECK_FALSE(read->ranks[0].ddp.has_value());
    // The typed fields, not only the document, come back.
    CHECK(r1.stats == ranks[1].stats);
    CHECK(r1.alloc_conf == "max_split_size_mb:20");
    CHECK(r1.device_index == 1);
    CHECK(r1.phases.size() == ranks[1].phases.size());
    CHECK(r1.oom->requested == 12 * MiB);
    CHECK(r1.oom->fragmentation.largest_free_block == ranks[1].oom->fragmentation.largest_free_block);
  }
}

TEST_CASE("report.json: the run's failure reads back when its rank has no entry (it recorded nothing)") {
  Report report = MakeReport(3, {Analyzed(Recording(0, 0)), Analyzed(Recording(2, 0))});
  report.failure = ReportFailure{1, "rank 1 was killed by signal 9 (SIGKILL)"};
  const json written = ReportToJson(report);
  CHECK(written["failure"] == json{{"rank", 1}, {"message", "rank 1 was killed by signal 9 (SIGKILL)"}});
  absl::StatusOr<Report> read = ReportFromJson(json::parse(written.dump()));
  INFO(read.status().ToString());
  REQUIRE(read.ok());
  CHECK(read->failure == report.failure);
  CHECK(ReportToJson(*read) == written);
}

TEST_CASE("report.json: memory_stats come back into DeviceStats key by key") {
  DeviceStats stats;
  std::map<std::string, std::int64_t> want;
  std::int64_t value = 1;
  for (const auto& [key, unused] : FlattenStats(DeviceStats{})) {
    REQUIRE(SetFlatStat(stats, key, value));
    want[key] = value++;
  }
  CHECK(FlattenStats(stats) == want);  // every key names its own field
  CHECK_FALSE(SetFlatStat(stats, "active_bytes.all.highest", 1));
  CHECK(FlattenStats(stats) == want);
}

TEST_CASE("report.json: a report from an older memscope (no status, ddp, failure, torn_bytes) still reads") {
  json old = ReportToJson(MakeReport(1, {Analyzed(Recording(0, 1764000000000000))}));
  json& rank = old["ranks"][0];
  for (const char* key : {"torn_bytes", "device_index", "device_capacity", "alloc_conf", "lower_bound_bytes",
                          "overhead_bytes", "peak_reserved_bytes"}) {
    rank.erase(key);
  }
  rank["peak"]["allocated"].erase("top_owners");
  absl::StatusOr<Report> read = ReportFromJson(old);
  INFO(read.status().ToString());
  REQUIRE(read.ok());
  const RankReport& r = read->ranks[0];
  CHECK(r.status.empty());
  CHECK_FALSE(r.ddp.has_value());
  CHECK_FALSE(read->failure.has_value());
  CHECK(r.torn_bytes == 0);
  CHECK(r.peak_allocated.top_owners.empty());
  CHECK(r.peak_allocated.bytes == rank["peak"]["allocated"]["bytes"].get<std::uint64_t>());
  CHECK(r.stats_known);
  CHECK_FALSE(ReportToJson(*read).contains("failure"));
}

TEST_CASE("report.json: a report that is not usable is an error naming the rank and the field") {
  std::vector<RankReport> ranks = {Analyzed(Recording(0, 0)), Analyzed(Recording(1, 0))};
  AddRunFields(ranks[1]);
  const json good = ReportToJson(MakeReport(2, ranks));
  const std::string usable = "is not a usable memscope.report/1: ";

  CHECK(ReadError(json::array()) == "is not a JSON object (expected memscope.report/1)");
  CHECK(ReadError(json{{"ranks", json::array()}}) == "has no \"schema\" (expected memscope.report/1)");
  CHECK(ReadError(json{{"schema", "memscope.run/1"}}) == "has schema 'memscope.run/1', not memscope.report/1");
  CHECK(ReadError(json{{"schema", "memscope.report/1"}}) == "has no \"ranks\" array");

  json bad = good;
  bad["ranks"][1]["peak"]["allocated"].erase("bytes");
  CHECK(ReadError(bad) == usable + "rank 1 peak.allocated has no \"bytes\" (bytes)");
  bad = good;
  bad["ranks"][1]["peak"]["reserved"]["bytes"] = -1;
  CHECK(ReadError(bad) == usable + "rank 1 peak.reserved has no \"bytes\" (bytes)");
  bad = good;
  bad["ranks"][1]["peak_reserved_bytes"] = 1;
  CHECK(
      ReadError(bad).starts_with(usable + "rank 1 has \"peak_reserved_bytes\" 1 but \"peak\".\"reserved\".\"bytes\" "));
  bad = good;
  bad["ranks"][1]["memory_stats"]["active_bytes.all.highest"] = 1;
  CHECK(ReadError(bad) == usable +
                              "rank 1 has a key \"active_bytes.all.highest\" in \"memory_stats\" that "
                              "torch.cuda.memory_stats() has not");
  bad = good;
  bad["ranks"][0]["phases"][0]["by_category"]["SHOES"] = 1;
  CHECK(ReadError(bad) == usable + "rank 0 phases[0] has an unknown category \"SHOES\" in \"by_category\"");
  bad = good;
  bad["ranks"][1]["ddp"]["rebuilt_buckets"][1].erase("bytes");
  CHECK(ReadError(bad) == usable + "rank 1 ddp.rebuilt_buckets[1] has no \"bytes\" (bytes)");
  bad = good;
  bad["ranks"][1]["losses"] = json::array({1.5, "x"});
  CHECK(ReadError(bad) == usable + "rank 1 has no \"losses\" (an array of numbers or null)");
  bad = good;
  bad["ranks"][0]["oom"]["verdict"] = 3;
  CHECK(ReadError(bad) == usable + "rank 0 oom has no string \"verdict\"");
  bad = good;
  bad["ranks"][1]["rank"] = 0;
  CHECK(ReadError(bad) == usable + "ranks[1] repeats rank 0");
  bad = good;
  bad["ranks"][1].erase("rank");
  CHECK(ReadError(bad) == usable + "ranks[1] has no \"rank\" (a rank number)");
  bad = good;
  bad["failure"] = {{"rank", 7}, {"message", "rank 7 was killed"}};
  CHECK(ReadError(bad) == usable + "failure names rank 7, not a rank of world_size 2");

  // DDP as a rank of memscope run records it in rank-R.json.
  absl::StatusOr<DdpBuckets> ddp = DdpFromJson(DdpJson(*ranks[1].ddp));
  REQUIRE(ddp.ok());
  CHECK(DdpJson(*ddp) == DdpJson(*ranks[1].ddp));
  json bad_ddp = DdpJson(*ranks[1].ddp);
  bad_ddp["buckets"][0]["params"] = json::array({1});
  CHECK(DdpFromJson(bad_ddp).status().message() == "ddp.buckets[0] has no \"params\" array of names");
}

TEST_CASE("report.json: the whole-GPU table is typed and reads back, totals recomputed from the processes") {
  Report report = MakeReport(2, {});
  GpuRow& gpu = report.gpus.emplace_back();
  gpu.physical = 3;
  gpu.capacity = 80ULL << 30;
  gpu.processes.push_back({.rank = 0, .ordinal = 0, .context_bytes = 500 << 20, .reserved_bytes = 1 << 30,
                           .nccl_bytes = 0});
  gpu.processes.push_back({.rank = 1, .ordinal = 0, .context_bytes = 500 << 20, .reserved_bytes = 2 << 20,
                           .nccl_bytes = 4096});
  const json j = ReportToJson(report);
  CHECK(j["gpus"] == json::parse(R"([{"physical": 3, "capacity_bytes": 85899345920, "used_bytes": 2124419072,
      "shared_by_ranks": [0, 1],
      "processes": [{"rank": 0, "cuda": 0, "context_bytes": 524288000, "reserved_bytes": 1073741824,
                     "nccl_bytes": 0, "used_bytes": 1598029824},
                    {"rank": 1, "cuda": 0, "context_bytes": 524288000, "reserved_bytes": 2097152,
                     "nccl_bytes": 4096, "used_bytes": 526389248}]}])"));
  absl::StatusOr<Report> back = ReportFromJson(j);
  REQUIRE(back.ok());
  CHECK(back->gpus == report.gpus);
  CHECK(ReportToJson(*back) == j);
  json stray = j;
  stray["gpus"][0]["processes"][1]["cuda"] = nullptr;  // a stray context: not its device
  REQUIRE(ReportFromJson(stray).ok());
  CHECK(ReportFromJson(stray)->gpus[0].processes[1].ordinal == -1);
  json bad = j;
  bad["gpus"][0].erase("capacity_bytes");
  CHECK(ReportFromJson(bad).status().message() ==
        "is not a usable memscope.report/1: gpus[0] has no \"capacity_bytes\" (bytes)");
}

TEST_CASE("report.json: memscope run's torch_version reads back, and a report without it reads as none") {
  Report report = MakeReport(1, {Analyzed(Recording(0, 0))});
  CHECK(!ReportToJson(report).contains("torch_version"));
  report.torch_version = "1.13";
  const json written = ReportToJson(report);
  CHECK(written["torch_version"] == "1.13");
  absl::StatusOr<Report> read = ReportFromJson(json::parse(written.dump()));
  REQUIRE(read.ok());
  CHECK(read->torch_version == "1.13");
  CHECK(ReportToJson(*read) == written);
  json without = written;
  without.erase("torch_version");
  read = ReportFromJson(without);
  REQUIRE(read.ok());
  CHECK(read->torch_version.empty());
  json wrong = written;
  wrong["torch_version"] = 1.13;
  CHECK(ReadError(wrong) == "is not a usable memscope.report/1: the report has no string \"torch_version\"");
}
