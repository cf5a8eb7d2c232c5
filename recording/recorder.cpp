#include "recording/recorder.h"

#include "allocator/fast_clock.h"

namespace memscope {
namespace {

std::int64_t SteadyNs() { return FastNowNs(); }  // the allocator's clock, so marks and events agree

}  // namespace

Recorder::Recorder(EventSink& sink)
    : sink_(sink), writer_(dynamic_cast<TimelineWriter*>(&sink)), start_ns_(SteadyNs()) {}

std::int64_t Recorder::Now() const { return use_trace_time_ ? trace_time_ns_ : SteadyNs() - start_ns_; }

void Recorder::OnEvent(const TraceEvent& e) {
  Event out;
  out.type = static_cast<EventType>(e.action);
  out.set_small_pool(e.small_pool);
  out.time_ns = use_trace_time_ ? trace_time_ns_ : e.time_ns - start_ns_;
  out.addr = e.addr;
  out.size = e.size;
  out.requested_size = e.requested_size;
  out.stream = e.stream;
  if (e.action == TraceAction::kAlloc) {
    out.category = ScopedTag::current_category();
    // Consecutive allocations mostly share an owner: skip the string table.
    const std::string_view owner = ScopedTag::current_owner();
    if (owner != last_owner_) {
      last_owner_.assign(owner.data(), owner.size());
      last_owner_id_ = sink_.Intern(owner);
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
