// A safe, streaming reader of Python pickles made of data only, for PyTorch
// memory snapshots: torch.cuda.memory._snapshot() written with pickle.dump,
// and torch.cuda.memory._dump_snapshot() files (both the 2.x dict format with
// segments / device_traces / allocator_settings / external_annotations and
// the 1.13 list-of-segments format are plain data, so both read).
//
//   std::ifstream in(path, std::ios::binary);
//   PickleReadOptions o;
//   o.stream_list = [](const PicklePath& p) {
//     return p.size() == 2 && p[0] == "device_traces";
//   };
//   o.on_item = [&](const PicklePath& p, PyView trace) { ...; return absl::OkStatus(); };
//   absl::StatusOr<PickleDoc> snapshot = ReadPickle(in, path, o);
//   PyView root = snapshot->root();  // root.Get("segments")[0].Get("address").AsUInt()
//
// Safety: only the data opcodes of protocols 0 to 5 are accepted (protocols 0
// and 1 have no PROTO opcode: any pickle is read from its first opcode).
// Opcodes that would import, build objects or call code (GLOBAL,
// STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4,
// PERSID, BINPERSID, NEXT_BUFFER, READONLY_BUFFER) are refused with an error
// naming them. Malformed input (truncation, unknown opcodes, stack underflow,
// bad memo references, invalid UTF-8, nesting deeper than max_depth, integers
// outside [-2^63, 2^64), a container inside itself) gives an error, never a
// crash. Errors are one line: "<source>: offset <byte offset of the opcode>: <what>".
//
// Values. A read pickle is an immutable DAG in one arena (PickleDoc): a value
// is a 16-byte PyRef (scalars inline, strings and containers by offset), and
// PyView reads it. A memo reference (GET / BINGET / LONG_BINGET) to a
// container is the same node again, not a copy: PyTorch hands one frames
// list to a block, its alloc trace entry and its segment, and one frame dict
// to every stack that passes through it, and pickle writes each once and
// refers back to it. Small containers of scalars and lists of them (frame
// dicts, frames lists, tuples of numbers) are stored once per distinct
// content, so a snapshot's million stacks cost what its distinct stacks cost.
// A GET of a list or dict still on the stack (complete, waiting in its
// batch) takes a copy of what it holds; one that grows after that was
// referred to from inside itself: a recursive structure, refused.
//
// Input: a stream (ReadPickle(std::istream&...)) is read through a 64 KiB
// buffer; bytes in memory (ReadPickleBytes) and a regular file
// (ReadPickleFile: mapped read-only) are read in place, through a 64 KiB
// window on them that moves where the stream's buffer is refilled, with
// nothing read or copied. So the three read the same: the values, memo,
// calls, errors and their offsets, the working-memory checks, the stats
// (tests/importers/pickle_reader_test.cpp and the pickle fuzzer read every
// input these ways).
//
// Memory (bounded by the input, whatever it holds):
// - strings are read as data arrives, so a declared length larger than the
//   file costs nothing; of a mapped file, the pages read more than a few
//   MiB behind the read position are released as it goes (its resident
//   pages stay a few MiB whatever its size);
// - nesting deeper than max_depth is refused when the deep value is pushed,
//   before anything is built for it (10^7 nested lists cost nothing);
// - at most kMaxPickleStack values may wait on the stack (a real snapshot
//   needs a few thousand: CPython writes lists and dicts in batches of 1000);
// - lists selected by stream_list hand each item to on_item and keep
//   nothing: what an item built is released after on_item returns (the memo
//   forgets containers released this way; a later GET of one is an error);
// - everything the reader holds (stack, memo, strings, nodes) stays under
//   max_working_bytes_fixed + max_working_bytes_per_input_byte x the bytes
//   read so far; beyond it the read stops with an error naming the budget.
//
// Paths. stream_list sees the path of a list when it is first appended to.
// Pickles carry no paths, so the reader infers them from the stack the way
// CPython's pickler lays values out: a dict being filled is followed by
// MARK, key, value, key, value...; a list by MARK, item, item...; a
// one-item batch is the item then APPEND (key, value then SETITEM). Where a
// prefix of a pickle is ambiguous without lookahead, the reader prefers
// "sibling in the enclosing batch" over "only element of the previous
// container"; the known mislabelled shapes are containers inside tuples
// still being built, and a container that is the only element of a
// one-element list or dict that itself sits inside a batch. Snapshots
// (dicts, lists and scalars, tuples of scalars) are labelled exactly.
//
// Sets and frozensets are read as lists; STRING / BINSTRING /
// SHORT_BINSTRING and BYTEARRAY8 are read as bytes. Duplicate dict keys
// replace the earlier value in place, as in Python (1, 1.0 and True are the
// same key).
#ifndef MEMSCOPE_IMPORTERS_PICKLE_READER_H_
#define MEMSCOPE_IMPORTERS_PICKLE_READER_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <istream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace memscope {

enum class PyKind : std::uint8_t { kMissing, kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict };

// One value in a PickleArena: 16 bytes, no padding (compared with memcmp).
struct PyRef {
  PyKind kind = PyKind::kMissing;
  std::uint8_t flags = 0;    // kPyRef* bits below
  std::uint16_t height = 0;  // containers: nesting height (1 + the tallest element), saturating
  std::uint32_t n = 0;       // strings: length; lists/tuples: items; dicts: pairs
  std::uint64_t v = 0;       // bool/int: value bits; float: double bits; strings: offset in
                             // chars; containers: offset of their first element in a pool
};
inline constexpr std::uint8_t kPyRefUnsigned = 1;  // kInt above INT64_MAX: v holds the uint64
inline constexpr std::uint8_t kPyRefShared = 2;    // container stored in the shared (deduplicated) pool
inline constexpr std::uint8_t kPyRefOpen = 4;      // reader-internal: a list/dict still being filled
inline constexpr std::uint8_t kPyRefRecord = 8;    // reader-internal: a record's placeholder (on_record)

// The storage of one read: string bytes and the elements of containers.
struct PickleArena {
  std::string chars;
  std::vector<PyRef> shared;  // distinct small containers, kept for the whole read
  std::vector<PyRef> tree;    // everything else (streamed items are released from it)
};

// Reads a value. Cheap to copy; valid while its arena lives and, for a
// streamed item handed to on_item, only during that call. A missing dict key
// gives a view whose kind() is kMissing, so lookups chain:
//   root.Get("allocator_settings").Get("max_split_size").AsInt()
class PyView {
 public:
  PyView() = default;
  PyView(const PickleArena* arena, PyRef ref) : arena_(arena), ref_(ref) {}

  PyKind kind() const { return ref_.kind; }
  bool valid() const { return ref_.kind != PyKind::kMissing; }
  bool is_list() const { return ref_.kind == PyKind::kList; }
  bool is_dict() const { return ref_.kind == PyKind::kDict; }
  const PyRef& ref() const { return ref_; }

  // Integer as int64/uint64 (kInt or kBool); nullopt otherwise and when the
  // value does not fit.
  std::optional<std::int64_t> AsInt() const;
  std::optional<std::uint64_t> AsUInt() const;
  // kInt, kBool or kFloat as a double.
  std::optional<double> AsNumber() const;
  std::optional<bool> AsBool() const;                // kBool only
  std::optional<std::string_view> AsString() const;  // kString only
  std::string_view bytes() const;                    // kString and kBytes; empty otherwise
  double float_value() const;                        // kFloat
  bool bool_value() const { return ref_.kind == PyKind::kBool && ref_.v != 0; }
  bool is_unsigned() const { return (ref_.flags & kPyRefUnsigned) != 0; }

  // Lists and tuples: number of items; dicts: number of pairs; 0 otherwise.
  std::size_t size() const;
  PyView operator[](std::size_t i) const;  // list/tuple item i (missing if out of range)
  PyView key(std::size_t i) const;         // dict pair i
  PyView value(std::size_t i) const;
  // The value under string key `key` of a dict; missing if none.
  PyView Get(std::string_view key) const;
  // For readers that walk every pair of a dict (a trace entry's keys): its
  // 2 * size() elements, key, value, key, value...; null if not a dict. The
  // arena holds their strings (chars) and containers.
  const PyRef* dict_elements() const { return ref_.kind == PyKind::kDict ? elements() : nullptr; }
  const PickleArena* arena() const { return arena_; }

 private:
  const PyRef* elements() const;
  const PickleArena* arena_ = nullptr;
  PyRef ref_;
};

[[gnu::always_inline]] inline const PyRef* PyView::elements() const {
  if (arena_ == nullptr) return nullptr;
  const std::vector<PyRef>& pool = (ref_.flags & kPyRefShared) ? arena_->shared : arena_->tree;
  return pool.data() + ref_.v;
}

inline std::optional<std::int64_t> PyView::AsInt() const {
  if (ref_.kind == PyKind::kBool) return ref_.v != 0 ? 1 : 0;
  if (ref_.kind != PyKind::kInt || is_unsigned()) return std::nullopt;
  return static_cast<std::int64_t>(ref_.v);
}

[[gnu::always_inline]] inline std::optional<std::uint64_t> PyView::AsUInt() const {
  if (ref_.kind == PyKind::kBool) return ref_.v != 0 ? 1u : 0u;
  if (ref_.kind != PyKind::kInt) return std::nullopt;
  if (is_unsigned()) return ref_.v;
  if (static_cast<std::int64_t>(ref_.v) < 0) return std::nullopt;
  return ref_.v;
}

inline std::optional<double> PyView::AsNumber() const {
  if (ref_.kind == PyKind::kFloat) return float_value();
  if (ref_.kind == PyKind::kInt) {
    return is_unsigned() ? static_cast<double>(ref_.v) : static_cast<double>(static_cast<std::int64_t>(ref_.v));
  }
  if (ref_.kind == PyKind::kBool) return ref_.v != 0 ? 1.0 : 0.0;
  return std::nullopt;
}

inline std::optional<bool> PyView::AsBool() const {
  if (ref_.kind != PyKind::kBool) return std::nullopt;
  return ref_.v != 0;
}

inline std::optional<std::string_view> PyView::AsString() const {
  if (ref_.kind != PyKind::kString) return std::nullopt;
  return bytes();
}

inline std::string_view PyView::bytes() const {
  if ((ref_.kind != PyKind::kString && ref_.kind != PyKind::kBytes) || arena_ == nullptr) return {};
  return std::string_view(arena_->chars.data() + ref_.v, ref_.n);
}

inline double PyView::float_value() const { return ref_.kind == PyKind::kFloat ? std::bit_cast<double>(ref_.v) : 0.0; }

inline std::size_t PyView::size() const {
  switch (ref_.kind) {
    case PyKind::kList:
    case PyKind::kTuple:
    case PyKind::kDict: return ref_.n;
    default: return 0;
  }
}

inline PyView PyView::operator[](std::size_t i) const {
  if ((ref_.kind != PyKind::kList && ref_.kind != PyKind::kTuple) || i >= ref_.n) return PyView();
  return PyView(arena_, elements()[i]);
}

[[gnu::always_inline]] inline PyView PyView::key(std::size_t i) const {
  if (ref_.kind != PyKind::kDict || i >= ref_.n) return PyView();
  return PyView(arena_, elements()[2 * i]);
}

[[gnu::always_inline]] inline PyView PyView::value(std::size_t i) const {
  if (ref_.kind != PyKind::kDict || i >= ref_.n) return PyView();
  return PyView(arena_, elements()[2 * i + 1]);
}

inline PyView PyView::Get(std::string_view key) const {
  if (ref_.kind != PyKind::kDict) return PyView();
  const PyRef* e = elements();
  for (std::uint32_t k = 0; k < ref_.n; ++k) {
    const PyRef& kr = e[2 * k];
    if (kr.kind != PyKind::kString || kr.n != key.size()) continue;
    const char* c = arena_->chars.data() + kr.v;
    if (key.empty() || (c[0] == key[0] && std::memcmp(c, key.data(), key.size()) == 0)) {
      return PyView(arena_, e[2 * k + 1]);
    }
  }
  return PyView();
}

// A whole read pickle: its arena and root.
class PickleDoc {
 public:
  PickleDoc(std::shared_ptr<const PickleArena> arena, PyRef root) : arena_(std::move(arena)), root_(root) {}
  PyView root() const { return PyView(arena_.get(), root_); }

 private:
  std::shared_ptr<const PickleArena> arena_;
  PyRef root_;
};

// Path of a container from the root: dict keys as their string, list/tuple
// positions as "[N]".
using PicklePath = std::vector<std::string>;

inline constexpr std::size_t kMaxPickleStack = 1 << 17;

// What a record (PickleReadOptions::on_record) hands over: a dict item of a
// streamed list, not built. Its pairs in the pickle's order (key, value,
// key, value...: what the dict's elements would be) and, for each pair, the
// index of its key in PickleReadOptions::record_keys. Valid only during the
// call; strings and containers are in the arena.
inline constexpr std::size_t kMaxRecordKeys = 16;
struct PickleRecord {
  const PickleArena* arena = nullptr;
  const PyRef* pairs = nullptr;             // 2 * n
  const std::uint8_t* key_index = nullptr;  // n
  std::uint32_t n = 0;
  PyView key(std::size_t i) const { return PyView(arena, pairs[2 * i]); }
  PyView value(std::size_t i) const { return PyView(arena, pairs[2 * i + 1]); }
};

struct PickleReadOptions {
  // Lists for which this returns true are streamed: each of their items is
  // passed to on_item as soon as it is complete and is NOT kept in the result
  // (the list appears empty in the returned tree). Used for device_traces,
  // which can hold millions of entries. An error from on_item stops the read
  // and is returned as is.
  std::function<bool(const PicklePath& list_path)> stream_list;
  std::function<absl::Status(const PicklePath& list_path, PyView item)> on_item;
  // False: a list inside an item of a streamed list's MARK ... APPENDS batch
  // (the path of which starts with the streamed list's path and the item's
  // index) is not streamed and stream_list is not asked about it: its path is
  // not built (the frames list of every trace entry would cost one each).
  // Other lists are asked as before.
  bool stream_inside_items = true;
  // With stream_inside_items false: a dict inside an item of a streamed list
  // (a trace entry, or a frame dict inside one) is decoded by a specialised
  // path that builds it directly from its opcodes (scalars, strings, memo
  // references, small lists, tuples and dicts of those) instead of through
  // the general stack; anything it does not expect (another opcode, a memo
  // reference to something still being built, a duplicate or non-str key,
  // the end of the read buffer...) rewinds to the dict's EMPTY_DICT and reads
  // it the general way. The values, memo entries and errors are the same
  // either way (tests/importers/pickle_reader_test.cpp reads every test
  // pickle both ways); false reads everything the general way.
  bool fast_dicts = true;
  // Records (with fast_dicts and stream_inside_items false, and on_record
  // set): a dict read by the fast path's common shape (see FastPairs in the
  // .cpp) whose keys are all str keys among record_keys (at most
  // kMaxRecordKeys, each at most once) and that holds a list, dict or tuple
  // (so the general path would not keep it past its batch) is not built: a
  // placeholder waits on the stack and, when the streamed list's APPENDS or
  // APPEND takes it, on_record gets its pairs and key indices instead of
  // on_item getting the dict. Anything else uses the dict (on_item), and a
  // placeholder used in any other way (a memo reference to it, a tuple or a
  // list holding it...) is built into the dict it stands for then. The memo,
  // the values, the order of the calls and the errors are the same as
  // without records (tests/importers/pickle_reader_test.cpp and the pickle
  // fuzzer read every input both ways). fast_records false: no records.
  std::vector<std::string> record_keys;
  std::function<absl::Status(const PicklePath& list_path, const PickleRecord& record)> on_record;
  bool fast_records = true;
  // Records: the templates (see TemplatePairs in the .cpp). The keys of the
  // records last read (two shapes), as the bytes of their memo references,
  // are matched against the next entry's bytes directly and its values
  // decoded in one pass; any difference (another key, another opcode, a
  // FRAME inside the entry, the end of the read buffer, a memo change...)
  // reads the entry as without them. The records, memo, values, calls,
  // errors and stats are the same either way
  // (tests/importers/pickle_reader_test.cpp reads every test pickle both
  // ways, the pickle fuzzer every input); false: no templates.
  bool fast_template = true;
  std::uint64_t max_depth = 1000;
  // The working-memory budget (see the header comment).
  std::uint64_t max_working_bytes_fixed = 256ull << 20;
  std::uint64_t max_working_bytes_per_input_byte = 16;
};

// What a read cost: for tests and benchmarks.
struct PickleReadStats {
  std::uint64_t input_bytes = 0;         // bytes consumed up to STOP (or the error)
  std::uint64_t peak_working_bytes = 0;  // the most the reader held at once (estimated from capacities)
  std::uint64_t shared_containers = 0;   // distinct containers in the shared pool
  std::uint64_t fast_dicts = 0;          // dicts read by the fast path (PickleReadOptions::fast_dicts)
  std::uint64_t records = 0;             // of those, handed to on_record (not built)
  std::uint64_t template_records = 0;    // of those, read by the template (PickleReadOptions::fast_template)
  // ReadPickleFile: whether the file was mapped (else read as a stream), and
  // how many of its bytes were released (whole pages behind the read
  // position) before the read ended.
  bool mapped = false;
  std::uint64_t released_bytes = 0;
};

// Reads one pickle from `in` (up to and including its STOP opcode; the
// stream may have been read further than that). Errors (one line, naming
// `source` and the byte offset): refused opcodes
// ("trace.pickle: offset 17: opcode GLOBAL (c) builds objects or calls code: refused"),
// unknown opcodes, truncated input, bad memo references, stack underflow,
// depth beyond max_depth, invalid UTF-8, the working-memory budget, etc.
absl::StatusOr<PickleDoc> ReadPickle(std::istream& in, const std::string& source, const PickleReadOptions& options = {},
                                     PickleReadStats* stats = nullptr);

// The same, of `data`: the whole input, in memory (read in place; nothing
// is read beyond its end). What it reads, the errors included, is what
// ReadPickle reads from a stream of the same bytes.
absl::StatusOr<PickleDoc> ReadPickleBytes(std::string_view data, const std::string& source,
                                          const PickleReadOptions& options = {}, PickleReadStats* stats = nullptr);

// The largest snapshot read (docs/snapshot-format.md): PyTorch's with the
// default max_entries are tens of MB, a whole job's a few GB.
inline constexpr std::uint64_t kMaxPickleFileBytes = std::uint64_t{64} << 30;

// The same, of the file at `path` (`path` names it in errors): a regular
// file over kMaxPickleFileBytes is refused before it is read, a regular
// non-empty file is mapped read-only (mmap, MAP_PRIVATE; its pages are
// released behind the read position as the read goes, see above), anything
// that cannot be mapped (a FIFO, an empty file, /proc...) is read as a
// stream. "cannot open '<path>'" (NotFound) if it cannot be opened. (A
// mapped file must not shrink while it is read: the pages past its new end
// are gone, SIGBUS.)
absl::StatusOr<PickleDoc> ReadPickleFile(const std::string& path, const PickleReadOptions& options = {},
                                         PickleReadStats* stats = nullptr);

}  // namespace memscope

#endif  // MEMSCOPE_IMPORTERS_PICKLE_READER_H_
