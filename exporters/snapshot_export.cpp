#include "exporters/snapshot_export.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "allocator/config.h"
#include "allocator/sizes.h"
#include "allocator/snapshot.h"
#include "base/json_writer.h"
#include "exporters/json_double.h"
#include "exporters/pickle_writer.h"

namespace memscope {
namespace {

std::int64_t TimeUs(const Timeline& timeline, const Event& e) { return timeline.wall_start_us + e.time_ns / 1000; }

// Whether an event is one of the actions of PyTorch's device traces.
bool IsPytorchTraceAction(EventType t) { return ChangesMemory(t) || t == EventType::kOom; }

// "forward:3", "model" (before the first step), a user phase by its label;
// torch.profiler's step scope as PyTorch names it, "ProfilerStep#3".
std::string AnnotationName(const Timeline& timeline, const Event& e) {
  if (e.phase == Phase::kUser && e.step() != kNoStep && timeline.str(e.name) == "ProfilerStep") {
    return absl::StrCat("ProfilerStep#", e.step());
  }
  return PhaseMarkName(e.phase, e.step(), timeline.str(e.name), e.micro_batch());
}

template <typename W>
class SnapshotWriter {
 public:
  SnapshotWriter(W& w, const Timeline& timeline) : w_(w), timeline_(timeline) {
    for (int c = 0; c < kNumCategories; ++c) {
      category_frame_names_[static_cast<std::size_t>(c)] =
          absl::StrCat("memscope ", std::string(CategoryName(static_cast<Category>(c))));
    }
  }

  void Write(const TraceModel& model, std::size_t events_until, std::size_t max_entries) {
    // The tags of the blocks alive at the snapshot, for their frames. A
    // segment_alloc or segment_map takes the tag of the allocation that made
    // it (the next alloc: the allocator records both inside one call), as
    // PyTorch gives them, and the segment, the context of that cudaMalloc
    // (context_when_segment_allocated; for an expandable segment, the map
    // that starts its mapped range).
    std::vector<std::size_t> waiting;  // segment events before their alloc
    for (std::size_t i = 0; i < events_until; ++i) {
      const Event& e = timeline_.events[i];
      switch (e.type) {
        case EventType::kAlloc: {
          const Tag tag{e.category, e.name, timeline_.stack_of(i)};
          live_tags_[e.addr] = tag;
          for (const std::size_t s : waiting) {
            const Event& segment = timeline_.events[s];
            segment_entry_tags_[s] = tag;
            if (segment.type == EventType::kSegmentAlloc || !segment_tags_.contains(segment.addr)) {
              segment_tags_[segment.addr] = tag;
            }
          }
          waiting.clear();
          break;
        }
        case EventType::kFreeCompleted: live_tags_.erase(e.addr); break;
        case EventType::kSegmentAlloc:
        case EventType::kSegmentMap: waiting.push_back(i); break;
        case EventType::kSegmentFree:
        case EventType::kSegmentUnmap: segment_tags_.erase(e.addr); break;
        case EventType::kOom: waiting.clear(); break;
        default: break;
      }
    }
    w_.BeginDict();
    Key("segments");
    w_.BeginList();
    for (const SegmentInfo& segment : model.Snapshot(timeline_.device_index, timeline_.pools)) WriteSegment(segment);
    w_.EndList();

    Key("device_traces");
    w_.BeginList();
    for (int device = 0; device < timeline_.device_index; ++device) {
      w_.BeginList();
      w_.EndList();
    }
    w_.BeginList();
    // A ring buffer of max_entries, as _record_memory_history(max_entries=N):
    // only the last entries are kept.
    std::size_t skip = 0;
    if (max_entries != 0) {
      std::size_t n = 0;
      for (std::size_t i = 0; i < events_until; ++i) n += IsPytorchTraceAction(timeline_.events[i].type) ? 1 : 0;
      skip = n > max_entries ? n - max_entries : 0;
    }
    for (std::size_t i = 0; i < events_until; ++i) {
      const Event& e = timeline_.events[i];
      if (!IsPytorchTraceAction(e.type)) continue;
      // The stack of each live allocation, for its alloc and free entries.
      if (e.type == EventType::kAlloc) {
        if (const std::uint32_t stack = timeline_.stack_of(i); stack != 0) {
          trace_stacks_[e.addr] = stack;
        } else {
          trace_stacks_.erase(e.addr);
        }
      }
      if (skip > 0) {
        --skip;
      } else {
        WriteTraceEntry(e);
      }
      if (e.type == EventType::kFreeCompleted) trace_stacks_.erase(e.addr);
    }
    w_.EndList();
    w_.EndList();

    Key("allocator_settings");
    WriteAllocatorSettings();

    Key("external_annotations");
    w_.BeginList();
    for (std::size_t i = 0; i < events_until; ++i) {
      const Event& e = timeline_.events[i];
      switch (e.type) {
        case EventType::kPhaseBegin: WriteAnnotation(AnnotationName(timeline_, e), "START", e); break;
        case EventType::kPhaseEnd: WriteAnnotation(AnnotationName(timeline_, e), "END", e); break;
        case EventType::kMark: WriteAnnotation(timeline_.str(e.name), "START", e); break;
        default: break;
      }
    }
    w_.EndList();
    w_.EndDict();
  }

 private:
  struct Tag {
    Category category;
    std::uint32_t owner, stack;
  };
  void Key(std::string_view key) { w_.Key(key); }
  // PickleWriter's BINFLOAT, or nlohmann's text in JSON (exporters/json_double.h).
  void Float(double v) {
    if constexpr (kPickle) {
      w_.Float(v);
    } else {
      WriteJsonDouble(w_, v);
    }
  }
  void EmptyFrames() {
    Key("frames");
    w_.BeginList();
    w_.EndList();
  }
  // An allocation's frames: those of its stack when it was read from a
  // PyTorch snapshot, written back unchanged; otherwise (memscope records no
  // stacks) one frame made of its owner (as the file name) and category, so
  // that PyTorch's viewers show who allocated, and memscope reads both back
  // (docs/snapshot-format.md).
  void TagFrames(Category category, std::uint32_t owner, std::uint32_t stack) {
    Key("frames");
    if constexpr (kPickle) {
      const FramesBytes& bytes = PickledFrames(category, owner, stack);
      if (bytes.ok) {
        if (char* p = w_.BeginRawValue(bytes.bytes.size())) {
          w_.EndRawValue(Put(p, bytes.bytes));
          return;
        }
      }
    }
    w_.BeginList();
    if (stack != 0 && stack < timeline_.stacks.size()) {
      for (const std::uint32_t id : timeline_.stacks[stack].frames) {
        const StackFrame& f = timeline_.stack_frames[id];
        WriteFrame(f.filename, f.line, f.name);
      }
    } else {
      const std::string& text = timeline_.str(owner);
      WriteFrame(text.empty() ? std::string_view("??") : std::string_view(text), 0, FrameName(category));
    }
    w_.EndList();
  }

  // CategoryName's, which calls an unknown category OTHER.
  std::string_view FrameName(Category c) const {
    const auto i = static_cast<std::size_t>(c);
    return category_frame_names_[i < category_frame_names_.size() ? i : static_cast<std::size_t>(Category::kOther)];
  }

  void WriteFrame(std::string_view filename, std::int64_t line, std::string_view name) {
    w_.BeginDict();
    Key("filename");
    w_.String(filename);
    Key("line");
    w_.Int(line);
    Key("name");
    w_.String(name);
    w_.EndDict();
  }

  void WriteSegment(const SegmentInfo& s) {
    w_.BeginDict();
    Key("device");
    w_.Int(s.device);
    Key("address");
    w_.UInt(s.address);
    Key("total_size");
    w_.UInt(s.total_size);
    Key("allocated_size");
    w_.UInt(s.allocated_size);
    Key("active_size");
    w_.UInt(s.active_size);
    Key("requested_size");
    w_.UInt(s.requested_size);
    Key("stream");
    w_.UInt(s.stream);
    Key("segment_type");
    w_.String(s.is_large ? "large" : "small");
    // (0, 0) is the default pool; a replayed snapshot's private pools keep their ids.
    Key("segment_pool_id");
    w_.BeginTuple(2);
    w_.UInt(s.pool_id.first);
    w_.UInt(s.pool_id.second);
    w_.EndTuple();
    Key("is_expandable");
    w_.Bool(s.is_expandable);
    if (const auto it = segment_tags_.find(s.address); it != segment_tags_.end()) {
      TagFrames(it->second.category, it->second.owner, it->second.stack);
    } else {
      EmptyFrames();
    }
    Key("blocks");
    w_.BeginList();
    for (const BlockInfo& b : s.blocks) {
      if constexpr (kPickle) {
        if (WriteBlockRaw(b)) continue;
      }
      w_.BeginDict();
      Key("address");
      w_.UInt(b.address);
      Key("size");
      w_.UInt(b.size);
      Key("requested_size");
      w_.UInt(b.requested_size);
      Key("state");
      w_.String(BlockStateName(b.state));
      if (auto it = live_tags_.find(b.address); b.state != BlockState::kInactive && it != live_tags_.end()) {
        TagFrames(it->second.category, it->second.owner, it->second.stack);
      } else {
        EmptyFrames();
      }
      w_.EndDict();
    }
    w_.EndList();
    w_.EndDict();
  }

  void WriteTraceEntry(const Event& e) {
    if constexpr (kPickle) {
      if (WriteTraceEntryRaw(e)) return;
    }
    const bool segment_event = e.type == EventType::kSegmentAlloc || e.type == EventType::kSegmentFree ||
                               e.type == EventType::kSegmentMap || e.type == EventType::kSegmentUnmap;
    w_.BeginDict();
    Key("action");
    w_.String(EventTypeName(e.type));
    // PyTorch's oom entry reuses the address slot for cudaMemGetInfo's free
    // bytes, under its own key.
    const bool oom = e.type == EventType::kOom;
    Key(oom ? "device_free" : "addr");
    w_.UInt(oom ? e.device_free() : e.addr);
    // PyTorch records what the caller asked for (alloc, free, oom) and the
    // device allocation's size for segment events.
    Key("size");
    w_.UInt(segment_event ? e.size : e.requested_size);
    Key("stream");
    w_.UInt(e.stream);
    Key("time_us");
    w_.Int(TimeUs(timeline_, e));
    if (e.pool() != 0) {  // a private pool's entry: its pool, as PyTorch's newer traces write on every entry
      const PoolId pool = e.pool() < timeline_.pools.size() ? timeline_.pools[e.pool()] : PoolId{};
      Key("pool_id");
      w_.BeginTuple(2);
      w_.UInt(pool.first);
      w_.UInt(pool.second);
      w_.EndTuple();
    }
    if (e.type == EventType::kAlloc || e.type == EventType::kFreeRequested || e.type == EventType::kFreeCompleted) {
      // A free carries the frames of its allocation (memscope keeps no stack of the free itself).
      const auto it = trace_stacks_.find(e.addr);
      TagFrames(e.category, e.name, it == trace_stacks_.end() ? 0 : it->second);
    } else if (const Tag* tag = SegmentEntryTag(e)) {
      TagFrames(tag->category, tag->owner, tag->stack);
    } else {
      EmptyFrames();
    }
    w_.EndDict();
  }

  // The tag of the allocation that made a segment_alloc or segment_map
  // entry (the event being written), or null.
  const Tag* SegmentEntryTag(const Event& e) const {
    if (e.type != EventType::kSegmentAlloc && e.type != EventType::kSegmentMap) return nullptr;
    const auto it = segment_entry_tags_.find(static_cast<std::size_t>(&e - timeline_.events.data()));
    return it == segment_entry_tags_.end() ? nullptr : &it->second;
  }

  void WriteAllocatorSettings() {
    // Settings text memscope could not parse still identifies the run, so it
    // is kept; the values then are the defaults (Timeline::settings).
    const AllocatorConfig& config = timeline_.settings;
    w_.BeginDict();
    Key("PYTORCH_CUDA_ALLOC_CONF");
    w_.String(timeline_.alloc_conf);
    // PyTorch casts SIZE_MAX ("unlimited") to int64: -1.
    Key("max_split_size");
    w_.Int(config.max_split_size_unlimited() ? -1 : static_cast<std::int64_t>(config.max_split_size));
    Key("max_non_split_rounding_size");
    w_.UInt(config.max_non_split_rounding_size);
    Key("garbage_collection_threshold");
    Float(config.garbage_collection_threshold);
    Key("expandable_segments");
    w_.Bool(config.expandable_segments);
    // Keyed by the start of each power-of-two interval in MB, as PyTorch.
    Key("roundup_power2_divisions");
    w_.BeginDict();
    for (std::size_t i = 0; i < kRoundUpPowerOfTwoIntervals; ++i) {
      Key(std::to_string(std::uint64_t{1} << i));
      w_.UInt(config.roundup_power2_divisions[i]);
    }
    w_.EndDict();
    w_.EndDict();
  }

  void WriteAnnotation(std::string_view name, std::string_view stage, const Event& e) {
    w_.BeginDict();
    Key("name");
    w_.String(name);
    Key("stage");
    w_.String(stage);
    Key("device");
    w_.Int(timeline_.device_index);
    Key("time_us");
    w_.Int(TimeUs(timeline_, e));
    w_.EndDict();
  }

  // The pickle's fast path: trace entries, blocks and frame lists written as
  // raw bytes, exactly those the calls above write (PickleWriter's raw
  // values), the frames of each stack (or category and owner) pickled once.
  static constexpr bool kPickle = std::is_same_v<W, PickleWriter>;
  struct FramesBytes {
    std::string bytes;
    bool ok = true;  // false: a string too long to pickle (the ordinary path reports it)
  };
  static char* Put(char* p, std::string_view bytes) {
    std::memcpy(p, bytes.data(), bytes.size());
    return p + bytes.size();
  }
  // A dict key, a short ASCII string: its SHORT_BINUNICODE bytes.
  static char* PutKey(char* p, std::string_view key) { return PickleWriter::EncodeShortString(p, key); }

  const FramesBytes& PickledFrames(Category category, std::uint32_t owner, std::uint32_t stack) {
    const bool has_stack = stack != 0 && stack < timeline_.stacks.size();
    const std::uint64_t key =
        has_stack ? (std::uint64_t{1} << 63) | stack : (static_cast<std::uint64_t>(category) << 32) | owner;
    auto [it, inserted] = frames_bytes_.try_emplace(key);
    if (!inserted) return it->second;
    FramesBytes& f = it->second;
    // As BeginList, a dict per frame, EndList write them: batches of
    // PickleWriter::kBatchSize items, each MARK ... APPENDS.
    std::string& b = f.bytes;
    b += static_cast<char>(0x5d);  // EMPTY_LIST
    std::size_t n = 0;
    const auto frame = [&](std::string_view filename, std::int64_t line, std::string_view name) {
      if (n % PickleWriter::kBatchSize == 0) b += static_cast<char>(0x28);  // MARK
      b += static_cast<char>(0x7d);                                         // EMPTY_DICT
      b += static_cast<char>(0x28);                                         // MARK
      f.ok = f.ok && PickleWriter::AppendString(b, "filename") && PickleWriter::AppendString(b, filename) &&
             PickleWriter::AppendString(b, "line");
      char num[PickleWriter::kMaxIntBytes];
      b.append(num, static_cast<std::size_t>(PickleWriter::EncodeInt(num, line) - num));
      f.ok = f.ok && PickleWriter::AppendString(b, "name") && PickleWriter::AppendString(b, name);
      b += static_cast<char>(0x75);                                           // SETITEMS
      if (++n % PickleWriter::kBatchSize == 0) b += static_cast<char>(0x65);  // APPENDS
    };
    if (has_stack) {
      for (const std::uint32_t id : timeline_.stacks[stack].frames) {
        const StackFrame& fr = timeline_.stack_frames[id];
        frame(fr.filename, fr.line, fr.name);
      }
    } else {
      const std::string& text = timeline_.str(owner);
      frame(text.empty() ? std::string_view("??") : std::string_view(text), 0, FrameName(category));
    }
    if (n % PickleWriter::kBatchSize != 0) b += static_cast<char>(0x65);  // APPENDS
    return f;
  }

  // WriteTraceEntry's dict as raw bytes; false: write it the ordinary way.
  bool WriteTraceEntryRaw(const Event& e) {
    if (e.pool() != 0) return false;  // a private pool's entry carries pool_id: the general path
    const bool tagged =
        e.type == EventType::kAlloc || e.type == EventType::kFreeRequested || e.type == EventType::kFreeCompleted;
    const FramesBytes* frames = &kNoFrames;
    if (tagged) {
      const auto it = trace_stacks_.find(e.addr);
      frames = &PickledFrames(e.category, e.name, it == trace_stacks_.end() ? 0 : it->second);
    } else if (const Tag* tag = SegmentEntryTag(e)) {
      frames = &PickledFrames(tag->category, tag->owner, tag->stack);
    }
    const std::string_view action = EventTypeName(e.type);
    if (!frames->ok || action.size() >= 256) return false;
    char* p = w_.BeginRawValue(128 + action.size() + frames->bytes.size());
    if (p == nullptr) return false;
    const bool segment_event = e.type == EventType::kSegmentAlloc || e.type == EventType::kSegmentFree ||
                               e.type == EventType::kSegmentMap || e.type == EventType::kSegmentUnmap;
    const bool oom = e.type == EventType::kOom;
    *p++ = static_cast<char>(0x7d);  // EMPTY_DICT
    *p++ = static_cast<char>(0x28);  // MARK
    p = PickleWriter::EncodeShortString(PutKey(p, "action"), action);
    p = PickleWriter::EncodeUInt(PutKey(p, oom ? "device_free" : "addr"), oom ? e.device_free() : e.addr);
    p = PickleWriter::EncodeUInt(PutKey(p, "size"), segment_event ? e.size : e.requested_size);
    p = PickleWriter::EncodeUInt(PutKey(p, "stream"), e.stream);
    p = PickleWriter::EncodeInt(PutKey(p, "time_us"), TimeUs(timeline_, e));
    p = Put(PutKey(p, "frames"), frames->bytes);
    *p++ = static_cast<char>(0x75);  // SETITEMS
    w_.EndRawValue(p);
    return true;
  }

  // A block's dict of WriteSegment as raw bytes; false: the ordinary way.
  bool WriteBlockRaw(const BlockInfo& b) {
    const FramesBytes* frames = &kNoFrames;
    if (auto it = live_tags_.find(b.address); b.state != BlockState::kInactive && it != live_tags_.end()) {
      frames = &PickledFrames(it->second.category, it->second.owner, it->second.stack);
    }
    const std::string_view state = BlockStateName(b.state);
    if (!frames->ok || state.size() >= 256) return false;
    char* p = w_.BeginRawValue(128 + state.size() + frames->bytes.size());
    if (p == nullptr) return false;
    *p++ = static_cast<char>(0x7d);  // EMPTY_DICT
    *p++ = static_cast<char>(0x28);  // MARK
    p = PickleWriter::EncodeUInt(PutKey(p, "address"), b.address);
    p = PickleWriter::EncodeUInt(PutKey(p, "size"), b.size);
    p = PickleWriter::EncodeUInt(PutKey(p, "requested_size"), b.requested_size);
    p = PickleWriter::EncodeShortString(PutKey(p, "state"), state);
    p = Put(PutKey(p, "frames"), frames->bytes);
    *p++ = static_cast<char>(0x75);  // SETITEMS
    w_.EndRawValue(p);
    return true;
  }

  inline static const FramesBytes kNoFrames{std::string(1, static_cast<char>(0x5d)), true};  // []
  absl::flat_hash_map<std::uint64_t, FramesBytes> frames_bytes_;

  W& w_;
  const Timeline& timeline_;
  std::array<std::string, kNumCategories> category_frame_names_;    // "memscope ACTIVATION": a frame's name
  absl::flat_hash_map<std::uint64_t, Tag> live_tags_;               // address -> tag of the blocks at the snapshot
  absl::flat_hash_map<std::uint64_t, Tag> segment_tags_;            // segment address -> tag of the alloc that made it
  absl::flat_hash_map<std::size_t, Tag> segment_entry_tags_;  // event index of a segment_alloc/map -> its alloc's tag
  absl::flat_hash_map<std::uint64_t, std::uint32_t> trace_stacks_;  // address -> stack, while writing the trace
};

}  // namespace

namespace {

absl::Status WriteSnapshotImpl(const Timeline& timeline, const TraceModel& model, std::size_t events_until,
                               SnapshotFormat format, std::ostream& out, std::size_t max_entries, bool raw_values) {
  if (events_until > timeline.events.size()) {
    return absl::InvalidArgumentError("WriteSnapshot: events_until " + std::to_string(events_until) +
                                      " is past the timeline's " + std::to_string(timeline.events.size()) + " events");
  }
  if (timeline.device_index < 0) {
    return absl::InvalidArgumentError("WriteSnapshot: negative device index " + std::to_string(timeline.device_index));
  }
  if (format == SnapshotFormat::kJson) {
    // nlohmann::json::dump(1)'s layout (base/json_writer.h's indent), a newline at the end.
    JsonWriter w(out, {.indent = 1});
    SnapshotWriter<JsonWriter>(w, timeline).Write(model, events_until, max_entries);
    w.Verbatim("\n");
    const bool written = w.Finish();
    out.flush();
    if (!written || !out) return absl::DataLossError("writing the JSON snapshot failed");
    return absl::OkStatus();
  }
  PickleWriter w(out);
  w.set_raw_values(raw_values);
  SnapshotWriter<PickleWriter>(w, timeline).Write(model, events_until, max_entries);
  return w.Finish();
}

}  // namespace

absl::Status WriteSnapshot(const Timeline& timeline, const TraceModel& model, std::size_t events_until,
                           SnapshotFormat format, std::ostream& out, std::size_t max_entries) {
  return WriteSnapshotImpl(timeline, model, events_until, format, out, max_entries, true);
}

absl::Status WritePickleSnapshotWithoutRawValues(const Timeline& timeline, const TraceModel& model,
                                                 std::size_t events_until, std::ostream& out, std::size_t max_entries) {
  return WriteSnapshotImpl(timeline, model, events_until, SnapshotFormat::kPickle, out, max_entries, false);
}

void SnapshotAt::Write(const TimelineWalk& walk) {
  written_ = true;
  status_ = WriteSnapshot(walk.timeline(), walk.model(), events_until_, format_, out_);
}

void SnapshotAt::OnStart(const TimelineWalk& walk) {
  if (!written_ && events_until_ == walk.applied()) Write(walk);
}

void SnapshotAt::OnEvent(const TimelineWalk& walk, const Event& /*event*/) {
  if (!written_ && events_until_ == walk.applied()) Write(walk);
}

// A moment past the end: WriteSnapshot's error.
void SnapshotAt::OnFinish(const TimelineWalk& walk) {
  if (!written_ && events_until_ > walk.applied()) Write(walk);
}

}  // namespace memscope
