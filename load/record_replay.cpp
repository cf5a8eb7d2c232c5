#include "load/record_replay.h"

#include <utility>

#include "load/recording_session.h"

namespace memscope {
namespace {

// RecordReplay's body: `movable` (the trace itself, when the caller gives
// up its stacks) gets its stacks moved into the timeline.
absl::StatusOr<Timeline> RecordReplayImpl(const RequestTrace& trace, RequestTrace* movable,
                                          const AllocatorConfig& config, std::uint64_t device_memory, int rank,
                                          ReplayResult* result) {
  // In memory, on GPU 0 whatever device the trace came from (the timeline keeps `rank`).
  RecordingSessionOptions options;
  options.rank = rank;
  options.device_index = 0;
  options.device_memory = device_memory;
  options.config = config;
  options.clock = RecordClock::kTrace;  // the trace's own times, or 1 us a request (ReplayOn)
  RecordingSession session(options);
  if (absl::Status s = session.Start(); !s.ok()) return s;
  // Room for the events (an alloc, a free's two, segments): reserved address
  // space costs no memory until used, and millions of events grown by
  // doubling are copied (and faulted in) again at every step.
  session.timeline().events.reserve(session.timeline().events.size() + 2 * trace.requests.size() + 64);
  // (The recorder records into session.timeline(): the replay takes each
  // alloc's stack as its event is recorded.)
  absl::StatusOr<ReplayResult> r =
      ReplayOn(trace, session.allocator(), session.device(), &session.recorder(), &session.timeline().events);
  if (!r.ok()) return r.status();
  if (absl::Status s = session.Finish(); !s.ok()) return s;
  Timeline timeline = std::move(session.timeline());
  timeline.pools = r->pools;
  if (movable != nullptr) {
    AttachStacksMoving(*movable, *r, timeline);
  } else {
    AttachStacks(trace, *r, timeline);
  }
  r->alloc_stacks.clear();
  r->alloc_event_stacks.clear();
  if (result != nullptr) *result = std::move(*r);
  return timeline;
}

}  // namespace

absl::StatusOr<Timeline> RecordReplay(const RequestTrace& trace, const AllocatorConfig& config,
                                      std::uint64_t device_memory, int rank, ReplayResult* result) {
  return RecordReplayImpl(trace, nullptr, config, device_memory, rank, result);
}

absl::StatusOr<Timeline> RecordReplayTakingStacks(RequestTrace& trace, const AllocatorConfig& config,
                                                  std::uint64_t device_memory, int rank, ReplayResult* result) {
  return RecordReplayImpl(trace, &trace, config, device_memory, rank, result);
}

}  // namespace memscope
