#include "allocator/sizes.h"

#include <catch2/catch.hpp>

#include "allocator/config.h"

using namespace memscope;

TEST_CASE("round_size rounds every request up to 512 B steps, at least 512 B") {
  const AllocatorConfig c;
  CHECK(c.RoundSize(1) == 512);
  CHECK(c.RoundSize(511) == 512);
  CHECK(c.RoundSize(512) == 512);
  CHECK(c.RoundSize(513) == 1024);
  CHECK(c.RoundSize(1048576) == 1048576);
  CHECK(c.RoundSize(1048577) == 1049088);
  CHECK(c.RoundSize(16000000) == 16000000);
}

TEST_CASE("allocation_size: 2 MiB small segments, 20 MiB below 10 MiB, else 2 MiB multiples") {
  CHECK(AllocationSize(512) == 2 * kMiB);
  CHECK(AllocationSize(kMiB) == 2 * kMiB);
  CHECK(AllocationSize(1049088) == 20 * kMiB);
  CHECK(AllocationSize(10 * kMiB - 512) == 20 * kMiB);
  CHECK(AllocationSize(10 * kMiB) == 10 * kMiB);
  CHECK(AllocationSize(16000000) == 16777216);
  CHECK(AllocationSize(21 * kMiB) == 22 * kMiB);
}

TEST_CASE("roundup_power2_next_division follows PyTorch's example and keeps powers of two") {
  CHECK(RoundupPower2NextDivision(1200, 4) == 1280);
  CHECK(RoundupPower2NextDivision(1024, 4) == 1024);
  CHECK(RoundupPower2NextDivision(1200000, 4) == 1310720);
  CHECK(RoundupPower2NextDivision(104857600, 4) == 117440512);  // 100 MiB -> 112 MiB
  CHECK(RoundupPower2NextDivision(64 * kMiB, 4) == 64 * kMiB);
}

TEST_CASE("the divisions table index is floor(log2(size)) - 20, clamped to [0, 15]") {
  CHECK(RoundupPower2Index(1) == 0);
  CHECK(RoundupPower2Index(kMiB - 1) == 0);
  CHECK(RoundupPower2Index(kMiB) == 0);
  CHECK(RoundupPower2Index(2 * kMiB) == 1);
  CHECK(RoundupPower2Index(256 * kMiB) == 8);
  CHECK(RoundupPower2Index(1536 * kMiB) == 10);
  CHECK(RoundupPower2Index(std::size_t{1} << 40) == 15);
}

TEST_CASE("format_size prints bytes up to 1024, then two decimals of KiB, MiB, GiB") {
  CHECK(FormatSize(0) == "0 bytes");
  CHECK(FormatSize(1024) == "1024 bytes");
  CHECK(FormatSize(1025) == "1.00 KiB");
  CHECK(FormatSize(1048576) == "1024.00 KiB");
  CHECK(FormatSize(20 * kMiB) == "20.00 MiB");
  CHECK(FormatSize(1073741824ULL) == "1024.00 MiB");
  CHECK(FormatSize(80ULL << 30) == "80.00 GiB");
}

TEST_CASE("sizes parse with binary and decimal units") {
  CHECK(*ParseSize("123") == 123);
  CHECK(*ParseSize("4KiB") == 4096);
  CHECK(*ParseSize("2.5GiB") == 2684354560ULL);
  CHECK(*ParseSize("512MB") == 512000000ULL);
  CHECK(*ParseSize(" 16 GB ") == 16000000000ULL);
  CHECK(*ParseSize("80G") == 80ULL << 30);
  CHECK(*ParseSize("1b") == 1);
  for (const char* bad : {"", "abc", "12XB", "-1", "1.5", "1e3", "GiB", "1..2MiB"}) {
    INFO(bad);
    auto r = ParseSize(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(std::string(r.status().message()).find("invalid size") != std::string::npos);
  }
}
