// Files a Python generator script writes (the importers' tests write their
// pickles with Python's own pickle module), made once per generator text and
// shared by every test process: ctest runs each test case in a process of
// its own, and generating took about 3 s a case. The directory is named by
// the generator's name and a hash of its text (/tmp/PREFIX-HASH), so a
// changed generator gets a new one; it is made under a temporary name and
// renamed into place, so a parallel process never sees it half written.
#ifndef MEMSCOPE_TESTS_IMPORTERS_PYTHON_GENERATED_H_
#define MEMSCOPE_TESTS_IMPORTERS_PYTHON_GENERATED_H_

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <system_error>

#include <stdlib.h>

namespace memscope::testing {

struct PythonGenerated {
  std::filesystem::path dir;
  // The files of `generator` (Python source, run as `python3 gen.py DIR`),
  // generated now unless an earlier process already did.
  PythonGenerated(const std::string& prefix, const char* generator) {
    const std::string text(generator);
    dir = "/tmp/" + prefix + "-" + std::to_string(std::hash<std::string>{}(text));
    std::error_code ec;
    if (std::filesystem::is_regular_file(dir / "gen.py", ec)) return;  // complete: renamed into place
    std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
    char* d = mkdtemp(tmpl.data());
    REQUIRE(d != nullptr);
    const std::filesystem::path fresh = d;
    {
      std::ofstream(fresh / "gen.tmp") << text;
      const std::string run = "python3 '" + (fresh / "gen.tmp").string() + "' '" + fresh.string() + "'";
      REQUIRE(std::system(run.c_str()) == 0);
    }
    std::filesystem::rename(fresh / "gen.tmp", fresh / "gen.py", ec);
    REQUIRE(!ec);
    std::filesystem::rename(fresh, dir, ec);
    if (ec) std::filesystem::remove_all(fresh, ec);  // another process was first: use its files
    REQUIRE(std::filesystem::is_regular_file(dir / "gen.py", ec));
  }
  PythonGenerated(const PythonGenerated&) = delete;
  PythonGenerated& operator=(const PythonGenerated&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return dir / name; }
};

}  // namespace memscope::testing

#endif  // MEMSCOPE_TESTS_IMPORTERS_PYTHON_GENERATED_H_
