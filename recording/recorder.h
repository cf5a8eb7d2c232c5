// Records what an allocator does, plus what only the caller knows: the
// memory category and owner of each allocation (a cheap scoped tag) and the
// phases of training.
//
//   Timeline timeline;                       // or a TimelineWriter for a file
//   MemorySink sink(timeline);
//   Recorder recorder(sink);
//   allocator.SetObserver(&recorder);
//   recorder.PhaseBegin(Phase::kForward, step);
//   {
//     ScopedTag tag(Category::kActivation, "encoder.rnn");
//     allocator.Malloc(...);                 // recorded as ACTIVATION of encoder.rnn
//   }
//   recorder.PhaseEnd(Phase::kForward, step);  // also flushes the sink
#ifndef MEMSCOPE_RECORDING_RECORDER_H_
#define MEMSCOPE_RECORDING_RECORDER_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "allocator/alloc_tag.h"
#include "allocator/observer.h"
#include "recording/event.h"
#include "recording/timeline.h"

namespace memscope {

// Where the times of allocator events come from.
enum class RecordClock : std::uint8_t {
  // Every allocator call reads the clock (the allocator's FastNowNs): exact
  // times, for runs whose time means something (kernels that really run).
  kWall,
  // Simulated runs: the allocator reads no clock. The recorder reads its
  // own (steady_clock, then the TSC once calibrated from those readings: no
  // 5 ms calibration spin, unlike FastNowNs) at
  // every phase mark, mark and collective, and at every kClockSampleEvents-th
  // allocator event (a free that completes at once, one OnFreeAtOnce call,
  // counts once); an allocator event carries the last time read. Times
  // stay monotonic, phase durations exact, and an event's time is early by at
  // most the time of the kClockSampleEvents events before it (about 10 us
  // when nothing but the allocator runs).
  kSampled,
  // Replays: every time is the trace's (SetTraceTime before each request);
  // the recorder and the allocator read no clock, so the same trace gives
  // the same times on every run.
  kTrace,
};
inline constexpr int kClockSampleEvents = 64;

class Recorder final : public AllocatorObserver {
 public:
  // Times are measured from now. The sink must outlive the recorder.
  explicit Recorder(EventSink& sink, RecordClock clock = RecordClock::kWall);
  ~Recorder() override;
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  void OnEvent(const TraceEvent& event) override;
  void OnFreeAtOnce(const TraceEvent& requested) override;
  bool wants_time() const override { return clock_ == RecordClock::kWall; }
  // A timeline file's state, for the allocator to write the hot records
  // itself (allocator/record_sink.h) when the clock is sampled (between two
  // clock reads every allocator event carries the same time), and to keep
  // the record ids of its blocks' allocs (a lean free in any clock mode).
  RecordSink* record_sink() override { return writer_ != nullptr ? &writer_->record_sink() : nullptr; }
  RecordClock clock() const { return clock_; }

  // Phase marks; a phase end flushes the sink (a crash keeps every phase that ended).
  // `micro_batch`: the phase's micro-batch under gradient accumulation.
  void PhaseBegin(Phase phase, std::int64_t step = kNoStep, std::string_view label = {},
                  std::int64_t micro_batch = kNoMicroBatch);
  void PhaseEnd(Phase phase, std::int64_t step = kNoStep, std::string_view label = {},
                std::int64_t micro_batch = kNoMicroBatch);
  // A free-form mark ("checkpoint saved").
  void Mark(std::string_view text);
  // A mark that was a PyTorch snapshot's `annotate` trace entry
  // (kEventTraceAnnotation: written back as one).
  void Annotate(std::string_view text);

  // The first error a phase end's flush met (a full disk: the timeline can
  // no longer be written whole), OK until then. The training loop stops at
  // it (train/step_loop.h) rather than train on unrecorded.
  const absl::Status& write_error() const { return write_error_; }

  // The rank's communicator ran collective `kind` ("allreduce") on `bytes`.
  void CollectiveBegin(std::string_view kind, std::uint64_t bytes);
  void CollectiveEnd(std::string_view kind, std::uint64_t bytes);

  EventSink& sink() { return sink_; }

  // For a caller that tags many allocations with owners it has seen before
  // (a replay opens a tag per request): the string id of the current tag's
  // owner when the recorder knows it (it recorded an alloc under this very
  // tag), else nullopt; and UseOwnerId tells the recorder that the current
  // tag's owner `owner` has id `id` (one the recorder gave it), so the
  // allocs under this tag skip the string table. Same ids, same records.
  std::optional<std::uint32_t> CurrentOwnerId() const {
    if (ScopedTag::current().generation != last_generation_) return std::nullopt;
    return last_owner_id_;
  }
  void UseOwnerId(std::string_view owner, std::uint32_t id) {
    Sync sync(*this);
    last_generation_ = ScopedTag::current().generation;
    if (last_owner_id_ != id) {
      last_owner_.assign(owner.data(), owner.size());
      last_owner_id_ = id;
    }
  }

  // Replaying a trace that has its own times: events and marks from now on
  // carry `ns` (since the recording's start) instead of the clock's time,
  // until ClearTraceTime().
  void SetTraceTime(std::int64_t ns) {
    Sync sync(*this);
    trace_time_ns_ = ns;
    use_trace_time_ = true;
  }
  void ClearTraceTime() {
    Sync sync(*this);
    use_trace_time_ = false;
  }

 private:
  // Every entry point holds one: on entry it counts the fast records the
  // allocator wrote into the sampled clock's countdown and ends their
  // budget; on exit it grants a new one (up to the next clock read, within
  // the buffer's room) when the allocator's records would carry the time
  // the recorder would give them.
  class Sync {
   public:
    explicit Sync(Recorder& r) : r_(r) {
      if (r_.fast_ != nullptr) r_.TakeFastRecords();
    }
    ~Sync() {
      if (r_.fast_ != nullptr) r_.GrantFastRecords();
    }
    Sync(const Sync&) = delete;
    Sync& operator=(const Sync&) = delete;

   private:
    Recorder& r_;
  };
  void TakeFastRecords();
  void GrantFastRecords();
  static bool Refill(RecordSink& sink);  // RecordSink::refill

  std::int64_t EventTime(const TraceEvent& e);  // an allocator event's time (the clock mode's)
  std::int64_t Now();  // a mark's time; restarts the sampled clock
  std::int64_t ClockNs();  // the clock mode's clock (recorder.cpp)
  std::uint32_t OwnerId(const AllocTag& tag);  // the string id of the tag's owner
  void AppendMark(EventType type, Phase phase, std::int64_t step, std::string_view label,
                  std::int64_t micro_batch = kNoMicroBatch, std::uint8_t flags = 0);
  void AppendCollective(EventType type, std::string_view kind, std::uint64_t bytes);

  EventSink& sink_;
  TimelineWriter* writer_;  // sink_ when it is a timeline file's writer, else null
  MemorySink* memory_;      // sink_ when it is a timeline in memory, else null
  std::int64_t start_ns_;
  RecordClock clock_;
  int countdown_ = 1;             // kSampled: allocator events until the next clock read
  std::int64_t sampled_ns_ = 0;   // kSampled: the last time read (since start_ns_)
  std::string last_owner_;           // the owner of the previous allocation...
  std::uint64_t last_generation_ = 0;  // ...the generation of its tag (alloc_tag.h)...
  std::uint32_t last_owner_id_ = 0;  // ...and its string id ("" is 0)
  bool use_trace_time_ = false;
  std::int64_t trace_time_ns_ = 0;
  absl::Status write_error_;  // write_error()
  RecordSink* fast_ = nullptr;  // writer_'s state when the clock is sampled (record_sink())
  long granted_ = 0;            // the budget last granted to fast_
  // kSampled on x86-64 (ClockNs): a TSC reading and the steady_clock time
  // at it (tsc_base_ 0: none yet), and the rate found (0: not yet).
  std::uint64_t tsc_base_ = 0;
  std::int64_t tsc_base_ns_ = 0;
  double tsc_ns_per_tick_ = 0.0;
};

}  // namespace memscope

#endif  // MEMSCOPE_RECORDING_RECORDER_H_
