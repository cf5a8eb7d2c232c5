#include "allocator/config.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

using namespace memscope;

namespace {
std::string ErrorOf(const std::string& text) {
  auto c = AllocatorConfig::Parse(text);
  REQUIRE_FALSE(c.ok());
  const std::string message(c.status().message());
  CHECK(message.find('\n') == std::string::npos);
  return message;
}
}  // namespace

TEST_CASE("an empty setting gives PyTorch's defaults") {
  auto c = AllocatorConfig::Parse("");
  REQUIRE(c.ok());
  CHECK(c->max_split_size_unlimited());
  CHECK(c->max_non_split_rounding_size == 20 * kMiB);
  CHECK(c->garbage_collection_threshold == 0.0);
  CHECK_FALSE(c->expandable_segments);
  for (std::size_t d : c->roundup_power2_divisions) CHECK(d == 0);
}

TEST_CASE("every key of the spec parses, with spaces allowed") {
  auto c = AllocatorConfig::Parse(
      "max_split_size_mb:128, max_non_split_rounding_mb:40,garbage_collection_threshold:0.6,"
      "expandable_segments:True,roundup_power2_divisions:4");
  REQUIRE(c.ok());
  CHECK(c->max_split_size == 128 * kMiB);
  CHECK(c->max_non_split_rounding_size == 40 * kMiB);
  CHECK(c->garbage_collection_threshold == 0.6);
  CHECK(c->expandable_segments);
  for (std::size_t d : c->roundup_power2_divisions) CHECK(d == 4);
  CHECK(c->text.find("max_split_size_mb:128") == 0);
}

TEST_CASE("PyTorch's other keys are accepted and change nothing") {
  auto c = AllocatorConfig::Parse(
      "backend:native,release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:False,"
      "pinned_num_register_threads:8");
  REQUIRE(c.ok());
  CHECK(c->max_split_size_unlimited());
}

TEST_CASE("roundup_power2_divisions list: keys in MB, first entry fills below, '>' fills from the last key") {
  auto c = AllocatorConfig::Parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  REQUIRE(c.ok());
  const auto& d = c->roundup_power2_divisions;
  for (std::size_t i = 0; i <= 8; ++i) CHECK(d[i] == 1);  // < 512 MiB
  CHECK(d[9] == 2);                                       // [512 MiB, 1 GiB)
  // PyTorch's '>' fill starts AT the last named interval, overwriting its 4.
  CHECK(d[10] == 8);
  for (std::size_t i = 11; i < 16; ++i) CHECK(d[i] == 8);
  CHECK(c->DivisionsFor(300 * kMiB) == 1);
  CHECK(c->DivisionsFor(600 * kMiB) == 2);
  CHECK(c->DivisionsFor(1536 * kMiB) == 8);
}

TEST_CASE("roundup_power2_divisions: intervals not named stay 0 (plain rounding)") {
  auto c = AllocatorConfig::Parse("roundup_power2_divisions:[64:8,256:4]");
  REQUIRE(c.ok());
  const auto& d = c->roundup_power2_divisions;
  for (std::size_t i = 0; i <= 6; ++i) CHECK(d[i] == 8);
  CHECK(d[7] == 0);
  CHECK(d[8] == 4);
  CHECK(d[9] == 0);
}

TEST_CASE("round_size with divisions rounds to the next 1/d of the power-of-two interval") {
  auto c = AllocatorConfig::Parse("roundup_power2_divisions:4");
  REQUIRE(c.ok());
  CHECK(c->RoundSize(1200000) == 1310720);
  CHECK(c->RoundSize(104857600) == 117440512);
  CHECK(c->RoundSize(64 * kMiB) == 64 * kMiB);
  CHECK(c->RoundSize(1000) == 1024);  // not above 512 * divisions: plain rounding
  CHECK(c->RoundSize(2048) == 2048);
}

TEST_CASE("bad settings are one-line errors that name the key") {
  CHECK(ErrorOf("max_split_size_mb:10").find("max_split_size_mb") != std::string::npos);
  CHECK(ErrorOf("max_split_size_mb:10").find(">= 20") != std::string::npos);
  CHECK(ErrorOf("max_split_size_mb:abc").find("max_split_size_mb") != std::string::npos);
  CHECK(ErrorOf("max_split_size_mb").find("max_split_size_mb") != std::string::npos);
  CHECK(ErrorOf("max_non_split_rounding_mb:5").find("max_non_split_rounding_mb") != std::string::npos);
  CHECK(ErrorOf("garbage_collection_threshold:1.5").find("garbage_collection_threshold") != std::string::npos);
  CHECK(ErrorOf("garbage_collection_threshold:0").find("garbage_collection_threshold") != std::string::npos);
  CHECK(ErrorOf("expandable_segments:yes").find("expandable_segments") != std::string::npos);
  CHECK(ErrorOf("expandable_segments:true").find("expandable_segments") != std::string::npos);
  CHECK(ErrorOf("roundup_power2_divisions:3").find("roundup_power2_divisions") != std::string::npos);
  CHECK(ErrorOf("roundup_power2_divisions:[100:2]").find("roundup_power2_divisions") != std::string::npos);
  CHECK(ErrorOf("roundup_power2_divisions:[256:2").find("roundup_power2_divisions") != std::string::npos);
  CHECK(ErrorOf("foo:1").find("unknown key 'foo'") != std::string::npos);
  CHECK(ErrorOf("backend:cudaMallocAsync").find("backend") != std::string::npos);
  CHECK(ErrorOf("expandable_segments:True,").find("trailing") != std::string::npos);
  CHECK(ErrorOf("expandable_segments:True max_split_size_mb:20").find("expandable_segments") != std::string::npos);
}

TEST_CASE("settings come from PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF") {
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  unsetenv("PYTORCH_ALLOC_CONF");
  CHECK(AllocatorConfig::FromEnvironment()->max_split_size_unlimited());
  setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64", 1);
  CHECK(AllocatorConfig::FromEnvironment()->max_split_size == 64 * kMiB);
  setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", 1);
  auto c = AllocatorConfig::FromEnvironment();
  CHECK(c->expandable_segments);
  CHECK(c->max_split_size_unlimited());
  setenv("PYTORCH_CUDA_ALLOC_CONF", "bogus:1", 1);
  auto bad = AllocatorConfig::FromEnvironment();
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find("PYTORCH_CUDA_ALLOC_CONF") != std::string::npos);
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  unsetenv("PYTORCH_ALLOC_CONF");
}

TEST_CASE("per_process_memory_fraction (PyTorch 2.9+) is a number in [0, 1], default 1 (no cap)") {
  CHECK(AllocatorConfig::Parse("")->per_process_memory_fraction == 1.0);
  auto c = AllocatorConfig::Parse("per_process_memory_fraction:0.25,garbage_collection_threshold:0.5");
  REQUIRE(c.ok());
  CHECK(c->per_process_memory_fraction == 0.25);
  CHECK(AllocatorConfig::Parse("per_process_memory_fraction:0")->per_process_memory_fraction == 0.0);
  CHECK(ErrorOf("per_process_memory_fraction:1.5") ==
        "invalid allocator setting: 'per_process_memory_fraction' must be a number in [0.0, 1.0], got '1.5'");
  CHECK(ErrorOf("per_process_memory_fraction:half").find("per_process_memory_fraction") != std::string::npos);
}
