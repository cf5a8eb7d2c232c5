// libFuzzer target for the pickle reader (importers/pickle_reader.h), which
// reads PyTorch memory snapshots (torch.cuda.memory._snapshot() pickles).
//
// Reads the input as a pickle with the default options. Errors are expected
// and ignored; only crashes, sanitizer reports and hangs are findings.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "importers/pickle_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  (void)memscope::ReadPickle(in, "fuzz.pickle");
  return 0;
}
