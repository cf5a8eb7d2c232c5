// memscope explain on hand-built traces whose cause is known: the cause, and
// the what-if that cures a fragmentation OOM by exactly 40 MiB.
#include "explain/explain.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "allocator/sizes.h"

using namespace memscope;

namespace {

// Writes `text` to a file in the temporary directory and returns its path.
std::string TraceFile(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

const WhatIf* Find(const MemoryExplanation& e, const std::string& change) {
  for (const WhatIf& w : e.what_ifs) {
    if (w.change == change) return &w;
  }
  return nullptr;
}

}  // namespace

TEST_CASE(
    "explain: 60 MiB freed, split by 4 MiB, then 60 MiB on a 100 MiB GPU is fragmentation that "
    "expandable segments cure by 40 MiB") {
  const std::string path = TraceFile("explain-split-test.jsonl", R"({"action":"alloc","id":"w","size":62914560}
{"action":"free","id":"w"}
{"action":"alloc","id":"g","size":4194304}
{"action":"alloc","id":"a","size":62914560}
)");
  absl::StatusOr<MemoryExplanation> e = Explain(path, {.gpu_memory = 100 * kMiB, .alloc_conf = ""});
  REQUIRE(e.ok());
  REQUIRE(e->oom);
  CHECK(*e->cause == OomCause::kFragmentation);
  CHECK(e->min_device_memory == std::optional<std::uint64_t>(120 * kMiB));
  const WhatIf* expandable = Find(*e, "expandable_segments:True");
  REQUIRE(expandable != nullptr);
  CHECK(!expandable->oom);
  CHECK(expandable->saved_bytes == std::optional<std::int64_t>(40 * kMiB));
  CHECK(e->what_ifs.front().change == "expandable_segments:True");  // ranked first: it runs, and saves the most
  CHECK(e->diagnosis.size() == 3);
}

TEST_CASE("explain: 110 MiB live on a 100 MiB GPU is capacity and under a fraction of 0.5 of 200 MiB the fraction") {
  const std::string path = TraceFile("explain-capacity-test.jsonl", R"({"action":"alloc","id":"w","size":62914560}
{"action":"alloc","id":"a","size":52428800}
)");
  absl::StatusOr<MemoryExplanation> e = Explain(path, {.gpu_memory = 100 * kMiB, .alloc_conf = ""});
  REQUIRE(e.ok());
  REQUIRE(e->oom);
  CHECK(*e->cause == OomCause::kCapacity);
  for (const WhatIf& w : e->what_ifs) CHECK(w.oom);
  e = Explain(path, {.gpu_memory = 200 * kMiB, .alloc_conf = "", .memory_fraction = 0.5});
  REQUIRE(e.ok());
  REQUIRE(e->oom);
  CHECK(*e->cause == OomCause::kMemoryFraction);
  const WhatIf* none = Find(*e, "no memory fraction");
  REQUIRE(none != nullptr);
  CHECK(!none->oom);
  CHECK(none->saved_bytes == std::optional<std::int64_t>(110 * kMiB));
}
