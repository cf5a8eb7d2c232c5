// OutputFile's buffer: small writes gathered, a write that does not fit sent
// with what is buffered in one writev; the file holds every byte in order.
#include "load/output_file.h"

#include <catch2/catch.hpp>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace memscope {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_CASE("OutputFile writes small and large writes in order, byte for byte") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("memscope-output-file-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "out.bin").string();
  std::string expected;
  {
    OutputFile out(path);
    // A 9-byte header then a 64 KiB body (a pickle frame), bodies larger
    // than the buffer, single characters, and writes that just fit.
    for (int i = 0; i < 40; ++i) {
      std::string header(9, static_cast<char>('a' + i % 26));
      std::string body(static_cast<std::size_t>(65536 + 17 * i), static_cast<char>('A' + i % 26));
      out.stream().write(header.data(), static_cast<std::streamsize>(header.size()));
      out.stream().write(body.data(), static_cast<std::streamsize>(body.size()));
      out.stream().put(static_cast<char>('0' + i % 10));
      const std::string fits(static_cast<std::size_t>(65535 - i), 'z');
      out.stream().write(fits.data(), static_cast<std::streamsize>(fits.size()));
      expected += header + body + static_cast<char>('0' + i % 10) + fits;
    }
    const std::string huge(300000, 'h');
    out.stream() << huge;
    expected += huge;
    REQUIRE(out.Commit().ok());
  }
  CHECK(ReadAll(path) == expected);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace memscope
