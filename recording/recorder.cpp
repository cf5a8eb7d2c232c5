#include "recording/recorder.h"

#include "allocator/fast_clock.h"

namespace memscope {
namespace {

std::int64_t SteadyNs() { return FastNowNs(); }  // the allocator's clock, so marks and events agree

}  // namespace

Recorder::Recorder(EventSink& sink, RecordClock clock)
    : sink_(sink), writer_(dynamic_cast<TimelineWriter*>(&sink)), start_ns_(SteadyNs()), clock_(clock) {}

std::int64_t Recorder::Now() {
  if (use_trace_time_) return trace_time_ns_;
  // A mark reads the clock; the sampled clock restarts from it, so that the
  // events after the mark are never earlier than it.
  sampled_ns_ = SteadyNs() - start_ns_;
  countdown_ = kClockSampleEvents;
  return sampled_ns_;
}

void Recorder::OnEvent(const TraceEvent& e) {
  Event out;
  out.type = static_cast<EventType>(e.action);
  out.set_small_pool(e.small_pool);
  if (use_trace_time_) {
    out.time_ns = trace_time_ns_;
  } else if (clock_ == RecordClock::kWall) {
    out.time_ns = e.time_ns - start_ns_;
  } else {
    if (--countdown_ == 0) {
      countdown_ = kClockSampleEvents;
      sampled_ns_ = SteadyNs() - start_ns_;
    }
    out.time_ns = sampled_ns_;
  }
  out.addr = e.addr;
  out.size = e.size;
  out.requested_size = e.requested_size;
  out.stream = e.stream;
  if (e.action == TraceAction::kAlloc) {
    const AllocTag& tag = ScopedTag::current();
    out.category = tag.category;
    // Consecutive allocations mostly share an owner: skip the string table,
    // and the string compare when the tag is of the same generation (no tag
    // began or ended since: the same owner).
    if (tag.generation != last_generation_) {
      last_generation_ = tag.generation;
      if (tag.owner != last_owner_) {
        last_owner_.assign(tag.owner.data(), tag.owner.size());
        last_owner_id_ = sink_.Intern(tag.owner);
      }
    }
    out.name = last_owner_id_;
  }
  // A timeline file's writer is called directly (it is final: the call is
  // not virtual and its encoder is inlined here).
  if (writer_ != nullptr) {
    writer_->Append(out);
  } else {
    sink_.Append(out);
  }
}

void Recorder::AppendMark(EventType type, Phase phase, std::int64_t step, std::string_view label,
                          std::int64_t micro_batch) {
  Event e;
  e.type = type;
  e.phase = phase;
  e.set_step(step);
  e.set_micro_batch(micro_batch);
  e.name = sink_.Intern(label);
  e.time_ns = Now();
  sink_.Append(e);
}

void Recorder::PhaseBegin(Phase phase, std::int64_t step, std::string_view label, std::int64_t micro_batch) {
  AppendMark(EventType::kPhaseBegin, phase, step, label, micro_batch);
}

void Recorder::PhaseEnd(Phase phase, std::int64_t step, std::string_view label, std::int64_t micro_batch) {
  AppendMark(EventType::kPhaseEnd, phase, step, label, micro_batch);
  (void)sink_.Flush();
}

void Recorder::AppendCollective(EventType type, std::string_view kind, std::uint64_t bytes) {
  Event e;
  e.type = type;
  e.name = sink_.Intern(kind);
  e.size = bytes;
  e.time_ns = Now();
  sink_.Append(e);
}

void Recorder::CollectiveBegin(std::string_view kind, std::uint64_t bytes) {
  AppendCollective(EventType::kCollectiveBegin, kind, bytes);
}

void Recorder::CollectiveEnd(std::string_view kind, std::uint64_t bytes) {
  AppendCollective(EventType::kCollectiveEnd, kind, bytes);
}

void Recorder::Mark(std::string_view text) { AppendMark(EventType::kMark, Phase::kUser, kNoStep, text); }

}  // namespace memscope
