#include "devicemem/device_timeline.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

Event MakeEvent(EventType type, std::int64_t time, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                std::uint32_t name) {
  Event e;
  e.type = type;
  e.time_ns = time;
  e.addr = addr;
  e.size = size;
  e.requested_size = size;
  e.stream = stream;
  e.name = name;
  return e;
}

std::string_view PoolOpName(DeviceMemoryOp op) {
  switch (op) {
    case DeviceMemoryOp::kPoolCreated: return "created";
    case DeviceMemoryOp::kPoolDestroyed: return "destroyed";
    default: return "trimmed";
  }
}

}  // namespace

bool DeviceTimelineRecorder::Add(const DeviceMemoryRecord& r, const Attribution* caller) {
  if (r.op != DeviceMemoryOp::kAlloc && r.op != DeviceMemoryOp::kFree) {
    AddPool(r);
    return true;
  }
  if (!OnDevice(r.kind)) return false;
  const bool pooled = r.pool_address != 0;
  if (r.op == DeviceMemoryOp::kAlloc) {
    const std::uint32_t owner = sink_.Intern(caller != nullptr ? std::string_view(caller->path) : "");
    if (auto old = live_.find(r.address); old != live_.end()) live_bytes_ -= old->second.size;  // a missed free
    live_[r.address] = {r.bytes, owner, pooled};
    live_bytes_ += r.bytes;
    sink_.Append(MakeEvent(pooled ? EventType::kAlloc : EventType::kSegmentAlloc, Time(r.timestamp_ns), r.address,
                           r.bytes, r.stream, owner));
    return true;
  }
  const auto it = live_.find(r.address);
  if (it == live_.end()) return false;
  const Live live = it->second;
  live_.erase(it);
  live_bytes_ -= live.size;
  const std::int64_t time = Time(r.timestamp_ns);
  if (live.pooled) {
    sink_.Append(MakeEvent(EventType::kFreeRequested, time, r.address, live.size, r.stream, live.owner));
    sink_.Append(MakeEvent(EventType::kFreeCompleted, time, r.address, live.size, r.stream, live.owner));
  } else {
    sink_.Append(MakeEvent(EventType::kSegmentFree, time, r.address, live.size, r.stream, live.owner));
  }
  return true;
}

void DeviceTimelineRecorder::AddPool(const DeviceMemoryRecord& r) {
  const std::string text = absl::StrCat(std::string(kPoolMarkPrefix), std::string(PoolOpName(r.op)), " 0x", absl::Hex(r.address), " bytes ",
                                        r.bytes, " release_threshold ", r.release_threshold, " utilized ",
                                        r.utilized_bytes);
  sink_.Append(MakeEvent(EventType::kMark, Time(r.timestamp_ns), 0, 0, 0, sink_.Intern(text)));
}

void DeviceTimelineRecorder::Sample(std::uint64_t timestamp_ns, std::uint64_t used_bytes, std::string_view label) {
  const std::string text = absl::StrCat(std::string(kNvmlMarkPrefix), used_bytes, " ", std::string(label));
  sink_.Append(MakeEvent(EventType::kMark, Time(timestamp_ns), 0, 0, 0, sink_.Intern(text)));
}

namespace {

// The used bytes of an NVML mark's text, none for another mark.
std::optional<std::uint64_t> NvmlUsed(std::string_view text) {
  if (!text.starts_with(kNvmlMarkPrefix)) return std::nullopt;
  text.remove_prefix(kNvmlMarkPrefix.size());
  std::uint64_t used = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), used);
  if (ec != std::errc() || (end != text.data() + text.size() && *end != ' ')) return std::nullopt;
  return used;
}

// Live allocations while reading a device timeline.
struct UsageWalk {
  explicit UsageWalk(const absl::flat_hash_set<std::uint64_t>& segments) : pytorch_segments(segments) {}
  const absl::flat_hash_set<std::uint64_t>& pytorch_segments;
  DeviceUsage usage;
  absl::flat_hash_map<std::uint64_t, std::size_t> live;  // addr -> index in usage.ever
  std::array<std::uint64_t, kNumDeviceLibraries> by_library{};
  std::uint64_t total = 0;

  void Alloc(const Event& e, const std::string& owner, bool pooled) {
    if (auto old = live.find(e.addr); old != live.end()) Free(e.addr);
    const DeviceLibrary library =
        pytorch_segments.contains(e.addr) ? DeviceLibrary::kPytorchAllocator : ClassifyLibrary(owner);
    live[e.addr] = usage.ever.size();
    usage.ever.push_back({e.addr, e.size, owner, library, pooled});
    by_library[static_cast<std::size_t>(library)] += e.size;
    total += e.size;
    auto& peak = usage.peak_by_library[static_cast<std::size_t>(library)];
    peak = std::max(peak, by_library[static_cast<std::size_t>(library)]);
    usage.peak_bytes = std::max(usage.peak_bytes, total);
  }
  void Free(std::uint64_t addr) {
    const auto it = live.find(addr);
    if (it == live.end()) return;
    const DeviceAllocation& a = usage.ever[it->second];
    by_library[static_cast<std::size_t>(a.library)] -= a.size;
    total -= a.size;
    live.erase(it);
  }
  void Sample(std::uint64_t used) {
    ++usage.samples;
    usage.used_bytes = std::max(usage.used_bytes.value_or(0), used);
    const std::uint64_t overhead = used > total ? used - total : 0;
    usage.overhead_bytes = std::max(usage.overhead_bytes.value_or(0), overhead);
  }
};

}  // namespace

DeviceUsage ReadDeviceUsage(const Timeline& timeline, const absl::flat_hash_set<std::uint64_t>& pytorch_segments) {
  UsageWalk walk(pytorch_segments);
  walk.usage.device = timeline.device_index;
  for (const Event& e : timeline.events) {
    switch (e.type) {
      case EventType::kSegmentAlloc: walk.Alloc(e, timeline.str(e.name), false); break;
      case EventType::kAlloc: walk.Alloc(e, timeline.str(e.name), true); break;
      case EventType::kSegmentFree:
      case EventType::kFreeCompleted: walk.Free(e.addr); break;
      case EventType::kMark:
        if (const std::optional<std::uint64_t> used = NvmlUsed(timeline.str(e.name))) walk.Sample(*used);
        break;
      default: break;
    }
  }
  walk.usage.end_by_library = walk.by_library;
  return std::move(walk.usage);
}

}  // namespace memscope
