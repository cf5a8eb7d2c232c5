// Files a Python generator script writes, made once in a fresh temporary
// directory and removed at exit (the importers' tests write their pickles
// with Python's own pickle module).
#ifndef MEMSCOPE_TESTS_IMPORTERS_PYTHON_GENERATED_H_
#define MEMSCOPE_TESTS_IMPORTERS_PYTHON_GENERATED_H_

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <stdlib.h>

namespace memscope::testing {

struct PythonGenerated {
  std::filesystem::path dir;
  // Runs `generator` (Python source) as `python3 gen.py DIR` in a new
  // directory /tmp/PREFIX.XXXXXX.
  PythonGenerated(const std::string& prefix, const char* generator) {
    std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
    char* d = mkdtemp(tmpl.data());
    REQUIRE(d != nullptr);
    dir = d;
    std::ofstream(dir / "gen.py") << generator;
    const std::string cmd = "python3 '" + (dir / "gen.py").string() + "' '" + dir.string() + "'";
    REQUIRE(std::system(cmd.c_str()) == 0);
  }
  PythonGenerated(const PythonGenerated&) = delete;
  PythonGenerated& operator=(const PythonGenerated&) = delete;
  ~PythonGenerated() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return dir / name; }
};

}  // namespace memscope::testing

#endif  // MEMSCOPE_TESTS_IMPORTERS_PYTHON_GENERATED_H_
