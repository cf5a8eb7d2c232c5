#include "base/trace_action.h"

namespace memscope {

std::string_view TraceActionName(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc: return "alloc";
    case TraceAction::kFreeRequested: return "free_requested";
    case TraceAction::kFreeCompleted: return "free_completed";
    case TraceAction::kSegmentAlloc: return "segment_alloc";
    case TraceAction::kSegmentFree: return "segment_free";
    case TraceAction::kSegmentMap: return "segment_map";
    case TraceAction::kSegmentUnmap: return "segment_unmap";
    case TraceAction::kOom: return "oom";
    case TraceAction::kEmptyCache: return "empty_cache";
    case TraceAction::kAllocRetry: return "alloc_retry";
    case TraceAction::kSyncAllStreams: return "sync_all_streams";
    case TraceAction::kSnapshot: return "snapshot";
    case TraceAction::kUserDefined: return "user_defined";
    case TraceAction::kAnnotate: return "annotate";
  }
  return "unknown";
}

// By length first, then one telling byte: a snapshot's importer classifies
// every action name it has not seen at that place of the file before.
std::optional<TraceAction> ParseTraceAction(std::string_view a) {
  const auto is = [&](std::string_view name, TraceAction action) -> std::optional<TraceAction> {
    if (a == name) return action;
    return std::nullopt;
  };
  switch (a.size()) {
    case 3: return is("oom", TraceAction::kOom);
    case 5: return is("alloc", TraceAction::kAlloc);
    case 8:
      if (a[0] == 'a') return is("annotate", TraceAction::kAnnotate);
      return is("snapshot", TraceAction::kSnapshot);
    case 11:
      if (a[0] == 'e') return is("empty_cache", TraceAction::kEmptyCache);
      if (a[0] == 'a') return is("alloc_retry", TraceAction::kAllocRetry);
      return is("segment_map", TraceAction::kSegmentMap);
    case 12:
      if (a[8] == 'f') return is("segment_free", TraceAction::kSegmentFree);
      return is("user_defined", TraceAction::kUserDefined);
    case 13:
      if (a[8] == 'u') return is("segment_unmap", TraceAction::kSegmentUnmap);
      return is("segment_alloc", TraceAction::kSegmentAlloc);
    case 14:
      if (a[5] == 'r') return is("free_requested", TraceAction::kFreeRequested);
      return is("free_completed", TraceAction::kFreeCompleted);
    case 16: return is("sync_all_streams", TraceAction::kSyncAllStreams);
    default: return std::nullopt;
  }
}

}  // namespace memscope
