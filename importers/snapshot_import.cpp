#include "importers/snapshot_import.h"

#include <algorithm>
#include <array>
#include <bit>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
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
#include "base/hex_address.h"
#include "base/status.h"
#include "base/trace_action.h"
#include "importers/pickle_reader.h"
#include "importers/prefault.h"
#include "recording/timeline.h"

namespace memscope {
namespace {

// torch.profiler's step scope, record_function("ProfilerStep#N") around
// each step of its schedule: N, or kNoStep for another name.
std::int64_t ProfilerStepOf(std::string_view name) {
  constexpr std::string_view kPrefix = "ProfilerStep#";
  std::int64_t step = kNoStep;
  if (!name.starts_with(kPrefix)) return kNoStep;
  name.remove_prefix(kPrefix.size());
  if (!absl::SimpleAtoi(absl::string_view(name.data(), name.size()), &step) || step < 0) return kNoStep;
  return step;
}

// "forward:0" and "model" are memscope's own names; "ProfilerStep#N" is the
// user phase ProfilerStep of step N (the marks inside it take step N:
// ProfilerSteps); anything else is a user phase.
void AnnotationPhase(const std::string& name, Request& r, RequestTrace& trace) {
  if (const std::int64_t profiler_step = ProfilerStepOf(name); profiler_step != kNoStep) {
    r.phase = Phase::kUser;
    r.step = profiler_step;
    trace.strings.push_back("ProfilerStep");
    r.text = static_cast<std::uint32_t>(trace.strings.size() - 1);
    return;
  }
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

// ---- Reading trace entries and segments (field names: docs/snapshot-format.md).

[[gnu::always_inline]] inline std::uint64_t UIntOr0(const PyView& v) { return v.AsUInt().value_or(0); }

// The trace entry keys memscope reads, those it knows and deliberately
// ignores, and the rest (counted and named in a note). Decided by length and
// a byte or two before one comparison: this runs for every key of every entry.
enum class Field : std::uint8_t {
  kAddr,
  kSize,
  kStream,
  kTimeUs,
  kFrames,
  kPoolId,
  kCompileContext,
  kUserMetadata,
  kAction,
  kDeviceFree,
  kName,
  kStage,
  kOtherKnown,  // device, requested_size, real_size
  kUnknown
};

Field FieldOf(std::string_view k) {
  auto is = [&](std::string_view x, Field f) { return k == x ? f : Field::kUnknown; };
  switch (k.size()) {
    case 4:
      if (k[0] == 'a') return is("addr", Field::kAddr);
      if (k[0] == 's') return is("size", Field::kSize);
      return is("name", Field::kName);
    case 5: return is("stage", Field::kStage);
    case 6:
      if (k[0] == 's') return is("stream", Field::kStream);
      if (k[0] == 'f') return is("frames", Field::kFrames);
      if (k[0] == 'a') return is("action", Field::kAction);
      return is("device", Field::kOtherKnown);
    case 7:
      if (k[0] == 't') return is("time_us", Field::kTimeUs);
      return is("pool_id", Field::kPoolId);
    case 9: return is("real_size", Field::kOtherKnown);
    case 11: return is("device_free", Field::kDeviceFree);
    case 13: return is("user_metadata", Field::kUserMetadata);
    case 14: return is("requested_size", Field::kOtherKnown);
    case 15: return is("compile_context", Field::kCompileContext);
    default: return Field::kUnknown;
  }
}

// The keys the reader hands over as records (PickleReadOptions::record_keys):
// every known key, so that an entry of known keys is never built as a dict.
// A key's index is its Field (the last three, ignored, have slots of their own).
constexpr const char* kRecordKeys[] = {
    "addr",   "size",        "stream", "time_us", "frames", "pool_id",        "compile_context", "user_metadata",
    "action", "device_free", "name",   "stage",   "device", "requested_size", "real_size"};
constexpr std::size_t kEntrySlots = std::size(kRecordKeys);
static_assert(kEntrySlots <= kMaxRecordKeys);
static_assert(static_cast<std::size_t>(Field::kStage) == 11 && static_cast<std::size_t>(Field::kOtherKnown) == 12);

// The fields of one trace entry, as the reader stored them (kMissing:
// absent), by Field (kOtherKnown's slot takes the keys memscope ignores).
struct EntryFields {
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  const PyRef* pairs = nullptr;               // the entry's pairs: key, value, key, value...
  std::array<std::uint32_t, kEntrySlots> at;  // by Field: the pair that holds it, kNone when absent
  bool unknown_keys = false;
  explicit EntryFields(const PyRef* p) : pairs(p) { at.fill(kNone); }
  [[gnu::always_inline]] const PyRef& operator[](Field f) const {
    static constexpr PyRef kMissing{};
    const std::uint32_t k = at[static_cast<std::size_t>(f)];
    return k == kNone ? kMissing : pairs[2 * std::size_t{k} + 1];
  }
  // The key of pair k of a dict (the first `action` counts, as PyView::Get would give).
  [[gnu::always_inline]] void Set(Field field, std::uint32_t k) {
    if (field == Field::kUnknown) [[unlikely]] {
      unknown_keys = true;
    } else if (field != Field::kAction || at[static_cast<std::size_t>(field)] == kNone) {
      at[static_cast<std::size_t>(field)] = k;
    }
  }
};

// A trace entry's action (base/trace_action.h); nullopt: a name that is no
// action at all. Those memscope does not model are noted as unknown below.
using Action = std::optional<TraceAction>;

// What a str of the pickle names (a Field or an Action), by where its bytes
// are: a key or action written once and referred back to (BINGET) is the
// same bytes of the reader's arena every time, and those bytes never change
// during a read. A few entries, replaced on collision.
template <typename T>
struct NameCache {
  struct Slot {
    std::uint64_t offset = ~std::uint64_t{0};
    std::uint32_t length = 0;
    T value{};
  };
  std::array<Slot, 64> slots;
  T Of(const PyRef& str, std::string_view text, T (*classify)(std::string_view)) {
    Slot& s = slots[(str.v ^ (str.v >> 6) ^ str.n) & 63];
    if (s.offset != str.v || s.length != str.n) s = Slot{str.v, str.n, classify(text)};
    return s.value;
  }
};

// Counts of things a reader met but does not model, by name, for one note.
struct Unknowns {
  std::map<std::string, std::uint64_t> counts;
  void Add(std::string_view name) {
    if (counts.size() < 64 || counts.contains(std::string(name))) ++counts[std::string(name)];
  }
  std::string Text() const {
    std::vector<std::string> parts;
    for (const auto& [name, n] : counts) parts.push_back(absl::StrCat(name, " (", n, ")"));
    return absl::StrJoin(parts, ", ");
  }
};

// A pool_id / segment_pool_id pair (a container of two ints; missing items are 0).
PoolId PoolIdOf(const PyView& pool) { return PoolId{UIntOr0(pool[0]), UIntOr0(pool[1])}; }

bool IsDefaultPool(const PyView& pool) {
  if (!pool.valid() || pool.kind() == PyKind::kNone) return true;
  for (std::size_t k = 0; k < pool.size(); ++k) {
    if (UIntOr0(pool[k]) != 0) return false;
  }
  return true;
}

// ---- Attribution from stacks (docs/snapshot-format.md, "Categories and
// owners"). PyTorch's frames are innermost first.

// A block freed by the program that waits on stream events: PyTorch's C++
// names the state active_pending_free, its documentation (memory.py's
// _snapshot) active_awaiting_free.
bool IsPendingFreeState(std::string_view state) {
  return state == "active_pending_free" || state == "active_awaiting_free";
}

bool Contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// A frame PyTorch's own viewer leaves out (torch/cuda/_memory_viz.py,
// _frame_filter): the unwinder, the interpreter's evaluation loop and call
// machinery, and the dispatcher's boxing and registration glue, which a
// snapshot recorded with context="all" puts between every two Python frames.
bool OmittedFrame(std::string_view file, std::string_view name) {
  static constexpr std::string_view kFunctions[] = {"unwind::unwind",    "CapturedTraceback::gather",
                                                    "gather_with_cpp",   "_start",
                                                    "__libc_start_main", "PyEval_",
                                                    "PyObject_",         "PyFunction_"};
  static constexpr std::string_view kFiles[] = {"core/boxing",
                                                "/Register",
                                                "/Redispatch",
                                                "pythonrun.c",
                                                "Modules/main.c",
                                                "Objects/call.c",
                                                "Objects/methodobject.c",
                                                "pycore_ceval.h",
                                                "ceval.c",
                                                "cpython/abstract.h"};
  for (const std::string_view f : kFunctions) {
    if (Contains(name, f)) return true;
  }
  for (const std::string_view f : kFiles) {
    if (Contains(file, f)) return true;
  }
  return false;
}

// A frame of PyTorch itself, of C or C++ (the interpreter's, PyTorch's, an
// extension's), one PyTorch's viewer omits, or of memscope capture's start-up
// module (RUN/.memscope-capture/sitecustomize.py, whose wrappers call the
// user's modules and optimizers): not the user's code. (The viewer's
// function names are C and C++ ones: a Python function of the user's named
// like them, on_train_start, stays the user's.)
bool LibraryFrame(std::string_view file, std::string_view name) {
  return file.empty() || Contains(file, "/.memscope-capture/") || Contains(file, "/torch/") ||
         Contains(file, "\\torch\\") || file.starts_with("torch/") || file.ends_with(".cpp") || file.ends_with(".h") ||
         file.ends_with(".c") || file.ends_with(".cc") || file.ends_with(".cu") || file.ends_with(".cuh") ||
         file.starts_with("<") || file == "??" || (!file.ends_with(".py") && OmittedFrame(file, name));
}

// The category rules, in their order: bit k of a frame's mask says it
// matches rule k.
std::uint8_t FrameRules(std::string_view f, std::string_view n) {
  std::uint8_t m = 0;
  if (Contains(f, "torch/optim/")) m |= 1;
  if (Contains(n, "Reducer") || Contains(n, "reducer") || Contains(n, "bucket") ||
      (Contains(f, "torch/nn/parallel/distributed.py") && Contains(n, "_rebuild_buckets"))) {
    m |= 2;
  }
  if (Contains(f, "torch/distributed/") || Contains(n, "c10d::") || Contains(n, "_sync_module_states") ||
      Contains(n, "_sync_buffers") || Contains(n, "_sync_params")) {
    m |= 4;
  }
  if (Contains(f, "torch/autograd/") || Contains(n, "AccumulateGrad") || Contains(n, "autograd::Engine") ||
      (Contains(f, "torch/_tensor.py") && n == "backward")) {
    m |= 8;
  }
  if (Contains(f, "torch/nn/init.py") || n == "reset_parameters" ||
      (Contains(f, "torch/nn/modules/module.py") && (n == "_apply" || n == "to" || n == "cuda"))) {
    m |= 16;
  }
  if (Contains(f, "torch/utils/data/")) m |= 32;
  if (n == "forward" || Contains(f, "torch/nn/modules/") || Contains(f, "torch/nn/functional.py")) m |= 64;
  return m;
}

// The first rule any frame matches (`rules`: the frames' masks or'ed).
Category CategoryOfRules(std::uint8_t rules) {
  static constexpr Category kOrder[] = {Category::kOptimizerState, Category::kDdpBucket, Category::kCommTemp,
                                        Category::kGradient,       Category::kParameter, Category::kInput,
                                        Category::kActivation};
  return rules == 0 ? Category::kOther : kOrder[std::countr_zero(rules)];
}

// The category of an allocation from its stack: the first rule that any
// frame matches, in this order.
Category CategoryFromFrames(const PyView& frames) {
  // memscope's own exports: one frame named "memscope CATEGORY".
  if (std::optional<std::string_view> name = frames[0].Get("name").AsString(); name && name->starts_with("memscope ")) {
    if (std::optional<Category> c = ParseCategory(name->substr(9))) return *c;
  }
  std::uint8_t rules = 0;
  for (std::size_t k = 0; k < frames.size(); ++k) {
    rules |=
        FrameRules(frames[k].Get("filename").AsString().value_or(""), frames[k].Get("name").AsString().value_or(""));
  }
  return CategoryOfRules(rules);
}

// "file:line function" of the innermost frame of the user's code ("" if none).
std::string OwnerFromFrames(const PyView& frames) {
  if (std::optional<std::string_view> name = frames[0].Get("name").AsString(); name && name->starts_with("memscope ")) {
    const std::string_view owner = frames[0].Get("filename").AsString().value_or("??");
    return owner == "??" ? std::string() : std::string(owner);
  }
  for (std::size_t k = 0; k < frames.size(); ++k) {
    const std::string_view file = frames[k].Get("filename").AsString().value_or("");
    const std::string_view name = frames[k].Get("name").AsString().value_or("");
    if (LibraryFrame(file, name)) continue;
    return absl::StrCat(std::string(file), ":", frames[k].Get("line").AsInt().value_or(0), " ", std::string(name));
  }
  return "";
}

std::string FrameText(std::string_view file, std::int64_t line, std::string_view name) {
  return absl::StrCat(std::string(file), ":", line, " ", std::string(name));
}

// Category, owner and stack per distinct stack: frames lists are shared nodes
// of the pickle, so one computation serves every entry that holds the same
// stack; equal stacks in separate lists share one stack too.
struct StackTags {
  struct Tags {
    Category category;
    std::uint32_t owner, stack;
  };
  absl::flat_hash_map<std::uint64_t, Tags> by_node;
  // by_node's entries last found, direct-mapped by key (key ~0: none): a
  // trace's allocations repeat a few thousand stacks.
  struct Recent {
    std::uint64_t key = ~std::uint64_t{0};
    Tags tags{};
  };
  static constexpr std::size_t kRecent = 4096;
  std::unique_ptr<Recent[]> recent = std::make_unique<Recent[]>(kRecent);
  std::uint64_t attributed = 0, from_frames = 0;
  // Each distinct frame (by content) once: trace.stack_frames[id], and what
  // the stacks need of it. Frame dicts shared by many lists are found by
  // their stored identity, the others (and the first of each shared one) by content.
  static constexpr std::uint32_t kNoOwner = ~std::uint32_t{0};
  struct FrameInfo {
    std::string text;                // FrameText
    std::uint32_t owner = kNoOwner;  // text's index in trace.strings, once it was an owner
    std::uint8_t rules = 0;
    bool library = false;
    bool omitted = false;  // OmittedFrame: not even a site's last resort
  };
  absl::flat_hash_map<std::uint64_t, std::uint32_t> frame_by_node;
  absl::flat_hash_map<std::string, std::uint32_t> frame_by_content;
  std::vector<FrameInfo> frame_infos;  // by frame id
  // Stacks by their frames' ids (4 bytes each, a string key): equal stacks
  // in separate lists are one stack. Per stack, its category and owner.
  absl::flat_hash_map<std::string, std::uint32_t> by_ids;
  struct StackTag {
    Category category;
    std::uint32_t owner;
  };
  std::vector<StackTag> stack_tags{StackTag{Category::kOther, 0}};  // by stack index (0: none)
  std::string bad_value;           // the first value of a wrong type in the frames read ("" if none): an error
  std::string ids_key;             // reused: one list's key
  std::vector<std::uint32_t> ids;  // reused: one list's frame ids

  std::uint32_t FrameId(const PyView& f, RequestTrace& trace) {
    const bool shared = (f.ref().flags & kPyRefShared) != 0;
    const std::uint64_t node = f.ref().v * 2 + (f.ref().n > 0 ? 1 : 0);
    if (shared) {
      if (auto it = frame_by_node.find(node); it != frame_by_node.end()) return it->second;
    }
    StackFrame frame;
    frame.filename = std::string(f.Get("filename").AsString().value_or(""));
    frame.line = f.Get("line").AsInt().value_or(0);
    frame.name = std::string(f.Get("name").AsString().value_or(""));
    std::string key = absl::StrCat(frame.filename.size(), ":", frame.filename, ":", frame.line, ":", frame.name);
    if (f.size() > 3) ReadFxFields(f, frame, key);
    // (the file name's length first: no two frames have the same key)
    auto [it, added] = frame_by_content.try_emplace(std::move(key), static_cast<std::uint32_t>(frame_infos.size()));
    if (added) {
      FrameInfo& info = frame_infos.emplace_back();
      info.text = FrameText(frame.filename, frame.line, frame.name);
      info.rules = FrameRules(frame.filename, frame.name);
      info.library = LibraryFrame(frame.filename, frame.name);
      info.omitted = OmittedFrame(frame.filename, frame.name);
      if (!frame.fx_node_name.empty()) {
        // torch.compile's generated code, which stands for the user's
        // frames it was traced from: the graph node is the owner.
        info.text = absl::StrCat("fx: ", frame.fx_node_name,
                                 frame.fx_node_op.empty() ? "" : absl::StrCat(" (", frame.fx_node_op, ")"));
        info.library = false;
        info.omitted = false;
      }
      trace.stack_frames.push_back(std::move(frame));
    }
    if (shared) frame_by_node.emplace(node, it->second);
    return it->second;
  }

  // The fx_ fields of a frame (augment_with_fx_traces, PyTorch 2.11+), added
  // to its content key; a value that is not a str is the first bad value.
  void ReadFxFields(const PyView& f, StackFrame& frame, std::string& key) {
    const std::pair<const char*, std::string*> fields[] = {{"fx_node_op", &frame.fx_node_op},
                                                           {"fx_node_name", &frame.fx_node_name},
                                                           {"fx_node_target", &frame.fx_node_target},
                                                           {"fx_original_trace", &frame.fx_original_trace}};
    for (const auto& [name, value] : fields) {
      const PyView v = f.Get(name);
      if (!v.valid()) continue;
      if (const std::optional<std::string_view> text = v.AsString()) {
        *value = std::string(*text);
      } else if (bad_value.empty()) {
        bad_value = absl::StrCat("a frame's ", name, " is not a str");
      }
      absl::StrAppend(&key, "\x1f", name, ":", value->size(), ":", *value);
    }
  }

  // A new stack of the frames `ids`: its category (the first rule any frame
  // matches), owner (the innermost frame of the user's code) and site.
  std::uint32_t AddStack(RequestTrace& trace) {
    std::uint8_t rules = 0;
    for (const std::uint32_t id : ids) rules |= frame_infos[id].rules;
    StackTag tag{CategoryOfRules(rules), 0};
    for (const std::uint32_t id : ids) {
      FrameInfo& i = frame_infos[id];
      if (i.library) continue;
      if (!i.text.empty()) {
        if (i.owner == kNoOwner) {
          trace.strings.push_back(i.text);
          i.owner = static_cast<std::uint32_t>(trace.strings.size() - 1);
        }
        tag.owner = i.owner;
      }
      break;
    }
    AllocStack stack;
    stack.frames = ids;
    // The site: the user's frames joined by " <- ", or the innermost frame
    // PyTorch's viewer shows when none is the user's.
    std::size_t length = 0;
    for (const std::uint32_t id : ids) {
      if (!frame_infos[id].library) length += frame_infos[id].text.size() + 4;
    }
    stack.site.reserve(length);
    bool user = false;
    for (const std::uint32_t id : ids) {
      const FrameInfo& i = frame_infos[id];
      if (i.library) continue;
      if (user) stack.site += " <- ";
      stack.site += i.text;
      user = true;
    }
    if (!user && !ids.empty()) {
      auto shown = std::find_if(ids.begin(), ids.end(), [&](std::uint32_t id) { return !frame_infos[id].omitted; });
      stack.site = frame_infos[shown != ids.end() ? *shown : ids[0]].text;
    }
    trace.stacks.push_back(std::move(stack));
    stack_tags.push_back(tag);
    return static_cast<std::uint32_t>(trace.stacks.size() - 1);
  }

  void Tag(const PyView& frames, Request& r, RequestTrace& trace) {
    if (!frames.is_list() || frames.size() == 0) return;
    ++from_frames;
    const bool shared = (frames.ref().flags & kPyRefShared) != 0;
    const std::uint64_t key = frames.ref().v * 2 + (frames.ref().n > 0 ? 1 : 0);
    if (shared) {
      Recent& hot = recent[(key * 0x9e3779b97f4a7c15ull) >> (64 - std::countr_zero(kRecent))];
      const Tags* found = nullptr;
      if (hot.key == key) {
        found = &hot.tags;
      } else if (auto it = by_node.find(key); it != by_node.end()) {
        hot = Recent{key, it->second};
        found = &it->second;
      }
      if (found != nullptr) {
        r.category = found->category;
        r.text = found->owner;
        r.stack = found->stack;
        if (r.category != Category::kOther) ++attributed;
        return;
      }
    }
    r.stack = 0;
    r.text = 0;
    // memscope's own exports carry tags, not stacks: their site is category and owner.
    const std::optional<std::string_view> first = frames[0].Get("name").AsString();
    if (first && first->starts_with("memscope ")) {
      r.category = CategoryFromFrames(frames);
      std::string owner = OwnerFromFrames(frames);
      if (!owner.empty()) {
        trace.strings.push_back(std::move(owner));
        r.text = static_cast<std::uint32_t>(trace.strings.size() - 1);
      }
    } else {
      // What CategoryFromFrames and OwnerFromFrames give, and the stack,
      // from the frames' ids: once per distinct stack.
      const std::size_t n = frames.size();
      ids.resize(n);
      for (std::size_t k = 0; k < n; ++k) ids[k] = FrameId(frames[k], trace);
      ids_key.assign(reinterpret_cast<const char*>(ids.data()), n * sizeof(std::uint32_t));
      std::uint32_t stack;
      if (auto it = by_ids.find(ids_key); it != by_ids.end()) {
        stack = it->second;
      } else {
        stack = AddStack(trace);
        by_ids.emplace(ids_key, stack);
      }
      r.category = stack_tags[stack].category;
      r.text = stack_tags[stack].owner;
      r.stack = stack;
    }
    if (r.category != Category::kOther) ++attributed;
    if (shared) by_node.emplace(key, Tags{r.category, r.text, r.stack});
  }
};

// Builds one device's request trace from trace entries, in order.
struct DeviceBuilder {
  ImportedTrace out;
  // time_us per request, for placing annotations: kept only from the first
  // request whose time_us is not the one its Request::time_us gives back
  // (TimeOf): PyTorch's times are whole microseconds, so mostly never.
  std::vector<double> times;
  bool times_kept = false;
  double TimeOf(std::size_t i) const {
    if (times_kept) return times[i];
    const std::int64_t t = out.requests.requests[i].time_us;
    return t >= 0 ? static_cast<double>(t) : 0.0;
  }
  // The addresses that are live or have a delayed free waiting (one hash
  // probe per alloc or free): the slot while live, and the slot of a delayed
  // free waiting on its own stream (WaitStream) until its free_completed. An
  // address neither live nor waiting is erased (it reads as one never seen),
  // so the map holds what is live, not every address the trace ever used:
  // a million-entry trace's 100k addresses missed the cache at every probe.
  // (Every address allocated at is in out.requests.address_ids.)
  struct AddrState {
    std::uint32_t slot = 0;
    std::uint32_t wait_slot = 0;
    bool live = false;
    bool waiting = false;
  };
  absl::flat_hash_map<std::uint64_t, AddrState> addrs;
  absl::flat_hash_set<std::uint64_t> trace_segments;  // segment addresses the trace allocated or mapped
  std::uint64_t unknown_frees = 0;
  std::uint64_t ooms = 0;
  std::uint64_t entries = 0;
  std::uint64_t private_pool_allocs = 0;
  std::uint64_t pools_over = 0;  // allocations in pools past the kMaxEventPool-th: served from the default pool
  // Segments of private pools (address -> index into out.requests.pools), and
  // the pools a segment_free showed released.
  absl::flat_hash_map<std::uint64_t, std::uint8_t> private_segments;
  std::vector<bool> pool_released{false};
  std::vector<std::size_t> release_request{0};  // per pool: its kReleasePool request, while pool_released
  std::uint8_t oom_pool = 0;                    // the pool of the last oom entry
  StackTags tags;
  std::uint64_t compile_contexts = 0;
  std::uint64_t user_metadata = 0;
  std::uint64_t annotations = 0;  // annotate entries read
  std::int64_t reserved = 0;      // the trace's own count of segment bytes (for an OOM's capacity)
  // The empty-cache request of the segment frees just read, while only
  // more segment frees follow: its line and the reserved bytes before them.
  std::optional<ImportedTrace::MallocFrees> pending_frees;
  std::uint64_t last_alloc_entry = 0, last_oom_entry = 0;
  std::uint64_t oom_size = 0;
  Unknowns unknown_actions, unknown_fields;
  NameCache<Field> field_names;
  // The key last seen at each position of an entry (stored strings' offsets
  // in the read's arena never change once an entry is handed over).
  static constexpr std::size_t kKeyPositions = 16;
  struct KeyAt {
    std::uint64_t offset = ~std::uint64_t{0};
    std::uint32_t length = 0;
    Field field{};
  };
  std::array<KeyAt, kKeyPositions> key_at;
  NameCache<Action> action_names;
  double last_time = 0;
  bool time_known = false;  // an entry had time_us
  // A free_requested whose completion is not known yet: if the next entry is
  // its free_completed, the block was freed at once (a plain free); otherwise
  // it waited on stream events (record_stream) until its free_completed.
  struct Held {
    std::uint64_t addr;
    std::uint32_t slot;
    double time_us;
  };
  std::optional<Held> held;
  PrefaultAhead requests_ahead;  // out.requests.requests' pages, populated ahead of its end
  std::uint64_t waiting = 0;     // addresses with a delayed free waiting (AddrState::waiting)
  std::uint64_t delayed_frees = 0;
  // Expandable segments seen so far: base and the end of the furthest range mapped in them.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> reservations;

  // For rebuilding the state at the trace's start (RebuildStart): the blocks
  // the trace frees but never allocated (an alloc request of the slot their
  // free took, tagged from the free's frames; `pending`: only their
  // free_completed is in the trace, so their free was requested before it
  // began), the segments it frees but never allocated, and the segments it
  // allocated and has not freed.
  struct StartFree {
    std::uint64_t addr;
    Request alloc;
    bool pending;
  };
  std::vector<StartFree> start_frees;
  struct StartSegmentFree {
    std::uint64_t addr, size, stream;
    std::uint8_t pool;
  };
  std::vector<StartSegmentFree> start_segment_frees;
  absl::flat_hash_set<std::uint64_t> live_segments;
  bool maps_seen = false;         // segment_map / segment_unmap entries (expandable segments)
  std::int64_t oom_reserved = 0;  // `reserved` at the first oom entry, and its device_free
  std::uint64_t oom_device_free = 0;

  // The file's addresses for the replay: every segment_alloc, and the first
  // segment_map of each expandable segment (one that starts outside every
  // range mapped so far; PyTorch maps an expandable segment from its base).
  void PlanSegment(bool map, std::uint64_t addr, std::uint64_t size) {
    if (!map) {
      out.requests.planned_mallocs.push_back({size, addr});
      return;
    }
    for (std::size_t k = 0; k < reservations.size(); ++k) {
      auto& [base, end] = reservations[k];
      if (addr >= base && addr <= end) {
        end = std::max(end, addr + size);
        out.requests.planned_reservations[k].size = end - base;
        return;
      }
    }
    reservations.emplace_back(addr, addr + size);
    out.requests.planned_reservations.push_back({size, addr});
  }

  // Each delayed free waits on a stream of its own, so that its
  // free_completed can complete exactly that block.
  static StreamId WaitStream(std::uint32_t slot) { return (StreamId{1} << 62) + slot; }

  // Decides the held free: plain if `completed_at_once`, else pending.
  void Release(bool completed_at_once) {
    if (!held) return;
    if (!completed_at_once) {
      const StreamId s = WaitStream(held->slot);
      Push(Request{.op = RequestOp::kRecordStream, .slot = held->slot, .stream = s}, held->time_us);
      AddrState& a = addrs[held->addr];
      if (!a.waiting) ++waiting;
      a.waiting = true;
      a.wait_slot = held->slot;
      ++delayed_frees;
    }
    Push(Request{.op = RequestOp::kFree, .slot = held->slot}, held->time_us);
    held.reset();
  }

  // A new slot for an allocation at `addr` (its id is the address, RequestTrace::IdOf).
  std::uint32_t Slot(std::uint64_t addr) {
    out.requests.address_ids.push_back(addr);
    return static_cast<std::uint32_t>(out.requests.address_ids.size() - 1);
  }
  void Push(Request r, double time_us) {
    r.line = entries;  // the entry's position in the device trace (1-based)
    if (time_known) r.time_us = static_cast<std::int64_t>(time_us);
    if (!times_kept && (r.time_us >= 0 ? static_cast<double>(r.time_us) : 0.0) != time_us) [[unlikely]] {
      times.reserve(out.requests.requests.capacity());
      for (std::size_t i = 0; i < out.requests.requests.size(); ++i) times.push_back(TimeOf(i));
      times_kept = true;
    }
    std::vector<Request>& requests = out.requests.requests;
    if (requests.size() % 4096 == 0) {
      requests_ahead.Advance(requests.data(), requests.capacity() * sizeof(Request), requests.size() * sizeof(Request));
    }
    requests.push_back(r);
    if (times_kept) times.push_back(time_us);
  }

  // IsDefaultPool, remembering the last default pool_id that is a shared
  // node of the read (entries mostly refer to one stored (0, 0)): shared
  // nodes never change during a read.
  struct PoolNode {
    std::uint64_t v = 0;
    std::uint32_t n = 0;
    PyKind kind = PyKind::kMissing;
  } default_pool_node;
  bool DefaultPool(const PyView& pool) {
    const PyRef& ref = pool.ref();
    const bool shared = (ref.flags & kPyRefShared) != 0;
    if (shared && ref.kind == default_pool_node.kind && ref.v == default_pool_node.v && ref.n == default_pool_node.n) {
      return true;
    }
    const bool is_default = IsDefaultPool(pool);
    if (is_default && shared) default_pool_node = {ref.v, ref.n, ref.kind};
    return is_default;
  }

  // The index of `id` in out.requests.pools, added on first use; 0 for the
  // default pool and past kMaxEventPool private pools (counted in pools_over).
  // `over`: set when `id` is a private pool past the kMaxEventPool-th.
  std::uint8_t PoolIndexOf(PoolId id, bool* over = nullptr) {
    if (id.is_default()) return 0;
    std::vector<PoolId>& pools = out.requests.pools;
    for (std::size_t k = 1; k < pools.size(); ++k) {
      if (pools[k] == id) return static_cast<std::uint8_t>(k);
    }
    if (pools.size() > kMaxEventPool) {
      if (over != nullptr) *over = true;
      return 0;
    }
    pools.push_back(id);
    pool_released.push_back(false);
    release_request.push_back(0);
    return static_cast<std::uint8_t>(pools.size() - 1);
  }
  std::uint8_t PoolIndexOf(const PyView& pool, bool* over = nullptr) {
    if (!pool.valid() || DefaultPool(pool)) return 0;
    return PoolIndexOf(PoolIdOf(pool), over);
  }
  // Pool `pool` allocates again after a segment_free of its own taken for
  // its release: that free was the allocator's (release_available_cached_blocks
  // under max_split_size, which frees a live pool's oversize block inside an
  // allocation; the replay does it too), not a release. The release request
  // becomes a no-op (pool 0).
  void StillLive(std::uint8_t pool) {
    if (!pool_released[pool]) return;
    pool_released[pool] = false;
    out.requests.requests[release_request[pool]].pool = 0;
  }

  // A trace entry read as a dict (one the reader did not hand over as a record).
  void Entry(const PyView& e) {
    // One pass over the keys (str keys, each classified once per distinct
    // string of the pickle); what depends on the action is done after it.
    // The pairs as stored (what e.key(k) and e.value(k) give, without a view per key).
    const PyRef* const pairs = e.dict_elements();
    EntryFields f(pairs);
    const PickleArena* const arena = e.arena();
    const std::size_t n_pairs = pairs == nullptr || arena == nullptr ? 0 : e.size();
    for (std::size_t k = 0; k < n_pairs; ++k) {
      const PyRef& key = pairs[2 * k];
      if (key.kind != PyKind::kString) continue;
      // Entries repeat their keys in one order, each key the same stored
      // string (a memo reference): the key at this position last time first.
      Field field;
      if (k < kKeyPositions && key_at[k].offset == key.v && key_at[k].length == key.n) [[likely]] {
        field = key_at[k].field;
      } else {
        field = field_names.Of(key, std::string_view(arena->chars.data() + key.v, key.n), FieldOf);
        if (k < kKeyPositions) key_at[k] = {key.v, key.n, field};
      }
      f.Set(field, static_cast<std::uint32_t>(k));
    }
    Apply(f, arena, &e);
  }

  // A trace entry handed over as a record: its keys are kRecordKeys[index].
  void Record(const PickleRecord& r) {
    EntryFields f(r.pairs);
    // (each key once: the reader hands over no record with a key twice)
    for (std::uint32_t k = 0; k < r.n; ++k) f.at[r.key_index[k]] = k;
    Apply(f, r.arena, nullptr);
  }

  // Counts the entry's compile_context and user_metadata, and its keys memscope
  // does not read (`e`: the entry as a dict, when it has unknown keys).
  [[gnu::always_inline]] void CountExtras(const PyView& context_v, const PyView& metadata_v, bool unknown_keys,
                                          const PyView* e) {
    if (const std::optional<std::string_view> c = context_v.AsString(); c && *c != "N/A" && !c->empty()) {
      ++compile_contexts;
    }
    if (const std::optional<std::string_view> m = metadata_v.AsString(); m && !m->empty()) ++user_metadata;
    if (unknown_keys && e != nullptr) {
      for (std::size_t k = 0; k < e->size(); ++k) {
        const std::optional<std::string_view> key = e->key(k).AsString();
        if (key && field_names.Of(e->key(k).ref(), *key, FieldOf) == Field::kUnknown) unknown_fields.Add(*key);
      }
    }
  }

  // A free of a block the trace never allocated: it was alive when the
  // trace began (RebuildStart places it). Returns its new slot; unless
  // `pending`, the slot is live at `addr` and the free goes on as any other.
  std::uint32_t StartBlockFreed(const EntryFields& f, const PickleArena* arena, std::uint64_t addr, bool pending) {
    ++unknown_frees;
    Request r{.op = RequestOp::kAlloc,
              .slot = Slot(addr),
              .size = UIntOr0(PyView(arena, f[Field::kSize])),
              .stream = UIntOr0(PyView(arena, f[Field::kStream]))};
    tags.Tag(PyView(arena, f[Field::kFrames]), r, out.requests);
    start_frees.push_back({addr, r, pending});
    if (!pending) {
      AddrState& a = addrs[addr];
      a.slot = r.slot;
      a.live = true;
    }
    return r.slot;
  }

  // An alloc entry: a request of a new slot (after a free the trace lost, when
  // its address is still live), in its pool, tagged from its frames.
  [[gnu::always_inline]] void AllocEntry(const EntryFields& f, const PickleArena* arena, std::uint64_t addr,
                                         double time_us) {
    const std::uint64_t size = UIntOr0(PyView(arena, f[Field::kSize]));
    const std::uint64_t stream = UIntOr0(PyView(arena, f[Field::kStream]));
    const PyView frames_v(arena, f[Field::kFrames]);
    AddrState& a = addrs[addr];  // one probe: its slot is set below
    if (a.live) {                // a free the trace lost
      Push(Request{.op = RequestOp::kFree, .slot = a.slot}, time_us);
    }
    Request r{.op = RequestOp::kAlloc, .slot = Slot(addr), .size = size, .stream = stream};
    if (const PyView pool_v(arena, f[Field::kPoolId]); pool_v.valid() && !DefaultPool(pool_v)) [[unlikely]] {
      bool over = false;
      r.pool = PoolIndexOf(pool_v, &over);
      if (over) ++pools_over;
      if (r.pool != 0) {
        ++private_pool_allocs;
        StillLive(r.pool);
      }
    }
    tags.Tag(frames_v, r, out.requests);
    a.slot = r.slot;
    a.live = true;
    Push(r, time_us);
    last_alloc_entry = entries;
  }

  // A segment_free or segment_unmap entry of `size` bytes: the release of
  // its private pool, or else an empty_cache.
  void SegmentFreeEntry(const PyView& pool_v, std::uint64_t addr, std::uint64_t size, bool unmap, double time_us) {
    // empty_cache() (or the release-all retry before an OOM): the replay
    // empties its cache here too, once for the run of segment frees.
    out.segment_actions.push_back({unmap ? EventType::kSegmentUnmap : EventType::kSegmentFree, size});
    reserved -= static_cast<std::int64_t>(size);
    // The segment's pool: the entry's pool_id, else the pool its
    // segment_alloc named (entries without pool_id). A private pool's
    // segment freed while the pool was live: the pool was released then
    // (its MemPool deleted: releasePool and emptyCache(id); a CUDA graph
    // destroyed, then empty_cache), which frees that pool's free segments
    // (unless it allocates again: StillLive).
    std::uint8_t pool = 0;
    if (pool_v.valid()) {
      pool = PoolIndexOf(pool_v);
    } else if (!private_segments.empty()) {
      if (auto it = private_segments.find(addr); it != private_segments.end()) pool = it->second;
    }
    if (!private_segments.empty()) private_segments.erase(addr);
    std::vector<Request>& requests = out.requests.requests;
    if (pool != 0 && !pool_released[pool]) [[unlikely]] {
      pool_released[pool] = true;
      Push(Request{.op = RequestOp::kReleasePool, .pool = pool}, time_us);
      release_request[pool] = requests.size() - 1;
    } else if (pool != 0 && !requests.empty() && requests.back().op == RequestOp::kReleasePool &&
               requests.back().pool == pool) {
      // (freed by that release)
    } else if (requests.empty() || requests.back().op != RequestOp::kEmptyCache) {
      Push(Request{.op = RequestOp::kEmptyCache}, time_us);
      pending_frees = ImportedTrace::MallocFrees{.line = requests.back().line,
                                                 .reserved_before = static_cast<std::uint64_t>(reserved) + size,
                                                 .new_segment = 0};
    }
  }

  // A free_completed: the end of a delayed free's wait, or of one requested
  // before the trace began.
  void FreeCompletedEntry(const EntryFields& f, const PickleArena* arena, std::uint64_t addr, double time_us) {
    auto w = addrs.find(addr);
    if (w != addrs.end() && w->second.waiting) {
      Push(Request{.op = RequestOp::kFreeCompleted, .stream = WaitStream(w->second.wait_slot)}, time_us);
      w->second.waiting = false;
      --waiting;
      if (!w->second.live) addrs.erase(w);
    } else if (w == addrs.end() && addr != 0) {
      // Its free was requested before the trace began: the block waited
      // on stream events then, and waits in the replay too (the head's
      // record_stream and free, RebuildStart) until here.
      const std::uint32_t slot = StartBlockFreed(f, arena, addr, /*pending=*/true);
      Push(Request{.op = RequestOp::kFreeCompleted, .stream = WaitStream(slot)}, time_us);
    }
  }

  // `e`: the entry as a dict, for the names of unknown keys (records have none).
  void Apply(const EntryFields& f, const PickleArena* arena, const PyView* e) {
    ++entries;
    const PyView action_v(arena, f[Field::kAction]), time_v(arena, f[Field::kTimeUs]),
        context_v(arena, f[Field::kCompileContext]), metadata_v(arena, f[Field::kUserMetadata]);
    const bool unknown_keys = f.unknown_keys;
    const std::optional<std::string_view> action = action_v.AsString();
    if (!action) {
      unknown_actions.Add("(no action)");
      return;
    }
    const Action act = action_names.Of(action_v.ref(), *action, ParseTraceAction);
    // The entry's pool (newer PyTorch writes pool_id on every entry), read where it is used.
    const auto pool_of = [&] { return PyView(arena, f[Field::kPoolId]); };
    // (an annotate entry's user_metadata is its text, not an extra)
    CountExtras(context_v, act == TraceAction::kAnnotate ? PyView() : metadata_v, unknown_keys, e);
    const std::uint64_t addr = UIntOr0(PyView(arena, f[Field::kAddr]));
    const std::optional<double> time = time_v.AsNumber();
    const double time_us = time.value_or(last_time);
    if (time) {
      if (!time_known) out.requests.time_origin_us = static_cast<std::int64_t>(time_us);
      time_known = true;
    }
    last_time = time_us;
    if (held) {
      const bool completes_held = act == TraceAction::kFreeCompleted && addr == held->addr;
      Release(completes_held);
      if (completes_held) return;
    }
    // (size, stream and frames: read where they are used)
    const auto size_of = [&] { return UIntOr0(PyView(arena, f[Field::kSize])); };
    if (pending_frees && act != TraceAction::kSegmentFree && act != TraceAction::kSegmentUnmap) {
      if (act == TraceAction::kSegmentAlloc && (!pool_of().valid() || DefaultPool(pool_of()))) {
        pending_frees->new_segment = size_of();
        out.malloc_frees.push_back(*pending_frees);
      }
      pending_frees.reset();
    }
    if (act == TraceAction::kAlloc) {
      AllocEntry(f, arena, addr, time_us);
    } else if (act == TraceAction::kFreeRequested) {
      auto it = addrs.find(addr);
      if (it == addrs.end() && addr != 0) {
        StartBlockFreed(f, arena, addr, /*pending=*/false);
        it = addrs.find(addr);
      }
      if (it == addrs.end() || !it->second.live) {
        ++unknown_frees;
        return;
      }
      held = Held{addr, it->second.slot, time_us};
      if (it->second.waiting) {
        it->second.live = false;
      } else {
        addrs.erase(it);  // Release puts it back if its free waits
      }
    } else if (act == TraceAction::kFreeCompleted) {
      FreeCompletedEntry(f, arena, addr, time_us);
    } else if (act == TraceAction::kSegmentAlloc || act == TraceAction::kSegmentMap) {
      const std::uint64_t size = size_of();
      out.segment_actions.push_back(
          {act == TraceAction::kSegmentAlloc ? EventType::kSegmentAlloc : EventType::kSegmentMap, size});
      reserved += static_cast<std::int64_t>(size);
      trace_segments.insert(addr);
      if (act == TraceAction::kSegmentAlloc) live_segments.insert(addr);
      maps_seen |= act == TraceAction::kSegmentMap;
      if (const PyView pool_v = pool_of(); pool_v.valid() && !DefaultPool(pool_v)) [[unlikely]] {
        if (const std::uint8_t pool = PoolIndexOf(pool_v); pool != 0) {
          private_segments[addr] = pool;
          StillLive(pool);
        }
      }
      if (addr != 0 && addr <= ~std::uint64_t{0} - size) PlanSegment(act == TraceAction::kSegmentMap, addr, size);
    } else if (act == TraceAction::kSegmentFree || act == TraceAction::kSegmentUnmap) {
      maps_seen |= act == TraceAction::kSegmentUnmap;
      if (act == TraceAction::kSegmentFree && live_segments.erase(addr) == 0) {
        start_segment_frees.push_back(
            {addr, size_of(), UIntOr0(PyView(arena, f[Field::kStream])), PoolIndexOf(pool_of())});
      }
      SegmentFreeEntry(pool_of(), addr, size_of(), act == TraceAction::kSegmentUnmap, time_us);
    } else if (act == TraceAction::kOom) {
      ++ooms;
      last_oom_entry = entries;
      oom_size = size_of();
      oom_pool = PoolIndexOf(pool_of());
      const std::uint64_t device_free = UIntOr0(PyView(arena, f[Field::kDeviceFree]));
      if (ooms == 1) {
        oom_reserved = reserved;
        oom_device_free = device_free;
      }
      if (out.device_capacity == 0 && reserved >= 0) {
        out.device_capacity = static_cast<std::uint64_t>(reserved) + device_free;
      }
    } else if (act == TraceAction::kUserDefined) {
      // PyTorch 2.1-2.3: record_function annotations inside the trace.
      const std::optional<std::string_view> name = PyView(arena, f[Field::kName]).AsString();
      const std::optional<std::string_view> stage = PyView(arena, f[Field::kStage]).AsString();
      if (name) {
        Request r{.op = RequestOp::kMark};
        if (stage) r.op = *stage == "END" ? RequestOp::kPhaseEnd : RequestOp::kPhaseBegin;
        AnnotationPhase(std::string(*name), r, out.requests);
        if (r.op == RequestOp::kMark && r.phase != Phase::kUser) {
          out.requests.strings.push_back(std::string(*name));
          r.text = static_cast<std::uint32_t>(out.requests.strings.size() - 1);
        }
        Push(r, time_us);
      }
    } else if (act == TraceAction::kAnnotate) {
      AnnotateEntry(PyView(arena, f[Field::kUserMetadata]), PyView(arena, f[Field::kName]), time_us);
    } else if (act != TraceAction::kSnapshot) {
      unknown_actions.Add(*action);
    }
  }

  // PyTorch 2.11+'s `annotate` entry (_annotate_memory): a point in the
  // trace named by its user_metadata (else its name), replayed as a mark
  // that is written back as the same entry. Without a text it is counted
  // as an entry memscope could not read.
  void AnnotateEntry(const PyView& metadata_v, const PyView& name_v, double time_us) {
    std::optional<std::string_view> text = metadata_v.AsString();
    if (!text || text->empty()) text = name_v.AsString();
    if (!text) {
      unknown_actions.Add("annotate (without user_metadata)");
      return;
    }
    out.requests.strings.push_back(std::string(*text));
    ++annotations;
    Push(Request{.op = RequestOp::kAnnotate, .text = static_cast<std::uint32_t>(out.requests.strings.size() - 1)},
         time_us);
  }
};

// The snapshot's allocator settings, parsed here once (the rest of a load
// reads the value): its PYTORCH_CUDA_ALLOC_CONF text when memscope can parse
// it, else the settings its fields give.
AllocatorConfig SnapshotSettings(const PyView& settings) {
  if (!settings.is_dict()) return AllocatorConfig{};
  if (std::optional<std::string_view> text = settings.Get("PYTORCH_CUDA_ALLOC_CONF").AsString()) {
    // Accept it only if memscope can parse it (PyTorch may list keys memscope refuses).
    if (absl::StatusOr<AllocatorConfig> parsed = AllocatorConfig::Parse(std::string(*text)); parsed.ok()) {
      return *std::move(parsed);
    }
  }
  std::vector<std::string> parts;
  if (std::optional<std::int64_t> m = settings.Get("max_split_size").AsInt(); m && *m > 0) {
    const std::int64_t mb = *m / static_cast<std::int64_t>(kMiB);
    if (mb >= 20 && mb < (std::int64_t{1} << 40)) parts.push_back(absl::StrCat("max_split_size_mb:", mb));
  }
  if (settings.Get("expandable_segments").bool_value()) parts.push_back("expandable_segments:True");
  if (const PyView g = settings.Get("garbage_collection_threshold"); g.kind() == PyKind::kFloat) {
    if (g.float_value() > 0 && g.float_value() < 1) {
      parts.push_back(absl::StrCat("garbage_collection_threshold:", g.float_value()));
    }
  }
  if (parts.empty()) return AllocatorConfig{};
  absl::StatusOr<AllocatorConfig> parsed = AllocatorConfig::Parse(absl::StrJoin(parts, ","));
  return parsed.ok() ? *std::move(parsed) : AllocatorConfig{};
}

int DeviceOf(const PyView& v) {
  const std::optional<std::int64_t> d = v.Get("device").AsInt();
  return d && *d >= 0 && *d <= kMaxTimelineDeviceIndex ? static_cast<int>(*d) : 0;
}

// "a, b, c" of at most 8 parts, then "and N more".
std::string PoolList(const std::vector<std::string>& parts) {
  constexpr std::size_t kShown = 8;
  if (parts.size() <= kShown) return absl::StrJoin(parts, ", ");
  return absl::StrCat(absl::StrJoin(parts.begin(), parts.begin() + kShown, ", "), " and ", parts.size() - kShown,
                      " more");
}

std::string PoolText(const PyView& pool) {
  std::vector<std::string> parts;
  for (std::size_t k = 0; k < pool.size(); ++k) parts.push_back(absl::StrCat(UIntOr0(pool[k])));
  return absl::StrCat("(", absl::StrJoin(parts, ", "), ")");
}

// Blocks alive at the snapshot that the trace never allocated were
// allocated before the trace began: they start the replay. Segments the
// trace never allocated count in the reserved bytes of an OOM's capacity.
struct Preexisting {
  std::uint64_t addr, size;
  PyView frames;
  PoolId pool;  // its segment's segment_pool_id
};

// What the snapshot's "segments" say, per device.
struct SnapshotSegments {
  std::map<int, std::vector<Preexisting>> preexisting;
  std::map<int, std::vector<std::pair<std::uint64_t, std::uint64_t>>> segments_at_end;  // device -> (addr, size)
  std::map<int, std::map<std::string, std::uint64_t>> private_pools;                    // device -> pool -> segments
  std::map<int, std::vector<PyView>> views;  // device -> its segments as the file has them
};

// Reads the snapshot's segments: their blocks alive at the end, addresses and private pools.
SnapshotSegments ReadSegments(const PyView& root) {
  SnapshotSegments out;
  const PyView segments = root.Get("segments");
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const PyView seg = segments[s];
    const int device = DeviceOf(seg);
    out.views[device].push_back(seg);
    out.segments_at_end[device].emplace_back(UIntOr0(seg.Get("address")), UIntOr0(seg.Get("total_size")));
    const PyView seg_pool = seg.Get("segment_pool_id");
    PoolId pool_id;
    if (!IsDefaultPool(seg_pool)) {
      ++out.private_pools[device][PoolText(seg_pool)];
      pool_id = PoolIdOf(seg_pool);
    }
    const PyView blocks = seg.Get("blocks");
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      const PyView block = blocks[k];
      const std::optional<std::string_view> state = block.Get("state").AsString();
      if (!state || *state != "active_allocated") continue;
      const std::uint64_t addr = UIntOr0(block.Get("address"));
      std::uint64_t size = UIntOr0(block.Get("requested_size"));
      if (size == 0) size = UIntOr0(block.Get("size"));
      out.preexisting[device].push_back({addr, size, block.Get("frames"), pool_id});
    }
  }
  return out;
}

// ---- Pinned host memory (record_pinned_host_memory, PyTorch 2.11+).

// Reads `host_segments` and `host_traces` into trace.host, their frames into
// trace's stacks (through `tags`, not counted as allocations' stacks). A
// value of the wrong type is an error naming where it is.
class HostMemoryReader {
 public:
  HostMemoryReader(const std::string& path, StackTags& tags, RequestTrace& trace)
      : path_(path), tags_(tags), trace_(trace) {}

  absl::Status Read(const PyView& root) {
    const PyView segments = root.Get("host_segments"), traces = root.Get("host_traces");
    PinnedHostMemory& host = trace_.host;
    host.present = segments.valid() || traces.valid();
    if (segments.valid() && !segments.is_list()) {
      Bad("host_segments", "a list");
      return error_;
    }
    for (std::size_t s = 0; s < segments.size() && error_.ok(); ++s) ReadSegment(segments[s], s);
    if (traces.valid() && !traces.is_list()) {
      Bad("host_traces", "a list");
      return error_;
    }
    // (one list of entries; a list of lists, one per device, is read in order)
    for (std::size_t k = 0; k < traces.size() && error_.ok(); ++k) {
      const PyView item = traces[k];
      if (!item.is_list()) {
        ReadEntry(item, absl::StrCat("host_traces[", k, "]"));
        continue;
      }
      for (std::size_t j = 0; j < item.size() && error_.ok(); ++j) {
        ReadEntry(item[j], absl::StrCat("host_traces[", k, "][", j, "]"));
      }
    }
    return error_;
  }

 private:
  // The first value of a wrong type: `where` is not `expected`.
  void Bad(const std::string& where, const char* expected) {
    if (error_.ok()) error_ = absl::InvalidArgumentError(absl::StrCat(path_, ": ", where, " is not ", expected));
  }
  std::uint64_t UInt(const PyView& d, const std::string& where, const char* key) {
    const PyView v = d.Get(key);
    if (!v.valid()) return 0;
    if (const std::optional<std::uint64_t> u = v.AsUInt()) return *u;
    Bad(where + "." + key, "a non-negative int");
    return 0;
  }
  std::string Str(const PyView& d, const std::string& where, const char* key) {
    const PyView v = d.Get(key);
    if (!v.valid()) return "";
    if (const std::optional<std::string_view> text = v.AsString()) return std::string(*text);
    Bad(where + "." + key, "a str");
    return "";
  }
  std::uint32_t Stack(const PyView& d, const std::string& where) {
    const PyView frames = d.Get("frames");
    if (!frames.valid()) return 0;
    if (!frames.is_list()) {
      Bad(where + ".frames", "a list");
      return 0;
    }
    // (host frames are no allocation's: the device's counts stay)
    const std::uint64_t attributed = tags_.attributed, from_frames = tags_.from_frames;
    Request r{.op = RequestOp::kAlloc};
    tags_.Tag(frames, r, trace_);
    tags_.attributed = attributed;
    tags_.from_frames = from_frames;
    return r.stack;
  }
  void ReadSegment(const PyView& seg, std::size_t s) {
    const std::string where = absl::StrCat("host_segments[", s, "]");
    if (!seg.is_dict()) {
      Bad(where, "a dict");
      return;
    }
    HostSegment& out = trace_.host.segments.emplace_back();
    out.address = UInt(seg, where, "address");
    out.total_size = UInt(seg, where, "total_size");
    out.allocated_size = UInt(seg, where, "allocated_size");
    out.active_size = UInt(seg, where, "active_size");
    out.requested_size = UInt(seg, where, "requested_size");
    if (const PyView d = seg.Get("device"); d.valid()) {
      if (!d.AsInt()) Bad(where + ".device", "an int");
      out.device = d.AsInt().value_or(-1);
    }
    out.stack = Stack(seg, where);
    const PyView blocks = seg.Get("blocks");
    if (blocks.valid() && !blocks.is_list()) Bad(where + ".blocks", "a list");
    for (std::size_t k = 0; k < blocks.size() && error_.ok(); ++k) {
      const std::string at = absl::StrCat(where, ".blocks[", k, "]");
      const PyView b = blocks[k];
      if (!b.is_dict()) {
        Bad(at, "a dict");
        return;
      }
      HostBlock& block = out.blocks.emplace_back();
      block.address = UInt(b, at, "address");
      block.size = UInt(b, at, "size");
      block.requested_size = UInt(b, at, "requested_size");
      block.state = Str(b, at, "state");
      block.stack = Stack(b, at);
    }
  }
  void ReadEntry(const PyView& e, const std::string& where) {
    if (!e.is_dict()) {
      Bad(where, "a dict");
      return;
    }
    HostTraceEntry& out = trace_.host.trace.emplace_back();
    out.action = Str(e, where, "action");
    out.addr = UInt(e, where, "addr");
    out.size = UInt(e, where, "size");
    out.stream = UInt(e, where, "stream");
    if (const PyView t = e.Get("time_us"); t.valid()) {
      if (!t.AsNumber()) Bad(where + ".time_us", "a number");
      out.time_us = static_cast<std::int64_t>(t.AsNumber().value_or(0));
    }
    out.stack = Stack(e, where);
  }

  const std::string& path_;
  StackTags& tags_;
  RequestTrace& trace_;
  absl::Status error_;
};

// ---- The state at the trace's start, rebuilt from the file's segments.
//
// A trace that begins after the program did (PyTorch's ring buffer of
// max_entries dropped its head, or recording began late) is undone from
// the segments at its end, as MemoryViz does: a segment the trace
// allocated (and did not free) was not there at its start; one it freed
// but never allocated was (its size, stream and pool from the
// segment_free); a block the trace allocated (and did not free) was not
// there; one it freed but never allocated was allocated. Between the blocks
// the gaps of a segment were free, one free block each (PyTorch merges
// free neighbours). A block the trace only frees has its requested size
// there, rounded as the settings round it; in the large pool it also holds
// the gap after it when PyTorch would not have split that off (up to 1
// MiB; an oversize block, under max_non_split_rounding).

struct StartSegmentBuild {
  RequestTrace::StartSegment seg;
  struct Block {
    std::uint64_t addr = 0, size = 0;
    Request alloc;
    bool exact = true;  // its size is the file's (else RoundSize of the freed request)
    bool pending = false;
  };
  std::vector<Block> blocks;
};
using StartMap = std::map<std::uint64_t, StartSegmentBuild>;

// The rebuilt state, or why the file's segments and its trace disagree.
struct StartState {
  std::vector<RequestTrace::StartSegment> segments;
  std::vector<RequestTrace::StartBlock> blocks;
  std::vector<std::uint32_t> pending;  // slots of blocks whose free was requested before the trace
  std::string failure;
};

// The file's segments the trace did not allocate, with their blocks alive at
// the end that it did not allocate either.
std::string StartFromFinal(DeviceBuilder& b, const std::vector<PyView>& views, StartMap& out) {
  for (const PyView& v : views) {
    const std::uint64_t addr = UIntOr0(v.Get("address"));
    if (b.live_segments.contains(addr)) continue;
    if (v.Get("is_expandable").bool_value()) return "its expandable segments are not rebuilt";
    const std::optional<std::string_view> type = v.Get("segment_type").AsString();
    StartSegmentBuild seg{.seg = {.address = addr,
                                  .size = UIntOr0(v.Get("total_size")),
                                  .stream = UIntOr0(v.Get("stream")),
                                  .pool = b.PoolIndexOf(v.Get("segment_pool_id")),
                                  .small = type && *type == "small"},
                          .blocks = {}};
    const PyView blocks = v.Get("blocks");
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      const PyView block = blocks[k];
      const std::optional<std::string_view> state = block.Get("state").AsString();
      if (!state || *state == "inactive") continue;
      const std::uint64_t at = UIntOr0(block.Get("address"));
      if (b.addrs.contains(at)) continue;  // the trace's own (live, or its free waiting)
      StartSegmentBuild::Block sb{.addr = at, .size = UIntOr0(block.Get("size")), .alloc = {}};
      sb.pending = IsPendingFreeState(*state);
      sb.alloc = Request{.op = RequestOp::kAlloc, .slot = b.Slot(at), .stream = seg.seg.stream};
      sb.alloc.size = UIntOr0(block.Get("requested_size"));
      if (sb.alloc.size == 0) sb.alloc.size = sb.size;
      b.tags.Tag(block.Get("frames"), sb.alloc, b.out.requests);
      seg.blocks.push_back(sb);
    }
    if (!out.emplace(addr, std::move(seg)).second) return absl::StrCat("two segments at ", HexAddress(addr));
  }
  return "";
}

// Adds the segments and blocks the trace freed but never allocated.
std::string StartFromFrees(const DeviceBuilder& b, const AllocatorConfig& settings, StartMap& out) {
  for (const DeviceBuilder::StartSegmentFree& f : b.start_segment_frees) {
    StartSegmentBuild seg{
        .seg = {.address = f.addr, .size = f.size, .stream = f.stream, .pool = f.pool, .small = f.size == kSmallBuffer},
        .blocks = {}};
    if (!out.emplace(f.addr, std::move(seg)).second) {
      return absl::StrCat("the segment at ", HexAddress(f.addr), " is freed by the trace and alive at its end");
    }
  }
  for (const DeviceBuilder::StartFree& f : b.start_frees) {
    auto it = out.upper_bound(f.addr);
    if (it == out.begin() || f.addr >= std::prev(it)->first + std::prev(it)->second.seg.size) {
      return absl::StrCat("the trace frees a block at ", HexAddress(f.addr), " outside every segment it starts with");
    }
    StartSegmentBuild::Block sb{.addr = f.addr, .size = settings.RoundSize(f.alloc.size), .alloc = f.alloc};
    sb.exact = false;
    sb.pending = f.pending;
    std::prev(it)->second.blocks.push_back(sb);
  }
  return "";
}

// Orders each segment's blocks, checks that they tile it without overlap,
// and gives a block the trace only freed the gap PyTorch would not have
// split off after it.
std::string StartBlockSizes(const AllocatorConfig& settings, StartMap& segs) {
  for (auto& [addr, seg] : segs) {
    auto& blocks = seg.blocks;
    std::sort(blocks.begin(), blocks.end(), [](const auto& x, const auto& y) { return x.addr < y.addr; });
    const std::uint64_t end = addr + seg.seg.size;
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      auto& block = blocks[k];
      const std::uint64_t next = k + 1 < blocks.size() ? blocks[k + 1].addr : end;
      if (block.addr < addr || block.size == 0 || block.addr + block.size > next ||
          block.addr + block.size < block.addr) {
        return absl::StrCat("the block at ", HexAddress(block.addr), " overlaps another or its segment's end");
      }
      const std::uint64_t gap = next - (block.addr + block.size);
      if (block.exact || gap == 0 || seg.seg.small) continue;
      const bool oversize = block.size >= settings.max_split_size;
      if (oversize ? gap < settings.max_non_split_rounding_size : gap <= kSmallSize) block.size += gap;
    }
  }
  return "";
}

StartState RebuildStart(DeviceBuilder& b, const std::vector<PyView>& views, const AllocatorConfig& settings) {
  StartState state;
  if (b.maps_seen) {
    if (!b.start_frees.empty()) state.failure = "its expandable segments are not rebuilt";
    return state;
  }
  StartMap segs;
  state.failure = StartFromFinal(b, views, segs);
  if (state.failure.empty()) state.failure = StartFromFrees(b, settings, segs);
  if (state.failure.empty()) state.failure = StartBlockSizes(settings, segs);
  if (!state.failure.empty()) return state;
  for (auto& [addr, seg] : segs) {
    state.segments.push_back(seg.seg);
    for (const StartSegmentBuild::Block& block : seg.blocks) {
      state.blocks.push_back({block.alloc, block.size});
      state.blocks.back().alloc.stream = seg.seg.stream;
      state.blocks.back().alloc.pool = seg.seg.pool;
      if (block.pending) state.pending.push_back(block.alloc.slot);
    }
  }
  return state;
}

// The file's segments as --verify compares them with the replay's end.
std::vector<SegmentInfo> FinalSegments(const std::vector<PyView>& views) {
  std::vector<SegmentInfo> out;
  for (const PyView& v : views) {
    SegmentInfo& seg = out.emplace_back();
    seg.address = UIntOr0(v.Get("address"));
    seg.total_size = UIntOr0(v.Get("total_size"));
    const PyView blocks = v.Get("blocks");
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      const std::optional<std::string_view> state = blocks[k].Get("state").AsString();
      BlockInfo& block = seg.blocks.emplace_back();
      block.address = UIntOr0(blocks[k].Get("address"));
      block.size = UIntOr0(blocks[k].Get("size"));
      block.state = !state || *state == "inactive" ? BlockState::kInactive
                    : IsPendingFreeState(*state)   ? BlockState::kActivePendingFree
                                                   : BlockState::kActiveAllocated;
    }
  }
  std::sort(out.begin(), out.end(), [](const SegmentInfo& x, const SegmentInfo& y) { return x.address < y.address; });
  return out;
}

// Starts the replay from the rebuilt state: its segments lead the planned
// addresses, and a block whose free was requested before the trace is
// freed at once onto a wait of its own (completed at its free_completed).
// Returns the head requests; fixes the reserved bytes the trace counted
// from 0 (an OOM's capacity, the malloc-frees' reserved bytes).
std::vector<Request> UseStart(DeviceBuilder& b, StartState& start, const std::vector<PyView>& views) {
  ImportedTrace& t = b.out;
  std::uint64_t start_reserved = 0;
  std::vector<PlannedAddress> planned;
  for (const RequestTrace::StartSegment& seg : start.segments) {
    start_reserved += seg.size;
    planned.push_back({seg.size, seg.address});
  }
  planned.insert(planned.end(), t.requests.planned_mallocs.begin(), t.requests.planned_mallocs.end());
  t.requests.planned_mallocs = std::move(planned);
  std::vector<Request> head;
  for (const std::uint32_t slot : start.pending) {
    head.push_back(Request{.op = RequestOp::kRecordStream, .slot = slot, .stream = DeviceBuilder::WaitStream(slot)});
    head.push_back(Request{.op = RequestOp::kFree, .slot = slot});
  }
  for (Request& r : head) r.time_us = t.requests.time_origin_us;
  for (ImportedTrace::MallocFrees& m : t.malloc_frees) m.reserved_before += start_reserved;
  if (b.ooms > 0 && b.oom_reserved + static_cast<std::int64_t>(start_reserved) >= 0) {
    t.device_capacity =
        static_cast<std::uint64_t>(b.oom_reserved + static_cast<std::int64_t>(start_reserved)) + b.oom_device_free;
  }
  t.notes.push_back(absl::StrCat(
      "the trace of device ", t.device,
      " does not start at the beginning of the program (PyTorch's ring buffer dropped its head, or recording began "
      "later): the state at its start was rebuilt from the snapshot's ",
      views.size(), views.size() == 1 ? " segment" : " segments", " (", start.segments.size(),
      start.segments.size() == 1 ? " segment" : " segments", " and ", start.blocks.size(),
      start.blocks.size() == 1 ? " block" : " blocks",
      " alive then); the replay starts from it, and --verify checks what the trace covers"));
  t.requests.start_segments = std::move(start.segments);
  t.requests.start_blocks = std::move(start.blocks);
  t.final_segments = FinalSegments(views);
  return head;
}

// The allocs of the blocks alive at the snapshot that the trace never
// allocated, in address order; `head_private`: how many are in private pools.
std::vector<Request> HeadRequests(DeviceBuilder& b, const std::vector<Preexisting>& preexisting,
                                  std::uint64_t& head_private) {
  ImportedTrace& t = b.out;
  std::vector<Request> head;
  absl::flat_hash_set<std::uint64_t> traced;  // every address the trace allocated at
  if (!preexisting.empty()) traced.insert(t.requests.address_ids.begin(), t.requests.address_ids.end());
  for (const Preexisting& p : preexisting) {
    if (traced.contains(p.addr)) continue;
    Request r{.op = RequestOp::kAlloc, .slot = b.Slot(p.addr), .size = p.size};
    bool over = false;
    r.pool = b.PoolIndexOf(p.pool, &over);
    if (over) ++b.pools_over;
    if (r.pool != 0) ++head_private;
    b.tags.Tag(p.frames, r, t.requests);
    r.time_us = t.requests.time_origin_us;
    head.push_back(r);
  }
  return head;
}

// The device's annotations (record_function scopes, memscope's phase marks)
// as phase marks with their times, in time order.
std::vector<std::pair<double, Request>> AnnotationMarks(const PyView& root, int device, DeviceBuilder& b) {
  ImportedTrace& t = b.out;
  std::vector<std::pair<double, Request>> marks;
  const PyView ann = root.Get("external_annotations");
  for (std::size_t k = 0; k < ann.size(); ++k) {
    const PyView a = ann[k];
    const std::optional<std::string_view> name = a.Get("name").AsString();
    const std::optional<std::string_view> stage = a.Get("stage").AsString();
    if (!name || !stage || DeviceOf(a) != device) continue;
    const double time_us = a.Get("time_us").AsNumber().value_or(0);
    Request r{.op = *stage == "START" ? RequestOp::kPhaseBegin : RequestOp::kPhaseEnd};
    AnnotationPhase(std::string(*name), r, t.requests);
    if (b.time_known) r.time_us = std::max<std::int64_t>(static_cast<std::int64_t>(time_us), t.requests.time_origin_us);
    marks.emplace_back(time_us, r);
  }
  std::stable_sort(marks.begin(), marks.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  return marks;
}

// Phase marks without a step inside a ProfilerStep#N scope take step N
// (torch.profiler's schedule names its steps only on that scope): a phase
// ends with the step its begin took, even after the scope closed.
void ProfilerSteps(std::vector<Request>& requests, const RequestTrace& trace) {
  std::int64_t current = kNoStep;
  absl::flat_hash_map<std::string, std::vector<std::int64_t>> open;  // steps of open phases, by phase and label
  for (Request& r : requests) {
    if (r.op != RequestOp::kPhaseBegin && r.op != RequestOp::kPhaseEnd) continue;
    if (r.phase == Phase::kUser && r.step != kNoStep && trace.strings[r.text] == "ProfilerStep") {
      current = r.op == RequestOp::kPhaseBegin ? r.step : kNoStep;
      continue;
    }
    if (r.step != kNoStep) continue;
    // (each mark has a label string of its own: key by the text)
    std::vector<std::int64_t>& steps =
        open[absl::StrCat(static_cast<int>(r.phase), ":", r.phase == Phase::kUser ? trace.strings[r.text] : "")];
    if (r.op == RequestOp::kPhaseBegin) {
      steps.push_back(current);
      r.step = current;
    } else if (!steps.empty()) {
      r.step = steps.back();
      steps.pop_back();
    }
  }
}

// The head, then the trace's requests with the marks placed by time among
// them (the trace's requests are moved out of b.out).
std::vector<Request> MergedRequests(DeviceBuilder& b, const std::vector<Request>& head,
                                    const std::vector<std::pair<double, Request>>& marks) {
  std::vector<Request>& requests = b.out.requests.requests;
  std::vector<Request> merged;
  std::size_t m = 0;
  if (head.empty() && marks.empty()) {
    merged = std::move(requests);  // nothing to merge: no copy (at 10M entries, ~400 MB)
  } else {
    merged = head;
    merged.reserve(head.size() + requests.size() + marks.size() + 1);
  }
  for (std::size_t i = 0; !(head.empty() && marks.empty()) && i < requests.size(); ++i) {
    // A scope's START goes before the entries of its microsecond, its END after them.
    const double time_i = b.TimeOf(i);
    while (m < marks.size() &&
           (marks[m].second.op == RequestOp::kPhaseBegin ? marks[m].first <= time_i : marks[m].first < time_i)) {
      merged.push_back(marks[m++].second);
    }
    merged.push_back(requests[i]);
  }
  while (m < marks.size()) merged.push_back(marks[m++].second);
  return merged;
}

// An OOM that ended the trace's allocations (the snapshot was taken at
// it): the failing request is replayed too, on a device of the capacity
// the OOM implies (plus `segments_at_end` the trace never allocated).
void AddOom(DeviceBuilder& b, int device, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& segments_at_end,
            std::vector<Request>& merged) {
  ImportedTrace& t = b.out;
  if (b.last_oom_entry > b.last_alloc_entry && b.oom_size > 0) {
    Request r{.op = RequestOp::kAlloc, .slot = b.Slot(0), .size = b.oom_size, .line = b.last_oom_entry};
    r.pool = b.oom_pool;
    if (b.time_known) r.time_us = static_cast<std::int64_t>(b.last_time);
    merged.push_back(r);
  }
  std::uint64_t before_trace = 0;  // segments alive at the end that the trace never allocated
  for (const auto& [addr, size] : segments_at_end) {
    if (!b.trace_segments.contains(addr)) before_trace += size;
  }
  if (t.device_capacity != 0) t.device_capacity += before_trace;
  t.notes.push_back(absl::StrCat(
      "the trace of device ", device, " records ", b.ooms, " OOM(s)",
      t.device_capacity != 0 ? absl::StrCat("; the first says the device had ", FormatSize(t.device_capacity),
                                            " for this process (reserved + device_free): the replay uses that capacity")
                             : std::string()));
}

// The notes on what the read of one device's trace skipped, kept apart or inferred.
void AddReadNotes(const DeviceBuilder& b, int device, std::uint64_t head_private,
                  const std::map<std::string, std::uint64_t>& private_pools, ImportedTrace& t) {
  if (!b.unknown_actions.counts.empty()) {
    t.notes.push_back(absl::StrCat("trace entries of device ", device,
                                   " with actions memscope does not model were skipped: ", b.unknown_actions.Text()));
  }
  if (!b.unknown_fields.counts.empty()) {
    t.notes.push_back(absl::StrCat("trace entry fields memscope does not read: ", b.unknown_fields.Text()));
  }
  if (b.private_pool_allocs > 0 || head_private > 0 || !private_pools.empty()) {
    std::vector<std::string> pools;
    for (const auto& [pool, n] : private_pools) pools.push_back(absl::StrCat(pool, ": ", n, " segments"));
    std::string replay_how;
    if (b.private_pool_allocs > 0) {
      replay_how = "the replay keeps each pool's blocks and segments apart, as PyTorch does";
    } else {
      replay_how =
          "its trace entries name no pool (no pool_id: an older PyTorch), so the replay serves the trace's "
          "allocations from the default pool";
      if (head_private > 0)
        absl::StrAppend(&replay_how, "; the blocks alive before the trace start in their segments' pools");
    }
    t.notes.push_back(absl::StrCat(
        "device ", device, " uses private memory pools (CUDA graphs or torch.cuda.MemPool): ", b.private_pool_allocs,
        " allocations of the trace",
        head_private > 0 ? absl::StrCat(" and ", head_private, " blocks alive before it") : std::string(),
        pools.empty() ? std::string() : absl::StrCat("; at the snapshot ", PoolList(pools)), "; ", replay_how,
        b.pools_over > 0 ? absl::StrCat(" (past ", kMaxEventPool, " pools: ", b.pools_over,
                                        " allocations served from the default pool)")
                         : std::string()));
  }
  if (b.tags.from_frames > 0) {
    t.notes.push_back(absl::StrCat("device ", device, ": ", b.tags.from_frames,
                                   " allocations carry stacks; categories from them for ", b.tags.attributed,
                                   " (the rest OTHER), owners from the innermost frame of the user's code"));
  }
  if (b.compile_contexts > 0 || b.user_metadata > 0) {
    t.notes.push_back(absl::StrCat(b.compile_contexts, " trace entries carry a compile_context and ", b.user_metadata,
                                   " a user_metadata (kept in the file, not shown)"));
  }
  if (b.annotations > 0) {
    t.notes.push_back(absl::StrCat("device ", device, ": ", b.annotations,
                                   b.annotations == 1 ? " annotate entry" : " annotate entries",
                                   " (_annotate_memory) read as marks"));
  }
  if (b.delayed_frees > 0) {
    t.notes.push_back(absl::StrCat(b.delayed_frees, " frees of device ", device,
                                   " completed later than requested "
                                   "(blocks used on other streams): they wait on stream events in the replay too"));
  }
}

// The requests that start the replay: the state at the trace's start,
// rebuilt from the file's segments (`rebuilt`); or, where they disagree with
// the trace, the blocks alive at the end that it never allocated, allocated
// first in address order (`head_private`: how many in private pools).
std::vector<Request> StartOfTrace(DeviceBuilder& b, SnapshotSegments& segments, const AllocatorConfig& settings,
                                  std::uint64_t& head_private, bool& rebuilt) {
  ImportedTrace& t = b.out;
  const std::size_t slots = t.requests.address_ids.size();
  const std::uint64_t attributed = b.tags.attributed, from_frames = b.tags.from_frames;
  StartState start = RebuildStart(b, segments.views[t.device], settings);
  rebuilt = start.failure.empty() && !start.segments.empty();
  std::vector<Request> head;
  if (rebuilt) {
    head = UseStart(b, start, segments.views[t.device]);
  } else {
    t.requests.address_ids.resize(slots);
    b.tags.attributed = attributed;
    b.tags.from_frames = from_frames;
    head = HeadRequests(b, segments.preexisting[t.device], head_private);
    t.requests.planned_from_request = head.size();  // the head's segments are not in the trace
  }
  if (!rebuilt && (!head.empty() || b.unknown_frees > 0)) {
    t.notes.push_back(absl::StrCat(
        "the trace of device ", t.device,
        " does not start at the beginning of the program (PyTorch's ring buffer dropped its head): ", head.size(),
        " blocks alive at the snapshot but allocated before the trace start the replay; ", b.unknown_frees,
        " frees of earlier blocks were ignored",
        start.failure.empty() ? std::string()
                              : absl::StrCat(" (the state at its start is not rebuilt: ", start.failure, ")")));
  }
  return head;
}

}  // namespace

absl::StatusOr<std::vector<ImportedTrace>> ReadPytorchSnapshot(const std::string& path) {
  return ReadPytorchSnapshot(path, SnapshotReadOptions{});
}

absl::StatusOr<std::vector<ImportedTrace>> ReadPytorchSnapshot(const std::string& path,
                                                               const SnapshotReadOptions& how) {
  // (Read by ReadPickleFile below: mapped, or a stream; "cannot open" if it cannot be opened.)
  std::error_code size_error;
  std::uint64_t file_size = std::filesystem::file_size(path, size_error);
  if (size_error) file_size = 0;  // no reserve
  std::map<int, DeviceBuilder> devices;
  PickleReadOptions options;
  options.stream_inside_items = false;
  options.fast_dicts = how.fast_dicts;
  options.fast_records = how.records;
  options.stream_list = [](const PicklePath& p) {
    return p.size() == 2 && p[0] == "device_traces" && p[1].size() > 2 && p[1].front() == '[';
  };
  // The device of the list being streamed, kept across its entries (the path
  // is the same for every entry of one list).
  std::string current_label;
  DeviceBuilder* current = nullptr;
  const auto select = [&](const PicklePath& p) -> absl::Status {
    int device = 0;
    if (!absl::SimpleAtoi(absl::string_view(p[1]).substr(1, p[1].size() - 2), &device) || device < 0 ||
        device > kMaxTimelineDeviceIndex) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": bad device_traces index ", p[1]));
    }
    const bool first = !devices.contains(device);
    current = &devices[device];
    current->out.device = device;
    current_label = p[1];
    if (first && devices.size() == 1) {
      // Room for the requests the file can hold (a trace entry takes 40
      // bytes or more of pickle; an alloc entry about 80): reserved address
      // space costs no memory until used, and a vector of millions grown
      // by doubling copies (and faults in) every element again.
      const std::uint64_t entries = file_size / 40;
      current->out.requests.requests.reserve(entries);
      current->out.requests.address_ids.reserve(entries / 2);
    }
    return absl::OkStatus();
  };
  options.on_item = [&](const PicklePath& p, PyView item) -> absl::Status {
    if (current == nullptr || p[1] != current_label) [[unlikely]] {
      if (absl::Status s = select(p); !s.ok()) return s;
    }
    DeviceBuilder& b = *current;
    if (!item.is_dict()) {
      b.unknown_actions.Add(
          absl::StrCat("(an entry that is a ", item.kind() == PyKind::kList ? "list" : "scalar", ", not a dict)"));
      return absl::OkStatus();
    }
    b.Entry(item);
    return absl::OkStatus();
  };
  // Entries of known keys holding their frames list come as records (no dict built).
  for (const char* k : kRecordKeys) options.record_keys.emplace_back(k);
  options.on_record = [&](const PicklePath& p, const PickleRecord& r) -> absl::Status {
    if (current == nullptr || p[1] != current_label) [[unlikely]] {
      if (absl::Status s = select(p); !s.ok()) return s;
    }
    current->Record(r);
    return absl::OkStatus();
  };
  absl::StatusOr<PickleDoc> doc = ReadPickleFile(path, options);
  if (!doc.ok()) return doc.status();
  const PyView root = doc->root();
  if (root.is_list()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path,
        ": a PyTorch 1.13 snapshot (a list of segments) has no trace of requests to replay; record one with "
        "torch.cuda.memory._record_memory_history() on PyTorch 2.x"));
  }
  if (!root.is_dict() || !root.Get("segments").valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a PyTorch memory snapshot (expected a dict with \"segments\" and \"device_traces\")"));
  }
  const AllocatorConfig settings = SnapshotSettings(root.Get("allocator_settings"));
  SnapshotSegments segments = ReadSegments(root);

  if (!devices.empty()) {  // the host allocator is the process's: on the first device's trace
    DeviceBuilder& first = devices.begin()->second;
    MEMSCOPE_RETURN_IF_ERROR(HostMemoryReader(path, first.tags, first.out.requests).Read(root));
  }
  std::vector<ImportedTrace> result;
  for (auto& [device, b] : devices) {
    if (!b.tags.bad_value.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", b.tags.bad_value));
    b.Release(/*completed_at_once=*/false);  // the trace ended before its free completed
    ImportedTrace& t = b.out;
    t.settings = settings;
    t.alloc_conf = settings.text;
    t.requests.source = absl::StrCat(path, " (device ", device, ")");
    std::uint64_t head_private = 0;  // blocks of the head in private pools
    bool rebuilt = false;
    const std::vector<Request> head = StartOfTrace(b, segments, settings, head_private, rebuilt);
    const std::vector<std::pair<double, Request>> marks = AnnotationMarks(root, device, b);
    std::vector<Request> merged = MergedRequests(b, head, marks);
    ProfilerSteps(merged, t.requests);
    if (b.ooms > 0) {
      // (a rebuilt start holds the segments from before the trace already)
      if (rebuilt) segments.segments_at_end[device].clear();
      AddOom(b, device, segments.segments_at_end[device], merged);
    }
    t.requests.requests = std::move(merged);
    AddReadNotes(b, device, head_private, segments.private_pools[device], t);
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

std::string ResolveMallocFrees(RequestTrace& requests, const std::vector<ImportedTrace::MallocFrees>& runs,
                               std::uint64_t capacity, bool capacity_known) {
  if (runs.empty()) return "";
  const std::string what =
      absl::StrCat(runs.size(), runs.size() == 1 ? " run" : " runs", " of segment frees right before a new segment");
  const std::string whose =
      "max_split_size_mb's release of a cached block, or the free-and-retry after a failed cudaMalloc";
  if (!capacity_known) {
    return absl::StrCat(what, ": an empty_cache() or PyTorch's frees inside that malloc (", whose,
                        "); without the device's capacity (an oom entry or --device-memory) they are replayed as "
                        "empty_cache()");
  }
  absl::flat_hash_set<std::uint64_t> inside;  // the lines of the empty-cache requests to drop
  for (const ImportedTrace::MallocFrees& m : runs) {
    if (m.reserved_before + m.new_segment > capacity) inside.insert(m.line);
  }
  std::vector<Request>& rq = requests.requests;
  std::size_t kept = 0, dropped_before_plan = 0;
  for (std::size_t i = 0; i < rq.size(); ++i) {
    if (rq[i].op == RequestOp::kEmptyCache && inside.contains(rq[i].line)) {
      if (i < requests.planned_from_request) ++dropped_before_plan;
      continue;
    }
    rq[kept++] = rq[i];
  }
  rq.resize(kept);
  requests.planned_from_request -= dropped_before_plan;
  return absl::StrCat(what, ": ", inside.size(), " could not have fit on the ", FormatSize(capacity),
                      " device, so PyTorch freed inside that malloc (", whose, ") and so does the replay; ",
                      runs.size() - inside.size(), " replayed as empty_cache()");
}

absl::StatusOr<std::vector<Timeline>> ReadPytorchSnapshotState(const std::string& path) {
  PickleReadOptions options;  // the trace, if any, is not needed: stream and drop it
  options.stream_inside_items = false;
  options.stream_list = [](const PicklePath& p) { return p.size() == 2 && p[0] == "device_traces"; };
  options.on_item = [](const PicklePath&, PyView) { return absl::OkStatus(); };
  absl::StatusOr<PickleDoc> doc = ReadPickleFile(path, options);
  if (!doc.ok()) return doc.status();
  const PyView root = doc->root();
  const PyView segments = root.is_list() ? root : root.Get("segments");
  if (!segments.is_list()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a PyTorch memory snapshot (no segments)"));
  }
  // Segments in address order, per device.
  std::map<int, std::vector<PyView>> by_device;
  for (std::size_t k = 0; k < segments.size(); ++k) {
    if (!segments[k].is_dict()) continue;
    const std::optional<std::int64_t> device = segments[k].Get("device").AsInt();
    if (device && (*device < 0 || *device > kMaxTimelineDeviceIndex)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": segment of device ", *device, " (devices 0 to ",
                                                     kMaxTimelineDeviceIndex, " are read)"));
    }
    by_device[DeviceOf(segments[k])].push_back(segments[k]);
  }
  AllocatorConfig settings;
  if (root.is_dict()) settings = SnapshotSettings(root.Get("allocator_settings"));
  std::vector<Timeline> timelines;
  for (auto& [device, segs] : by_device) {
    std::sort(segs.begin(), segs.end(),
              [](const PyView& a, const PyView& b) { return UIntOr0(a.Get("address")) < UIntOr0(b.Get("address")); });
    Timeline t;
    t.rank = device;
    t.device_index = device;
    t.SetAllocConf(settings);
    std::map<std::string, std::uint64_t> pools;
    std::uint64_t pools_over = 0;  // segments in pools past the kMaxEventPool-th: shown in the default pool
    for (const PyView& seg : segs) {
      const std::optional<std::string_view> type = seg.Get("segment_type").AsString();
      const bool expandable = seg.Get("is_expandable").bool_value();
      Event e;
      if (const PyView pool = seg.Get("segment_pool_id"); !IsDefaultPool(pool)) {
        ++pools[PoolText(pool)];
        const PoolId id = PoolIdOf(pool);
        const auto known = std::find(t.pools.begin(), t.pools.end(), id);
        if (known != t.pools.end()) {
          e.set_pool(static_cast<std::uint16_t>(known - t.pools.begin()));
        } else if (!id.is_default() && t.pools.size() <= kMaxEventPool) {
          t.pools.push_back(id);
          e.set_pool(static_cast<std::uint16_t>(t.pools.size() - 1));
        } else if (!id.is_default()) {
          ++pools_over;
        }
      }
      e.type = expandable ? EventType::kSegmentMap : EventType::kSegmentAlloc;
      e.set_small_pool(type && *type == "small");
      e.addr = UIntOr0(seg.Get("address"));
      e.size = UIntOr0(seg.Get("total_size"));
      e.stream = UIntOr0(seg.Get("stream"));
      t.events.push_back(e);
      const PyView blocks = seg.Get("blocks");
      std::uint64_t cursor = e.addr;
      for (std::size_t k = 0; k < blocks.size(); ++k) {
        const PyView block = blocks[k];
        const std::uint64_t size = UIntOr0(block.Get("size"));
        const std::uint64_t addr = block.Get("address").valid() ? UIntOr0(block.Get("address")) : cursor;
        cursor = addr + size;
        const std::optional<std::string_view> state = block.Get("state").AsString();
        if (!state || *state == "inactive") continue;
        std::uint64_t requested = UIntOr0(block.Get("requested_size"));
        if (const PyView history = block.Get("history"); requested == 0 && history.size() > 0) {
          requested = UIntOr0(history[history.size() - 1].Get("real_size"));  // 1.13
        }
        Event a;
        a.type = EventType::kAlloc;
        a.set_small_pool(e.small_pool());
        a.set_pool(e.pool());
        a.addr = addr;
        a.size = size;
        a.requested_size = requested != 0 ? requested : size;
        a.stream = e.stream;
        t.events.push_back(a);
        // (PyTorch's C++ writes active_pending_free; its documentation, and
        // so some tools, active_awaiting_free: the same state)
        if (IsPendingFreeState(*state)) {
          a.type = EventType::kFreeRequested;
          t.events.push_back(a);
        }
      }
    }
    t.notes.push_back(absl::StrCat(path, " has no trace of device ", device, ": showing the state of its ", segs.size(),
                                   " segments at the snapshot (exact blocks, no history)"));
    if (!pools.empty()) {
      std::vector<std::string> parts;
      for (const auto& [pool, n] : pools) parts.push_back(absl::StrCat(pool, ": ", n, " segments"));
      t.notes.push_back(absl::StrCat(
          "device ", device, " has segments in private pools (CUDA graphs or MemPool): ", PoolList(parts),
          pools_over > 0
              ? absl::StrCat(" (past ", kMaxEventPool, " pools: ", pools_over, " segments shown in the default pool)")
              : std::string()));
    }
    timelines.push_back(std::move(t));
  }
  if (timelines.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": the snapshot has no segments"));
  if (root.is_dict()) {  // pinned host memory, on the first device's timeline with its frames
    StackTags tags;
    RequestTrace host;
    MEMSCOPE_RETURN_IF_ERROR(HostMemoryReader(path, tags, host).Read(root));
    if (!tags.bad_value.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", tags.bad_value));
    Timeline& first = timelines.front();
    first.host = std::move(host.host);
    first.stacks = std::move(host.stacks);
    first.stack_frames = std::move(host.stack_frames);
  }
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
  std::uint64_t bytes = 0;
  for (LineRead read; (read = ReadBoundedLine(in, line, kMaxTraceLineBytes)) != LineRead::kEnd;) {
    ++line_no;
    if (absl::Status s = CheckTraceLine(source, line_no, read, bytes += line.size() + 1); !s.ok()) return s;
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
    Request r{.op = RequestOp::kAlloc, .size = size, .stream = stream, .line = line_no};
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

}  // namespace memscope
