// Replays a request trace through a fresh CachingAllocator on a simulated
// device: what the allocator would do with these requests under a setting.
#ifndef MEMSCOPE_IMPORTERS_REPLAYER_H_
#define MEMSCOPE_IMPORTERS_REPLAYER_H_

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/sim_device.h"
#include "allocator/stats.h"
#include "importers/request_trace.h"
#include "recording/recorder.h"

namespace memscope {

struct ReplayOom {
  std::size_t request_index = 0;  // position in the trace (0-based)
  std::uint64_t line = 0;         // source line
  std::string id;                 // the allocation that failed
  OutOfMemoryInfo info;
};

struct ReplayResult {
  std::string alloc_conf;
  std::size_t device_memory = 0;
  std::size_t requests_total = 0;
  std::size_t requests_done = 0;  // all of them unless an OOM stopped the replay
  std::optional<ReplayOom> oom;
  DeviceStats stats;                // at the end (or at the OOM)
  std::size_t peak_live_bytes = 0;  // peak of live requested bytes: the lower bound
  std::string memory_summary;       // torch.cuda.memory_summary() at the end
  std::vector<PoolId> pools;        // the allocator's pools by index (Event::pool()): [0] the default
  // The source's addresses (RequestTrace::planned_*): how many segments got
  // theirs, and how many did not (the replay's calls differed from the source's there).
  std::uint64_t planned_taken = 0;
  std::uint64_t planned_missed = 0;
  // When the trace has stacks: per allocation that got a block, in order,
  // its address and its stack (RequestTrace::stacks), for AttachStacks.
  std::vector<std::pair<DevicePtr, std::uint32_t>> alloc_stacks;
  // Or, when the replay was given the recorder's events (ReplayOn's
  // `recorded`): per allocation that got a block, the index of its event
  // and its stack, taken as the replay went; `event_stacks_ok` false when
  // an alloc's event was not the last one recorded (then no stacks).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> alloc_event_stacks;
  bool event_stacks_ok = false;
};

// Gives `timeline` (the recording of the replay that produced `result`) the
// trace's stacks: each alloc event the stack of its request, and the trace's
// pinned host memory (RequestTrace::host). Leaves the alloc events without
// stacks when they do not follow the replay's (the table stays when the host
// memory's entries name stacks).
void AttachStacks(const RequestTrace& trace, const ReplayResult& result, Timeline& timeline);
// The same, moving the trace's stacks into the timeline instead of copying
// them (`trace.stacks` is left empty), for callers done with them.
void AttachStacksMoving(RequestTrace& trace, const ReplayResult& result, Timeline& timeline);

// Replays `trace` with `config` on a SimDevice of `device_memory` bytes. An
// out-of-memory stops the replay and is part of the result (not an error);
// errors are only for requests the allocator rejects (e.g. a bad free).
// With `recorder`, every allocator action, phase mark, mark and category/
// owner tag of the trace is recorded (the recorder becomes the allocator's
// observer for the replay).
absl::StatusOr<ReplayResult> Replay(const RequestTrace& trace, const AllocatorConfig& config, std::size_t device_memory,
                                    Recorder* recorder = nullptr);

// The same on a caller's fresh `allocator` over `device` (a recording
// RankSession's, run/rank_session.h, whose recorder already observes the
// allocator): `recorder`, when given, gets only the trace's phase marks and
// marks; the allocator's observer is left as it is. Times: the recorder
// gets each request's time (SetTraceTime): the trace's own where it has
// them, else request i at i microseconds (a recorder of RecordClock::kTrace
// then reads no clock: the same trace, the same times).
// `recorded`: the recorder's events when it records into memory
// (MemorySink): each alloc's stack is then taken as its event is recorded
// (ReplayResult::alloc_event_stacks) instead of matched afterwards by address.
absl::StatusOr<ReplayResult> ReplayOn(const RequestTrace& trace, CachingAllocator& allocator, SimDevice& device,
                                      Recorder* recorder = nullptr, const std::vector<Event>* recorded = nullptr);

// The largest simulated GPU MinDeviceMemory tries: a trace that needs more
// has no answer.
inline constexpr std::uint64_t kMaxSearchedDeviceMemory = std::uint64_t{1} << 40;  // 1 TiB

// The smallest simulated GPU, in whole MiB, on which `trace` replays under
// `config` without an OOM (`memscope replay`'s "min memory", `memscope
// explain`'s what-ifs); nullopt when even kMaxSearchedDeviceMemory is not
// enough (or a memory fraction of 0 lets nothing in). Bisection between two
// sizes that do not depend on any given device: one MiB below the peak live
// bytes, rounded up, never works, and a GPU on which the peak reserved of a
// 1 TiB replay fits under the memory fraction (reserved / fraction) does,
// else the next doubling that does. Errors: the replay's.
//
//   absl::StatusOr<std::optional<std::uint64_t>> min = MinDeviceMemory(trace, config);
absl::StatusOr<std::optional<std::uint64_t>> MinDeviceMemory(const RequestTrace& trace, const AllocatorConfig& config);

}  // namespace memscope

#endif  // MEMSCOPE_IMPORTERS_REPLAYER_H_
