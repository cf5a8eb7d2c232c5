// Recording a replay in memory: a request trace run through a fresh
// CachingAllocator on a simulated GPU (importers/replayer.h), with a
// recorder attached (load/recording_session.h), gives the Timeline the
// analyses read. Importing a PyTorch snapshot is such a replay under its own
// settings (load/recording.h); `memscope replay` records its settings the
// same way.
#ifndef MEMSCOPE_LOAD_RECORD_REPLAY_H_
#define MEMSCOPE_LOAD_RECORD_REPLAY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "importers/replayer.h"
#include "importers/request_trace.h"
#include "recording/event.h"

namespace memscope {

// Replays `trace` under `config` on a simulated GPU of `device_memory` bytes,
// recording it into a Timeline of rank `rank` with the trace's stacks; the
// replay's own result goes to `result` when given. Errors: the replay's.
absl::StatusOr<Timeline> RecordReplay(const RequestTrace& trace, const AllocatorConfig& config,
                                      std::uint64_t device_memory, int rank, ReplayResult* result = nullptr);
// The same, moving the trace's stacks into the timeline instead of copying
// them: `trace.stacks` is left empty (the rest of the trace is unchanged).
absl::StatusOr<Timeline> RecordReplayTakingStacks(RequestTrace& trace, const AllocatorConfig& config,
                                                  std::uint64_t device_memory, int rank,
                                                  ReplayResult* result = nullptr);

}  // namespace memscope

#endif  // MEMSCOPE_LOAD_RECORD_REPLAY_H_
