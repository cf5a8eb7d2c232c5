#include "recording/event.h"

namespace memscope {
namespace {
constexpr std::string_view kPhaseNames[kNumPhases] = {"model", "ddp",      "zero_grad", "forward",
                                                      "loss",  "backward", "step",      "user"};
}  // namespace

std::string_view PhaseName(Phase p) {
  const auto i = static_cast<std::size_t>(p);
  return i < kNumPhases ? kPhaseNames[i] : "user";
}

std::optional<Phase> ParsePhase(std::string_view name) {
  for (int i = 0; i < kNumPhases; ++i) {
    if (kPhaseNames[i] == name) return static_cast<Phase>(i);
  }
  return std::nullopt;
}

bool ChangesMemory(EventType t) {
  switch (t) {
    case EventType::kAlloc:
    case EventType::kFreeRequested:
    case EventType::kFreeCompleted:
    case EventType::kSegmentAlloc:
    case EventType::kSegmentFree:
    case EventType::kSegmentMap:
    case EventType::kSegmentUnmap: return true;
    default: return false;
  }
}

std::string PhaseMarkName(Phase phase, std::int64_t step, std::string_view label, std::int64_t micro_batch) {
  std::string name(phase == Phase::kUser && !label.empty() ? label : PhaseName(phase));
  if (step >= 0) {
    // Two appends, not ":" + to_string(): GCC 12's -Wrestrict misfires on
    // the latter at -O2 (GCC bug 105651).
    name += ':';
    name += std::to_string(step);
    if (micro_batch >= 0) {
      name += '.';
      name += std::to_string(micro_batch);
    }
  }
  return name;
}

bool IsAllocatorAction(EventType t) { return static_cast<int>(t) <= static_cast<int>(EventType::kSyncAllStreams); }

std::string_view EventTypeName(EventType t) {
  if (IsAllocatorAction(t)) return TraceActionName(static_cast<TraceAction>(t));
  switch (t) {
    case EventType::kPhaseBegin: return "phase_begin";
    case EventType::kPhaseEnd: return "phase_end";
    case EventType::kMark: return "mark";
    case EventType::kCollectiveBegin: return "collective_begin";
    case EventType::kCollectiveEnd: return "collective_end";
    default: return "unknown";
  }
}

}  // namespace memscope
