// libFuzzer target for the JSON-lines request-trace reader
// (importers/request_trace.h).
//
// Parses the input as a request trace; on success replays it through a
// default-configured CachingAllocator on a small simulated device. Inputs
// with more than kMaxRequests requests or an allocation above kMaxAllocSize
// are only parsed, to keep every run fast. Errors are expected and ignored;
// only crashes, sanitizer reports and hangs are findings.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "importers/replayer.h"
#include "importers/request_trace.h"

namespace {

constexpr std::size_t kMaxRequests = 2000;
constexpr std::size_t kMaxAllocSize = std::size_t{1} << 30;   // 1 GiB
constexpr std::size_t kDeviceMemory = std::size_t{64} << 20;  // 64 MiB

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  absl::StatusOr<memscope::RequestTrace> trace = memscope::ReadJsonlTrace(in, "fuzz.jsonl");
  if (!trace.ok()) return 0;

  if (trace->requests.size() > kMaxRequests) return 0;
  for (const memscope::Request& r : trace->requests) {
    if (r.op == memscope::RequestOp::kAlloc && r.size > kMaxAllocSize) return 0;
  }
  (void)memscope::Replay(*trace, memscope::AllocatorConfig{}, kDeviceMemory);
  return 0;
}
