// libFuzzer target for the timeline reader (recording/timeline.h).
//
// Parses the input as a timeline file; on success feeds every event to a
// TraceModel (configured from the file's allocator settings when they parse)
// and runs AnalyzeRank. Errors are expected and ignored; only crashes,
// sanitizer reports and hangs are findings.
//
// Built as <timeline_fuzzer> with clang -fsanitize=fuzzer (scripts/fuzz), or
// as <timeline_corpus> with replay_main.cpp to replay tests/fuzz/corpus/timeline.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "analysis/analysis.h"
#include "analysis/trace_model.h"
#include "recording/timeline.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<memscope::Timeline> timeline = memscope::ParseTimeline(bytes, "fuzz.timeline");
  if (!timeline.ok()) return 0;

  absl::StatusOr<memscope::AllocatorConfig> config = memscope::AllocatorConfig::Parse(timeline->alloc_conf);
  memscope::TraceModel model(config.ok() ? *config : memscope::AllocatorConfig{});
  for (const memscope::Event& event : timeline->events) {
    (void)model.Apply(event);  // inconsistent events are errors, not crashes
  }
  (void)model.stats();
  (void)model.Fragmentation();

  (void)memscope::AnalyzeRank(*timeline);
  return 0;
}
