#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "load/run_directory.h"

namespace memscope {
namespace {

TEST_CASE("RunDirectory names every file of a run directory") {
  const RunDirectory dir("runs/a");
  CHECK(dir.Manifest() == "runs/a/run.json");
  CHECK(dir.Timeline(3) == "runs/a/rank-3.timeline");
  CHECK(dir.RankStatus(1) == "runs/a/rank-1.json");
  CHECK(dir.RankLog(0) == "runs/a/rank-0.log");
  CHECK(dir.Snapshot(2) == "runs/a/snapshot-rank-2.pickle");
  CHECK(dir.Report() == "runs/a/report.json");
  CHECK(dir.Summary() == "runs/a/summary.txt");
  CHECK(dir.Trace() == "runs/a/trace.json");
  CHECK(dir.Html() == "runs/a/report.html");
  CHECK(dir.Store() == "runs/a/.memscope-store");
  CHECK(RunDirectory("").Manifest() == "run.json");
  CHECK(RunDirectory::TimelineName(12) == "rank-12.timeline");
}

TEST_CASE("RunDirectory lists what a run holds, per rank as a range") {
  CHECK(RunDirectory::Listing(1) ==
        "run.json, rank-0.timeline, report.json, report.html, summary.txt, trace.json, snapshot-rank-0.pickle");
  CHECK(RunDirectory::Listing(4) ==
        "run.json, rank-{0..3}.timeline, report.json, report.html, summary.txt, "
        "trace.json, snapshot-rank-{0..3}.pickle");
}

TEST_CASE("RunDirectory reads the rank of a timeline file name and nothing else") {
  CHECK(RunDirectory::TimelineRank("rank-0.timeline") == 0);
  CHECK(RunDirectory::TimelineRank("rank-17.timeline") == 17);
  CHECK_FALSE(RunDirectory::TimelineRank("rank-.timeline"));
  CHECK_FALSE(RunDirectory::TimelineRank("rank-x.timeline"));
  CHECK_FALSE(RunDirectory::TimelineRank("rank-1.json"));
  CHECK_FALSE(RunDirectory::TimelineRank("snapshot-rank-1.pickle"));
  CHECK_FALSE(RunDirectory::TimelineRank("my-rank-1.timeline"));
}

TEST_CASE("RunDirectory cleans only the per-rank files memscope recorded writing, and the rendezvous directory") {
  const std::filesystem::path root = std::filesystem::temp_directory_path() / "memscope-run-directory-test";
  std::filesystem::remove_all(root);
  const RunDirectory dir((root / "nested").string());
  REQUIRE(dir.Create().ok());
  // Written by memscope (and recorded): removed.
  for (const std::string& name : {RunDirectory::TimelineName(0), RunDirectory::RankStatusName(0),
                                  RunDirectory::RankLogName(1), RunDirectory::SnapshotName(0)}) {
    dir.RecordFile(name);
    std::ofstream(dir.Path(name)) << "x";
  }
  // The user's, though named like rank files (never recorded), a recorded
  // name that is now a directory, and run.json, report.json: they stay.
  for (const std::string& f : {dir.Manifest(), dir.Report(), dir.Path("notes.txt"), dir.Path("rank-a.log"),
                               dir.Path("rank-5.log"), dir.Path("snapshot-rank-9.pickle")}) {
    std::ofstream(f) << "x";
  }
  dir.RecordFile("rank-3.json");
  std::filesystem::create_directories(std::filesystem::path(dir.Path("rank-3.json")));
  std::ofstream(dir.Path("rank-3.json") + "/inside") << "x";
  std::filesystem::create_directories(std::filesystem::path(dir.Store()) / "x");
  dir.RemoveRankFiles();
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.root())) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"notes.txt", "rank-3.json", "rank-5.log", "rank-a.log", "report.json",
                                         "run.json", "snapshot-rank-9.pickle"});
  CHECK(std::filesystem::exists(dir.Path("rank-3.json") + "/inside"));
  CHECK(RunDirectory::IsRankFile("rank-10.timeline"));
  CHECK_FALSE(RunDirectory::IsRankFile("rank-10.timeline.bak"));
  std::filesystem::remove_all(root);
}

TEST_CASE("RunDirectory's lock admits one run and names it to the next") {
  const std::filesystem::path root = std::filesystem::temp_directory_path() / "memscope-run-lock-test";
  std::filesystem::remove_all(root);
  const RunDirectory dir(root.string());
  REQUIRE(dir.Create().ok());
  {
    absl::StatusOr<RunDirectory::Lock> first = dir.TakeLock("pid 1: memscope run --out x");
    REQUIRE(first.ok());
    absl::StatusOr<RunDirectory::Lock> second = dir.TakeLock("pid 2: memscope run");
    REQUIRE_FALSE(second.ok());
    CHECK(second.status().message() == "'" + root.string() +
                                           "' is in use by another memscope run (pid 1: memscope run --out x); wait "
                                           "for it or choose another --out");
  }
  CHECK(dir.TakeLock("pid 3: memscope run").ok());  // released with the first
  std::filesystem::remove_all(root);
}

TEST_CASE("RunDirectory::Create names the directory it cannot create") {
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "memscope-run-directory-file";
  std::ofstream(file) << "x";
  const absl::Status s = RunDirectory((file / "sub").string()).Create();
  CHECK_FALSE(s.ok());
  CHECK(std::string(s.message()).starts_with("cannot create '" + (file / "sub").string() + "'"));
  std::filesystem::remove(file);
}

TEST_CASE("RunDirectory::Claim takes a new, empty or memscope's directory and refuses the user's") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "memscope-run-claim-test";
  fs::remove_all(root);
  // New: created, with its mark.
  const RunDirectory fresh((root / "new").string());
  REQUIRE(fresh.Claim(false).ok());
  CHECK(fresh.WrittenByMemscope());
  CHECK(fs::is_regular_file(fresh.Path(RunDirectory::kFileList)));
  // Empty: claimed.
  fs::create_directories(root / "empty");
  CHECK(RunDirectory((root / "empty").string()).Claim(false).ok());
  // The user's: refused, naming the file a run would overwrite; nothing added.
  const RunDirectory users((root / "users").string());
  fs::create_directories(users.root());
  for (const char* name : {"notes.txt", "report.json"}) std::ofstream(users.Path(name)) << "mine";
  CHECK_FALSE(users.WrittenByMemscope());
  const absl::Status refused = users.Claim(false);
  CHECK(refused.message() == "--out '" + users.root() +
                                 "' is not empty and was not written by memscope (it holds report.json and 1 other): "
                                 "choose a new or empty directory, or --force to write into it");
  CHECK(std::distance(fs::directory_iterator(users.root()), fs::directory_iterator()) == 2);
  // --force: claimed, and memscope's from then on.
  REQUIRE(users.Claim(true).ok());
  CHECK(users.Claim(false).ok());
  // --ddp copy,view: memscope's through its copy/ run.
  REQUIRE(RunDirectory((root / "both" / "copy").string()).Claim(false).ok());
  CHECK(RunDirectory((root / "both").string()).WrittenByMemscope());
  // A file is not a directory; / is always refused.
  std::ofstream(root / "file") << "x";
  CHECK(RunDirectory((root / "file").string()).Claim(true).message() ==
        "--out '" + (root / "file").string() + "' is not a directory");
  CHECK(RunDirectory("/").Check(true).message() == "--out '/' is the root directory: choose a new directory for the run");
  fs::remove_all(root);
}

}  // namespace
}  // namespace memscope
