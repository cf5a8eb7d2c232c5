#include "importers/timeline_requests.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace memscope {

TimelineRequests RequestsFromTimeline(const Timeline& t, const std::string& source) {
  TimelineRequests out;
  RequestTrace& trace = out.trace;
  trace.source = source;
  absl::flat_hash_map<std::string, std::uint32_t> strings;
  auto intern = [&](const std::string& text) -> std::uint32_t {
    if (text.empty()) return 0;
    auto [it, inserted] = strings.try_emplace(text, static_cast<std::uint32_t>(trace.strings.size()));
    if (inserted) trace.strings.push_back(text);
    return it->second;
  };
  absl::flat_hash_map<std::uint64_t, std::uint32_t> live;  // block address -> slot
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const Event& e = t.events[i];
    Request r{};
    r.line = i + 1;
    switch (e.type) {
      case EventType::kAlloc:
      case EventType::kOom: {
        r.op = RequestOp::kAlloc;
        r.slot = static_cast<std::uint32_t>(trace.ids.size());
        trace.ids.push_back(absl::StrCat("event ", i));
        r.size = e.requested_size;
        r.stream = e.stream;
        if (e.type == EventType::kAlloc) {
          r.category = e.category;
          r.text = intern(t.str(e.name));
          live[e.addr] = r.slot;
        }
        break;
      }
      case EventType::kFreeRequested: {
        auto it = live.find(e.addr);
        if (it == live.end()) continue;  // a torn or inconsistent recording: the walk reports those
        r.op = RequestOp::kFree;
        r.slot = it->second;
        live.erase(it);
        // The free completes at once when its free_completed follows directly.
        const bool at_once = i + 1 < t.events.size() && t.events[i + 1].type == EventType::kFreeCompleted &&
                             t.events[i + 1].addr == e.addr;
        if (!at_once) ++out.delayed_frees;
        break;
      }
      case EventType::kEmptyCache: r.op = RequestOp::kEmptyCache; break;
      case EventType::kPhaseBegin:
      case EventType::kPhaseEnd:
        r.op = e.type == EventType::kPhaseBegin ? RequestOp::kPhaseBegin : RequestOp::kPhaseEnd;
        r.phase = e.phase;
        r.step = e.step();
        r.text = intern(t.str(e.name));
        break;
      case EventType::kMark:
        r.op = (e.flags & kEventTraceAnnotation) != 0 ? RequestOp::kAnnotate : RequestOp::kMark;
        r.text = intern(t.str(e.name));
        break;
      default: continue;  // the allocator's own decisions (segments, retries, syncs)
    }
    trace.requests.push_back(r);
  }
  return out;
}

}  // namespace memscope
