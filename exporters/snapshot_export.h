// Exports a recording as a PyTorch memory snapshot: the structure
// torch.cuda.memory._snapshot() returns, so PyTorch's own tools read it
// (pickle.load, torch.cuda._memory_viz, the browser viewer at
// pytorch.org/memory_viz).
//
//   TraceModel model(config);
//   for (std::size_t i = 0; i < n; ++i) model.Apply(timeline.events[i]);
//   std::ofstream out(path, std::ios::binary);
//   absl::Status s = WriteSnapshot(timeline, model, n, SnapshotFormat::kPickle, out);
//
// The snapshot holds:
// - "segments": the model's segments and blocks (address order) and
//   segment_pool_id (0, 0). memscope records no stacks: an allocated block,
//   and each alloc / free_requested / free_completed entry, carries one
//   synthesised frame {filename: its owner ("??" for none), line: 0, name:
//   "memscope CATEGORY"}, so PyTorch's viewers show who allocated and
//   memscope reads the tags back; segments and segment actions have empty
//   "frames".
// - "device_traces": one list per device index 0..timeline.device_index
//   (only the recording's own device has entries), one entry per allocator
//   action in PyTorch's vocabulary (alloc, free_requested, free_completed,
//   segment_alloc, segment_free, segment_map, segment_unmap, oom). memscope's
//   own actions (empty_cache, alloc_retry, sync_all_streams) and the phase
//   and mark events have no PyTorch equivalent and are left out. As in
//   PyTorch, alloc and free entries carry the requested size, segment
//   entries the segment size, and oom entries "device_free" instead of
//   "addr".
// - "allocator_settings": the recording's PYTORCH_CUDA_ALLOC_CONF and the
//   values it sets, as PyTorch reports them.
// - "external_annotations": the phases of training, as record_function
//   scopes would appear: a START and an END entry per phase named
//   "forward:3" ("<phase>:<step>"), or "model" before the first step; a user
//   phase is named by its label. A mark ("checkpoint saved") becomes a single
//   START entry named by its text, with no END: PyTorch's record_function
//   scopes have no points, and a viewer that pairs START with END ignores
//   it. A mark read from a snapshot's `annotate` trace entry (PyTorch
//   2.11+'s point annotation, kEventTraceAnnotation) goes back into the
//   trace as that entry instead.
// - "host_segments" and "host_traces": a replayed snapshot's pinned host
//   memory (Timeline::host) as it was read, when it had any.
// A stack's frames carry their fx_ fields (torch.compile) when they had them.
//
// Both formats stream: memory does not grow with the length of the trace.
#ifndef MEMSCOPE_EXPORTERS_SNAPSHOT_EXPORT_H_
#define MEMSCOPE_EXPORTERS_SNAPSHOT_EXPORT_H_

#include <cstddef>
#include <ostream>

#include "absl/status/status.h"
#include "analysis/timeline_walk.h"
#include "analysis/trace_model.h"
#include "recording/event.h"

namespace memscope {

enum class SnapshotFormat {
  // pickle protocol 4, only the opcodes MemoryViz.js reads (pickle_writer.h).
  kPickle,
  // The same structure as JSON (tuples as arrays, indent 1), for jq and
  // scripts.
  kJson,
};

// Writes the snapshot of `timeline` after its first `events_until` events to
// `out`. `model` must hold the state after applying exactly
// timeline.events[0, events_until): its segments are the snapshot's, while
// the trace and the annotations are taken from the same events. Times are
// Unix microseconds (timeline.wall_start_us + time_ns / 1000).
//
// `max_entries` (0: all) keeps only the last that many trace entries, like
// PyTorch's ring buffer (_record_memory_history(max_entries=N)).
//
// Returns InvalidArgument if events_until exceeds the number of events or the
// device index is negative, DataLoss if the stream fails. Settings text that
// AllocatorConfig::Parse rejects is not an error: the text is kept and the
// values reported are the defaults.
absl::Status WriteSnapshot(const Timeline& timeline, const TraceModel& model, std::size_t events_until,
                           SnapshotFormat format, std::ostream& out, std::size_t max_entries = 0);

// WriteSnapshot as a walk listener: writes the snapshot when the walk has
// applied `events_until` events (at OnStart for 0), so a walk that writes
// other outputs takes the snapshot at a moment on its way (run/ writes the
// one at the peak so). The walk must start at event 0 and pass the moment.
//
//   SnapshotAt snapshot(report.peak_allocated.event_index + 1, SnapshotFormat::kPickle, out);
//   walk.Run({&snapshot, ...});
//   if (!snapshot.status().ok()) ...
// WriteSnapshot's pickle written by PickleWriter's ordinary calls only,
// without the raw bytes of its fast path: for tests, which check that both
// give the same bytes.
absl::Status WritePickleSnapshotWithoutRawValues(const Timeline& timeline, const TraceModel& model,
                                                 std::size_t events_until, std::ostream& out,
                                                 std::size_t max_entries = 0);

class SnapshotAt final : public WalkListener {
 public:
  SnapshotAt(std::size_t events_until, SnapshotFormat format, std::ostream& out)
      : events_until_(events_until), format_(format), out_(out) {}

  void OnStart(const TimelineWalk& walk) override;
  void OnEvent(const TimelineWalk& walk, const Event& event) override;
  void OnFinish(const TimelineWalk& walk) override;

  // WriteSnapshot's result; Internal "not written" until the walk passed the
  // moment (InvalidArgument when it is past the timeline's end).
  const absl::Status& status() const { return status_; }

 private:
  void Write(const TimelineWalk& walk);

  std::size_t events_until_;
  SnapshotFormat format_;
  std::ostream& out_;
  bool written_ = false;
  absl::Status status_ = absl::InternalError("the snapshot was not written: the walk did not reach its moment");
};

}  // namespace memscope

#endif  // MEMSCOPE_EXPORTERS_SNAPSHOT_EXPORT_H_
