// Input files read whole, with a limit for their kind: nothing larger is
// read, and /dev/zero is read no further than the limit.
#include "base/input_file.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

using namespace memscope;

namespace {

std::string TempPath(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string(name) + "-" + std::to_string(::getpid()))).string();
}

}  // namespace

TEST_CASE("a file within its limit is read whole") {
  const std::string path = TempPath("memscope-input-small");
  std::ofstream(path) << "{\"format\": \"memscope.model/1\"}";
  absl::StatusOr<std::string> text = ReadInputFile(path, "model file", 64);
  REQUIRE(text.ok());
  CHECK(*text == "{\"format\": \"memscope.model/1\"}");
  std::filesystem::remove(path);
}

TEST_CASE("a 5 GiB sparse file is refused by its size before a byte is read") {
  const std::string path = TempPath("memscope-input-sparse");
  std::ofstream(path) << "{";
  std::filesystem::resize_file(path, std::uint64_t{5} << 30);
  absl::StatusOr<std::string> text = ReadInputFile(path, "model file", std::uint64_t{64} << 20);
  CHECK(text.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(text.status().message() == "model file " + path + ": 5368709120 bytes, over the model file limit (64 MiB)");
  CHECK(CheckInputFileSize(path, "timeline", std::uint64_t{1} << 30).message() ==
        "timeline " + path + ": 5368709120 bytes, over the timeline limit (1 GiB)");
  CHECK(CheckInputFileSize(path, "timeline", std::uint64_t{64} << 30).ok());
  std::filesystem::remove(path);
}

TEST_CASE("an endless stream is read no further than the limit") {
  absl::StatusOr<std::string> text = ReadInputFile("/dev/zero", "Hugging Face config", std::uint64_t{1} << 20);
  CHECK(text.status().message() == "Hugging Face config /dev/zero: more than the Hugging Face config limit (1 MiB)");
  CHECK(CheckInputFileSize("/dev/zero", "timeline", 1).ok());  // the reader bounds a stream itself
  CHECK(ReadInputFile("/no/such/file", "report.json", 1).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("lines are read no further than their limit") {
  std::istringstream in("short\n\nlast without a break");
  std::string line;
  CHECK(ReadBoundedLine(in, line, 32) == LineRead::kLine);
  CHECK(line == "short");
  CHECK(ReadBoundedLine(in, line, 32) == LineRead::kLine);
  CHECK(line.empty());
  CHECK(ReadBoundedLine(in, line, 32) == LineRead::kLine);
  CHECK(line == "last without a break");
  CHECK(ReadBoundedLine(in, line, 32) == LineRead::kEnd);
  std::ifstream zero("/dev/zero", std::ios::binary);
  CHECK(ReadBoundedLine(zero, line, 1 << 20) == LineRead::kTooLong);
  CHECK(line.size() == 1 << 20);
}
