// memory_summary() must match PyTorch 2.x character for character. The
// goldens were produced by a transcription of torch/cuda/memory.py's
// memory_summary applied to the same statistics.
#include <catch2/catch.hpp>
#include <vector>

#include "test_util.h"

using namespace memscope;
using namespace memscope::testing;

namespace {
#include "memory_summary_goldens.inc"
}  // namespace

TEST_CASE("memory_summary after one 1 MiB tensor: 1024 KiB allocated, 2048 KiB reserved, 1024 KiB non-releasable") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  MustMalloc(a, MiB);
  const std::string text = a.MemorySummary();
  CHECK(text == kOneMiBSummary);
  CHECK(text.find("| Allocated memory      |   1024 KiB |") != std::string::npos);
  CHECK(text.find("| GPU reserved memory   |   2048 KiB |") != std::string::npos);
  CHECK(text.find("| Non-releasable memory |   1024 KiB |") != std::string::npos);
}

TEST_CASE("memory_summary: every line is 77 characters, wrapped in |...|, ending with | and a newline") {
  SimDevice gpu;
  CachingAllocator a(gpu);
  const std::string text = a.MemorySummary();
  REQUIRE(text.size() > 2);
  CHECK(text.substr(text.size() - 2) == "|\n");
  std::size_t start = 0;
  int lines = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    CHECK(line.size() == 77);
    CHECK(line.front() == '|');
    CHECK(line.back() == '|');
    start = end + 1;
    ++lines;
  }
  CHECK(lines == 6 + 9 * 4 + 2 * 2 + 1);
  CHECK(text.find("|      0 B   |      0 B   |      0 B   |      0 B   |") != std::string::npos);
}

TEST_CASE("memory_summary abbreviated drops the pool rows, the title carries the device id") {
  SimDevice gpu({.index = 3});
  CachingAllocator a(gpu);
  MustMalloc(a, MiB);
  CHECK(a.MemorySummary(/*abbreviated=*/true) == kOneMiBAbbreviatedDevice3);
  CHECK(a.MemorySummary(true).find("PyTorch CUDA memory summary, device ID 3                 |") != std::string::npos);
}

TEST_CASE("memory_summary switches units per column by the 'all' row: B, KiB, MiB, GiB and K counts") {
  SimDevice gpu({.capacity = 80ULL << 30});
  CachingAllocator a(gpu);
  for (int i = 0; i < 800; ++i) MustFree(a, MustMalloc(a, std::size_t{1} << 30));
  std::vector<DevicePtr> keep;
  keep.reserve(760000);
  for (int i = 0; i < 760000; ++i) keep.push_back(MustMalloc(a, 512));
  CHECK(a.MemorySummary() == kUnitsSummary);
}
