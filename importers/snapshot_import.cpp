#include "importers/snapshot_import.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "allocator/config.h"
#include "allocator/sizes.h"
#include "importers/pickle_reader.h"
#include "recording/timeline.h"

namespace memscope {
namespace {

// Builds one device's request trace from trace entries, in order.
struct DeviceBuilder {
  ImportedTrace out;
  std::vector<double> times;                               // time_us per request, for placing annotations
  absl::flat_hash_map<std::uint64_t, std::uint32_t> live;  // address -> slot
  absl::flat_hash_set<std::uint64_t> ever_allocated;
  std::uint64_t unknown_frees = 0;
  std::uint64_t ooms = 0;
  std::uint64_t skipped = 0;
  double last_time = 0;
  // A free_requested whose completion is not known yet: if the next entry is
  // its free_completed, the block was freed at once (a plain free); otherwise
  // it waited on stream events (record_stream) until its free_completed.
  struct Held {
    std::uint64_t addr;
    std::uint32_t slot;
    double time_us;
  };
  std::optional<Held> held;
  absl::flat_hash_map<std::uint64_t, StreamId> waiting;  // address -> its synthetic stream
  std::uint64_t delayed_frees = 0;

  // Each delayed free waits on a stream of its own, so that its
  // free_completed can complete exactly that block.
  static StreamId WaitStream(std::uint32_t slot) { return (StreamId{1} << 62) + slot; }

  // Decides the held free: plain if `completed_at_once`, else pending.
  void Release(bool completed_at_once) {
    if (!held) return;
    if (!completed_at_once) {
      const StreamId s = WaitStream(held->slot);
      Push(Request{RequestOp::kRecordStream, held->slot, 0, s, 0}, held->time_us);
      waiting[held->addr] = s;
      ++delayed_frees;
    }
    Push(Request{RequestOp::kFree, held->slot, 0, 0, 0}, held->time_us);
    held.reset();
  }

  std::uint32_t Slot(std::uint64_t addr) {
    out.requests.ids.push_back(absl::StrCat("0x", absl::Hex(addr)));
    return static_cast<std::uint32_t>(out.requests.ids.size() - 1);
  }
  void Push(Request r, double time_us) {
    r.line = out.requests.requests.size() + 1;  // the entry's position in the device trace
    out.requests.requests.push_back(r);
    times.push_back(time_us);
  }

  void Entry(const PyValue& e) {
    const std::string* action = e.Get("action") ? e.Get("action")->AsString() : nullptr;
    if (action == nullptr) {
      ++skipped;
      return;
    }
    const std::uint64_t addr = e.Get("addr") && e.Get("addr")->AsUInt() ? *e.Get("addr")->AsUInt() : 0;
    const std::uint64_t size = e.Get("size") && e.Get("size")->AsUInt() ? *e.Get("size")->AsUInt() : 0;
    const std::uint64_t stream = e.Get("stream") && e.Get("stream")->AsUInt() ? *e.Get("stream")->AsUInt() : 0;
    double time_us = last_time;
    if (const PyValue* t = e.Get("time_us")) {
      if (t->kind == PyValue::Kind::kFloat) time_us = t->f;
      if (t->AsInt()) time_us = static_cast<double>(*t->AsInt());
    }
    last_time = time_us;
    if (held) {
      const bool completes_held = *action == "free_completed" && addr == held->addr;
      Release(completes_held);
      if (completes_held) return;
    }
    if (*action == "alloc") {
      if (auto it = live.find(addr); it != live.end()) {  // a free the trace lost
        Request f{RequestOp::kFree, it->second, 0, 0, 0};
        Push(f, time_us);
        live.erase(it);
      }
      Request r{RequestOp::kAlloc, Slot(addr), size, stream, 0};
      live[addr] = r.slot;
      ever_allocated.insert(addr);
      Push(r, time_us);
    } else if (*action == "free_requested") {
      auto it = live.find(addr);
      if (it == live.end()) {
        ++unknown_frees;
        return;
      }
      held = Held{addr, it->second, time_us};
      live.erase(it);
    } else if (*action == "free_completed") {
      if (auto w = waiting.find(addr); w != waiting.end()) {
        Push(Request{RequestOp::kSync, 0, 0, w->second, 0}, time_us);
        waiting.erase(w);
      }
    } else if (*action == "segment_alloc") {
      out.segment_alloc_sizes.push_back(size);
    } else if (*action == "oom") {
      ++ooms;
    } else if (*action != "segment_free" && *action != "segment_map" && *action != "segment_unmap" &&
               *action != "snapshot") {
      ++skipped;
    }
  }
};

// "forward:0" and "model" are memscope's own names; anything else is a user phase.
void AnnotationPhase(const std::string& name, Request& r, RequestTrace& trace) {
  const std::size_t colon = name.rfind(':');
  std::int64_t step = kNoStep;
  std::string base = name;
  if (colon != std::string::npos && absl::SimpleAtoi(name.substr(colon + 1), &step) && step >= 0) {
    base = name.substr(0, colon);
  } else {
    step = kNoStep;
  }
  if (std::optional<Phase> p = ParsePhase(base); p && *p != Phase::kUser) {
    r.phase = *p;
    r.step = step;
    return;
  }
  r.phase = Phase::kUser;
  r.step = kNoStep;
  trace.strings.push_back(name);
  r.text = static_cast<std::uint32_t>(trace.strings.size() - 1);
}

std::string SettingsText(const PyValue* settings) {
  if (settings == nullptr || settings->kind != PyValue::Kind::kDict) return "";
  if (const PyValue* text = settings->Get("PYTORCH_CUDA_ALLOC_CONF"); text && text->AsString()) {
    // Accept it only if memscope can parse it (PyTorch may list keys memscope refuses).
    if (AllocatorConfig::Parse(*text->AsString()).ok()) return *text->AsString();
  }
  std::vector<std::string> parts;
  if (const PyValue* m = settings->Get("max_split_size"); m && m->AsInt() && *m->AsInt() > 0) {
    const std::int64_t mb = *m->AsInt() / static_cast<std::int64_t>(kMiB);
    if (mb >= 20 && mb < (std::int64_t{1} << 40)) parts.push_back(absl::StrCat("max_split_size_mb:", mb));
  }
  if (const PyValue* e = settings->Get("expandable_segments"); e && e->kind == PyValue::Kind::kBool && e->b) {
    parts.push_back("expandable_segments:True");
  }
  if (const PyValue* g = settings->Get("garbage_collection_threshold");
      g && g->kind == PyValue::Kind::kFloat && g->f > 0 && g->f < 1) {
    parts.push_back(absl::StrCat("garbage_collection_threshold:", g->f));
  }
  return absl::StrJoin(parts, ",");
}

}  // namespace

absl::StatusOr<std::vector<ImportedTrace>> ReadPytorchSnapshot(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::map<int, DeviceBuilder> devices;
  PickleReadOptions options;
  options.stream_list = [](const PicklePath& p) {
    return p.size() == 2 && p[0] == "device_traces" && p[1].size() > 2 && p[1].front() == '[';
  };
  options.on_item = [&](const PicklePath& p, PyValue&& item) -> absl::Status {
    int device = 0;
    if (!absl::SimpleAtoi(p[1].substr(1, p[1].size() - 2), &device) || device < 0 ||
        device > kMaxTimelineDeviceIndex) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": bad device_traces index ", p[1]));
    }
    DeviceBuilder& b = devices[device];
    b.out.device = device;
    b.Entry(item);
    return absl::OkStatus();
  };
  absl::StatusOr<PyValue> root = ReadPickle(in, path, options);
  if (!root.ok()) return root.status();
  if (root->kind == PyValue::Kind::kList) {
    return absl::FailedPreconditionError(absl::StrCat(
        path,
        ": a PyTorch 1.13 snapshot (a list of segments) has no trace of requests to replay; record one with "
        "torch.cuda.memory._record_memory_history() on PyTorch 2.x"));
  }
  if (root->kind != PyValue::Kind::kDict || root->Get("segments") == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a PyTorch memory snapshot (expected a dict with \"segments\" and \"device_traces\")"));
  }
  const std::string settings = SettingsText(root->Get("allocator_settings"));

  // Blocks alive at the snapshot that the trace never allocated were
  // allocated before the trace began: they start the replay.
  std::map<int, std::vector<std::pair<std::uint64_t, std::uint64_t>>> preexisting;  // device -> (addr, size)
  if (const PyValue* segments = root->Get("segments"); segments && segments->kind == PyValue::Kind::kList) {
    for (const PyValue& seg : segments->items) {
      const int device =
          seg.Get("device") && seg.Get("device")->AsInt() ? static_cast<int>(*seg.Get("device")->AsInt()) : 0;
      const PyValue* blocks = seg.Get("blocks");
      if (blocks == nullptr) continue;
      for (const PyValue& block : blocks->items) {
        const std::string* state = block.Get("state") ? block.Get("state")->AsString() : nullptr;
        if (state == nullptr || *state != "active_allocated") continue;
        const std::uint64_t addr =
            block.Get("address") && block.Get("address")->AsUInt() ? *block.Get("address")->AsUInt() : 0;
        std::uint64_t size = block.Get("requested_size") && block.Get("requested_size")->AsUInt()
                                 ? *block.Get("requested_size")->AsUInt()
                                 : 0;
        if (size == 0 && block.Get("size") && block.Get("size")->AsUInt()) size = *block.Get("size")->AsUInt();
        preexisting[device].emplace_back(addr, size);
      }
    }
  }

  std::vector<ImportedTrace> result;
  for (auto& [device, b] : devices) {
    b.Release(/*completed_at_once=*/false);  // the trace ended before its free completed
    ImportedTrace& t = b.out;
    t.alloc_conf = settings;
    t.requests.source = absl::StrCat(path, " (device ", device, ")");
    // Preexisting blocks first, in address order.
    std::vector<Request> head;
    for (const auto& [addr, size] : preexisting[device]) {
      if (b.ever_allocated.contains(addr)) continue;
      head.push_back(Request{RequestOp::kAlloc, b.Slot(addr), size, 0, 0});
    }
    if (!head.empty() || b.unknown_frees > 0) {
      t.notes.push_back(absl::StrCat("the trace of device ", device,
                                     " does not start at the beginning of the program (PyTorch's ring buffer "
                                     "dropped its head): ",
                                     head.size(),
                                     " blocks alive at the snapshot but allocated before the trace start "
                                     "the replay; ",
                                     b.unknown_frees, " frees of earlier blocks were ignored"));
    }
    // Annotations (record_function scopes, memscope's phase marks) as phase marks, placed by time.
    std::vector<std::pair<double, Request>> marks;
    if (const PyValue* ann = root->Get("external_annotations"); ann && ann->kind == PyValue::Kind::kList) {
      for (const PyValue& a : ann->items) {
        const std::string* name = a.Get("name") ? a.Get("name")->AsString() : nullptr;
        const std::string* stage = a.Get("stage") ? a.Get("stage")->AsString() : nullptr;
        const std::int64_t dev = a.Get("device") && a.Get("device")->AsInt() ? *a.Get("device")->AsInt() : 0;
        if (name == nullptr || stage == nullptr || dev != device) continue;
        double time_us = 0;
        if (const PyValue* tv = a.Get("time_us"))
          time_us = tv->kind == PyValue::Kind::kFloat ? tv->f : tv->AsInt() ? static_cast<double>(*tv->AsInt()) : 0;
        Request r{*stage == "START" ? RequestOp::kPhaseBegin : RequestOp::kPhaseEnd, 0, 0, 0, 0};
        AnnotationPhase(*name, r, t.requests);
        marks.emplace_back(time_us, r);
      }
    }
    std::stable_sort(marks.begin(), marks.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<Request> merged = head;
    std::size_t m = 0;
    for (std::size_t i = 0; i < t.requests.requests.size(); ++i) {
      // A scope's START goes before the entries of its microsecond, its END after them.
      while (m < marks.size() && (marks[m].second.op == RequestOp::kPhaseBegin ? marks[m].first <= b.times[i]
                                                                               : marks[m].first < b.times[i])) {
        merged.push_back(marks[m++].second);
      }
      merged.push_back(t.requests.requests[i]);
    }
    while (m < marks.size()) merged.push_back(marks[m++].second);
    t.requests.requests = std::move(merged);
    if (b.ooms > 0) t.notes.push_back(absl::StrCat("the trace of device ", device, " records ", b.ooms, " OOM(s)"));
    if (b.skipped > 0) t.notes.push_back(absl::StrCat(b.skipped, " trace entries of unknown kinds were skipped"));
    if (b.delayed_frees > 0) {
      t.notes.push_back(absl::StrCat(b.delayed_frees, " frees of device ", device,
                                     " completed later than requested "
                                     "(blocks used on other streams): they wait on stream events in the replay too"));
    }
    result.push_back(std::move(t));
  }
  if (result.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path,
        ": the snapshot has no trace entries (record with torch.cuda.memory._record_memory_history() before "
        "taking it)"));
  }
  return result;
}

absl::StatusOr<std::vector<Timeline>> ReadPytorchSnapshotState(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  PickleReadOptions options;  // the trace, if any, is not needed: stream and drop it
  options.stream_list = [](const PicklePath& p) { return p.size() == 2 && p[0] == "device_traces"; };
  options.on_item = [](const PicklePath&, PyValue&&) { return absl::OkStatus(); };
  absl::StatusOr<PyValue> root = ReadPickle(in, path, options);
  if (!root.ok()) return root.status();
  const PyValue* segments = root->kind == PyValue::Kind::kList ? &*root : root->Get("segments");
  if (segments == nullptr || segments->kind != PyValue::Kind::kList) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a PyTorch memory snapshot (no segments)"));
  }
  auto uint = [](const PyValue& v, const char* key) -> std::uint64_t {
    const PyValue* x = v.Get(key);
    return x != nullptr && x->AsUInt() ? *x->AsUInt() : 0;
  };
  // Segments in address order, per device.
  std::map<int, std::vector<const PyValue*>> by_device;
  for (const PyValue& seg : segments->items) {
    if (seg.kind != PyValue::Kind::kDict) continue;
    const std::uint64_t device = uint(seg, "device");
    if (device > static_cast<std::uint64_t>(kMaxTimelineDeviceIndex)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": segment of device ", device, " (at most ",
                                                     kMaxTimelineDeviceIndex, " devices are read)"));
    }
    by_device[static_cast<int>(device)].push_back(&seg);
  }
  std::string settings;
  if (root->kind == PyValue::Kind::kDict) settings = SettingsText(root->Get("allocator_settings"));
  std::vector<Timeline> timelines;
  for (auto& [device, segs] : by_device) {
    std::sort(segs.begin(), segs.end(),
              [&](const PyValue* a, const PyValue* b) { return uint(*a, "address") < uint(*b, "address"); });
    Timeline t;
    t.rank = device;
    t.device_index = device;
    t.alloc_conf = settings;
    for (const PyValue* seg : segs) {
      const std::string* type = seg->Get("segment_type") ? seg->Get("segment_type")->AsString() : nullptr;
      const bool expandable = seg->Get("is_expandable") && seg->Get("is_expandable")->kind == PyValue::Kind::kBool &&
                              seg->Get("is_expandable")->b;
      Event e;
      e.type = expandable ? EventType::kSegmentMap : EventType::kSegmentAlloc;
      e.set_small_pool(type != nullptr && *type == "small");
      e.addr = uint(*seg, "address");
      e.size = uint(*seg, "total_size");
      e.stream = uint(*seg, "stream");
      t.events.push_back(e);
      const PyValue* blocks = seg->Get("blocks");
      std::uint64_t cursor = e.addr;
      for (const PyValue& block : blocks != nullptr ? blocks->items : std::vector<PyValue>{}) {
        const std::uint64_t size = uint(block, "size");
        const std::uint64_t addr = block.Get("address") ? uint(block, "address") : cursor;
        cursor = addr + size;
        const std::string* state = block.Get("state") ? block.Get("state")->AsString() : nullptr;
        if (state == nullptr || *state == "inactive") continue;
        std::uint64_t requested = uint(block, "requested_size");
        if (const PyValue* history = block.Get("history"); requested == 0 && history && !history->items.empty()) {
          requested = uint(history->items.back(), "real_size");  // 1.13
        }
        Event a;
        a.type = EventType::kAlloc;
        a.set_small_pool(e.small_pool());
        a.addr = addr;
        a.size = size;
        a.requested_size = requested != 0 ? requested : size;
        a.stream = e.stream;
        t.events.push_back(a);
        if (*state == "active_pending_free") {
          a.type = EventType::kFreeRequested;
          t.events.push_back(a);
        }
      }
    }
    t.notes.push_back(absl::StrCat(path, " has no trace of device ", device, ": showing the state of its ", segs.size(),
                                   " segments at the snapshot (exact blocks, no history)"));
    timelines.push_back(std::move(t));
  }
  if (timelines.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": the snapshot has no segments"));
  return timelines;
}

absl::StatusOr<RequestTrace> ReadRmmCsv(std::istream& in, const std::string& source) {
  RequestTrace t;
  t.source = source;
  std::string line;
  std::uint64_t line_no = 0;
  absl::flat_hash_map<std::string, std::uint32_t> live;
  auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", what));
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1) {
      if (line.rfind("Thread,Time,Action,Pointer,Size,Stream", 0) != 0) {
        return error("expected RMM's header Thread,Time,Action,Pointer,Size,Stream");
      }
      continue;
    }
    if (line.empty()) continue;
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() < 6) return error("expected 6 comma-separated fields");
    const std::string action(absl::StripAsciiWhitespace(f[2]));
    const std::string pointer(absl::StripAsciiWhitespace(f[3]));
    std::uint64_t size = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(f[4]), &size)) return error("bad Size '" + f[4] + "'");
    std::uint64_t stream = 0;
    std::string stream_text(absl::StripAsciiWhitespace(f[5]));
    if (absl::StartsWith(stream_text, "0x")) {
      if (!absl::SimpleHexAtoi(stream_text.substr(2), &stream)) return error("bad Stream '" + stream_text + "'");
    } else if (!absl::SimpleAtoi(stream_text, &stream)) {
      return error("bad Stream '" + stream_text + "'");
    }
    Request r{RequestOp::kAlloc, 0, size, stream, line_no};
    if (action == "allocate") {
      if (live.contains(pointer)) return error("allocate of " + pointer + ", which is already allocated");
      t.ids.push_back(pointer);
      r.slot = static_cast<std::uint32_t>(t.ids.size() - 1);
      live[pointer] = r.slot;
    } else if (action == "free") {
      auto it = live.find(pointer);
      if (it == live.end()) return error("free of " + pointer + ", which was not allocated");
      r.op = RequestOp::kFree;
      r.slot = it->second;
      live.erase(it);
    } else if (action == "allocate failure") {
      continue;
    } else {
      return error("unknown Action '" + action + "' (expected allocate, free or allocate failure)");
    }
    t.requests.push_back(r);
  }
  return t;
}

absl::StatusOr<InputKind> DetectInput(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return InputKind::kDirectory;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  char head[40] = {};
  in.read(head, sizeof head);
  const std::string_view bytes(head, static_cast<std::size_t>(in.gcount()));
  if (!bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80) return InputKind::kPickle;
  if (bytes.size() >= 8 && bytes.substr(0, 8) == std::string_view(kTimelineMagic, 8)) return InputKind::kTimeline;
  if (bytes.rfind("Thread,Time,Action", 0) == 0) return InputKind::kRmmCsv;
  const std::size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && (bytes[first] == '{' || bytes[first] == '#')) return InputKind::kJsonl;
  return InputKind::kUnknown;
}

}  // namespace memscope
