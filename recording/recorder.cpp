#include "recording/recorder.h"

#include <algorithm>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "base/clock.h"

namespace memscope {
namespace {

// Below this much steady_clock time since its first reading, a sampled
// clock does not trust a TSC rate (20 ms: a read's jitter of about 50 ns is
// 2.5 ppm of it).
constexpr std::int64_t kTscCalibrationNs = 20'000'000;

}  // namespace

std::int64_t Recorder::ClockNs() {
  // kWall: the allocator's clock (FastNowNs), so that marks and the
  // allocator's event times agree.
  if (clock_ == RecordClock::kWall) return FastNowNs();
  // kTrace: no clock at all (the times are the trace's).
  if (clock_ == RecordClock::kTrace) return 0;
  // kSampled: the allocator reads no clock; the recorder reads its own.
  // FastNowNs's first call spins 5 ms calibrating the TSC, which a short
  // simulated run would pay for nothing; this reads steady_clock (a vDSO
  // call, 40-50 ns here under load) and calibrates the TSC on the side from
  // its own readings, then reads the TSC (15-25 ns here), starting from the
  // last steady reading: times stay monotonic.
#if defined(__x86_64__)
  if (tsc_ns_per_tick_ > 0.0) {
    const auto ticks = static_cast<std::int64_t>(__rdtsc() - tsc_base_);
    return tsc_base_ns_ + static_cast<std::int64_t>(static_cast<double>(ticks) * tsc_ns_per_tick_);
  }
  const std::int64_t ns = SteadyNs();
  const std::uint64_t tsc = __rdtsc();
  if (tsc_base_ == 0) {
    tsc_base_ = tsc;
    tsc_base_ns_ = ns;
  } else if (ns - tsc_base_ns_ >= kTscCalibrationNs && tsc > tsc_base_) {
    tsc_ns_per_tick_ = static_cast<double>(ns - tsc_base_ns_) / static_cast<double>(tsc - tsc_base_);
    tsc_base_ = tsc;
    tsc_base_ns_ = ns;
  }
  return ns;
#else
  return SteadyNs();
#endif
}

Recorder::Recorder(EventSink& sink, RecordClock clock)
    : sink_(sink),
      writer_(dynamic_cast<TimelineWriter*>(&sink)),
      memory_(dynamic_cast<MemorySink*>(&sink)),
      start_ns_(0),
      clock_(clock) {
  start_ns_ = ClockNs();
  if (writer_ != nullptr && clock_ == RecordClock::kSampled) {
    fast_ = &writer_->record_sink();
    fast_->refill = &Recorder::Refill;
    fast_->owner = this;
  }
}

Recorder::~Recorder() {
  if (fast_ != nullptr && fast_->owner == this) {
    fast_->budget = 0;
    fast_->refill = nullptr;
    fast_->owner = nullptr;
  }
}

bool Recorder::Refill(RecordSink& sink) {
  // An allocator event that could be a fast record, with the budget spent:
  // what OnEvent would do about its time, then a new budget.
  auto& r = *static_cast<Recorder*>(sink.owner);
  r.TakeFastRecords();
  if (r.use_trace_time_) return false;
  if (r.countdown_ == 1) {
    // The countdown's last event: it reads the clock (as EventTime), and
    // takes one unit of the new budget without counting down.
    r.sampled_ns_ = r.ClockNs() - r.start_ns_;
    r.countdown_ = kClockSampleEvents + 1;
    const auto t = static_cast<std::uint64_t>(r.sampled_ns_);
    if (t != sink.prev_time) r.writer_->AppendTime(t);
  }
  r.GrantFastRecords();
  return sink.budget > 0;
}

void Recorder::TakeFastRecords() {
  // Each fast record was an allocator event that did not read the clock.
  const long written = granted_ - fast_->budget - writer_->TakeRevoked();
  countdown_ = static_cast<int>(std::max(1L, countdown_ - written));
  fast_->budget = 0;
  granted_ = 0;
}

void Recorder::GrantFastRecords() {
  // A fast record carries the previous event's time: grant none unless that
  // is the sampled clock's, and none past the next clock read (the
  // countdown's last event reads it, through OnEvent).
  if (use_trace_time_ || fast_->prev_time != static_cast<std::uint64_t>(sampled_ns_)) return;
  granted_ = std::min<long>(countdown_ - 1, writer_->fast_room());
  if (granted_ <= 0) {
    granted_ = 0;
    return;
  }
  fast_->budget = granted_;
  // Compact allocs need the last alloc's owner: the tag generation known to have it.
  fast_->fast_generation = last_owner_id_ == fast_->last_alloc_name ? last_generation_ : RecordSink::kNoGeneration;
}

std::int64_t Recorder::Now() {
  if (use_trace_time_) return trace_time_ns_;
  // A mark reads the clock; the sampled clock restarts from it, so that the
  // events after the mark are never earlier than it.
  sampled_ns_ = ClockNs() - start_ns_;
  countdown_ = kClockSampleEvents;
  return sampled_ns_;
}

std::uint32_t Recorder::OwnerId(const AllocTag& tag) {
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
  return last_owner_id_;
}

inline std::int64_t Recorder::EventTime(const TraceEvent& e) {
  if (clock_ == RecordClock::kSampled && !use_trace_time_) {
    if (--countdown_ == 0) {
      countdown_ = kClockSampleEvents;
      sampled_ns_ = ClockNs() - start_ns_;
    }
    return sampled_ns_;
  }
  return use_trace_time_ ? trace_time_ns_ : e.time_ns - start_ns_;
}

void Recorder::OnFreeAtOnce(const TraceEvent& e) {
  Sync sync(*this);
  if (memory_ != nullptr) {
    // What the two OnEvent calls of AllocatorObserver::OnFreeAtOnce append
    // (each reads its time), straight into the timeline.
    Event out;
    out.type = EventType::kFreeRequested;
    out.set_small_pool(e.small_pool);
    out.set_pool(e.pool);
    out.addr = e.addr;
    out.size = e.size;
    out.requested_size = e.requested_size;
    out.stream = e.stream;
    std::vector<Event>& events = memory_->events();
    out.time_ns = EventTime(e);
    events.push_back(out);
    out.type = EventType::kFreeCompleted;
    out.time_ns = EventTime(e);
    events.push_back(out);
    return;
  }
  if (writer_ == nullptr) {
    AllocatorObserver::OnFreeAtOnce(e);
    return;
  }
  // The free_requested, then its free_completed folded into it.
  const auto t = static_cast<std::uint64_t>(EventTime(e));
  writer_->AppendAction(EventType::kFreeRequested, e.small_pool ? 1u : 0u, t, e.addr, e.size, e.requested_size,
                        e.stream, Category::kOther, 0, e.record_id);
  writer_->FoldCompleted();
}

void Recorder::OnEvent(const TraceEvent& e) {
  Sync sync(*this);
  const std::int64_t time = EventTime(e);
  const unsigned small = e.small_pool ? 1u : 0u;
  const auto t = static_cast<std::uint64_t>(time);
  // A timeline file's writer is called directly (it is final: the call is
  // not virtual and its encoder is inlined here, once per hot type so that
  // the type, and a free's category and owner, are constants).
  if (writer_ != nullptr) {
    switch (e.action) {
      case TraceAction::kAlloc: {
        const AllocTag& tag = ScopedTag::current();
        const std::uint32_t owner = tag.generation == last_generation_ ? last_owner_id_ : OwnerId(tag);
        writer_->AppendAction(EventType::kAlloc, small, t, e.addr, e.size, e.requested_size, e.stream, tag.category,
                              owner);
        return;
      }
      case TraceAction::kFreeRequested:
        writer_->AppendAction(EventType::kFreeRequested, small, t, e.addr, e.size, e.requested_size, e.stream,
                              Category::kOther, 0, e.record_id);
        return;
      case TraceAction::kFreeCompleted:
        writer_->AppendAction(EventType::kFreeCompleted, small, t, e.addr, e.size, e.requested_size, e.stream,
                              Category::kOther, 0);
        return;
      default:
        break;
    }
  }
  Event out;
  out.type = static_cast<EventType>(e.action);
  out.set_small_pool(e.small_pool);
  out.set_pool(e.pool);
  out.time_ns = time;
  out.addr = e.addr;
  out.size = e.size;
  out.requested_size = e.requested_size;
  out.stream = e.stream;
  if (e.action == TraceAction::kAlloc) {
    const AllocTag& tag = ScopedTag::current();
    out.category = tag.category;
    out.name = OwnerId(tag);
  }
  if (memory_ != nullptr) {
    memory_->events().push_back(out);
    return;
  }
  sink_.Append(out);
}

void Recorder::AppendMark(EventType type, Phase phase, std::int64_t step, std::string_view label,
                          std::int64_t micro_batch, std::uint8_t flags) {
  Sync sync(*this);
  Event e;
  e.type = type;
  e.flags = flags;
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
  Sync sync(*this);
  AppendMark(EventType::kPhaseEnd, phase, step, label, micro_batch);
  if (absl::Status s = sink_.Flush(); !s.ok() && write_error_.ok()) write_error_ = std::move(s);
}

void Recorder::AppendCollective(EventType type, std::string_view kind, std::uint64_t bytes) {
  Sync sync(*this);
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

void Recorder::Annotate(std::string_view text) {
  AppendMark(EventType::kMark, Phase::kUser, kNoStep, text, kNoMicroBatch, kEventTraceAnnotation);
}

}  // namespace memscope
