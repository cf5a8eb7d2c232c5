// One pass over a rank's events: a TimelineWalk owns the one TraceModel that
// rebuilds the allocator state, the stack of open phases (with each phase's
// running peak of allocated bytes) and the error context, and calls its
// listeners after each event with the state that event left. The analyses
// (analysis.h) and the exports (the Chrome trace, the viewer's samples and
// segment maps, the snapshot at a moment) are listeners, so a run's outputs
// cost two walks per rank: one that finds the moments (peaks, OOM, phase
// ends), one that writes everything and captures the state at those moments.
//
//   class CountAllocs : public WalkListener {
//    public:
//     void OnEvent(const TimelineWalk& walk, const Event& e) override {
//       if (e.type == EventType::kAlloc) ++allocs;
//       peak = std::max(peak, walk.model().allocated());
//     }
//     int allocs = 0;
//     std::uint64_t peak = 0;
//   };
//   TimelineWalk walk(timeline);
//   CountAllocs counter;
//   absl::Status s = walk.Run({&counter});  // "rank 0: event 7: free of ..." on a bad event
//
// The phase stack: a phase begin pushes; a phase end closes the innermost open
// phase with the same phase, step and label, and with it any phase still open
// inside it (PhaseEnd::cut); an end with no such begin closes nothing.
#ifndef MEMSCOPE_ANALYSIS_TIMELINE_WALK_H_
#define MEMSCOPE_ANALYSIS_TIMELINE_WALK_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "allocator/config.h"
#include "analysis/trace_model.h"
#include "recording/event.h"

namespace memscope {

// A phase the walk has seen begin and not yet end.
struct OpenPhase {
  Phase phase = Phase::kUser;
  std::int64_t step = kNoStep;
  std::uint32_t label = 0;  // string id of a user phase's label
  std::int64_t begin_ns = 0;
  std::size_t begin_event = 0;       // index of its begin event
  std::uint64_t peak_allocated = 0;  // running max of allocated since it began
  std::int64_t micro_batch = kNoMicroBatch;  // --grad-accum's micro-batch, when labelled

  // Whether the phase_end `end` closes this phase (ClosesPhase,
  // recording/event.h: phase, step, label and micro-batch all equal).
  bool ClosedBy(const Event& end) const { return ClosesPhase(end, phase, step, label, micro_batch); }
};

// What the phase end the walk just applied closed.
struct PhaseEnd {
  bool matched = false;        // false: no open phase matched; nothing closed
  std::size_t depth = 0;       // the closed phase's index in the stack (stack size when unmatched)
  OpenPhase phase;             // the closed phase, when matched
  std::vector<OpenPhase> cut;  // phases open inside it, closed with it, outermost first
};

class TimelineWalk;

// Receives a walk's events. Listeners are called in the order given to Run.
class WalkListener {
 public:
  virtual ~WalkListener() = default;
  // Before the first event, with the model empty (only when a Run starts at
  // event 0).
  virtual void OnStart(const TimelineWalk& /*walk*/) {}
  // After the walk applied `event` (walk.applied() - 1 is its index).
  virtual void OnEvent(const TimelineWalk& walk, const Event& event) = 0;
  // After the last event of the timeline (only when a Run reaches it).
  virtual void OnFinish(const TimelineWalk& /*walk*/) {}
};

class TimelineWalk {
 public:
  static constexpr std::size_t kToEnd = std::numeric_limits<std::size_t>::max();

  // A walk at event 0 with an empty model, set up with the timeline's
  // allocator settings (Timeline::settings). `timeline` must outlive the walk.
  explicit TimelineWalk(const Timeline& timeline);

  // Applies the events from applied() up to (not including) `end` (clamped to
  // the number of events), calling every listener after each. Errors: an
  // event the model rejects, as "rank R: event N: <the model's message>" with
  // the model's status code; the walk stops before that event.
  absl::Status Run(const std::vector<WalkListener*>& listeners, std::size_t end = kToEnd);

  const Timeline& timeline() const { return timeline_; }
  const TraceModel& model() const { return model_; }
  // The model, leaving the walk unusable (for "the state at a moment").
  TraceModel TakeModel() && { return std::move(model_); }
  // Events applied so far.
  std::size_t applied() const { return applied_; }

  // Open phases, outermost first.
  const std::vector<OpenPhase>& open_phases() const { return open_; }
  // "backward:1" for the innermost open phase, "" when none is open.
  std::string InnermostPhaseName() const;
  // What the event just applied closed; meaningful only in OnEvent of a
  // phase end.
  const PhaseEnd& phase_end() const { return phase_end_; }
  // The name of an open phase ("forward:0", "model", a user label).
  std::string PhaseName(const OpenPhase& p) const;

  // The earliest and latest event times so far (the first event's time
  // before any is applied; 0 for an empty timeline).
  std::int64_t first_ns() const { return first_ns_; }
  std::int64_t last_ns() const { return last_ns_; }

 private:
  void ApplyPhases(const Event& e);

  const Timeline& timeline_;
  TraceModel model_;
  std::size_t applied_ = 0;
  std::vector<OpenPhase> open_;
  PhaseEnd phase_end_;
  std::int64_t first_ns_ = 0;
  std::int64_t last_ns_ = 0;
};

}  // namespace memscope

#endif  // MEMSCOPE_ANALYSIS_TIMELINE_WALK_H_
