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

// A mark read from a PyTorch snapshot's `annotate` trace entry: written back as one.
bool IsTraceAnnotation(const Event& e) {
  return e.type == EventType::kMark && (e.flags & kEventTraceAnnotation) != 0;
}
bool IsTraceEntry(const Event& e) { return IsPytorchTraceAction(e.type) || IsTraceAnnotation(e); }

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
      for (std::size_t i = 0; i < events_until; ++i) n += IsTraceEntry(timeline_.events[i]) ? 1 : 0;
      skip = n > max_entries ? n - max_entries : 0;
    }
    for (std::size_t i = 0; i < events_until; ++i) {
      const Event& e = timeline_.events[i];
      if (!IsTraceEntry(e)) continue;
      // The tag (category, owner, stack) of each live allocation, for its
      // alloc and free entries: a free event carries none of its own.
      if (e.type == EventType::kAlloc) trace_tags_[e.addr] = Tag{e.category, e.name, timeline_.stack_of(i)};
      if (e.type == EventType::kSegmentAlloc || e.type == EventType::kSegmentMap) TrackSegment(e);
      if (skip > 0) {
        --skip;
      } else if (IsTraceAnnotation(e)) {
        WriteAnnotateEntry(e);
      } else {
        WriteTraceEntry(e);
      }
      if (e.type == EventType::kSegmentFree || e.type == EventType::kSegmentUnmap) TrackSegment(e);
      if (e.type == EventType::kFreeCompleted) trace_tags_.erase(e.addr);
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
        case EventType::kMark:
          if (!IsTraceAnnotation(e)) WriteAnnotation(timeline_.str(e.name), "START", e);
          break;
        default: break;
      }
    }
    w_.EndList();
    if (timeline_.host.present) WriteHostMemory(timeline_.host);
    w_.EndDict();
  }

 private:
  struct Tag {
    Category category;
    std::uint32_t owner, stack;
  };
  // Keys and the names of actions, states and stages are shared objects in
  // PyTorch's snapshots (its C++ makes each py::str once): pickled once,
  // then memo references (BINGET), as Python's pickler writes them.
  void Key(std::string_view key) {
    if constexpr (kPickle) {
      Name(key);
    } else {
      w_.Key(key);
    }
  }
  void Name(std::string_view text) {
    if constexpr (kPickle) {
      if (const auto it = string_memo_.find(absl::string_view(text.data(), text.size())); it != string_memo_.end()) {
        w_.Get(it->second);
      } else {
        string_memo_.emplace(std::string(text), w_.MemoString(text));
      }
    } else {
      w_.String(text);
    }
  }
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
  //
  // In a pickle each frames list is written once and memoized, and so is
  // each frame of a stack (PyTorch shares one dict per frame between its
  // tracebacks): later entries, blocks and segments refer to them (BINGET),
  // so a re-exported snapshot stays the size of PyTorch's own.
  void TagFrames(Category category, std::uint32_t owner, std::uint32_t stack) {
    Key("frames");
    const bool has_stack = stack != 0 && stack < timeline_.stacks.size();
    if constexpr (kPickle) {
      const std::uint64_t key = FramesKey(category, owner, stack);
      if (const auto it = frames_memo_.find(key); it != frames_memo_.end()) {
        w_.Get(it->second);
        return;
      }
      w_.BeginList();
      frames_memo_.emplace(key, w_.MemoizeOpen());
    } else {
      w_.BeginList();
    }
    if (has_stack) {
      for (const std::uint32_t id : timeline_.stacks[stack].frames) WriteStackFrame(id);
    } else {
      const std::string& text = timeline_.str(owner);
      WriteFrame(text.empty() ? std::string_view("??") : std::string_view(text), 0, FrameName(category));
    }
    w_.EndList();
  }

  std::uint64_t FramesKey(Category category, std::uint32_t owner, std::uint32_t stack) const {
    const bool has_stack = stack != 0 && stack < timeline_.stacks.size();
    return has_stack ? (std::uint64_t{1} << 63) | stack : (static_cast<std::uint64_t>(category) << 32) | owner;
  }

  void WriteStackFrame(std::uint32_t id) {
    const StackFrame& f = timeline_.stack_frames[id];
    if constexpr (kPickle) {
      if (frame_memo_.size() < timeline_.stack_frames.size()) frame_memo_.resize(timeline_.stack_frames.size(), kNotMemoized);
      if (frame_memo_[id] != kNotMemoized) {
        w_.Get(frame_memo_[id]);
        return;
      }
      w_.BeginDict();
      frame_memo_[id] = w_.MemoizeOpen();
    } else {
      w_.BeginDict();
    }
    WriteFrameItems(f.filename, f.line, f.name);
    if (f.has_fx()) WriteFxItems(f);
    w_.EndDict();
  }

  // The fx_ fields of a frame of torch.compile's code, those it had.
  void WriteFxItems(const StackFrame& f) {
    const std::pair<std::string_view, const std::string*> fields[] = {{"fx_node_op", &f.fx_node_op},
                                                                      {"fx_node_name", &f.fx_node_name},
                                                                      {"fx_node_target", &f.fx_node_target},
                                                                      {"fx_original_trace", &f.fx_original_trace}};
    for (const auto& [key, value] : fields) {
      if (value->empty()) continue;
      Key(key);
      w_.String(*value);
    }
  }

  // CategoryName's, which calls an unknown category OTHER.
  std::string_view FrameName(Category c) const {
    const auto i = static_cast<std::size_t>(c);
    return category_frame_names_[i < category_frame_names_.size() ? i : static_cast<std::size_t>(Category::kOther)];
  }

  void WriteFrame(std::string_view filename, std::int64_t line, std::string_view name) {
    w_.BeginDict();
    WriteFrameItems(filename, line, name);
    w_.EndDict();
  }
  void WriteFrameItems(std::string_view filename, std::int64_t line, std::string_view name) {
    Key("filename");
    w_.String(filename);
    Key("line");
    w_.Int(line);
    Key("name");
    w_.String(name);
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
    Name(s.is_large ? "large" : "small");
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
      Name(BlockStateName(b.state));
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
    Name(EventTypeName(e.type));
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
      const Tag tag = TraceTag(e);
      TagFrames(tag.category, tag.owner, tag.stack);
    } else if (const Tag* tag = SegmentEntryTag(e)) {
      TagFrames(tag->category, tag->owner, tag->stack);
    } else {
      EmptyFrames();
    }
    w_.EndDict();
  }

  // The tag of an alloc or free entry's allocation (a free before any alloc
  // of its address, in a trace whose head was dropped: its own, OTHER).
  Tag TraceTag(const Event& e) const {
    const auto it = trace_tags_.find(e.addr);
    return it != trace_tags_.end() ? it->second : Tag{e.category, e.name, 0};
  }

  // The tag of the allocation that made a segment_alloc or segment_map
  // entry (the event being written), or null. A segment_free or
  // segment_unmap carries the tag of the segment_alloc / segment_map at its
  // address, as PyTorch's release_block records the segment's own context
  // (context_when_segment_allocated) when the free has none; memscope keeps
  // no stack of the empty_cache call itself.
  const Tag* SegmentEntryTag(const Event& e) const {
    if (e.type == EventType::kSegmentFree || e.type == EventType::kSegmentUnmap) {
      const auto it = trace_segment_tags_.find(e.addr);
      return it == trace_segment_tags_.end() ? nullptr : &it->second;
    }
    if (e.type != EventType::kSegmentAlloc && e.type != EventType::kSegmentMap) return nullptr;
    const auto it = segment_entry_tags_.find(static_cast<std::size_t>(&e - timeline_.events.data()));
    return it == segment_entry_tags_.end() ? nullptr : &it->second;
  }
  // Keeps trace_segment_tags_ for the entries that follow `e`.
  void TrackSegment(const Event& e) {
    if (e.type == EventType::kSegmentAlloc || e.type == EventType::kSegmentMap) {
      if (const Tag* tag = SegmentEntryTag(e)) trace_segment_tags_[e.addr] = *tag;
    } else if (e.type == EventType::kSegmentFree || e.type == EventType::kSegmentUnmap) {
      trace_segment_tags_.erase(e.addr);
    }
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

  // PyTorch 2.11+'s point annotation (_annotate_memory), its text as user_metadata.
  void WriteAnnotateEntry(const Event& e) {
    w_.BeginDict();
    Key("action");
    Name("annotate");
    Key("addr");
    w_.UInt(0);
    Key("size");
    w_.UInt(0);
    Key("stream");
    w_.UInt(0);
    Key("time_us");
    w_.Int(TimeUs(timeline_, e));
    Key("user_metadata");
    w_.String(timeline_.str(e.name));
    EmptyFrames();
    w_.EndDict();
  }

  // A host segment's, block's or entry's frames: its stack's, or none.
  void HostFrames(std::uint32_t stack) {
    if (stack != 0 && stack < timeline_.stacks.size()) {
      TagFrames(Category::kOther, 0, stack);
    } else {
      EmptyFrames();
    }
  }

  // The snapshot's pinned host memory as it was read (record_pinned_host_memory).
  void WriteHostMemory(const PinnedHostMemory& host) {
    Key("host_segments");
    w_.BeginList();
    for (const HostSegment& s : host.segments) {
      w_.BeginDict();
      if (s.device >= 0) {
        Key("device");
        w_.Int(s.device);
      }
      const std::pair<std::string_view, std::uint64_t> sizes[] = {{"address", s.address},
                                                                  {"total_size", s.total_size},
                                                                  {"allocated_size", s.allocated_size},
                                                                  {"active_size", s.active_size},
                                                                  {"requested_size", s.requested_size}};
      for (const auto& [key, value] : sizes) {
        Key(key);
        w_.UInt(value);
      }
      HostFrames(s.stack);
      Key("blocks");
      w_.BeginList();
      for (const HostBlock& b : s.blocks) {
        w_.BeginDict();
        Key("address");
        w_.UInt(b.address);
        Key("size");
        w_.UInt(b.size);
        Key("requested_size");
        w_.UInt(b.requested_size);
        Key("state");
        Name(b.state);
        HostFrames(b.stack);
        w_.EndDict();
      }
      w_.EndList();
      w_.EndDict();
    }
    w_.EndList();
    Key("host_traces");
    w_.BeginList();
    for (const HostTraceEntry& e : host.trace) {
      w_.BeginDict();
      Key("action");
      Name(e.action);
      Key("addr");
      w_.UInt(e.addr);
      Key("size");
      w_.UInt(e.size);
      Key("stream");
      w_.UInt(e.stream);
      Key("time_us");
      w_.Int(e.time_us);
      HostFrames(e.stack);
      w_.EndDict();
    }
    w_.EndList();
  }

  void WriteAnnotation(std::string_view name, std::string_view stage, const Event& e) {
    w_.BeginDict();
    Key("name");
    w_.String(name);
    Key("stage");
    Name(stage);
    Key("device");
    w_.Int(timeline_.device_index);
    Key("time_us");
    w_.Int(TimeUs(timeline_, e));
    w_.EndDict();
  }

  // The pickle's fast path: trace entries and blocks written as raw bytes,
  // exactly those the calls above write, once everything they refer to is
  // in the memo (their keys, action or state, and frames list): until then
  // the ordinary calls write them and fill the memo, so the raw bytes never
  // memoize and both paths number the memo alike.
  static constexpr bool kPickle = std::is_same_v<W, PickleWriter>;
  static constexpr std::uint32_t kNotMemoized = std::numeric_limits<std::uint32_t>::max();
  static char* PutGet(char* p, std::uint32_t index) { return PickleWriter::EncodeGet(p, index); }

  // The memo index of a name, or kNotMemoized; `cache` keeps it once found.
  std::uint32_t MemoOf(std::string_view text, std::uint32_t& cache) const {
    if (cache == kNotMemoized) {
      if (const auto it = string_memo_.find(absl::string_view(text.data(), text.size())); it != string_memo_.end()) cache = it->second;
    }
    return cache;
  }
  // The frames list of an entry or block: its memo index, kEmptyFrames for
  // [], or kNotMemoized.
  static constexpr std::uint32_t kEmptyFrames = kNotMemoized - 1;
  std::uint32_t FramesMemo(const Tag* tag) const {
    if (tag == nullptr) return kEmptyFrames;
    const auto it = frames_memo_.find(FramesKey(tag->category, tag->owner, tag->stack));
    return it == frames_memo_.end() ? kNotMemoized : it->second;
  }
  static char* PutFrames(char* p, std::uint32_t frames) {
    if (frames == kEmptyFrames) {
      *p = static_cast<char>(0x5d);  // EMPTY_LIST
      return p + 1;
    }
    return PutGet(p, frames);
  }

  enum RawKey : std::size_t { kAction, kAddr, kDeviceFree, kSize, kStream, kTimeUs, kFrames, kAddress, kRequested, kState, kNumRawKeys };
  static constexpr std::array<std::string_view, kNumRawKeys> kRawKeyNames = {
      "action", "addr", "device_free", "size", "stream", "time_us", "frames", "address", "requested_size", "state"};
  // The memo indices of `keys`, false when one is not memoized yet.
  template <std::size_t N>
  bool RawKeys(const std::array<RawKey, N>& keys, std::array<std::uint32_t, N>& out) {
    for (std::size_t i = 0; i < N; ++i) {
      out[i] = MemoOf(kRawKeyNames[keys[i]], raw_key_memo_[keys[i]]);
      if (out[i] == kNotMemoized) return false;
    }
    return true;
  }

  // WriteTraceEntry's dict as raw bytes; false: write it the ordinary way.
  bool WriteTraceEntryRaw(const Event& e) {
    if (e.pool() != 0) return false;  // a private pool's entry carries pool_id: the general path
    const bool tagged =
        e.type == EventType::kAlloc || e.type == EventType::kFreeRequested || e.type == EventType::kFreeCompleted;
    std::uint32_t frames = kEmptyFrames;
    if (tagged) {
      const Tag alloc_tag = TraceTag(e);
      frames = FramesMemo(&alloc_tag);
    } else if (const Tag* tag = SegmentEntryTag(e)) {
      frames = FramesMemo(tag);
    }
    const bool oom = e.type == EventType::kOom;
    std::array<std::uint32_t, 6> k;
    const std::uint32_t action =
        MemoOf(EventTypeName(e.type), action_memo_[static_cast<std::size_t>(e.type) % action_memo_.size()]);
    if (frames == kNotMemoized || action == kNotMemoized ||
        !RawKeys<6>({kAction, oom ? kDeviceFree : kAddr, kSize, kStream, kTimeUs, kFrames}, k)) {
      return false;
    }
    char* p = w_.BeginRawValue(128);
    if (p == nullptr) return false;
    const bool segment_event = e.type == EventType::kSegmentAlloc || e.type == EventType::kSegmentFree ||
                               e.type == EventType::kSegmentMap || e.type == EventType::kSegmentUnmap;
    *p++ = static_cast<char>(0x7d);  // EMPTY_DICT
    *p++ = static_cast<char>(0x28);  // MARK
    p = PutGet(PutGet(p, k[0]), action);
    p = PickleWriter::EncodeUInt(PutGet(p, k[1]), oom ? e.device_free() : e.addr);
    p = PickleWriter::EncodeUInt(PutGet(p, k[2]), segment_event ? e.size : e.requested_size);
    p = PickleWriter::EncodeUInt(PutGet(p, k[3]), e.stream);
    p = PickleWriter::EncodeInt(PutGet(p, k[4]), TimeUs(timeline_, e));
    p = PutFrames(PutGet(p, k[5]), frames);
    *p++ = static_cast<char>(0x75);  // SETITEMS
    w_.EndRawValue(p);
    return true;
  }

  // A block's dict of WriteSegment as raw bytes; false: the ordinary way.
  bool WriteBlockRaw(const BlockInfo& b) {
    std::uint32_t frames = kEmptyFrames;
    if (auto it = live_tags_.find(b.address); b.state != BlockState::kInactive && it != live_tags_.end()) {
      frames = FramesMemo(&it->second);
    }
    std::array<std::uint32_t, 5> k;
    const std::uint32_t state =
        MemoOf(BlockStateName(b.state), state_memo_[static_cast<std::size_t>(b.state) % state_memo_.size()]);
    if (frames == kNotMemoized || state == kNotMemoized || !RawKeys<5>({kAddress, kSize, kRequested, kState, kFrames}, k)) {
      return false;
    }
    char* p = w_.BeginRawValue(96);
    if (p == nullptr) return false;
    *p++ = static_cast<char>(0x7d);  // EMPTY_DICT
    *p++ = static_cast<char>(0x28);  // MARK
    p = PickleWriter::EncodeUInt(PutGet(p, k[0]), b.address);
    p = PickleWriter::EncodeUInt(PutGet(p, k[1]), b.size);
    p = PickleWriter::EncodeUInt(PutGet(p, k[2]), b.requested_size);
    p = PutGet(PutGet(p, k[3]), state);
    p = PutFrames(PutGet(p, k[4]), frames);
    *p++ = static_cast<char>(0x75);  // SETITEMS
    w_.EndRawValue(p);
    return true;
  }

  // The memo (pickles only): names, frames lists by FramesKey, stack frames by id.
  absl::flat_hash_map<std::string, std::uint32_t> string_memo_;
  absl::flat_hash_map<std::uint64_t, std::uint32_t> frames_memo_;
  std::vector<std::uint32_t> frame_memo_;
  std::array<std::uint32_t, kNumRawKeys> raw_key_memo_ = Unmemoized<kNumRawKeys>();
  std::array<std::uint32_t, 256> action_memo_ = Unmemoized<256>();  // by EventType
  std::array<std::uint32_t, 16> state_memo_ = Unmemoized<16>();     // by BlockState
  template <std::size_t N>
  static constexpr std::array<std::uint32_t, N> Unmemoized() {
    std::array<std::uint32_t, N> a{};
    a.fill(kNotMemoized);
    return a;
  }

  W& w_;
  const Timeline& timeline_;
  std::array<std::string, kNumCategories> category_frame_names_;    // "memscope ACTIVATION": a frame's name
  absl::flat_hash_map<std::uint64_t, Tag> live_tags_;               // address -> tag of the blocks at the snapshot
  absl::flat_hash_map<std::uint64_t, Tag> segment_tags_;            // segment address -> tag of the alloc that made it
  absl::flat_hash_map<std::size_t, Tag> segment_entry_tags_;  // event index of a segment_alloc/map -> its alloc's tag
  absl::flat_hash_map<std::uint64_t, Tag> trace_segment_tags_;  // segment address -> its tag, while writing the trace
  absl::flat_hash_map<std::uint64_t, Tag> trace_tags_;  // address -> its allocation's tag, while writing the trace
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
