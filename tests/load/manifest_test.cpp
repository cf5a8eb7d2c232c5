#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "load/manifest.h"

namespace memscope {
namespace {

ManifestRank Entry(int rank, const std::string& status) {
  ManifestRank r;
  r.rank = rank;
  r.timeline = "rank-" + std::to_string(rank) + ".timeline";
  r.status = status;
  return r;
}

RankStatus SomeStatus() {
  RankStatus s;
  s.rank = 1;
  s.status = "oom";
  s.exit_code = 3;
  s.error = "CUDA out of memory. Tried to allocate 2.00 GiB";
  s.parameters = 124439808;
  s.steps_done = 2;
  s.seconds = 1.25;
  s.losses = {2.5f, 0.1f};
  s.ddp = DdpBuckets{"view",
                     {{0, 1 << 20, "float32", {"fc.bias"}}, {1, 4096, "float16", {"a", "b"}}},
                     {},
                     ZeroShards{false, {{"a"}, {"fc.bias", "b"}}, {}}};
  s.device = RankDevice{1, 5, "LOCAL_RANK=1, CUDA_VISIBLE_DEVICES=3,5", 500 << 20, 544 << 20, {{0, 500 << 20}}};
  return s;
}

RunManifest SomeRun() {
  RunManifest m;
  m.generator = "memscope 0.1.0";
  m.command = "run";
  m.world_size = 2;
  m.alloc_conf = "expandable_segments:True";
  m.device_memory = 80ULL << 30;
  ManifestRank& stopped = m.ranks.emplace_back(Entry(0, "stopped"));
  stopped.exit_code = 0;
  stopped.error = "";
  stopped.steps_done = 1;
  stopped.signal = 15;
  stopped.how = "was stopped by signal 15 (SIGTERM)";
  m.ranks.emplace_back(Entry(1, "failed")).error = "";
  TrainingManifest t;
  t.model = "gpt2";
  t.parameters = 124439808;
  t.steps = 3;
  t.steps_done = 1;
  t.optimizer = "adam";
  t.optimizer_impl = "foreach";
  t.zero_grad = "none";
  t.amp = "none";
  t.attention = "math";
  t.exec = "meta";
  t.ddp = "copy";
  t.seconds = 0.5;
  t.losses = {1.5f};
  t.ddp_options = TrainingManifest::Ddp{std::nullopt, true, false, "none", true};
  m.training = t;
  m.failure = RunFailure{1, "rank 1 was killed by signal 9 (SIGKILL)"};
  return m;
}

TEST_CASE("RankStatus round-trips through rank-R.json") {
  const RankStatus s = SomeStatus();
  absl::StatusOr<RankStatus> back = RankStatus::FromJson(nlohmann::json::parse(s.ToJson().dump()));
  REQUIRE(back.ok());
  CHECK(*back == s);
  CHECK(s.ToJson()["ddp"]["buckets"][1]["params"] == nlohmann::json{"a", "b"});
  RankStatus no_ddp = s;
  no_ddp.ddp.reset();
  CHECK_FALSE(no_ddp.ToJson().contains("ddp"));
}

TEST_CASE("RankStatus round-trips its checkpoint, with and without the load GPU") {
  RankStatus s = SomeStatus();
  RankCheckpoint c;
  c.step = 1;
  c.saved = true;
  c.state_bytes = 4978778232;
  c.map_location = "none";
  c.loaded_onto = "cuda:0";
  c.loaded = true;
  s.checkpoint = c;
  absl::StatusOr<RankStatus> back = RankStatus::FromJson(nlohmann::json::parse(s.ToJson().dump()));
  REQUIRE(back.ok());
  CHECK(*back == s);
  CHECK_FALSE(s.ToJson()["checkpoint"].contains("load_gpu"));
  s.checkpoint->load_physical = 0;
  s.checkpoint->gpu_used = 7;
  s.checkpoint->gpu_used_by_rank = {4, 3};
  CHECK(s.ToJson()["checkpoint"]["load_gpu"] == nlohmann::json{{"physical", 0}, {"used", 7}, {"used_by_rank", {4, 3}}});
  back = RankStatus::FromJson(nlohmann::json::parse(s.ToJson().dump()));
  REQUIRE(back.ok());
  CHECK(*back == s);
}

TEST_CASE("RankStatus is written atomically and a missing or broken one reads as none") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "memscope-manifest-test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "rank-1.json").string();
  REQUIRE(SomeStatus().Write(path).ok());
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  CHECK(RankStatus::Read(path) == SomeStatus());
  std::ofstream(path) << "{\"rank\": 1";
  CHECK_FALSE(RankStatus::Read(path));
  std::ofstream(path) << "{\"rank\": \"one\"}";
  CHECK_FALSE(RankStatus::Read(path));
  CHECK_FALSE(RankStatus::Read((dir / "rank-9.json").string()));
  std::filesystem::remove_all(dir);
}

TEST_CASE("RunManifest of memscope run round-trips through run.json") {
  const RunManifest m = SomeRun();
  const nlohmann::json j = m.ToJson();
  CHECK(j["schema"] == "memscope.run/1");
  CHECK(j["bucket_cap_mb"].is_null());
  CHECK(j["model"] == "gpt2");
  CHECK(j["failure"]["rank"] == 1);
  CHECK_FALSE(j["ranks"][1].contains("exit_code"));
  absl::StatusOr<RunManifest> back = RunManifest::FromJson(nlohmann::json::parse(j.dump()));
  REQUIRE(back.ok());
  CHECK(*back == m);
}

TEST_CASE("RunManifest records --torch-version, and a run.json without it (older memscope) reads as none") {
  RunManifest m = SomeRun();
  CHECK_FALSE(m.ToJson().contains("torch_version"));
  m.training->torch_version = "1.13";
  nlohmann::json j = m.ToJson();
  CHECK(j["torch_version"] == "1.13");
  absl::StatusOr<RunManifest> back = RunManifest::FromJson(nlohmann::json::parse(j.dump()));
  REQUIRE(back.ok());
  CHECK(back->training->torch_version == "1.13");
  CHECK(*back == m);
  j.erase("torch_version");
  back = RunManifest::FromJson(j);
  REQUIRE(back.ok());
  CHECK(back->training->torch_version.empty());
  j["torch_version"] = 2;
  CHECK_FALSE(RunManifest::FromJson(j).ok());
}

TEST_CASE("RunManifest records --zero only when it is on") {
  RunManifest m = SomeRun();
  CHECK_FALSE(m.ToJson().contains("zero"));
  m.training->zero = "bucket-view";
  const nlohmann::json j = m.ToJson();
  CHECK(j["zero"] == "bucket-view");
  absl::StatusOr<RunManifest> back = RunManifest::FromJson(nlohmann::json::parse(j.dump()));
  REQUIRE(back.ok());
  CHECK(*back == m);
}

TEST_CASE("RunManifest of memscope run --dp round-trips its data_parallel") {
  RunManifest m = SomeRun();
  m.failure.reset();
  TrainingManifest& t = *m.training;
  t.ddp = "dp";
  t.ddp_options.reset();
  t.data_parallel = TrainingManifest::DataParallel{{0, 1, 2}, 0, 64, {22, 22, 20}};
  const nlohmann::json j = m.ToJson();
  CHECK(j["ddp"] == "dp");
  CHECK(j["data_parallel"]["module"] == "torch.nn.DataParallel");
  CHECK(j["data_parallel"]["device_ids"] == nlohmann::json{0, 1, 2});
  CHECK(j["data_parallel"]["chunk_sizes"] == nlohmann::json{22, 22, 20});
  CHECK_FALSE(j.contains("comm_hook"));
  absl::StatusOr<RunManifest> back = RunManifest::FromJson(nlohmann::json::parse(j.dump()));
  REQUIRE(back.ok());
  CHECK(*back == m);
  CHECK_FALSE(SomeRun().ToJson().contains("data_parallel"));
}

TEST_CASE("RunManifest of memscope replay --out has what replay wrote") {
  RunManifest m;
  m.generator = "memscope 0.1.0";
  m.command = "replay";
  m.source = "trace.jsonl";
  m.device_memory = 1 << 30;
  m.ranks.emplace_back(Entry(0, "ok")).exit_code = 0;
  const nlohmann::json expected = {
      {"schema", "memscope.run/1"},
      {"generator", "memscope 0.1.0"},
      {"command", "replay"},
      {"source", "trace.jsonl"},
      {"world_size", 1},
      {"alloc_conf", ""},
      {"device_memory", 1 << 30},
      {"ranks", {{{"rank", 0}, {"status", "ok"}, {"exit_code", 0}, {"timeline", "rank-0.timeline"}}}}};
  CHECK(m.ToJson() == expected);
  absl::StatusOr<RunManifest> back = RunManifest::FromJson(expected);
  REQUIRE(back.ok());
  CHECK(*back == m);
}

TEST_CASE("RunManifest of memscope capture names the job, its exit status and each rank's snapshot") {
  RunManifest m;
  m.generator = "memscope 0.1.0";
  m.command = "capture";
  m.world_size = 2;
  m.capture = CaptureManifest{{"python", "train.py", "--lr", "0.1"}, 137, 9, 1000000};
  ManifestRank& r0 = m.ranks.emplace_back();
  r0.rank = 0;
  r0.timeline = "snapshot-rank-0.pickle";
  r0.status = "ok";
  r0.steps_done = 3;
  ManifestRank& r1 = m.ranks.emplace_back();
  r1.rank = 1;
  r1.status = "no_snapshot";
  const nlohmann::json j = m.ToJson();
  CHECK(j["capture"] == nlohmann::json{{"argv", {"python", "train.py", "--lr", "0.1"}},
                                       {"exit_status", 137},
                                       {"signal", 9},
                                       {"max_entries", 1000000}});
  absl::StatusOr<RunManifest> back = RunManifest::FromJson(nlohmann::json::parse(j.dump()));
  REQUIRE(back.ok());
  CHECK(*back == m);
  m.capture->signal.reset();
  CHECK(m.ToJson()["capture"]["signal"].is_null());
  back = RunManifest::FromJson(m.ToJson());
  REQUIRE(back.ok());
  CHECK(*back == m);
}

TEST_CASE("RunManifest rejects what is not a run manifest, in one line naming the file") {
  CHECK_FALSE(RunManifest::FromJson(nlohmann::json{{"schema", "memscope.report/1"}}).ok());
  CHECK_FALSE(RunManifest::FromJson(nlohmann::json::array()).ok());
  nlohmann::json j = SomeRun().ToJson();
  j["ranks"][0]["rank"] = "zero";
  const absl::StatusOr<RunManifest> bad = RunManifest::FromJson(j);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find('\n') == std::string::npos);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "memscope-manifest-read-test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "run.json") << "not json";
  const absl::StatusOr<RunManifest> broken = RunManifest::Read((dir / "run.json").string());
  REQUIRE_FALSE(broken.ok());
  CHECK(broken.status().message() == "'" + (dir / "run.json").string() + "' is not valid JSON");
  CHECK(absl::IsNotFound(RunManifest::Read((dir / "none.json").string()).status()));
  REQUIRE(SomeRun().Write((dir / "run.json").string()).ok());
  const absl::StatusOr<RunManifest> read = RunManifest::Read((dir / "run.json").string());
  REQUIRE(read.ok());
  CHECK(*read == SomeRun());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace memscope
