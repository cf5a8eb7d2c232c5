// A streaming writer of Python pickles (protocol 4), for snapshots that
// PyTorch tools read: pickle.load() and PyTorch's browser viewer
// (MemoryViz.js, pytorch.org/memory_viz).
//
//   PickleWriter w(out);
//   w.BeginDict();
//   w.String("segments");
//   w.BeginList();
//   ...
//   w.EndList();
//   w.EndDict();
//   if (absl::Status s = w.Finish(); !s.ok()) ...
//
// Values go straight to the stream as they are written: there is no tree of
// objects, so a trace of millions of entries costs a 64 KiB frame buffer and
// a stack as deep as the nesting, whatever its length.
//
// Only opcodes MemoryViz.js understands are used (PROTO, FRAME, MARK, STOP,
// EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE, TUPLE, TUPLE1-3, SETITEMS, APPENDS,
// BININT, BININT1, BININT2, LONG1, BINFLOAT, SHORT_BINUNICODE, BINUNICODE,
// NONE, NEWTRUE, NEWFALSE, MEMOIZE, BINGET, LONG_BINGET). The memo is the
// caller's to use, as CPython's pickler uses it for objects shared by
// identity: MemoizeOpen() right after BeginList / BeginDict stores that
// container (EMPTY_LIST MEMOIZE MARK ..., CPython's order), MemoString
// writes a str and stores it, and Get(i) writes memo entry i again (BINGET
// below 256, else LONG_BINGET). A snapshot's shared frames, keys and action
// names are written once that way (snapshot_export.cpp). The
// choices follow CPython's pickler, so a lone integer or float pickles to the
// same bytes as pickle.dumps(value, protocol=4):
// - Integers: BININT1 for 0..255, BININT2 for 0..65535, BININT for the rest
//   of int32, else LONG1 (little-endian two's complement, minimal length).
//   Device addresses such as 0x7f0000000000 are LONG1.
// - Floats: BINFLOAT (big-endian IEEE 754 double).
// - Strings: SHORT_BINUNICODE below 256 bytes of UTF-8, else BINUNICODE.
// - Lists and dicts: EMPTY_LIST / EMPTY_DICT, then the items in batches of at
//   most 1000 (dict: 1000 key/value pairs), each MARK ... APPENDS / SETITEMS,
//   like CPython's batching. (CPython writes a batch of one item as a lone
//   APPEND / SETITEM; a streaming writer cannot know a batch will stay that
//   short, and MARK + one item + APPENDS means the same.)
// - Frames: protocol 4 groups opcodes in frames of about 64 KiB, each opcode
//   wholly inside one frame, as CPython does (Python's unpickler rejects an
//   opcode that straddles frames).
//
// Misuse (an End without its Begin, a dict key without a value, a tuple with
// more or fewer values than declared, Finish with containers open) is a
// programming error: it is recorded, later calls are ignored, and Finish()
// returns it.
#ifndef MEMSCOPE_EXPORTERS_PICKLE_WRITER_H_
#define MEMSCOPE_EXPORTERS_PICKLE_WRITER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace memscope {

class PickleWriter {
 public:
  // Items per MARK ... APPENDS / SETITEMS batch (pairs for dicts), as CPython.
  static constexpr std::size_t kBatchSize = 1000;
  // A frame is written out once it holds at least this many bytes.
  static constexpr std::size_t kFrameSizeTarget = 64 * 1024;

  // Writes the protocol header to `out`, which must outlive the writer.
  explicit PickleWriter(std::ostream& out);
  PickleWriter(const PickleWriter&) = delete;
  PickleWriter& operator=(const PickleWriter&) = delete;

  // Containers. Inside a dict, values alternate key, value, key, value...
  void BeginDict();
  void EndDict();
  void BeginList();
  void EndList();
  // A tuple of exactly `arity` values (written between Begin and End).
  void BeginTuple(std::size_t arity);
  void EndTuple();

  // Scalars.
  void None();
  void Bool(bool value);
  void Int(std::int64_t value);
  void UInt(std::uint64_t value);
  void Float(double value);
  // UTF-8 text, a Python str. Invalid UTF-8 bytes become U+FFFD: Python
  // refuses to load a str that is not UTF-8, and one bad label must not make
  // a whole snapshot unreadable.
  void String(std::string_view utf8);
  // A dict key: a str, as String writes it (JsonWriter's name, so that one
  // template writes both formats).
  void Key(std::string_view key) { String(key); }

  // The memo. Each returns the memo index it stored. MemoizeOpen must come
  // right after BeginList or BeginDict, before the container's first value.
  std::uint32_t MemoizeOpen();
  std::uint32_t MemoString(std::string_view utf8);
  void Get(std::uint32_t index);
  // Raw values (below) that memoize take their indices here, in the order
  // their MEMOIZE opcodes appear.
  std::uint32_t TakeMemoIndex() { return memo_size_++; }
  static constexpr std::size_t kMaxGetBytes = 5;  // LONG_BINGET: opcode, 4 bytes
  static char* EncodeGet(char* p, std::uint32_t index);
  static char* EncodeMemoize(char* p) {
    *p = static_cast<char>(0x94);  // MEMOIZE
    return p + 1;
  }

  // The bytes of single values, for a caller that writes the same shapes many
  // times and keeps them (snapshot_export.cpp: the frames of each stack, and
  // whole trace entries). Each writes exactly what Int, UInt and String
  // write for the value (no MARK or batch of an enclosing container).
  static constexpr std::size_t kMaxIntBytes = 11;  // LONG1: opcode, length, 9 bytes
  static char* EncodeInt(char* p, std::int64_t value);
  static char* EncodeUInt(char* p, std::uint64_t value);
  // String's bytes appended to `out`; false (nothing appended) for text too
  // long for BINUNICODE, which String reports as an error.
  static bool AppendString(std::string& out, std::string_view utf8);
  // A string known to be valid UTF-8 (ASCII) and shorter than 256 bytes.
  static char* EncodeShortString(char* p, std::string_view ascii) {
    p[0] = static_cast<char>(0x8c);  // SHORT_BINUNICODE
    p[1] = static_cast<char>(ascii.size());
    std::memcpy(p + 2, ascii.data(), ascii.size());
    return p + 2 + ascii.size();
  }

  // One whole value (a scalar or a complete container) as raw bytes that the
  // caller writes into the current frame, inside an open list or dict: room
  // for at most `max_bytes`, or null when the value must be written the
  // ordinary way (then nothing was written; also when it could end the
  // frame, so frames split exactly where the ordinary calls would split
  // them). EndRawValue takes the end of what was written.
  char* BeginRawValue(std::size_t max_bytes);
  void EndRawValue(const char* end);
  // Tests: false makes BeginRawValue always null (the ordinary path only).
  void set_raw_values(bool on) { raw_values_ = on; }

  // Writes STOP and the last frame, and flushes the stream. Returns the
  // first misuse (FailedPrecondition), a string too long for BINUNICODE
  // (InvalidArgument) or a stream failure (DataLoss). The writer takes no
  // more values afterwards.
  absl::Status Finish();

  // Bytes handed to the stream so far (the current frame excluded).
  std::uint64_t bytes_written() const { return bytes_written_; }

 private:
  enum class Kind : std::uint8_t { kList, kDict, kTuple };
  struct Open {
    Kind kind;
    std::size_t arity = 0;  // tuples: values declared
    std::size_t count = 0;  // tuples: values so far; lists and dicts: values in the current batch
  };

  // Called around every value (a scalar, or a whole container) written into
  // the innermost open container: opens and closes batches, counts tuple
  // values.
  // The common case (a value after the first in an open list or dict) is
  // inline; the rest, and every misuse, is BeforeValueSlow's.
  bool BeforeValue() {
    if (!finished_ && status_.ok() && !open_.empty() && open_.back().kind != Kind::kTuple && open_.back().count != 0) {
      return true;
    }
    return BeforeValueSlow();
  }
  bool BeforeValueSlow();
  void AfterValue();
  // Appends an opcode (and its argument bytes) to the current frame; at
  // opcode boundaries the frame is written out once it is large enough.
  void Op(std::uint8_t opcode) {
    Reserve(1);
    frame_[frame_size_++] = static_cast<char>(opcode);
  }
  void Bytes(const void* data, std::size_t size) {
    Reserve(size);
    std::memcpy(frame_.data() + frame_size_, data, size);
    frame_size_ += size;
  }
  // Little-endian bytes of the low `n` bytes of `v`.
  void PutLittleEndian(std::uint64_t v, int n) {
    Reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) frame_[frame_size_++] = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  // Room for `n` more bytes in the frame.
  void Reserve(std::size_t n) {
    if (frame_size_ + n > frame_.size()) frame_.resize(std::max(2 * frame_.size(), frame_size_ + n));
  }
  void OpcodeBoundary();
  void CommitFrame();
  // LONG1 of a 64-bit pattern, read as signed when `negative`.
  static char* EncodeLong1(char* p, std::uint64_t bits, bool negative);
  // SHORT_BINUNICODE or BINUNICODE of valid UTF-8 (at most 4 GiB - 1 bytes).
  static char* EncodeValidString(char* p, std::string_view utf8);
  void Fail(absl::Status status);

  std::ostream& out_;
  std::string frame_;  // the current frame: its first frame_size_ bytes (the rest is room)
  std::size_t frame_size_ = 0;
  std::vector<Open> open_;
  std::uint64_t bytes_written_ = 0;
  std::size_t roots_ = 0;  // top-level values written (a pickle holds one)
  absl::Status status_;
  bool finished_ = false;
  bool raw_values_ = true;
  std::uint32_t memo_size_ = 0;  // MEMOIZE opcodes written
};

}  // namespace memscope

#endif  // MEMSCOPE_EXPORTERS_PICKLE_WRITER_H_
