#include "importers/replayer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/sim_device.h"
#include "importers/prefault.h"

namespace memscope {

absl::StatusOr<ReplayResult> Replay(const RequestTrace& trace, const AllocatorConfig& config, std::size_t device_memory,
                                    Recorder* recorder) {
  SimDevice device({.capacity = device_memory, .index = 0, .host_backed = false});
  CachingAllocator allocator(device, config);
  if (recorder != nullptr) allocator.SetObserver(recorder);
  absl::StatusOr<ReplayResult> result = ReplayOn(trace, allocator, device, recorder);
  allocator.SetObserver(nullptr);
  return result;
}

absl::StatusOr<std::optional<std::uint64_t>> MinDeviceMemory(const RequestTrace& trace, const AllocatorConfig& config) {
  constexpr std::uint64_t kStep = kMiB;
  constexpr std::uint64_t kMaxSteps = kMaxSearchedDeviceMemory / kStep;
  absl::StatusOr<ReplayResult> largest = Replay(trace, config, kMaxSearchedDeviceMemory);
  if (!largest.ok()) return largest.status();
  if (largest->oom) return std::optional<std::uint64_t>();
  auto fails = [&](std::uint64_t steps) -> absl::StatusOr<bool> {
    absl::StatusOr<ReplayResult> probe = Replay(trace, config, steps * kStep);
    if (!probe.ok()) return probe.status();
    return probe->oom.has_value();
  };
  // The peak reserved of the large replay fits on a GPU whose allowed share
  // (the memory fraction of it) holds it: that GPU works, but for the
  // fraction's rounding down, which the doublings below make up.
  const auto reserved = static_cast<double>(All(largest->stats.reserved_bytes).peak);
  const double fraction = config.per_process_memory_fraction < 1.0 ? config.per_process_memory_fraction : 1.0;
  const double needed = std::ceil(reserved / fraction / static_cast<double>(kStep));
  std::uint64_t hi = needed >= static_cast<double>(kMaxSteps) ? kMaxSteps : static_cast<std::uint64_t>(needed);
  for (;;) {
    absl::StatusOr<bool> failed = fails(hi);
    if (!failed.ok()) return failed.status();
    if (!*failed) break;
    if (hi == kMaxSteps) return std::optional<std::uint64_t>();  // (not seen: the largest replay worked)
    hi = std::min(kMaxSteps, std::max<std::uint64_t>(1, hi * 2));
  }
  const std::uint64_t live = (largest->peak_live_bytes + kStep - 1) / kStep;
  std::uint64_t lo = live == 0 ? 0 : live - 1;  // in MiB; fails (or is 0)
  while (hi > lo + 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    absl::StatusOr<bool> failed = fails(mid);
    if (!failed.ok()) return failed.status();
    (*failed ? lo : hi) = mid;
  }
  return std::optional<std::uint64_t>(hi * kStep);
}

namespace {

// The allocator's index of each of the trace's pools ([0], the default pool: 0).
absl::StatusOr<std::vector<std::uint16_t>> PoolIndices(const RequestTrace& trace, CachingAllocator& allocator) {
  std::vector<std::uint16_t> pool_index(trace.pools.size(), 0);
  for (std::size_t k = 1; k < trace.pools.size(); ++k) {
    absl::StatusOr<std::uint16_t> index = allocator.PoolIndex(trace.pools[k]);
    if (!index.ok())
      return absl::Status(index.status().code(), absl::StrCat(trace.source, ": ", index.status().message()));
    pool_index[k] = *index;
  }
  return pool_index;
}

// n zeroed slots, their pages faulted in before the replay writes them (PrefaultForWrite).
template <typename T>
std::vector<T> PrefaultedSlots(std::size_t n) {
  std::vector<T> slots;
  slots.reserve(n);
  PrefaultForWrite(slots.data(), n * sizeof(T));
  slots.resize(n, 0);
  return slots;
}

// The allocations' tag: one scope for the whole replay, retagged when an
// alloc's category or owner differs from the last one's (nothing but an
// alloc reads the tag).
class ReplayTag {
 public:
  [[gnu::always_inline]] void Set(Category category, std::uint32_t text, const std::vector<std::string>& strings) {
    if (!tag_) {
      tag_.emplace(category, strings[text]);
    } else if (category != category_ || text != text_) {
      tag_->Retag(category, strings[text]);
    }
    category_ = category;
    text_ = text;
  }

 private:
  std::optional<ScopedTag> tag_;
  Category category_ = Category::kOther;
  std::uint32_t text_ = 0;
};

// Gives the recorder request i's time: the trace's own where it has them (a
// request without one keeps the last); a trace with none (a JSON request
// trace, a snapshot without time_us) puts request i at i microseconds, so
// that its outputs are the same on every run.
[[gnu::always_inline]] inline void SetRequestTime(Recorder& recorder, const RequestTrace& trace, std::size_t i,
                                                  const Request& r) {
  if (trace.time_origin_us < 0) {
    recorder.SetTraceTime(static_cast<std::int64_t>(i) * 1000);
  } else if (r.time_us >= 0) {
    recorder.SetTraceTime((r.time_us - trace.time_origin_us) * 1000);
  }
}

// The OOM of alloc request i, which the allocator refused with `status` (resource exhausted).
ReplayOom OomOf(const RequestTrace& trace, std::size_t i, const Request& r, const CachingAllocator& allocator,
                const SimDevice& device, const absl::Status& status) {
  if (allocator.last_oom().has_value()) return ReplayOom{i, r.line, trace.IdOf(r.slot), *allocator.last_oom()};
  // A size no device has (1 EB or more): PyTorch raises its
  // OutOfMemoryError before asking the device, and so does the
  // allocator. It is an OOM like any other: the replay's answer.
  OutOfMemoryInfo info;
  info.requested = r.size;
  info.device_total = device.capacity();
  info.message = std::string(status.message());
  info.diagnosis = absl::StrCat("memscope: the request of ", r.size, " B is larger than any device; PyTorch refuses ",
                                "requests of 1 EB and more before asking the device.");
  return ReplayOom{i, r.line, trace.IdOf(r.slot), std::move(info)};
}

// Keeps the stack of an allocation that got block `p` for AttachStacks: with
// the recorder's events (`recorded`), by the index of its alloc event, the
// last one recorded; else by its address.
[[gnu::always_inline]] inline void KeepAllocStack(ReplayResult& result, DevicePtr p, std::uint32_t stack,
                                                  const std::vector<Event>* recorded) {
  if (recorded == nullptr) {
    result.alloc_stacks.emplace_back(p, stack);
  } else if (!recorded->empty() && recorded->size() <= std::numeric_limits<std::uint32_t>::max() &&
             recorded->back().type == EventType::kAlloc && recorded->back().addr == p) {
    result.alloc_event_stacks.emplace_back(static_cast<std::uint32_t>(recorded->size() - 1), stack);
  } else {
    result.event_stacks_ok = false;
  }
}

// Adopts the state the trace starts from (RequestTrace::start_segments and
// start_blocks): each segment where the device puts it (the plan gives it
// the source's address), each block at its offset in its segment, tagged
// and with its stack like an alloc of the trace.
absl::Status AdoptStart(const RequestTrace& trace, CachingAllocator& allocator,
                        const std::vector<std::uint16_t>& pool_index, ReplayTag& tag, ReplayResult& result,
                        const std::vector<Event>* recorded, std::vector<DevicePtr>& ptrs,
                        std::vector<std::size_t>& sizes, std::size_t& live) {
  const std::string where = absl::StrCat(trace.source, ": the state at the trace's start: ");
  std::vector<std::pair<DevicePtr, DevicePtr>> bases;  // (the source's address, the replay's), by the source's
  for (const RequestTrace::StartSegment& seg : trace.start_segments) {
    const std::uint16_t pool = seg.pool < pool_index.size() ? pool_index[seg.pool] : 0;
    absl::StatusOr<DevicePtr> base = allocator.AdoptSegment(seg.size, seg.stream, pool, seg.small);
    if (!base.ok()) return absl::Status(base.status().code(), absl::StrCat(where, base.status().message()));
    bases.emplace_back(seg.address, *base);
  }
  std::sort(bases.begin(), bases.end());
  const bool with_stacks = trace.stacks.size() > 1;
  for (const RequestTrace::StartBlock& b : trace.start_blocks) {
    const Request& r = b.alloc;
    const DevicePtr addr = r.slot < trace.address_ids.size() ? trace.address_ids[r.slot] : 0;
    auto seg = std::upper_bound(bases.begin(), bases.end(), std::make_pair(addr, ~DevicePtr{0}));
    if (seg == bases.begin()) return absl::InvalidArgumentError(absl::StrCat(where, "a block outside every segment"));
    const DevicePtr ptr = addr - std::prev(seg)->first + std::prev(seg)->second;
    tag.Set(r.category, r.text, trace.strings);
    if (absl::Status s = allocator.AdoptBlock(ptr, b.block_size, r.size); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(where, s.message()));
    }
    if (with_stacks) KeepAllocStack(result, ptr, r.stack, recorded);
    ptrs[r.slot] = ptr;
    sizes[r.slot] = r.size;
    live += r.size;
  }
  result.peak_live_bytes = live;
  return absl::OkStatus();
}

// The end of a replay: the plan's counts, the allocator's stats, summary and pools.
void FinishReplay(CachingAllocator& allocator, SimDevice& device, bool planned, ReplayResult& result) {
  if (planned) {
    result.planned_taken = device.planned_taken();
    result.planned_missed = device.planned_missed();
    device.PlanAddresses({}, {});
  }
  result.stats = allocator.GetStats();
  result.memory_summary = allocator.MemorySummary();
  result.pools = allocator.pool_ids();
}

// A request that neither allocates nor frees nor marks a stream use:
// empty_cache, a pool released, stream work completing, phase marks and marks.
void ApplyOther(const RequestTrace& trace, const Request& r, CachingAllocator& allocator, SimDevice& device,
                Recorder* recorder) {
  switch (r.op) {
    case RequestOp::kEmptyCache: allocator.EmptyCache(); break;
    case RequestOp::kReleasePool:
      if (r.pool != 0 && r.pool < trace.pools.size()) allocator.ReleasePool(trace.pools[r.pool]);
      break;
    case RequestOp::kSync:
      if (r.stream == kAllStreams) {
        device.CompleteAll();
      } else {
        device.CompleteStream(r.stream);
      }
      break;
    case RequestOp::kFreeCompleted:
      device.CompleteStream(r.stream);
      allocator.ProcessEvents();
      break;
    case RequestOp::kPhaseBegin:
      if (recorder != nullptr) recorder->PhaseBegin(r.phase, r.step, trace.strings[r.text]);
      break;
    case RequestOp::kPhaseEnd:
      if (recorder != nullptr) recorder->PhaseEnd(r.phase, r.step, trace.strings[r.text]);
      break;
    case RequestOp::kMark:
      if (recorder != nullptr) recorder->Mark(trace.strings[r.text]);
      break;
    case RequestOp::kAnnotate:
      if (recorder != nullptr) recorder->Annotate(trace.strings[r.text]);
      break;
    case RequestOp::kAlloc:
    case RequestOp::kFree:
    case RequestOp::kRecordStream: break;  // ReplayOn's own
  }
}

}  // namespace

absl::StatusOr<ReplayResult> ReplayOn(const RequestTrace& trace, CachingAllocator& allocator, SimDevice& device,
                                      Recorder* recorder, const std::vector<Event>* recorded) {
  std::vector<DevicePtr> ptrs = PrefaultedSlots<DevicePtr>(trace.slot_count());
  std::vector<std::size_t> sizes = PrefaultedSlots<std::size_t>(trace.slot_count());
  PrefaultAhead events_ahead;  // the recorder's events, when they are in memory

  ReplayResult result;
  result.alloc_conf = allocator.config().text;
  result.device_memory = device.capacity();
  result.requests_total = trace.requests.size();
  std::size_t live = 0;
  // The recorder's string id of each owner (by index into trace.strings),
  // once an alloc under it was recorded: the next allocs of that owner hand
  // it over (a replay opens a tag per request; without this the recorder
  // would look each owner up in its string table by text).
  constexpr std::uint32_t kUnknownId = ~std::uint32_t{0};
  std::vector<std::uint32_t> owner_ids(recorder != nullptr ? trace.strings.size() : 0, kUnknownId);
  const bool with_stacks = trace.stacks.size() > 1;
  const bool direct_stacks = with_stacks && recorded != nullptr;
  result.event_stacks_ok = direct_stacks;
  if (direct_stacks) {
    result.alloc_event_stacks.reserve(trace.requests.size());  // address space until used
  } else if (with_stacks) {
    result.alloc_stacks.reserve(trace.requests.size());
  }
  ReplayTag tag;
  absl::StatusOr<std::vector<std::uint16_t>> pool_indices = PoolIndices(trace, allocator);
  if (!pool_indices.ok()) return pool_indices.status();
  const std::vector<std::uint16_t> pool_index = *std::move(pool_indices);
  const bool planned = !trace.planned_mallocs.empty() || !trace.planned_reservations.empty();
  if (planned) {
    device.PlanAddresses(trace.planned_mallocs, trace.planned_reservations);
    device.PausePlan(trace.planned_from_request > 0);
  }
  if (!trace.start_segments.empty()) {
    if (recorder != nullptr) recorder->SetTraceTime(0);
    if (absl::Status s = AdoptStart(trace, allocator, pool_index, tag, result, recorded, ptrs, sizes, live); !s.ok()) {
      return s;
    }
  }
  for (std::size_t i = 0; i < trace.requests.size(); ++i) {
    const Request& r = trace.requests[i];
    if (recorded != nullptr && i % 4096 == 0) {
      events_ahead.Advance(recorded->data(), recorded->capacity() * sizeof(Event), recorded->size() * sizeof(Event));
    }
    if (planned && i == trace.planned_from_request && i > 0) device.PausePlan(false);
    if (recorder != nullptr) SetRequestTime(*recorder, trace, i, r);
    auto where = [&] { return absl::StrCat(trace.source, ":", r.line, ": "); };
    switch (r.op) {
      case RequestOp::kAlloc: {
        tag.Set(r.category, r.text, trace.strings);
        if (recorder != nullptr && owner_ids[r.text] != kUnknownId) {
          recorder->UseOwnerId(trace.strings[r.text], owner_ids[r.text]);
        }
        absl::StatusOr<DevicePtr> p =
            r.pool == 0 ? allocator.Malloc(r.size, r.stream)
                        : allocator.Malloc(r.size, r.stream, r.pool < pool_index.size() ? pool_index[r.pool] : 0);
        if (recorder != nullptr && owner_ids[r.text] == kUnknownId) {
          if (std::optional<std::uint32_t> id = recorder->CurrentOwnerId()) owner_ids[r.text] = *id;
        }
        if (!p.ok()) {
          if (!absl::IsResourceExhausted(p.status())) {
            return absl::Status(p.status().code(), absl::StrCat(where(), p.status().message()));
          }
          result.oom = OomOf(trace, i, r, allocator, device, p.status());
          break;
        }
        if (*p != 0 && with_stacks) KeepAllocStack(result, *p, r.stack, direct_stacks ? recorded : nullptr);
        ptrs[r.slot] = *p;
        sizes[r.slot] = r.size;
        live += r.size;
        if (live > result.peak_live_bytes) result.peak_live_bytes = live;
        break;
      }
      case RequestOp::kFree:
        if (absl::Status s = allocator.Free(ptrs[r.slot]); !s.ok()) {
          return absl::Status(s.code(), absl::StrCat(where(), s.message()));
        }
        ptrs[r.slot] = 0;
        live -= sizes[r.slot];
        sizes[r.slot] = 0;
        break;
      case RequestOp::kRecordStream:
        // A zero-size allocation has no block; record_stream is then a no-op.
        if (ptrs[r.slot] != 0) {
          if (absl::Status s = allocator.RecordStream(ptrs[r.slot], r.stream); !s.ok()) {
            return absl::Status(s.code(), absl::StrCat(where(), s.message()));
          }
        }
        break;
      default: ApplyOther(trace, r, allocator, device, recorder); break;
    }
    if (result.oom.has_value()) break;
    result.requests_done = i + 1;
  }
  if (recorder != nullptr) recorder->ClearTraceTime();
  FinishReplay(allocator, device, planned, result);
  return result;
}

namespace {

// Each alloc event's stack (index into the trace's stacks), or nothing when
// the timeline has no stacks to take or its alloc events do not follow the replay's.
bool EventStacks(const RequestTrace& trace, const ReplayResult& result, const Timeline& timeline,
                 std::vector<std::uint32_t>& stacks) {
  if (trace.stacks.size() <= 1) return false;
  if (result.event_stacks_ok) {  // taken as the replay went (ReplayOn's `recorded`)
    if (result.alloc_event_stacks.empty()) return false;
    stacks.assign(timeline.events.size(), 0);
    for (const auto& [event, stack] : result.alloc_event_stacks) {
      if (event >= stacks.size()) return false;
      stacks[event] = stack;
    }
    return true;
  }
  if (result.alloc_stacks.empty()) return false;
  stacks.assign(timeline.events.size(), 0);
  std::size_t k = 0;
  for (std::size_t i = 0; i < timeline.events.size(); ++i) {
    const Event& e = timeline.events[i];
    if (e.type != EventType::kAlloc) continue;
    if (k >= result.alloc_stacks.size() || result.alloc_stacks[k].first != e.addr) return false;
    stacks[i] = result.alloc_stacks[k++].second;
  }
  return k == result.alloc_stacks.size();
}

// Whether the pinned host memory's entries name stacks (they need the table
// even when the device's allocations have none).
bool HostStacks(const PinnedHostMemory& host) {
  for (const HostSegment& s : host.segments) {
    if (s.stack != 0) return true;
    for (const HostBlock& b : s.blocks) {
      if (b.stack != 0) return true;
    }
  }
  for (const HostTraceEntry& e : host.trace) {
    if (e.stack != 0) return true;
  }
  return false;
}

}  // namespace

void AttachStacks(const RequestTrace& trace, const ReplayResult& result, Timeline& timeline) {
  timeline.host = trace.host;
  std::vector<std::uint32_t> stacks;
  if (!EventStacks(trace, result, timeline, stacks)) {
    stacks.clear();  // (the host's stacks only)
    if (!HostStacks(trace.host)) return;
  }
  timeline.stacks = trace.stacks;
  timeline.stack_frames = trace.stack_frames;
  timeline.event_stacks = std::move(stacks);
}

void AttachStacksMoving(RequestTrace& trace, const ReplayResult& result, Timeline& timeline) {
  timeline.host = std::move(trace.host);
  trace.host = PinnedHostMemory{};
  std::vector<std::uint32_t> stacks;
  if (!EventStacks(trace, result, timeline, stacks)) {
    stacks.clear();  // (the host's stacks only)
    if (!HostStacks(timeline.host)) return;
  }
  timeline.stacks = std::move(trace.stacks);
  timeline.stack_frames = std::move(trace.stack_frames);
  trace.stacks.clear();
  trace.stack_frames.clear();
  timeline.event_stacks = std::move(stacks);
}

}  // namespace memscope
