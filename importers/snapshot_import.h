// Reading what PyTorch records: torch.cuda.memory._snapshot() pickles and
// RMM's logging_resource_adaptor CSV, as request traces.
//
// A PyTorch trace entry carries the size the program asked for, not the block
// the allocator chose, so memscope does not read blocks off the trace: it
// turns the trace back into requests (alloc / free by address, per stream,
// with record_function annotations as phase marks) and replays them through
// its PyTorch-faithful allocator under the snapshot's own settings. The
// replay's recording is then analysed like any memscope run, and --verify
// compares its segment sizes with the trace's segment_alloc entries.
#ifndef MEMSCOPE_IMPORTERS_SNAPSHOT_IMPORT_H_
#define MEMSCOPE_IMPORTERS_SNAPSHOT_IMPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/snapshot.h"
#include "importers/request_trace.h"
#include "recording/event.h"

namespace memscope {

struct ImportedTrace {
  RequestTrace requests;
  int device = 0;
  std::string alloc_conf;    // the snapshot's allocator settings, as PYTORCH_CUDA_ALLOC_CONF text
  AllocatorConfig settings;  // the same, parsed (once, by the reader)
  // The trace's segment_alloc / segment_free / segment_map / segment_unmap
  // entries, in order (for --verify): type and size.
  struct SegmentAction {
    EventType type;
    std::uint64_t size;
  };
  std::vector<SegmentAction> segment_actions;
  // The device capacity an `oom` entry implies (reserved bytes then +
  // device_free), 0 without one: the replay's device size unless the user
  // gives one.
  std::uint64_t device_capacity = 0;
  // Segment frees right before a new segment (segment_free entries, then a
  // segment_alloc, nothing between): an empty_cache() and then a malloc, or
  // PyTorch's frees inside that malloc (release_available_cached_blocks
  // under max_split_size_mb, or the free-everything-and-retry after a
  // failed cudaMalloc). The reader replays them as the empty-cache request
  // of entry `line`; ResolveMallocFrees decides once the device's capacity
  // is known.
  struct MallocFrees {
    std::uint64_t line;             // the empty-cache request's Request::line
    std::uint64_t reserved_before;  // the trace's reserved bytes before the frees
    std::uint64_t new_segment;      // the size of the segment_alloc after them
  };
  std::vector<MallocFrees> malloc_frees;
  // The file's segments (address order), when the state at the trace's
  // start was rebuilt from them (RequestTrace::start_segments): --verify
  // checks that the replay ends with exactly these.
  std::vector<SegmentInfo> final_segments;
  // Things the user should know: a trace that does not start at the
  // beginning of the program, entries skipped, the legacy format.
  std::vector<std::string> notes;
};

// Reads a PyTorch snapshot pickle (2.x dict or 1.13 list format; the
// fields and actions read are listed in docs/snapshot-format.md). One
// ImportedTrace per device that has trace entries. segment_free and
// segment_unmap entries (empty_cache) become an empty-cache request; an
// `oom` that ended the trace becomes its failing request; unknown actions
// and fields are counted and named in a note. A snapshot without trace
// entries (the 1.13 format, or history not recorded) is FailedPrecondition:
// read its state with ReadPytorchSnapshotState instead.
absl::StatusOr<std::vector<ImportedTrace>> ReadPytorchSnapshot(const std::string& path);

// Decides each of a trace's malloc_frees on a device of `capacity` bytes:
// when the new segment could not have fit beside the segments reserved
// before the frees (reserved_before + new_segment > capacity), cudaMalloc
// failed and the frees were the malloc's own, so the empty-cache request is
// dropped from `requests` and the replay's allocator frees what PyTorch's
// did; otherwise it stays an empty_cache(). `capacity_known` false (no oom
// entry, no --device-memory): every run stays an empty_cache(). Returns the
// one-line note to show ("" when there are no such runs).
std::string ResolveMallocFrees(RequestTrace& requests, const std::vector<ImportedTrace::MallocFrees>& runs,
                               std::uint64_t capacity, bool capacity_known);

// How the pickle reader goes about it (for tests and benchmarks: the result
// is the same either way). records: trace entries of known keys handed
// over as records (PickleReadOptions::on_record), no dict built; fast_dicts:
// the reader's trace-entry fast path (PickleReadOptions::fast_dicts).
struct SnapshotReadOptions {
  bool records = true;
  bool fast_dicts = true;
};
absl::StatusOr<std::vector<ImportedTrace>> ReadPytorchSnapshot(const std::string& path, const SnapshotReadOptions& how);

// The state of a snapshot's segments and blocks (exact block sizes, no
// history), one Timeline per device: segment_alloc (or segment_map for
// expandable segments) and alloc events in address order. Accepts the 2.x and
// 1.13 formats (1.13 blocks have no address: they follow each other from the
// segment's start, and the request size comes from their history).
absl::StatusOr<std::vector<Timeline>> ReadPytorchSnapshotState(const std::string& path);

// Reads RMM's logging_resource_adaptor CSV (Thread,Time,Action,Pointer,Size,Stream).
absl::StatusOr<RequestTrace> ReadRmmCsv(std::istream& in, const std::string& source);

}  // namespace memscope

#endif  // MEMSCOPE_IMPORTERS_SNAPSHOT_IMPORT_H_
