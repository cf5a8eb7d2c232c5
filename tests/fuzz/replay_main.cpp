// A main() for the fuzz targets when they are not built with libFuzzer (g++
// builds, CI): runs LLVMFuzzerTestOneInput once on every regular file of the
// directories (recursively) and files given as arguments, then prints how
// many inputs it ran. A crash or sanitizer report fails the run by itself;
// the exit status is 1 only when an argument cannot be read. Arguments
// starting with '-' (libFuzzer flags) are ignored.
//
//   ./timeline_corpus tests/fuzz/corpus/timeline [more dirs or files...]
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

bool RunFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "cannot read " << path.string() << "\n";
    return false;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Copy into an exactly-sized buffer so reads past the end are caught by ASan.
  std::vector<std::uint8_t> input(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(input.empty() ? nullptr : input.data(), input.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t ran = 0;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;  // libFuzzer-style flags: ignored here
    const std::filesystem::path arg(argv[i]);
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::recursive_directory_iterator(arg, ec)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      if (ec) {
        std::cerr << "cannot list " << arg.string() << ": " << ec.message() << "\n";
        ok = false;
      }
      std::sort(files.begin(), files.end());
      for (const auto& file : files) ran += RunFile(file) ? 1 : 0;
    } else if (std::filesystem::is_regular_file(arg, ec)) {
      ran += RunFile(arg) ? 1 : 0;
    } else {
      std::cerr << "no such file or directory: " << arg.string() << "\n";
      ok = false;
    }
  }
  std::cout << argv[0] << ": ran " << ran << " input(s)\n";
  return ok ? 0 : 1;
}
