// What memscope records: allocator actions and phase marks, one fixed-size
// 48-byte Event each in memory. Timeline files (timeline.h) store them
// delta-encoded since version 3 (versions 1 and 2 stored this struct as is).
#ifndef MEMSCOPE_RECORDING_EVENT_H_
#define MEMSCOPE_RECORDING_EVENT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "allocator/alloc_tag.h"
#include "allocator/config.h"
#include "allocator/observer.h"
#include "base/trace_action.h"

namespace memscope {

// Phases of a training step, and the two before the first step.
enum class Phase : std::uint8_t { kModel, kDdp, kZeroGrad, kForward, kLoss, kBackward, kStep, kUser };
inline constexpr int kNumPhases = 8;
std::string_view PhaseName(Phase p);  // "model", "ddp", "zero_grad", "forward", "loss", "backward", "step", "user"
std::optional<Phase> ParsePhase(std::string_view name);

enum class EventType : std::uint8_t {
  // Allocator actions: TraceAction's (base/trace_action.h), value for value.
  kAlloc = static_cast<std::uint8_t>(TraceAction::kAlloc),
  kFreeRequested = static_cast<std::uint8_t>(TraceAction::kFreeRequested),
  kFreeCompleted = static_cast<std::uint8_t>(TraceAction::kFreeCompleted),
  kSegmentAlloc = static_cast<std::uint8_t>(TraceAction::kSegmentAlloc),
  kSegmentFree = static_cast<std::uint8_t>(TraceAction::kSegmentFree),
  kSegmentMap = static_cast<std::uint8_t>(TraceAction::kSegmentMap),
  kSegmentUnmap = static_cast<std::uint8_t>(TraceAction::kSegmentUnmap),
  kOom = static_cast<std::uint8_t>(TraceAction::kOom),
  kEmptyCache = static_cast<std::uint8_t>(TraceAction::kEmptyCache),
  kAllocRetry = static_cast<std::uint8_t>(TraceAction::kAllocRetry),
  kSyncAllStreams = static_cast<std::uint8_t>(TraceAction::kSyncAllStreams),
  // Marks set by the caller.
  kPhaseBegin = 32,
  kPhaseEnd = 33,
  kMark = 34,
  // A collective (allreduce, broadcast, allgather, barrier) of the rank's
  // communicator: begin and end, recorded by run/'s recording communicator.
  kCollectiveBegin = 35,
  kCollectiveEnd = 36,
};
static_assert(static_cast<int>(EventType::kSyncAllStreams) < static_cast<int>(EventType::kPhaseBegin));
std::string_view EventTypeName(EventType t);  // "alloc", ..., "phase_begin", "phase_end", "mark"
bool IsAllocatorAction(EventType t);
// Whether an event changes allocated, reserved or active bytes (alloc,
// free_*, segment_*: kAlloc to kSegmentUnmap). Inline: every event of an
// analysis asks.
inline bool ChangesMemory(EventType t) {
  return static_cast<std::uint8_t>(t) <= static_cast<std::uint8_t>(EventType::kSegmentUnmap);
}

// The name of a phase mark everywhere memscope shows one (tables, --at,
// Chrome trace slices, snapshot annotations): "forward:3", "model" when there
// is no step, a user phase by its label ("user" without one).
// With --grad-accum, the phases that run once per micro-batch carry its index:
// "backward:0.1" is step 0's second micro-batch.
std::string PhaseMarkName(Phase phase, std::int64_t step, std::string_view label,
                          std::int64_t micro_batch = -1 /* kNoMicroBatch */);

// Bits of Event::flags.
inline constexpr std::uint8_t kEventSmallPool = 1;  // the block or segment is in the small pool
// Only in timeline files: a free_requested whose free_completed followed at
// once with the same fields (no stream waited). The reader turns it back
// into the two events, so an Event in memory never carries it.
inline constexpr std::uint8_t kEventCompletedAtOnce = 2;
// Only in memory, on a mark: the mark is a PyTorch snapshot's `annotate`
// trace entry (_annotate_memory, PyTorch 2.11+), written back as one.
// Timeline files do not store it (their reader keeps kEventSmallPool only).
inline constexpr std::uint8_t kEventTraceAnnotation = 2;
// Bits 2 to 7, only in memory (a replay's recording): the pool of an
// allocator event, 0 for the default pool, else the index of a private pool
// in Timeline::pools. Timeline files do not store it.
inline constexpr int kEventPoolShift = 2;
inline constexpr std::uint16_t kMaxEventPool = 63;

// One event. Field use by type:
//   alloc / free_*: addr, size (block), requested_size, stream, category, name = owner
//   segment_*:      addr, size (segment or mapped range), stream
//   oom:            device_free() (stored in addr), size = rounded request, requested_size
//   alloc_retry:    size = segment size asked again
//   phase_*:        phase, step() (stored in addr; kNoStep before the first step), name = label
//                   (user phases), micro_batch() (stored in requested_size as index + 1; 0 = none)
//   mark:           name = the mark's text
//   collective_*:   name = the collective ("allreduce"), size = its payload bytes
// Fields that mean different things per type are read and written through
// the accessors below, never directly.
struct Event {
  EventType type = EventType::kMark;
  std::uint8_t flags = 0;  // kEventSmallPool (and, in files only, kEventCompletedAtOnce)
  Category category = Category::kOther;
  Phase phase = Phase::kUser;
  std::uint32_t name = 0;    // string id (0 = none)
  std::int64_t time_ns = 0;  // since the start of the recording
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t requested_size = 0;
  std::uint64_t stream = 0;

  bool small_pool() const { return (flags & kEventSmallPool) != 0; }
  void set_small_pool(bool small) {
    flags = static_cast<std::uint8_t>(small ? flags | kEventSmallPool : flags & ~kEventSmallPool);
  }
  // Allocator events: the pool index (Timeline::pools), 0 for the default pool.
  std::uint16_t pool() const { return static_cast<std::uint16_t>(flags >> kEventPoolShift); }
  void set_pool(std::uint16_t pool) {
    flags = static_cast<std::uint8_t>((flags & ((1u << kEventPoolShift) - 1)) | (pool << kEventPoolShift));
  }
  // phase_begin / phase_end: the training step, kNoStep before the first.
  std::int64_t step() const { return static_cast<std::int64_t>(addr); }
  void set_step(std::int64_t step) { addr = static_cast<std::uint64_t>(step); }
  // phase_begin / phase_end: the micro-batch (--grad-accum), kNoMicroBatch
  // when the phase runs once per step.
  // (Unsigned arithmetic: a file may hold any value here, and 2^63 - 1 must not overflow.)
  std::int64_t micro_batch() const { return static_cast<std::int64_t>(requested_size - 1); }
  void set_micro_batch(std::int64_t micro) { requested_size = static_cast<std::uint64_t>(micro) + 1; }
  // oom: the bytes the device had free when the allocation failed.
  std::uint64_t device_free() const { return addr; }
  void set_device_free(std::uint64_t bytes) { addr = bytes; }
};
static_assert(sizeof(Event) == 48);
static_assert(std::is_trivially_copyable_v<Event>);

inline constexpr std::int64_t kNoStep = -1;
inline constexpr std::int64_t kNoMicroBatch = -1;

// The phase-matching rule, the one every reader of phase marks keeps (the
// timeline walk's phase stack, the Chrome trace's slices): the phase_end
// `end` closes a phase that began with this phase, step, label and
// micro-batch, all four equal. It lives here, beside Phase and Event, which
// it compares (base/ sees neither).
//
//   ClosesPhase(end, Phase::kBackward, 0, 0, 1)  // end is "backward:0.1"'s end
inline bool ClosesPhase(const Event& end, Phase phase, std::int64_t step, std::uint32_t label,
                        std::int64_t micro_batch) {
  return end.phase == phase && end.step() == step && end.name == label && end.micro_batch() == micro_batch;
}

// One frame of an allocation's stack, as PyTorch records it
// (torch.cuda.memory._snapshot() "frames" entries, innermost first). The fx_
// fields are set on the frames of torch.compile's generated code when the
// snapshot was taken with augment_with_fx_traces (PyTorch 2.11+): the FX
// graph node that allocated (op "call_function", name "addmm", target
// "aten.addmm.default") and the user's code it was traced from; empty when
// the frame has none.
struct StackFrame {
  std::string filename;
  std::int64_t line = 0;
  std::string name;
  std::string fx_node_op;
  std::string fx_node_name;
  std::string fx_node_target;
  std::string fx_original_trace;
  bool has_fx() const {
    return !fx_node_op.empty() || !fx_node_name.empty() || !fx_node_target.empty() || !fx_original_trace.empty();
  }
  bool operator==(const StackFrame&) const = default;
};

// Pinned host memory, as a PyTorch snapshot with record_pinned_host_memory
// (PyTorch 2.11+) has it: the host caching allocator's segments
// (`host_segments`) and its trace (`host_traces`), kept to be shown and
// written back; memscope does not replay them. `stack`: index into the
// timeline's stacks (0: no frames).
struct HostBlock {
  std::uint64_t address = 0, size = 0, requested_size = 0;
  std::string state;  // active_allocated, active_pending_free / active_awaiting_free, inactive
  std::uint32_t stack = 0;
};
struct HostSegment {
  std::uint64_t address = 0, total_size = 0, allocated_size = 0, active_size = 0, requested_size = 0;
  std::int64_t device = -1;  // -1: the snapshot gave none
  std::uint32_t stack = 0;
  std::vector<HostBlock> blocks;
};
struct HostTraceEntry {
  std::string action;  // alloc, free_requested, free_completed, segment_alloc, segment_free, ...
  std::uint64_t addr = 0, size = 0, stream = 0;
  std::int64_t time_us = 0;
  std::uint32_t stack = 0;
};
struct PinnedHostMemory {
  bool present = false;  // the snapshot had host_segments or host_traces
  std::vector<HostSegment> segments;
  std::vector<HostTraceEntry> trace;
};

// The stack of an allocation read from a PyTorch snapshot, and its site: the
// frames of the user's code from the innermost one outwards ("file:line
// function", joined by " <- "; the innermost frame when none is the user's),
// the key by which bytes are summed by stack.
// Its frames are indices into the frame table of its trace or timeline
// (RequestTrace::stack_frames, Timeline::stack_frames): stacks share their
// frames, each distinct frame stored once.
struct AllocStack {
  std::vector<std::uint32_t> frames;
  std::string site;
};

// A recording of one rank: what the timeline file holds.
struct Timeline {
  int rank = 0;
  int world_size = 1;
  int device_index = 0;
  std::uint64_t device_capacity = 0;
  std::int64_t wall_start_us = 0;  // Unix time of the start, microseconds
  // The allocator settings' text as recorded (kept even where memscope
  // cannot parse it: it still names the run) and its value, parsed once by
  // whoever made the timeline (SetAllocConf): the defaults where the text
  // does not parse. Readers of settings use `settings`, never parse again.
  std::string alloc_conf;
  AllocatorConfig settings;
  void SetAllocConf(std::string text);             // parses the text
  void SetAllocConf(const AllocatorConfig& value);  // text and value as they are
  std::vector<std::string> strings{""};  // id -> text; id 0 is ""
  std::vector<Event> events;
  std::uint64_t torn_bytes = 0;    // bytes of an incomplete last record, ignored
  // The allocator events were timed by a sampled clock (recorder.h,
  // RecordClock::kSampled): the reader spreads each run of events that share
  // a clock reading over the time until the next reading (SpreadSampledTimes).
  bool sampled_clock = false;
  std::vector<std::string> notes;  // what the reader wants the user to know (not stored in files)
  // The stacks of allocations, when the recording was replayed from a
  // PyTorch snapshot that has them (not stored in timeline files): stacks[0]
  // is none; event_stacks is empty or holds, per event, the index of its
  // allocation's stack (0 for every other event).
  std::vector<AllocStack> stacks{AllocStack{}};
  std::vector<StackFrame> stack_frames;  // the frames the stacks' indices name
  std::vector<std::uint32_t> event_stacks;
  std::uint32_t stack_of(std::size_t event) const { return event < event_stacks.size() ? event_stacks[event] : 0; }
  // The pools the allocator events name (Event::pool()): [0] is the default
  // pool, the others private pools (CUDA graphs, torch.cuda.MemPool) of a
  // replayed snapshot. Not stored in timeline files.
  std::vector<PoolId> pools{PoolId{}};
  bool has_private_pools() const { return pools.size() > 1; }
  // A replayed PyTorch snapshot's pinned host memory (on its first device's
  // timeline only: the host allocator is the process's). Not stored in timeline files.
  PinnedHostMemory host;

  const std::string& str(std::uint32_t id) const { return id < strings.size() ? strings[id] : strings[0]; }
};

// A sampled clock (recorder.h) gives every allocator event between two
// readings the earlier reading. Spreads each such run evenly over the time
// until the next event with a later time: the j-th of n events at time T1,
// followed by an event at T2 > T1, gets T1 + (T2 - T1) * j / n. Events that
// read the clock themselves (marks, collectives: the first of each run) keep
// their times. The last run, with no later time after it, is spaced at the
// mean time per event of the runs spread before it (1 us per event when
// there were none). Events from `from` on (earlier ones are already spread).
void SpreadSampledTimes(std::vector<Event>& events, std::size_t from = 0);

}  // namespace memscope

#endif  // MEMSCOPE_RECORDING_EVENT_H_
