// What the allocator reports as it works: the profiler plugs in here.
//
// Every action of PyTorch's memory trace (alloc, free_requested,
// free_completed, segment_alloc, segment_free, segment_map, segment_unmap,
// oom), plus empty_cache, alloc_retry and sync_all_streams, is passed to an attached AllocatorObserver while the
// allocator lock is held, in the order the allocator does them. With no
// observer attached the cost is one pointer test per action.
#ifndef MEMSCOPE_ALLOCATOR_OBSERVER_H_
#define MEMSCOPE_ALLOCATOR_OBSERVER_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "allocator/device.h"
#include "base/trace_action.h"

namespace memscope {

struct RecordSink;  // allocator/record_sink.h

// One action (base/trace_action.h: TraceAction, up to kSyncAllStreams; the
// allocator never reports kSnapshot or kUserDefined).
struct TraceEvent {
  TraceAction action;
  bool small_pool = false;  // the block's or segment's pool
  DevicePtr addr = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;  // alloc / free: the size the caller asked for
  StreamId stream = 0;
  std::int64_t time_ns = 0;  // steady clock (FastNowNs); 0 when the observer declines time
  // free_requested: the record id of the block's alloc in the observer's
  // RecordSink (record_sink()), 0 when it has none.
  std::uint64_t record_id = 0;
  // The block's or segment's pool: 0 for the default pool, else the
  // allocator's index of a private pool (CachingAllocator::PoolIndex).
  std::uint16_t pool = 0;
};

class AllocatorObserver {
 public:
  virtual ~AllocatorObserver() = default;
  // Called with the allocator lock held: must not call back into the allocator.
  virtual void OnEvent(const TraceEvent& event) = 0;
  // A free that completes at once (no other stream to wait for): its
  // free_requested (`requested`) and its free_completed, with the same
  // fields, in one call. By default, the two OnEvent calls.
  virtual void OnFreeAtOnce(const TraceEvent& requested) {
    OnEvent(requested);
    TraceEvent completed = requested;
    completed.action = TraceAction::kFreeCompleted;
    OnEvent(completed);
  }
  // Whether events need TraceEvent::time_ns. Read once, when the observer is
  // attached: an observer that keeps its own clock (a Recorder's sampled
  // clock, recording/recorder.h) saves the allocator a clock read per call.
  virtual bool wants_time() const { return true; }
  // A recording the allocator may write its hot events into itself (an
  // alloc, a free that completes at once), skipping OnEvent and
  // OnFreeAtOnce for those it can write (allocator/record_sink.h); null
  // (the default) for none. Read once, when the observer is attached.
  virtual RecordSink* record_sink() { return nullptr; }
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_OBSERVER_H_
