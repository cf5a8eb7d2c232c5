// The actions of PyTorch's memory trace (torch.cuda.memory._snapshot()'s
// "device_traces" entries), under PyTorch's names, plus the three allocator
// counters memscope records beside them: one enum for the allocator that does
// them (allocator/observer.h), the recording that stores them
// (recording/event.h: EventType's allocator values are these) and the
// importer that reads them back from a snapshot (importers/snapshot_import.cpp).
//
//   TraceActionName(TraceAction::kSegmentMap);       // "segment_map"
//   ParseTraceAction("free_completed");              // TraceAction::kFreeCompleted
//   ParseTraceAction("cudaMalloc");                  // std::nullopt
#ifndef MEMSCOPE_BASE_TRACE_ACTION_H_
#define MEMSCOPE_BASE_TRACE_ACTION_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace memscope {

// The values up to kSyncAllStreams are stored in timeline files (as
// EventType): never renumber them.
enum class TraceAction : std::uint8_t {
  kAlloc,           // a block handed out: addr, size = block size, requested_size
  kFreeRequested,   // the caller freed it (may still wait on stream events)
  kFreeCompleted,   // the block is back in the cache
  kSegmentAlloc,    // cudaMalloc: addr, size = segment size
  kSegmentFree,     // cudaFree
  kSegmentMap,      // expandable segment pages mapped: addr, size
  kSegmentUnmap,    // expandable segment pages unmapped
  kOom,             // out of memory: addr = device free bytes, size = rounded request
  kEmptyCache,      // empty_cache() called (before the segments it frees)
  kAllocRetry,      // device allocation retried after freeing the whole cache (num_alloc_retries)
  kSyncAllStreams,  // all pending stream events waited for (num_sync_all_streams)
  // Entries of PyTorch's trace that are no allocator action: the allocator
  // never reports them and the recording never stores them.
  kSnapshot,     // a snapshot was taken here
  kUserDefined,  // PyTorch 2.1-2.3: a record_function annotation (name, stage)
  kAnnotate,     // PyTorch 2.11+: _annotate_memory's point annotation (user_metadata)
};

// The name in PyTorch's trace ("alloc", "segment_map", "oom", "snapshot",
// "user_defined", "annotate"; memscope's own "empty_cache", "alloc_retry",
// "sync_all_streams"); "unknown" for a value outside the enum.
std::string_view TraceActionName(TraceAction action);

// The action named `name` (TraceActionName's inverse), or nullopt for a name
// that is none of them.
std::optional<TraceAction> ParseTraceAction(std::string_view name);

}  // namespace memscope

#endif  // MEMSCOPE_BASE_TRACE_ACTION_H_
