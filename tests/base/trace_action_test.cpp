// The one trace-action enum: PyTorch's names, each read back as its action.
#include "base/trace_action.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using namespace memscope;

TEST_CASE("trace actions carry PyTorch's names and every name reads back as its action") {
  const std::vector<std::pair<TraceAction, std::string>> names = {
      {TraceAction::kAlloc, "alloc"},
      {TraceAction::kFreeRequested, "free_requested"},
      {TraceAction::kFreeCompleted, "free_completed"},
      {TraceAction::kSegmentAlloc, "segment_alloc"},
      {TraceAction::kSegmentFree, "segment_free"},
      {TraceAction::kSegmentMap, "segment_map"},
      {TraceAction::kSegmentUnmap, "segment_unmap"},
      {TraceAction::kOom, "oom"},
      {TraceAction::kEmptyCache, "empty_cache"},
      {TraceAction::kAllocRetry, "alloc_retry"},
      {TraceAction::kSyncAllStreams, "sync_all_streams"},
      {TraceAction::kSnapshot, "snapshot"},
      {TraceAction::kUserDefined, "user_defined"},
      {TraceAction::kAnnotate, "annotate"},
  };
  for (const auto& [action, name] : names) {
    INFO(name);
    CHECK(TraceActionName(action) == name);
    REQUIRE(ParseTraceAction(name).has_value());
    CHECK(*ParseTraceAction(name) == action);
  }
}

TEST_CASE("a name that is no trace action reads as none") {
  for (const char* name : {"", "allocs", "free", "segment_mop", "user_defines", "snapshots", "OOM", "free_completes",
                           "sync_all_stream_", "empty_cachE", "alloc_retrx"}) {
    INFO(name);
    CHECK_FALSE(ParseTraceAction(name).has_value());
  }
}
