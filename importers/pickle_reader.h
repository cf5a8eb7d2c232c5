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
//   o.on_item = [&](const PicklePath& p, PyValue&& trace) { ...; return absl::OkStatus(); };
//   absl::StatusOr<PyValue> snapshot = ReadPickle(in, path, o);
//
// Safety: only the data opcodes of protocols 0 to 5 are accepted. Opcodes
// that would import, build objects or call code (GLOBAL, STACK_GLOBAL,
// REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4, PERSID, BINPERSID,
// NEXT_BUFFER, READONLY_BUFFER) are refused with an error naming them.
// Malformed input (truncation, unknown opcodes, stack underflow, bad memo
// references, invalid UTF-8, nesting deeper than max_depth, integers outside
// [-2^63, 2^64)) gives an error, never a crash. Errors are one line:
// "<source>: offset <byte offset of the opcode>: <what>".
//
// Memory: the input is read through a 64 KiB buffer; strings are read in
// chunks, so a declared length larger than the file costs nothing. Lists
// selected by stream_list hand each item to on_item and keep nothing, so a
// snapshot's device_traces cost one batch (CPython pickles lists in batches
// of at most 1000 items) rather than the whole trace.
//
// Memo (PUT / BINPUT / LONG_BINPUT / MEMOIZE, and GET / BINGET /
// LONG_BINGET). CPython memoizes every string, list, dict and tuple it
// writes and refers back with GET when the same object appears again
// (PyTorch's snapshots repeat action names, file names, and share frame
// dicts between traces). The memo here:
// - keeps scalars (None, bool, int, float, str, bytes) by value, including
//   those inside streamed items; GET pushes a copy.
// - keeps a container only if it is "flat and small": all its elements
//   are scalars and it has at most 64 of them (frame dicts
//   {filename, line, name}, tuples of numbers), taking a copy when the
//   container is complete (when it leaves the stack).
// - keeps all of this within a budget of about 128 MiB (estimated) for the
//   whole read; entries beyond it are forgotten, and a GET of a forgotten
//   entry is an error (bounded memory wins over very large memos). GET of such a container pushes a copy: the result is
//   a tree, not a graph sharing that object (equal by value to what Python reads, which is all data needs).
// - does not keep other containers (ones holding containers, e.g. a trace
//   entry with its frames list; large ones; ones beyond the budget), so an
//   item of a streamed list is never retained by the memo. A GET of one is an
//   error ("shared reference to a container ... not kept"). A flat container
//   still on the stack (complete, waiting in a MARK batch) is copied from the
//   stack; a container that would end up inside itself (a recursive
//   structure) is an error.
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
// SHORT_BINSTRING and BYTEARRAY8 are read as bytes. DUP is supported for
// scalars only. Duplicate dict keys replace the earlier value in place, as in
// Python (1, 1.0 and True are the same key).
#ifndef MEMSCOPE_IMPORTERS_PICKLE_READER_H_
#define MEMSCOPE_IMPORTERS_PICKLE_READER_H_

#include <cstdint>
#include <functional>
#include <istream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace memscope {

struct PyItem;

// A Python value made of data only.
struct PyValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict };
  Kind kind = Kind::kNone;
  bool b = false;
  std::int64_t i = 0;  // kInt (values above INT64_MAX but below 2^64 are stored
                       // as uint64 bits in `u`, with `is_unsigned` true)
  std::uint64_t u = 0;
  bool is_unsigned = false;
  double f = 0;
  std::string s;               // kString (UTF-8) and kBytes
  std::vector<PyValue> items;  // kList, kTuple
  std::vector<PyItem> dict;    // kDict, insertion order

  // Helpers: the value under string key `key` of a dict, or nullptr.
  const PyValue* Get(std::string_view key) const;
  // Integer as int64/uint64 (kInt or kBool); nullopt otherwise (and when the
  // value does not fit).
  std::optional<std::int64_t> AsInt() const;
  std::optional<std::uint64_t> AsUInt() const;
  const std::string* AsString() const;  // kString only
};

// One key/value pair of a dict. (A named struct, not std::pair: a vector of an
// incomplete type is fine, a std::pair of one is not, and clang says so.)
struct PyItem {
  PyValue first;
  PyValue second;
};

// Path of a container from the root: dict keys as their string, list/tuple
// positions as "[N]".
using PicklePath = std::vector<std::string>;

struct PickleReadOptions {
  // Lists for which this returns true are streamed: each of their items is
  // passed to on_item as soon as it is complete and is NOT kept in the result
  // (the list appears empty in the returned tree). Used for device_traces,
  // which can hold millions of entries. An error from on_item stops the read
  // and is returned as is.
  std::function<bool(const PicklePath& list_path)> stream_list;
  std::function<absl::Status(const PicklePath& list_path, PyValue&& item)> on_item;
  std::uint64_t max_depth = 1000;
};

// Reads one pickle from `in` (up to and including its STOP opcode; the
// stream may have been read further than that). Errors (one line, naming
// `source` and the byte offset): refused opcodes
// ("trace.pickle: offset 17: opcode GLOBAL (c) builds objects or calls code: refused"),
// unknown opcodes, truncated input, bad memo references, stack underflow,
// depth beyond max_depth, invalid UTF-8, etc.
absl::StatusOr<PyValue> ReadPickle(std::istream& in, const std::string& source, const PickleReadOptions& options = {});

}  // namespace memscope

#endif  // MEMSCOPE_IMPORTERS_PICKLE_READER_H_
