#include "recording/event.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace memscope {

namespace {

// t + d (d >= 0) without overflow: saturated at the largest time (a file
// may hold any times; the spread of its last run goes past them).
std::int64_t AddSaturating(std::int64_t t, std::uint64_t d) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  // (modulo 2^64: kMax - t is in [0, 2^64) for any t)
  const std::uint64_t room = static_cast<std::uint64_t>(kMax) - static_cast<std::uint64_t>(t);
  return d >= room ? kMax : static_cast<std::int64_t>(static_cast<std::uint64_t>(t) + d);
}

}  // namespace

void SpreadSampledTimes(std::vector<Event>& events, std::size_t from) {
  // The time per event seen in the runs spread so far: the last run, which
  // has no later reading after it, is spread at that rate (1 us per event
  // when nothing was spread before it).
  std::uint64_t spread_ns = 0, spread_events = 0;
  std::size_t i = from;
  while (i < events.size()) {
    const std::int64_t t1 = events[i].time_ns;
    std::size_t j = i + 1;
    while (j < events.size() && events[j].time_ns == t1) ++j;
    const auto n = static_cast<std::uint64_t>(j - i);
    if (n > 1 && j < events.size() && events[j].time_ns > t1) {
      // (modulo 2^64: the difference of two int64 times fits in a uint64)
      const std::uint64_t span = static_cast<std::uint64_t>(events[j].time_ns) - static_cast<std::uint64_t>(t1);
      for (std::size_t k = i + 1; k < j; ++k) {
        const auto step = static_cast<std::uint64_t>(k - i);
        // span * step / n without overflow: (q n + r) step / n = q step + r step / n, r step < n^2.
        events[k].time_ns = AddSaturating(t1, span / n * step + span % n * step / n);
      }
      spread_ns += span;
      spread_events += n;
    } else if (n > 1 && j == events.size()) {
      const std::uint64_t per_event = spread_events > 0 ? std::max<std::uint64_t>(spread_ns / spread_events, 1) : 1000;
      for (std::size_t k = i + 1; k < j; ++k) {
        std::uint64_t d;
        if (__builtin_mul_overflow(per_event, static_cast<std::uint64_t>(k - i), &d)) d = ~std::uint64_t{0};
        events[k].time_ns = AddSaturating(t1, d);
      }
    }
    i = j;
  }
}

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

void Timeline::SetAllocConf(std::string text) {
  absl::StatusOr<AllocatorConfig> parsed = AllocatorConfig::Parse(text);
  settings = parsed.ok() ? *std::move(parsed) : AllocatorConfig{};
  alloc_conf = std::move(text);
}

void Timeline::SetAllocConf(const AllocatorConfig& value) {
  settings = value;
  alloc_conf = value.text;
}

}  // namespace memscope
