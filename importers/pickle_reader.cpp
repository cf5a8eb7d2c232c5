#include "importers/pickle_reader.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "importers/prefault.h"
#include "importers/zero_array.h"

namespace memscope {

// PyView's accessors are inline in the header (the importer calls them per trace entry).

namespace {

#define MS_RETURN_IF_ERROR(expr)              \
  do {                                        \
    if (absl::Status s_ = (expr); !s_.ok()) { \
      return s_;                              \
    }                                         \
  } while (0)

constexpr std::size_t kBufferSize = 1 << 16;
constexpr std::size_t kMaxLine = 1 << 20;  // text opcodes (protocol 0)
constexpr std::uint64_t kMaxLongBytes = 1 << 20;
// Containers stored once per distinct content (see the header): lists and
// tuples of scalars or of such containers, and dicts of scalars with at most
// this many pairs (frame dicts have 3 to 6; trace entries hold a frames list
// and are never shared).
constexpr std::uint32_t kMaxSharedElements = 1024;
constexpr std::uint32_t kMaxSharedDictPairs = 16;
constexpr std::uint64_t kBudgetCheckEvery = 256;  // opcodes between working-memory checks
// The dict fast path: the bytes it wants in the buffer before it starts,
// and its limits (beyond them, the general path reads the dict).
constexpr std::size_t kFastWindow = 16 << 10;
constexpr std::size_t kFastMaxMarks = 16;
constexpr std::size_t kFastMaxBoxes = 64;
constexpr std::size_t kFastMaxStack = 2048;
constexpr std::size_t kFastMaxDictItems = 64;   // 32 pairs: the general path's small-dict case
constexpr std::size_t kFastMaxListItems = 999;  // below CPython's batch of 1000 (no second batch)
// The frames lists cache (FastPairs): lists of at most this many bytes of
// memo references, at most this many lists.
constexpr std::size_t kListCacheMaxBytes = 4096;
constexpr std::size_t kListCacheMaxLists = 1 << 20;

const char* OpName(std::uint8_t op) {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

std::string OpCode(std::uint8_t op) {
  if (op >= 0x21 && op < 0x7f) return std::string(1, static_cast<char>(op));
  return absl::StrFormat("0x%02x", op);
}

bool ValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t n = s.size(), k = 0;
  while (k < n) {
    unsigned c = p[k];
    if (c < 0x80) {
      ++k;
      continue;
    }
    std::size_t len;
    std::uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else
      return false;
    if (k + len > n) return false;
    for (std::size_t j = 1; j < len; ++j) {
      if ((p[k + j] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[k + j] & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    k += len;
  }
  return true;
}

void AppendUtf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

PyRef ScalarRef(PyKind kind, std::uint64_t v, std::uint8_t flags = 0) {
  PyRef r;
  r.kind = kind;
  r.flags = flags;
  r.v = v;
  return r;
}
PyRef IntRef(std::int64_t v) { return ScalarRef(PyKind::kInt, static_cast<std::uint64_t>(v)); }
PyRef UIntRef(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return ScalarRef(PyKind::kInt, v);
  return ScalarRef(PyKind::kInt, v, kPyRefUnsigned);
}
PyRef BoolRef(bool b) { return ScalarRef(PyKind::kBool, b ? 1 : 0); }
PyRef FloatRef(double d) { return ScalarRef(PyKind::kFloat, std::bit_cast<std::uint64_t>(d)); }

bool IsContainerKind(PyKind k) { return k == PyKind::kList || k == PyKind::kTuple || k == PyKind::kDict; }
bool IsMutableKind(PyKind k) { return k == PyKind::kList || k == PyKind::kDict; }

// Parses a decimal integer (optional sign); false if it is not one or is
// outside [-2^63, 2^64).
bool ParseDecimal(std::string_view t, PyRef& out) {
  bool neg = false;
  if (!t.empty() && (t[0] == '-' || t[0] == '+')) {
    neg = t[0] == '-';
    t.remove_prefix(1);
  }
  if (t.empty()) return false;
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || p != t.data() + t.size()) return false;
  if (!neg) {
    out = UIntRef(v);
    return true;
  }
  if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + 1) return false;
  out = IntRef(static_cast<std::int64_t>(0 - v));
  return true;
}

// Canonical text of a hashable key, equal for keys Python considers equal
// (1 == 1.0 == True). False if the key is unhashable.
bool KeyText(const PyView& v, std::string& out) {
  switch (v.kind()) {
    case PyKind::kMissing: return false;
    case PyKind::kNone: out += 'N'; return true;
    case PyKind::kBool: out += v.bool_value() ? "i1;" : "i0;"; return true;
    case PyKind::kInt:
      absl::StrAppend(&out, "i", v.is_unsigned() ? absl::StrCat(*v.AsUInt()) : absl::StrCat(*v.AsInt()), ";");
      return true;
    case PyKind::kFloat: {
      const double f = v.float_value();
      if (std::isfinite(f) && f == std::floor(f) && f >= -9223372036854775808.0 && f < 18446744073709551616.0) {
        if (f < 0) {
          absl::StrAppend(&out, "i", static_cast<std::int64_t>(f), ";");
        } else {
          absl::StrAppend(&out, "i", static_cast<std::uint64_t>(f), ";");
        }
        return true;
      }
      absl::StrAppend(&out, "f", std::bit_cast<std::uint64_t>(f), ";");
      return true;
    }
    case PyKind::kString:
      absl::StrAppend(&out, "s", v.bytes().size(), ":");
      out += v.bytes();
      return true;
    case PyKind::kBytes:
      absl::StrAppend(&out, "b", v.bytes().size(), ":");
      out += v.bytes();
      return true;
    case PyKind::kTuple:
      out += '(';
      for (std::size_t k = 0; k < v.size(); ++k) {
        if (!KeyText(v[k], out)) return false;
      }
      out += ')';
      return true;
    case PyKind::kList:
    case PyKind::kDict: return false;
  }
  return false;
}

bool KeysEqual(const PyView& a, const PyView& b) {
  // The common case first: two str keys (memoized keys are the same bytes).
  if (a.kind() == PyKind::kString && b.kind() == PyKind::kString) return a.bytes() == b.bytes();
  if (a.kind() == PyKind::kString || b.kind() == PyKind::kString) return false;
  std::string x, y;
  return KeyText(a, x) && KeyText(b, y) && x == y;
}

const char* KindName(PyKind k) {
  switch (k) {
    case PyKind::kMissing: return "missing";
    case PyKind::kNone: return "None";
    case PyKind::kBool: return "bool";
    case PyKind::kInt: return "int";
    case PyKind::kFloat: return "float";
    case PyKind::kString: return "str";
    case PyKind::kBytes: return "bytes";
    case PyKind::kList: return "list";
    case PyKind::kTuple: return "tuple";
    case PyKind::kDict: return "dict";
  }
  return "?";
}

// A growable array of trivially copyable values whose push_back is always
// inlined (the reader pushes a value per opcode; std::vector's is an
// out-of-line call there). capacity() is what it holds in memory.
template <typename T>
class FastVec {
 public:
  FastVec() = default;
  FastVec(const FastVec&) = delete;
  FastVec& operator=(const FastVec&) = delete;
  FastVec(FastVec&& o) noexcept { *this = std::move(o); }
  FastVec& operator=(FastVec&& o) noexcept {
    buf_ = std::move(o.buf_);
    data_ = buf_.data();
    size_ = o.size_;
    cap_ = buf_.size();
    o.data_ = nullptr;
    o.size_ = o.cap_ = 0;
    return *this;
  }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::size_t capacity() const { return cap_; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  T& back() { return data_[size_ - 1]; }
  const T& back() const { return data_[size_ - 1]; }
  [[gnu::always_inline]] void push_back(const T& v) {
    if (size_ == cap_) [[unlikely]]
      Grow(size_ + 1);
    data_[size_++] = v;
  }
  void pop_back() { --size_; }
  void clear() { size_ = 0; }
  // Shrinks, or grows with default values.
  void resize(std::size_t n) {
    if (n > cap_) Grow(n);
    for (std::size_t k = size_; k < n; ++k) data_[k] = T();
    size_ = n;
  }
  // Room for n values (written through data(), then set_size).
  void reserve(std::size_t n) {
    if (n > cap_) Grow(n);
  }
  void set_size(std::size_t n) { size_ = n; }

 private:
  [[gnu::noinline]] void Grow(std::size_t need) {
    buf_.resize(std::max<std::size_t>({need, 2 * buf_.size(), 8}));
    data_ = buf_.data();
    cap_ = buf_.size();
  }
  std::vector<T> buf_;  // its size is the capacity
  T* data_ = nullptr;
  std::size_t size_ = 0, cap_ = 0;
};

// A list or dict still being filled. Builders are pooled: their vectors keep
// their capacity, so filling one allocates nothing in the steady state.
struct Builder {
  PyKind kind = PyKind::kList;
  FastVec<PyRef> items;        // dicts: key, value, key, value...
  std::uint64_t appended = 0;  // lists: items appended so far, streamed or kept
  int streamed = -1;           // -1: not decided yet
  bool has_path = false;
  PicklePath path;  // cached
  std::vector<std::uint64_t> memo_ids;
  std::uint64_t token = 0;      // tells a builder from a later use of the same slot
  std::uint64_t tree_mark = 0;  // arena tree size when it was created (streamed lists release back to it)
  std::uint16_t height = 1;
  bool copied = false;             // a GET/DUP took a copy: growing after that means it is inside itself
  std::uint64_t str_key_bits = 0;  // dicts: StrKeyBit of every str key held (a str key whose bit is
                                   // clear is new: no duplicate scan)
  absl::flat_hash_map<std::string, std::uint32_t> key_index;  // large dicts: key text -> pair index
};

struct Slot {
  PyRef ref;  // for an open list/dict: kPyRefOpen, v = builder index
  std::uint32_t level = 0;
  bool mark = false;
  bool open() const { return (ref.flags & kPyRefOpen) != 0; }
};

struct MemoEntry {
  PyRef ref;                // kMissing: no entry; for a list/dict still open: kPyRefOpen and v = builder index
  std::uint64_t token = 0;  // open: the builder's token
};

// The memo: ids as CPython's pickler writes them (0, 1, 2... in order) in a
// vector of 16-byte values indexed by id, others (sparse ids from other
// picklers or hostile input) in a hash map. An open list/dict's entry holds
// its builder's token in the fields an open reference does not use (n and
// height: 48 bits, more builders than any input can make). The vector only
// grows to ids below half the bytes read so far (every memoized value costs
// at least two bytes of input: its opcode and a PUT or MEMOIZE), so it
// stays within the reader's budget.
// MemoTable's slots start as all-zero bytes (ZeroArray): that must be PyRef().
constexpr bool PyRefZeroIsMissing() {
  const auto bytes = std::bit_cast<std::array<unsigned char, sizeof(PyRef)>>(PyRef());
  for (unsigned char c : bytes) {
    if (c != 0) return false;
  }
  return true;
}
static_assert(PyRefZeroIsMissing());

class MemoTable {
 public:
  static constexpr std::uint64_t kTokenMask = (std::uint64_t{1} << 48) - 1;

  // The entry for `id` (ref.kind kMissing if none).
  [[gnu::always_inline]] MemoEntry Find(std::uint64_t id) const {
    MemoEntry m;
    if (id < dense_.size()) {
      m.ref = dense_[id];
    } else if (auto it = sparse_.find(id); it != sparse_.end()) {
      m.ref = it->second;
    }
    if (m.ref.flags & kPyRefOpen) {
      m.token = m.ref.n | (std::uint64_t{m.ref.height} << 32);
      if (m.token == 0) m.token = ~std::uint64_t{0};  // never a builder's: stays open, matches none
      m.ref.n = 0;
      m.ref.height = 1;
    }
    return m;
  }
  // The stored reference of a dense id (open ones as stored: kPyRefOpen, the
  // token in n and height), or null for an id beyond the vector.
  [[gnu::always_inline]] const PyRef* Dense(std::uint64_t id) const {
    return id < dense_.size() ? dense_.data() + id : nullptr;
  }
  const PyRef* DenseData() const { return dense_.data(); }
  std::size_t DenseSize() const { return dense_.size(); }
  // A finished value; or an open list/dict (kPyRefOpen) with its builder's
  // token (compare tokens masked with kTokenMask).
  [[gnu::always_inline]] void Set(std::uint64_t id, PyRef ref, std::uint64_t token, std::uint64_t bytes_read) {
    if (ref.flags & kPyRefOpen) {
      ref.n = static_cast<std::uint32_t>(token);
      ref.height = static_cast<std::uint16_t>((token & kTokenMask) >> 32);
    }
    if (id < dense_.size()) [[likely]] {
      Count(dense_[id]);
      dense_[id] = ref;
    } else {
      PyRef& e = Entry(id, bytes_read);
      Count(e);
      e = ref;
    }
  }
  // Erase(id) if the entry is still the record placeholder whose v is `v`
  // (a placeholder is no finished value: no change counted).
  [[gnu::always_inline]] void EraseRecord(std::uint64_t id, std::uint64_t v) {
    if (id < dense_.size()) [[likely]] {
      PyRef& d = dense_[id];
      if ((d.flags & kPyRefRecord) && d.v == v) d = PyRef();
    } else if (auto it = sparse_.find(id); it != sparse_.end()) {
      if ((it->second.flags & kPyRefRecord) && it->second.v == v) sparse_.erase(it);
    }
  }
  void Erase(std::uint64_t id) {
    if (id < dense_.size()) {
      Count(dense_[id]);
      dense_[id] = PyRef();
    } else if (auto it = sparse_.find(id); it != sparse_.end()) {
      Count(it->second);
      sparse_.erase(it);
    }
  }
  // How many times an entry a finished value could have read (not missing,
  // not an open list/dict, not a record's placeholder) was replaced or
  // erased: while it stays the same, every memo reference means what it
  // meant (the frames lists cache relies on it).
  std::uint64_t changes() const { return changes_; }
  std::uint64_t Bytes() const { return dense_.capacity() * sizeof(PyRef) + sparse_.capacity() * (sizeof(PyRef) + 9); }
  // The dense slots from `next_id` on are about to be written (MEMOIZE
  // takes ids in order): their pages populated a chunk ahead (prefault.h).
  void PrefaultUpTo(std::uint64_t next_id) {
    if (next_id >= dense_.size()) return;
    ahead_.Advance(dense_.data(), dense_.size() * sizeof(PyRef), next_id * sizeof(PyRef));
  }

 private:
  PyRef& Entry(std::uint64_t id, std::uint64_t bytes_read) {
    if (id < dense_.size()) return dense_[id];
    if (id < bytes_read / 2 + 4096) {
      std::size_t n = std::max<std::size_t>(dense_.size() * 2, 1024);
      n = std::max<std::size_t>(std::min<std::size_t>(n, bytes_read / 2 + 4096), id + 1);
      dense_.Grow(n);  // the new slots are PyRef() (all zero bytes), untouched
      for (auto it = sparse_.begin(); it != sparse_.end();) {  // ids now in the vector's range move there
        if (it->first < n) {
          dense_[it->first] = it->second;
          sparse_.erase(it++);
        } else {
          ++it;
        }
      }
      return dense_[id];
    }
    return sparse_[id];
  }
  [[gnu::always_inline]] void Count(const PyRef& old) {
    if (old.kind != PyKind::kMissing && !(old.flags & (kPyRefOpen | kPyRefRecord))) ++changes_;
  }
  ZeroArray<PyRef> dense_;
  PrefaultAhead ahead_;
  absl::flat_hash_map<std::uint64_t, PyRef> sparse_;
  std::uint64_t changes_ = 0;
};

// One of 64 bits for a str key, from its length, first and last bytes: equal
// keys have the same bit. (The keys of a PyTorch trace entry, action, addr,
// size, stream, time_us, frames, compile_context, user_metadata and pool_id,
// have nine different bits: a dict's duplicate-key check compares no bytes.)
std::uint64_t StrKeyBit(const char* chars, const PyRef& k) {
  if (k.n == 0) return 1;
  const unsigned first = static_cast<unsigned char>(chars[k.v]);
  const unsigned last = static_cast<unsigned char>(chars[k.v + k.n - 1]);
  return std::uint64_t{1} << ((k.n * 7 + last + first * 3) & 63);
}

// A LONG1/LONG4 argument (little-endian two's complement) as an int; false
// outside [-2^63, 2^64).
bool LongRef(const unsigned char* b, std::size_t n, PyRef& out) {
  if (n == 0) {
    out = IntRef(0);
    return true;
  }
  const bool neg = (b[n - 1] & 0x80) != 0;
  if (!neg) {
    while (n > 8 && b[n - 1] == 0) --n;
    if (n > 8) return false;
    std::uint64_t v = 0;
    for (std::size_t k = 0; k < n; ++k) v |= static_cast<std::uint64_t>(b[k]) << (8 * k);
    out = UIntRef(v);
    return true;
  }
  while (n > 8 && b[n - 1] == 0xff && (b[n - 2] & 0x80) != 0) --n;
  if (n > 8) return false;
  std::uint64_t v = ~std::uint64_t{0};
  for (std::size_t k = 0; k < n; ++k) {
    v &= ~(std::uint64_t{0xff} << (8 * k));
    v |= static_cast<std::uint64_t>(b[k]) << (8 * k);
  }
  out = IntRef(static_cast<std::int64_t>(v));
  return true;
}

// The scalar and string opcodes both fast-path decoders read (FastPairs and
// FastDict's stack machine): BININT1, BININT2, BININT, LONG1, NONE, NEWTRUE,
// NEWFALSE, BINFLOAT, SHORT_BINUNICODE and BINUNICODE. `op` was read from
// b[p - 1]; its argument starts at b[p] and ends before b[end]. kOk: `out`
// holds the value (a string's bytes appended to `chars`), p is past it.
// kOther: not one of these opcodes (p unchanged). kBad: truncated, an integer
// outside [-2^63, 2^64) or invalid UTF-8: the caller rewinds to the general
// path, which gives the error.
enum class FastScalar : std::uint8_t { kOk, kOther, kBad };
[[gnu::always_inline]] inline FastScalar DecodeFastScalar(std::uint8_t op, const unsigned char* b, std::size_t& p,
                                                          std::size_t end, std::string& chars, PyRef& out) {
  const std::size_t left = end - p;
  const auto u32 = [&] {
    return b[p] | (std::uint32_t{b[p + 1]} << 8) | (std::uint32_t{b[p + 2]} << 16) | (std::uint32_t{b[p + 3]} << 24);
  };
  const auto str = [&](std::uint64_t n) {
    if (end - p < n) return FastScalar::kBad;
    const std::string_view text(reinterpret_cast<const char*>(b + p), static_cast<std::size_t>(n));
    if (!ValidUtf8(text)) return FastScalar::kBad;
    out = ScalarRef(PyKind::kString, chars.size());
    out.n = static_cast<std::uint32_t>(n);
    chars.append(text);
    p += n;
    return FastScalar::kOk;
  };
  switch (op) {
    case 'K':  // BININT1
      if (left < 1) return FastScalar::kBad;
      out = IntRef(b[p++]);
      return FastScalar::kOk;
    case 'M':  // BININT2
      if (left < 2) return FastScalar::kBad;
      out = IntRef(b[p] | (std::int64_t{b[p + 1]} << 8));
      p += 2;
      return FastScalar::kOk;
    case 'J':  // BININT
      if (left < 4) return FastScalar::kBad;
      out = IntRef(static_cast<std::int32_t>(u32()));
      p += 4;
      return FastScalar::kOk;
    case 0x8a: {  // LONG1
      if (left < 1 || left - 1 < b[p]) return FastScalar::kBad;
      const std::size_t n = b[p];
      if (n <= 8 && (n == 0 || (b[p + n] & 0x80) == 0)) {  // the common case: non-negative, 8 bytes at most
        std::uint64_t v = 0;
        if constexpr (std::endian::native == std::endian::little) {
          if (left >= 9) {  // one load of 8 bytes, the n of them kept
            std::memcpy(&v, b + p + 1, 8);
            if (n < 8) v &= (std::uint64_t{1} << (8 * n)) - 1;
          } else {
            for (std::size_t k = n; k > 0; --k) v = (v << 8) | b[p + k];
          }
        } else {
          for (std::size_t k = n; k > 0; --k) v = (v << 8) | b[p + k];
        }
        out = UIntRef(v);
      } else if (!LongRef(b + p + 1, n, out)) {
        return FastScalar::kBad;
      }
      p += 1 + n;
      return FastScalar::kOk;
    }
    case 'N': out = ScalarRef(PyKind::kNone, 0); return FastScalar::kOk;
    case 0x88: out = BoolRef(true); return FastScalar::kOk;
    case 0x89: out = BoolRef(false); return FastScalar::kOk;
    case 'G': {  // BINFLOAT: big-endian
      if (left < 8) return FastScalar::kBad;
      std::uint64_t x = 0;
      for (std::size_t k = 0; k < 8; ++k) x = (x << 8) | b[p + k];
      p += 8;
      out = FloatRef(std::bit_cast<double>(x));
      return FastScalar::kOk;
    }
    case 0x8c:  // SHORT_BINUNICODE
      if (left < 1) return FastScalar::kBad;
      ++p;
      return str(b[p - 1]);
    case 'X': {  // BINUNICODE
      if (left < 4) return FastScalar::kBad;
      const std::uint32_t n = u32();
      p += 4;
      return str(n);
    }
    default: return FastScalar::kOther;
  }
}

// A hash of a span of input bytes (a frames list's memo references).
std::uint64_t BytesHash(const unsigned char* b, std::size_t n) {
  __extension__ using U128 = unsigned __int128;
  const auto mum = [](std::uint64_t x, std::uint64_t y) {
    const U128 m = static_cast<U128>(x) * y;
    return static_cast<std::uint64_t>(m) ^ static_cast<std::uint64_t>(m >> 64);
  };
  std::uint64_t h = mum(n ^ 0xa0761d6478bd642full, 0xe7037ed1a0b428dbull);
  std::size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    std::uint64_t w;
    std::memcpy(&w, b + k, 8);
    h = mum(h ^ w, 0x8ebc6af09c88c6e3ull);
  }
  std::uint64_t w = 0;
  for (std::size_t j = 0; k < n; ++k, ++j) w |= std::uint64_t{b[k]} << (8 * j);
  return mum(h ^ w, 0x589965cc75374cc3ull);
}

std::uint16_t AddHeight(std::uint16_t h) { return h == std::numeric_limits<std::uint16_t>::max() ? h : h + 1; }

// A file mapped for a Reader (ReadPickleFile): the file's bytes, then
// zeros up to kMapPadding bytes at least (an anonymous mapping under it), so
// that reading a little beyond the end finds zeros, never SIGBUS (the
// decoders check every read against the end: this is insurance). The pages
// read are released behind the read position: whole pages more than
// kMapKeep bytes behind it, every kMapReleaseStep bytes read (a mapped
// page counts in the resident set as long as it is mapped). The reader
// rewinds within one trace entry or kFastWindow at most; a page released
// and read again would be read again from the file, the same bytes.
constexpr std::size_t kMapPadding = 64 << 10;
constexpr std::uint64_t kMapKeep = 4 << 20;
constexpr std::uint64_t kMapReleaseStep = 4 << 20;
struct MappedInput {
  MappedInput() = default;
  MappedInput(const MappedInput&) = delete;
  MappedInput& operator=(const MappedInput&) = delete;
  ~MappedInput() {
    if (base != nullptr) munmap(base, reserved);
  }
  // Maps the regular file open as `fd`, of `size` bytes (> 0); false if it cannot.
  bool Map(int fd, std::uint64_t size);
  // The read has reached `read`: the pages wholly before read - kMapKeep released.
  void Release(std::uint64_t read);

  char* base = nullptr;
  std::size_t size = 0;      // the file's bytes
  std::size_t reserved = 0;  // the mapping's bytes (a whole number of pages)
  std::size_t page = 4096;
  std::uint64_t released = 0;                               // bytes from base released
  std::uint64_t next_release = kMapKeep + kMapReleaseStep;  // Release when the read reaches this
};

bool MappedInput::Map(int fd, std::uint64_t file_size) {
  const long p = sysconf(_SC_PAGESIZE);
  page = p > 0 ? static_cast<std::size_t>(p) : 4096;
  if (file_size == 0 || file_size > std::numeric_limits<std::size_t>::max() - 2 * kMapPadding - page) return false;
  size = static_cast<std::size_t>(file_size);
  reserved = (size + page - 1) / page * page + (kMapPadding + page - 1) / page * page;
  void* area = mmap(nullptr, reserved, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED) return false;
  base = static_cast<char*>(area);
  if (mmap(area, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED) return false;
  // Read once, in order. (MADV_WILLNEED, MADV_POPULATE_READ of the whole
  // file or of the next 8 MiB at each release, or no advice at all cost the
  // same CPU on a 80 MB snapshot, cached or not: README, Benchmarks.)
  madvise(base, size, MADV_SEQUENTIAL);
  return true;
}

void MappedInput::Release(std::uint64_t read) {
  const std::uint64_t upto = (read - kMapKeep) / page * page;  // (read >= next_release > kMapKeep)
  if (upto > released) {
    madvise(base + released, static_cast<std::size_t>(upto - released), MADV_DONTNEED);
    released = upto;
  }
  next_release = read + kMapReleaseStep;
}

class Reader {
 public:
  // From a stream, through a kBufferSize buffer.
  Reader(std::istream& in, const std::string& source, const PickleReadOptions& options)
      : in_(&in), source_(source), options_(options), buf_(kBufferSize), arena_(std::make_shared<PickleArena>()) {
    data_ = buf_.data();
  }
  // From the whole input in memory, in place: the buffer is a window on
  // the input, moved where a stream's buffer would be filled (Refill,
  // Window) and as large as it would be, without reading or copying
  // anything; so everything else (where a fast path meets the end of the
  // buffer, the strings appended piecewise, the working-memory checks and
  // errors, the stats) is what a stream of the same bytes does. `map`, if
  // given, is the mapped file `data` is: its pages are released behind the
  // read position (at the working-memory checks).
  Reader(std::string_view data, MappedInput* map, const std::string& source, const PickleReadOptions& options)
      : source_(source),
        options_(options),
        input_(data.data()),
        input_size_(data.size()),
        map_(map),
        arena_(std::make_shared<PickleArena>()) {
    data_ = input_;
  }

  absl::StatusOr<PickleDoc> Run(PickleReadStats* stats);

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": offset ", op_offset_, ": ", what));
  }
  absl::Status Truncated() const {
    return Error(absl::StrCat("truncated input in opcode ", OpName(op_) ? OpName(op_) : "?"));
  }

  // ---- Input.
  bool Refill() {
    base_ += end_;
    pos_ = end_ = 0;
    if (eof_) return false;
    end_ = Read(0, kBufferSize);
    if (end_ == 0) {
      eof_ = true;
      return false;
    }
    return true;
  }
  // Reads up to n bytes into the buffer at `at` (the buffer starting at
  // input byte base_): how many (0 at the end of the input). In memory,
  // none is copied: the buffer is input_ + base_, and a read gets all it
  // asks for up to the end, as a stream of a file does.
  std::size_t Read(std::size_t at, std::size_t n) {
    if (in_ == nullptr) {
      data_ = input_ + base_;
      return static_cast<std::size_t>(std::min<std::uint64_t>(n, input_size_ - (base_ + at)));
    }
    in_->read(buf_.data() + at, static_cast<std::streamsize>(n));
    return static_cast<std::size_t>(in_->gcount());
  }
  [[gnu::always_inline]] bool ReadByte(std::uint8_t& b) {
    if (pos_ == end_ && !Refill()) return false;
    b = static_cast<std::uint8_t>(data_[pos_++]);
    return true;
  }
  absl::Status ReadRaw(void* dst, std::size_t n) {
    if (end_ - pos_ >= n) {
      std::memcpy(dst, data_ + pos_, n);
      pos_ += n;
      return absl::OkStatus();
    }
    auto* d = static_cast<char*>(dst);
    while (n > 0) {
      if (pos_ == end_ && !Refill()) return Truncated();
      std::size_t k = std::min(n, end_ - pos_);
      std::memcpy(d, data_ + pos_, k);
      pos_ += k;
      d += k;
      n -= k;
    }
    return absl::OkStatus();
  }
  // Appends n bytes to `out`, growing it only as data actually arrives (and
  // within the working-memory budget).
  absl::Status AppendBytes(std::uint64_t n, std::string& out) {
    while (n > 0) {
      if (pos_ == end_ && !Refill()) return Truncated();
      std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, end_ - pos_));
      out.append(data_ + pos_, k);
      pos_ += k;
      n -= k;
      if (n > 0) MS_RETURN_IF_ERROR(CheckBudget());
    }
    return absl::OkStatus();
  }
  absl::Status ReadLine(std::string& out) {
    out.clear();
    for (;;) {
      std::uint8_t c;
      if (!ReadByte(c)) return Truncated();
      if (c == '\n') return absl::OkStatus();
      if (out.size() >= kMaxLine) return Error("text argument longer than 1 MiB");
      out += static_cast<char>(c);
    }
  }
  template <typename T>
  [[gnu::always_inline]] absl::Status ReadLE(T& v) {
    unsigned char b[sizeof(T)];
    if (end_ - pos_ >= sizeof(T)) {  // the common case: in the buffer
      std::memcpy(b, data_ + pos_, sizeof(T));
      pos_ += sizeof(T);
    } else {
      MS_RETURN_IF_ERROR(ReadRaw(b, sizeof(T)));
    }
    std::uint64_t x = 0;
    for (std::size_t k = 0; k < sizeof(T); ++k) x |= static_cast<std::uint64_t>(b[k]) << (8 * k);
    v = static_cast<T>(x);
    return absl::OkStatus();
  }

  // ---- Working memory.
  std::uint64_t WorkingBytes() const {
    const PickleArena& a = *arena_;
    return a.chars.capacity() + (a.shared.capacity() + a.tree.capacity() + cons_refs_.capacity()) * sizeof(PyRef) +
           cons_next_.capacity() * 4 + cons_head_.capacity() * 16 + stack_.capacity() * sizeof(Slot) + memo_.Bytes() +
           tree_memo_.capacity() * 16 + builders_.size() * (sizeof(Builder) + 16) + builder_bytes_ +
           marks_.capacity() * 8 + scratch_.capacity() * sizeof(PyRef) + streaming_.capacity() * 16 +
           records_.capacity() * sizeof(Record) + record_pairs_.capacity() * sizeof(PyRef) + record_index_.capacity() +
           record_memo_.capacity() * 16 + list_cache_.capacity() * 13 +
           list_cache_items_.capacity() * sizeof(CachedList) + list_cache_bytes_.capacity() +
           list_prefix_.capacity() * 13;
  }
  // The working-memory check without its error: the peak updated, false
  // if the budget is exceeded.
  bool BudgetOk(std::uint64_t& used, std::uint64_t& read) {
    used = WorkingBytes();
    peak_ = std::max(peak_, used);
    read = base_ + pos_;
    if (map_ != nullptr && read >= map_->next_release) map_->Release(read);
    memo_.PrefaultUpTo(std::max(memo_count_, fast_memo_count_));
    return used <= options_.max_working_bytes_fixed + options_.max_working_bytes_per_input_byte * read;
  }
  absl::Status CheckBudget() {
    std::uint64_t used, read;
    if (!BudgetOk(used, read)) {
      return Error(absl::StrCat("the pickle needs more than ", options_.max_working_bytes_per_input_byte,
                                " bytes of working memory per byte of input (", used, " bytes after ", read,
                                " bytes): refused"));
    }
    return absl::OkStatus();
  }

  // ---- Builders.
  std::uint32_t NewBuilder(PyKind kind) {
    std::uint32_t b;
    if (!free_builders_.empty()) {
      b = free_builders_.back();
      free_builders_.pop_back();
    } else {
      b = static_cast<std::uint32_t>(builders_.size());
      builders_.push_back(std::make_unique<Builder>());
    }
    Builder& B = *builders_[b];
    B.kind = kind;
    B.items.clear();
    B.appended = 0;
    B.streamed = -1;
    B.has_path = false;
    B.path.clear();
    B.memo_ids.clear();
    B.token = ++next_token_;
    B.tree_mark = arena_->tree.size();
    B.height = 1;
    B.copied = false;
    B.str_key_bits = 0;
    B.key_index.clear();
    return b;
  }
  void AddItem(Builder& B, const PyRef& r) {
    const std::size_t cap = B.items.capacity();
    B.items.push_back(r);
    if (B.items.capacity() != cap) builder_bytes_ += (B.items.capacity() - cap) * sizeof(PyRef);
  }
  Builder& BuilderOf(const PyRef& r) { return *builders_[static_cast<std::size_t>(r.v)]; }

  // A hash of a container's kind and elements for the shared pool's index
  // (a traceback's frames list per trace entry: this is per entry). Two
  // 64-bit words per element folded by a 128-bit multiply, then into the
  // running hash by an odd multiply (a bijection: no element erases what
  // came before it). A collision costs only a compare (Store compares the
  // elements before sharing).
  static std::uint64_t ContentHash(PyKind kind, const PyRef* items, std::size_t count) {
    static_assert(sizeof(PyRef) == 16);
    __extension__ using U128 = unsigned __int128;
    const auto mum = [](std::uint64_t x, std::uint64_t y) {
      const U128 m = static_cast<U128>(x) * y;
      return static_cast<std::uint64_t>(m) ^ static_cast<std::uint64_t>(m >> 64);
    };
    std::uint64_t h = mum(static_cast<std::uint64_t>(kind) ^ 0xa0761d6478bd642full, count ^ 0xe7037ed1a0b428dbull);
    const auto* bytes = reinterpret_cast<const unsigned char*>(items);
    for (std::size_t k = 0; k < count; ++k) {
      std::uint64_t w0, w1;
      std::memcpy(&w0, bytes + 16 * k, 8);
      std::memcpy(&w1, bytes + 16 * k + 8, 8);
      h = (h ^ mum(w0 ^ 0x8ebc6af09c88c6e3ull, w1 ^ 0x589965cc75374cc3ull)) * 0x9e3779b97f4a7c15ull;
    }
    return h;
  }

  // Stores a finished container and returns its reference: small containers
  // of scalars once per distinct content in the shared pool, others in the tree.
  PyRef Store(PyKind kind, const PyRef* items, std::size_t count, std::uint16_t height) {
    PyRef r;
    r.kind = kind;
    r.height = height;
    r.n = static_cast<std::uint32_t>(kind == PyKind::kDict ? count / 2 : count);
    PickleArena& a = *arena_;
    if (count == 0) {
      r.flags = kPyRefShared;
      return r;
    }
    const bool shared = count <= kMaxSharedElements &&
                        (kind == PyKind::kDict ? height == 1 && count <= 2 * kMaxSharedDictPairs : height <= 2);
    if (!shared) {
      r.v = a.tree.size();
      a.tree.insert(a.tree.end(), items, items + count);
      return r;
    }
    r.flags = kPyRefShared;
    const std::size_t bytes = count * sizeof(PyRef);
    const std::uint64_t h = ContentHash(kind, items, count);
    auto [it, inserted] = cons_head_.try_emplace(h, static_cast<std::uint32_t>(cons_refs_.size()));
    if (!inserted) {
      for (std::uint32_t k = it->second; k != kNoNext; k = cons_next_[k]) {
        const PyRef& c = cons_refs_[k];
        if (c.kind == kind && c.n == r.n && std::memcmp(a.shared.data() + c.v, items, bytes) == 0) return c;
      }
    }
    r.v = a.shared.size();
    a.shared.insert(a.shared.end(), items, items + count);
    cons_next_.push_back(inserted ? kNoNext : it->second);
    it->second = static_cast<std::uint32_t>(cons_refs_.size());
    cons_refs_.push_back(r);
    return r;
  }

  // Finishes an open list/dict: stores it, points its memo entries at it and
  // returns the builder to the pool.
  PyRef Freeze(const PyRef& open) {
    const std::uint32_t b = static_cast<std::uint32_t>(open.v);
    Builder& B = *builders_[b];
    PyRef r = Store(B.kind, B.items.data(), B.items.size(), B.height);
    for (std::uint64_t id : B.memo_ids) {
      const MemoEntry m = memo_.Find(id);
      if (m.ref.kind == PyKind::kMissing || m.token != (B.token & MemoTable::kTokenMask)) continue;
      SetMemo(id, r);
    }
    free_builders_.push_back(b);
    return r;
  }
  // A stack value as a finished reference (freezing an open list/dict).
  PyRef Finish(const Slot& s) {
    if (s.ref.flags & kPyRefRecord) [[unlikely]]
      return BuildRecord(s.ref);
    return s.open() ? Freeze(s.ref) : s.ref;
  }
  // A stack value as a finished reference, a record's placeholder kept as it is.
  PyRef FinishKeepRecord(const Slot& s) { return s.open() ? Freeze(s.ref) : s.ref; }
  void SetMemo(std::uint64_t id, const PyRef& r) {
    if (r.flags & kPyRefRecord) {  // a record's placeholder: forgotten at the batch's end (ReleaseRecords)
      memo_.Set(id, r, 0, base_ + pos_);
      record_memo_.push_back({id, r.v});
      return;
    }
    memo_.Set(id, r, 0, base_ + pos_);
    if (IsContainerKind(r.kind) && r.n > 0 && !(r.flags & kPyRefShared)) tree_memo_.emplace_back(id, r.v);
  }

  // Releases what streamed items built in the tree (everything above `mark`),
  // and the memo entries that point there.
  void ReleaseTree(std::uint64_t mark) {
    PickleArena& a = *arena_;
    if (a.tree.size() <= mark) return;
    while (!tree_memo_.empty() && tree_memo_.back().second >= mark) {
      const std::uint64_t id = tree_memo_.back().first;
      const MemoEntry m = memo_.Find(id);
      if (m.token == 0 && IsContainerKind(m.ref.kind) && !(m.ref.flags & kPyRefShared) && m.ref.v >= mark) {
        memo_.Erase(id);
      }
      tree_memo_.pop_back();
    }
    a.tree.resize(mark);
  }

  // ---- Stack.
  [[gnu::always_inline]] std::uint32_t NextLevel(bool for_mark) const {
    if (stack_.empty()) return 1;
    const Slot& p = stack_.back();
    if (p.mark) return p.level + 1;
    // After a list or dict with no MARK open: its element (a one-item APPEND
    // or SETITEM). Inside a batch: the next element of the batch.
    if (!for_mark && p.open() && marks_.empty()) return p.level + 1;
    return p.level;
  }
  absl::Status CheckDepth(std::uint64_t depth) const {
    if (depth > options_.max_depth) {
      return Error(absl::StrCat("nesting deeper than max_depth (", options_.max_depth, ")"));
    }
    return absl::OkStatus();
  }
  absl::Status Push(const PyRef& r) {
    if (stack_.size() >= kMaxPickleStack) {
      return Error(absl::StrCat("more than ", kMaxPickleStack,
                                " values waiting on the pickle stack (a real snapshot needs a few thousand): refused"));
    }
    const std::uint32_t level = NextLevel(false);
    const std::uint64_t depth = IsContainerKind(r.kind) ? std::uint64_t{level} + r.height - 1 : level;
    if (depth > options_.max_depth) return CheckDepth(depth);
    Slot s;
    s.ref = r;
    s.level = level;
    stack_.push_back(s);
    return absl::OkStatus();
  }
  // The common memo reference, a finished value pushed where nothing needs
  // checking; false leaves everything (errors included) to Get.
  [[gnu::always_inline]] bool PushMemoFast(std::uint64_t id) {
    const MemoEntry m = memo_.Find(id);
    if (m.ref.kind == PyKind::kMissing || m.token != 0 || (m.ref.flags & kPyRefRecord) ||
        stack_.size() >= kMaxPickleStack) {
      return false;
    }
    const std::uint32_t level = NextLevel(false);
    const std::uint64_t depth = IsContainerKind(m.ref.kind) ? std::uint64_t{level} + m.ref.height - 1 : level;
    if (depth > options_.max_depth) return false;
    Slot s;
    s.ref = m.ref;
    s.level = level;
    stack_.push_back(s);
    return true;
  }
  absl::Status PushNew(PyKind kind) {                            // an empty list or dict, open for filling
    if (stack_.size() >= kMaxPickleStack) return Push(PyRef());  // the same error
    const std::uint32_t level = NextLevel(false);
    MS_RETURN_IF_ERROR(CheckDepth(level));
    PyRef r;
    r.kind = kind;
    r.flags = kPyRefOpen;
    r.height = 1;
    r.v = NewBuilder(kind);
    Slot s;
    s.ref = r;
    s.level = level;
    stack_.push_back(s);
    return absl::OkStatus();
  }
  absl::Status PushString(PyKind kind, std::size_t start) {
    const std::size_t n = arena_->chars.size() - start;
    if (n > std::numeric_limits<std::uint32_t>::max()) return Error("string longer than 4 GiB: not supported");
    PyRef r = ScalarRef(kind, start);
    r.n = static_cast<std::uint32_t>(n);
    return Push(r);
  }
  // The value entry at the top; error for an empty stack or a MARK.
  absl::Status CheckTopValue(std::size_t n = 1) const {
    if (stack_.size() < n) return Error(absl::StrCat("stack underflow in ", OpName(op_)));
    for (std::size_t k = stack_.size() - n; k < stack_.size(); ++k) {
      if (stack_[k].mark) return Error(absl::StrCat("unexpected MARK on the stack in ", OpName(op_)));
    }
    return absl::OkStatus();
  }
  PyRef PopFinished() {
    Slot s = stack_.back();
    stack_.pop_back();
    return Finish(s);
  }
  // Takes the values above the topmost MARK (finished) into `out`, and the MARK.
  absl::Status TakeFromMark(FastVec<PyRef>& out, std::uint32_t* mark_level = nullptr, bool keep_records = false) {
    if (marks_.empty()) return Error(absl::StrCat("no MARK for ", OpName(op_)));
    std::size_t m = marks_.back();
    marks_.pop_back();
    if (mark_level != nullptr) *mark_level = stack_[m].level;
    const std::size_t n = stack_.size() - m - 1;
    out.reserve(n);
    PyRef* const o = out.data();  // (Finish and Freeze touch neither the stack nor `out`)
    const Slot* const from = stack_.data() + m + 1;
    if (keep_records) {
      for (std::size_t k = 0; k < n; ++k) o[k] = FinishKeepRecord(from[k]);
    } else {
      for (std::size_t k = 0; k < n; ++k) o[k] = Finish(from[k]);
    }
    out.set_size(n);
    stack_.resize(m);
    return absl::OkStatus();
  }
  // A copy of what an open list/dict holds now (GET or DUP of it while it is
  // still on the stack).
  PyRef CopyOpen(const PyRef& open) {
    Builder& B = BuilderOf(open);
    B.copied = true;
    return Store(B.kind, B.items.data(), B.items.size(), B.height);
  }

  // ---- Paths (see the header).
  std::string KeyLabel(const PyRef& k) const {
    PyView v(arena_.get(), k);
    if (v.kind() == PyKind::kString) return std::string(v.bytes());
    if (v.kind() == PyKind::kInt) return v.is_unsigned() ? absl::StrCat(*v.AsUInt()) : absl::StrCat(*v.AsInt());
    return "[?]";
  }
  static bool IsMutable(const Slot& e) { return !e.mark && IsMutableKind(e.ref.kind); }
  std::uint64_t Count(const Slot& e) const {
    if (!e.open()) return e.ref.n;
    const Builder& B = *builders_[static_cast<std::size_t>(e.ref.v)];
    return B.kind == PyKind::kList ? B.appended : B.items.size() / 2;
  }
  static PicklePath Unknown(PicklePath p) {
    p.push_back("[?]");
    return p;
  }
  // Path of the value at stack position q (for q == stack_.size() or a MARK
  // position: of the value that will be there).
  PicklePath PathAt(std::size_t q, std::uint64_t level) {
    if (level > options_.max_depth) {
      path_too_deep_ = true;
      return {};
    }
    const bool cacheable = q < stack_.size() && !stack_[q].mark && stack_[q].open();
    if (cacheable && BuilderOf(stack_[q].ref).has_path) return BuilderOf(stack_[q].ref).path;
    PicklePath p = ComputePath(q, level);
    if (cacheable) {
      Builder& B = BuilderOf(stack_[q].ref);
      B.path = p;
      B.has_path = true;
    }
    return p;
  }
  PicklePath ComputePath(std::size_t q, std::uint64_t level) {
    if (q == 0) return {};
    auto it = std::lower_bound(marks_.begin(), marks_.end(), q);
    if (it == marks_.begin()) return ChainPath(0, q, level);  // no MARK below q
    std::size_t m = *(it - 1);
    std::size_t lo = m + 1;
    if (m == 0 || stack_[m - 1].mark || !IsMutable(stack_[m - 1])) {
      // A tuple (or list/dict built by LIST/DICT) still being built at m.
      PicklePath p = PathAt(m, level + 1);
      p.push_back(absl::StrCat("[", q - lo, "]"));
      return p;
    }
    const Slot& owner = stack_[m - 1];
    if (owner.ref.kind == PyKind::kList) {
      PicklePath p = PathAt(m - 1, level + 1);
      p.push_back(absl::StrCat("[", Count(owner) + (q - lo), "]"));
      return p;
    }
    // A dict's batch: key, value, key, value...
    for (std::size_t j = lo;; j += 2) {
      if (j >= q) return Unknown(PathAt(m - 1, level + 1));
      if (j + 1 == q) {
        PicklePath p = PathAt(m - 1, level + 1);
        p.push_back(KeyLabel(stack_[j].ref));
        return p;
      }
      // A list or dict where a key should be cannot be a key: it belongs to
      // the value before it.
      if (j + 2 == q || IsMutable(stack_[j + 2])) {
        if (IsMutable(stack_[j + 1])) return ChainPath(j + 1, q, level + 1);
        return Unknown(PathAt(m - 1, level + 1));
      }
    }
  }
  // Entries c+1 .. q-1 are single elements nested under the container at c
  // (APPEND / SETITEM batches of one, no MARK).
  PicklePath ChainPath(std::size_t c, std::size_t q, std::uint64_t level) {
    PicklePath p = PathAt(c, level + 1);
    for (;;) {
      const Slot& e = stack_[c];
      if (!IsMutable(e)) return Unknown(std::move(p));
      std::size_t next;
      if (e.ref.kind == PyKind::kList) {
        p.push_back(absl::StrCat("[", Count(e), "]"));
        next = c + 1;
      } else {
        if (c + 1 >= q) return Unknown(std::move(p));
        p.push_back(KeyLabel(stack_[c + 1].ref));
        next = c + 2;
      }
      if (next == q) return p;
      if (next > q || p.size() > options_.max_depth) return Unknown(std::move(p));
      c = next;
    }
  }

  // Whether the value at stack position q is inside an item of a streamed
  // list: the newest streamed list still open has its batch's MARK open right
  // above it, below q (in a batch, a sibling of the list cannot come before
  // its APPENDS; the path of anything there starts with the list's path and
  // an item index). False when unsure (a one-item APPEND has no MARK): the
  // caller then builds the path. Entries of streaming_ whose list is gone
  // are dropped here.
  bool InsideStreamedList(std::size_t q) {
    while (!streaming_.empty()) {
      const auto [pos, token] = streaming_.back();
      if (pos < stack_.size() && stack_[pos].open() && !stack_[pos].mark && BuilderOf(stack_[pos].ref).token == token) {
        break;
      }
      streaming_.pop_back();
    }
    if (streaming_.empty()) return false;
    const std::size_t s = streaming_.back().first;
    return s + 1 < q && stack_[s + 1].mark;
  }

  // ---- Containers.
  absl::Status OpenTarget(std::size_t target, PyKind kind) {
    if (target >= stack_.size() || stack_[target].mark || stack_[target].ref.kind != kind) {
      return Error(absl::StrCat(OpName(op_), " to something that is not a ", KindName(kind)));
    }
    if (!stack_[target].open()) {
      return Error(absl::StrCat(OpName(op_), " to a ", KindName(kind),
                                " that is complete (a memo reference to it): not supported"));
    }
    if (BuilderOf(stack_[target].ref).copied) {
      return Error(absl::StrCat(OpName(op_), ": a container inside itself (recursive structure): not supported"));
    }
    return absl::OkStatus();
  }
  // The pair of a small dict (fewer than 32 pairs) whose key equals the str
  // key `kr`. A str key equals only a str key with the same bytes (a
  // memoized key is the very same bytes: same offset).
  [[gnu::always_inline]] std::optional<std::size_t> FindStrKey(Builder& B, const PyRef& kr) {
    const char* chars = arena_->chars.data();
    const std::uint64_t bit = StrKeyBit(chars, kr);
    const bool maybe_held = (B.str_key_bits & bit) != 0;
    B.str_key_bits |= bit;
    if (!maybe_held) return std::nullopt;
    const std::size_t pairs = B.items.size() / 2;
    for (std::size_t j = 0; j < pairs; ++j) {
      const PyRef& e = B.items[2 * j];
      if (e.kind == PyKind::kString && e.n == kr.n &&
          (e.v == kr.v || std::memcmp(chars + e.v, chars + kr.v, kr.n) == 0)) {
        return j;
      }
    }
    return std::nullopt;
  }
  absl::Status AppendTo(std::size_t target, FastVec<PyRef>& items);
  absl::Status SetItems(std::size_t target, FastVec<PyRef>& kv);
  absl::Status MakeTuple(FastVec<PyRef>& items, std::uint32_t level) {
    std::uint16_t h = 1;
    for (const PyRef& e : items) {
      if (IsContainerKind(e.kind)) h = std::max<std::uint16_t>(h, AddHeight(e.height));
    }
    MS_RETURN_IF_ERROR(CheckDepth(h));
    PyRef r = Store(PyKind::kTuple, items.data(), items.size(), h);
    Slot s;
    s.ref = r;
    s.level = level;
    stack_.push_back(s);
    return absl::OkStatus();
  }
  absl::Status Memo(std::uint64_t id);
  absl::Status Get(std::uint64_t id);

  // ---- The dict fast path (PickleReadOptions::fast_dicts).
  // Makes at least n bytes available from pos_ (fewer at the end of the input).
  void Window(std::size_t n) {
    if (end_ - pos_ >= n || eof_) return;
    if (in_ != nullptr) std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
    base_ += pos_;
    end_ -= pos_;
    pos_ = 0;
    while (end_ < kBufferSize && !eof_) {
      const std::size_t got = Read(end_, kBufferSize - end_);
      if (got == 0) eof_ = true;
      end_ += got;
    }
  }
  struct FastVal {
    PyRef ref;
    std::int32_t box = -1;  // >= 0: an open list/dict of this decode (fast_boxes_[box])
    bool mark = false;
  };
  struct FastBox {
    FastVec<PyRef> items;
    std::uint64_t memo[4];
    std::uint64_t str_key_bits = 0;
    PyKind kind = PyKind::kDict;
    std::uint16_t height = 1;
    std::uint8_t memos = 0;
  };
  bool FastDict();
  // The end of a dict read fast: its value (a dict or a record's
  // placeholder) pushed at `level`, the opcodes it took counted.
  [[gnu::always_inline]] bool FastPush(const PyRef& r, std::uint32_t level, std::uint64_t ops) {
    Slot s;
    s.ref = r;
    s.level = level;
    stack_.push_back(s);
    fast_ops_ = ops;
    ++fast_count_;
    return true;
  }
  template <bool kRecord>
  bool FastPairs(std::size_t& pos);
  struct Template;
  template <bool kChecked>
  [[gnu::always_inline]] inline bool TemplatePairs(const Template& T, std::size_t& pos);
  bool TemplateRun();
  // After a record FastDict pushed: true if the next opcode is an
  // EMPTY_DICT that FastDict would read the same way if Run's loop handed it
  // over; the record's opcodes then counted as Run counts them (and Run's
  // working-memory check made when due: if it fails, false, and Run makes it
  // again and stops with its error), the EMPTY_DICT read as Run reads an
  // opcode, the window made.
  [[gnu::always_inline]] bool NextTemplateEntry() {
    if (pos_ >= end_ || data_[pos_] != '}') return false;
    // (Still inside the streamed list's item batch: FastDict found it so,
    // and the stack has only grown by the records pushed since.)
    if (stack_.size() + kFastMaxStack >= kMaxPickleStack) return false;
    const std::uint64_t ops = run_ops_ + 1 + fast_ops_;
    if (ops >= run_next_check_) {  // Run's check, made here; if it fails, Run makes it again and stops
      std::uint64_t used, read;
      if (!BudgetOk(used, read)) return false;
      run_next_check_ = ops + kBudgetCheckEvery;
    }
    run_ops_ = ops;
    fast_ops_ = 0;
    op_offset_ = base_ + pos_;
    op_ = '}';
    ++pos_;
    Window(kFastWindow);
    return true;
  }
  [[gnu::always_inline]] inline bool PushRecord(std::size_t p, std::size_t chars0, bool from_template);
  template <bool kOneMemo>
  [[gnu::always_inline]] inline PyRef CommitRecord(std::uint64_t gen);
  struct TmplState {  // TemplatePairs' memo writes so far
    std::uint64_t bloom = 0, next_id = 0;
    bool list_cache_ok = true;
  };
  std::uint64_t TmplMemoize(TmplState& s) const;
  [[gnu::noinline]] bool TmplScalarTail(std::uint8_t op, std::size_t& p, PyRef& val, TmplState& s);
  [[gnu::noinline]] bool TmplValue(std::uint8_t op, std::size_t& p, PyRef& val, TmplState& s);
  void BuildTemplate(const PyRef* pairs, std::uint32_t n);
  // A memo reference's value as FastLookup gives it outside a decode (no
  // memo write of the decode is readable: their ids are all new): none, an
  // open list/dict of the general path or a record's placeholder is no value.
  [[gnu::always_inline]] bool MemoValue(std::uint64_t id, PyRef& out) const {
    if (const PyRef* d = memo_.Dense(id)) [[likely]] {  // what Find does, without building an entry
      if (d->kind == PyKind::kMissing || (d->flags & (kPyRefOpen | kPyRefRecord))) return false;
      out = *d;
      return true;
    }
    const MemoEntry m = memo_.Find(id);
    if (m.ref.kind == PyKind::kMissing || m.token != 0 || (m.ref.flags & kPyRefRecord)) return false;
    out = m.ref;
    return true;
  }
  std::uint8_t RecordKeyIndex(const PyRef& key) const;
  PyRef BuildRecord(const PyRef& placeholder);
  void ReleaseRecords();
  // The list_cache_ entry of a frames list's item bytes (`span` bytes at
  // `items`, hashed to `hash`), while no memo entry has changed since it was
  // stored: the same bytes are the same list.
  [[gnu::always_inline]] bool CachedListOf(const unsigned char* items, std::size_t span, std::uint64_t hash,
                                           PyRef& out) const {
    auto it = list_cache_.find(hash);
    if (it == list_cache_.end()) return false;
    const CachedList& c = list_cache_items_[it->second];
    if (c.changes != memo_.changes() || c.length != span ||
        std::memcmp(list_cache_bytes_.data() + c.offset, items, span) != 0) {
      return false;
    }
    out = c.list;
    return true;
  }
  [[gnu::always_inline]] bool FastLookup(std::uint64_t id, PyRef& out) const {
    if (fast_memo_bloom_ & (std::uint64_t{1} << (id & 63))) [[unlikely]]
      return FastLookupWritten(id, out);
    return MemoValue(id, out);
  }
  bool FastLookupWritten(std::uint64_t id, PyRef& out) const;
  [[gnu::always_inline]] PyRef FastFinish(const FastVal& v) { return v.box < 0 ? v.ref : FastStore(v.box); }
  PyRef FastStore(std::int32_t box);
  bool FastInto(FastBox& box, FastVal* vals, std::size_t n);
  absl::Status Long(const unsigned char* b, std::size_t n);
  absl::Status Step(std::uint8_t op);

  static constexpr std::uint32_t kNoNext = ~std::uint32_t{0};

  std::istream* in_ = nullptr;  // null: the input is in memory (input_)
  const std::string& source_;
  const PickleReadOptions& options_;
  std::vector<char> buf_;        // a stream's buffer
  const char* input_ = nullptr;  // the input in memory, input_size_ bytes
  std::uint64_t input_size_ = 0;
  const char* data_ = nullptr;  // the buffer: buf_, or input_ + base_ (kBufferSize bytes at most)
  MappedInput* map_ = nullptr;  // the mapped file input_ is, if it is one
  std::size_t pos_ = 0, end_ = 0;
  std::uint64_t base_ = 0;
  bool eof_ = false;
  std::uint64_t op_offset_ = 0;
  std::uint8_t op_ = 0;

  std::shared_ptr<PickleArena> arena_;
  FastVec<Slot> stack_;
  std::vector<std::size_t> marks_;  // positions of the MARKs in stack_
  std::vector<std::unique_ptr<Builder>> builders_;
  std::vector<std::uint32_t> free_builders_;
  std::uint64_t builder_bytes_ = 0;
  MemoTable memo_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> tree_memo_;  // (memo id, tree offset), ascending offsets
  std::vector<PyRef> cons_refs_;                                    // shared containers
  std::vector<std::uint32_t> cons_next_;                            // same-hash chain
  absl::flat_hash_map<std::uint64_t, std::uint32_t> cons_head_;     // content hash -> newest index
  std::uint64_t memo_count_ = 0;                                    // MEMOIZE's index: entries ever memoized
  std::uint64_t next_token_ = 0;
  std::uint64_t peak_ = 0;
  bool path_too_deep_ = false;
  bool stopped_ = false;
  FastVec<PyRef> scratch_;
  // The dict fast path's state, reused from one dict to the next.
  bool fast_dicts_ = false;
  std::uint64_t fast_ops_ = 0;    // opcodes the fast path consumed (for the budget checks)
  std::uint64_t fast_count_ = 0;  // dicts it read
  // Run's opcode count and its next working-memory check (FastDict's run of
  // template records counts the opcodes it reads in their place: see NextTemplateEntry).
  std::uint64_t run_ops_ = 0, run_next_check_ = kBudgetCheckEvery;
  std::uint64_t fast_pair_ops_ = 0;
  std::unique_ptr<FastVal[]> fast_vals_;  // the fast path's stack (kFastMaxStack values)
  std::size_t fast_marks_[kFastMaxMarks] = {};
  std::size_t fast_nmarks_ = 0;
  std::vector<FastBox> fast_boxes_;
  std::size_t fast_nboxes_ = 0;
  std::vector<std::pair<std::uint64_t, PyRef>> fast_memo_;  // memo writes, made when the dict is done
  std::uint64_t fast_memo_bloom_ = 0;                       // bit (id & 63) of every id written by this decode
  std::uint64_t fast_memo_count_ = 0;
  // Records (PickleReadOptions::on_record): placeholders on the stack stand
  // for records_[v & 0xffffffff] of generation v >> 32 (records_ is emptied
  // at the end of each batch of the streamed list, which takes them all).
  struct Record {
    std::uint32_t first = 0;  // its pairs: record_pairs_[2 * first...], record_index_[first...]
    std::uint32_t n = 0;
    std::uint16_t height = 1;
    bool built = false;
    PyRef dict;  // once built
  };
  bool records_on_ = false;
  FastVec<Record> records_;
  FastVec<PyRef> record_pairs_;
  FastVec<std::uint8_t> record_index_;
  FastVec<std::pair<std::uint64_t, std::uint64_t>> record_memo_;  // (memo id, placeholder's v) written
  std::uint64_t record_gen_ = 1;
  std::uint64_t record_count_ = 0;
  bool record_stale_ = false;  // a placeholder outlived its batch (a reader bug: an error, not a crash)
  struct KeyAt {
    std::uint64_t v = ~std::uint64_t{0};
    std::uint32_t n = 0;
    std::uint8_t index = 0;
  };
  KeyAt record_key_at_[kMaxRecordKeys];                  // the key last seen at each position of a record
  std::uint8_t fast_record_index_[kMaxRecordKeys] = {};  // FastPairs<true>: the key index of each pair
  std::uint32_t fast_record_pairs_ = 0;                  // FastPairs<true>: its pairs (in record_pairs_)
  std::uint32_t fast_key_pos_[kMaxRecordKeys] = {};      // FastPairs<true>: where each key's opcode is in the buffer
  // The templates (TemplatePairs): the keys of a record FastPairs<true>
  // read, each a memo reference (its bytes, little-endian, and a mask of
  // their length), the string it gave and its key index; valid while
  // memo_.changes() is `changes`. n 0: none. Two of them, the one last used
  // first (tmpl_[tmpl_first_]): entries of two shapes in turn (an alloc with
  // more keys than a free) take one each.
  // A pair whose value was a memo reference or a BININT1/2/4 also keeps
  // the pair's bytes (8 at most) and that value: the same bytes again are
  // the same value (pair_mask 0 and pair_bytes ~0: none).
  // And the shape of the value: the key's bytes with the value's opcode
  // (and LONG1's length byte) after them, when that opcode is one whose
  // argument has a fixed length: a memo reference, BININT1/2/4, LONG1 of
  // 8 bytes at most (vkind; vmask 0 and vbytes ~0: none). The same bytes
  // again: the value is read from its argument without a look at its opcode.
  enum : std::uint8_t { kVNone, kVMemo1, kVMemo4, kVInt1, kVInt2, kVInt4, kVLong1 };
  struct TmplKey {
    std::uint64_t bytes = 0, mask = 0;
    std::uint64_t pair_bytes = ~std::uint64_t{0}, pair_mask = 0;
    std::uint64_t vbytes = ~std::uint64_t{0}, vmask = 0;
    std::uint64_t varg_mask = 0, vsign = 0;  // LONG1: its argument's bytes, their top bit
    PyRef key, value;
    std::uint16_t value_height = 1;  // what the value adds to the dict's height
    std::uint8_t len = 0, pair_len = 0;
    std::uint8_t vkind = kVNone, vlen = 0, varg = 0;  // vlen: bytes of vbytes; varg: of the argument after them
  };
  struct Template {
    TmplKey keys[kMaxRecordKeys];
    std::uint8_t index[kMaxRecordKeys] = {};
    std::uint32_t n = 0;
    std::uint64_t changes = 0;
  };
  Template tmpl_[2];
  Template tmpl_build_;  // BuildTemplate's
  std::uint32_t tmpl_first_ = 0;
  std::uint64_t tmpl_count_ = 0;  // records read by a template
  // Frames lists by their bytes (FastPairs): the stored list, valid while
  // memo_.changes() is what it was.
  struct CachedList {
    std::size_t offset, length;  // in list_cache_bytes_
    PyRef list;
    std::uint64_t changes;
  };
  absl::flat_hash_map<std::uint64_t, std::uint32_t> list_cache_;  // BytesHash -> list_cache_items_
  std::vector<CachedList> list_cache_items_;
  std::string list_cache_bytes_;
  // The lists of at least 16 bytes by their first 16 (PrefixHash), the one
  // cached last: TmplValue finds a cached list without scanning its items'
  // opcodes for where they end or hashing them all.
  absl::flat_hash_map<std::uint64_t, std::uint32_t> list_prefix_;
  static std::uint64_t PrefixHash(const unsigned char* b) {
    std::uint64_t w0, w1;
    std::memcpy(&w0, b, 8);
    std::memcpy(&w1, b + 8, 8);
    __extension__ using U128 = unsigned __int128;
    const U128 m = static_cast<U128>(w0 ^ 0xa0761d6478bd642full) * (w1 ^ 0xe7037ed1a0b428dbull);
    return static_cast<std::uint64_t>(m) ^ static_cast<std::uint64_t>(m >> 64);
  }
  // Keeps a list read from `span` bytes of memo references (hash BytesHash of them).
  void CacheList(std::uint64_t span_hash, const unsigned char* bytes, std::size_t span, const PyRef& list) {
    auto [it, added] = list_cache_.try_emplace(span_hash, static_cast<std::uint32_t>(list_cache_items_.size()));
    if (!added) {  // the same hash: the newer list replaces the older
      list_cache_items_[it->second] = CachedList{list_cache_bytes_.size(), span, list, memo_.changes()};
    } else {
      list_cache_items_.push_back(CachedList{list_cache_bytes_.size(), span, list, memo_.changes()});
    }
    list_cache_bytes_.append(reinterpret_cast<const char*>(bytes), span);
    if (span >= 16) list_prefix_[PrefixHash(bytes)] = it->second;
  }
  // A frames list's items from p (after its MARK): true, `list` and p past
  // its APPENDS, if they are the bytes of the list cached last with the same
  // first 16 bytes and an APPENDS follows. Then the scan and the lookup by
  // all their bytes (TmplValue) would find that very list: the bytes are
  // memo references (they were when cached), so the scan would end where
  // they end (the 3 bytes after them in the buffer: the scan's bound for a
  // BINGET there), and the item list_cache_ holds for their hash is the one
  // they were cached in (an item is only ever replaced through its hash).
  [[gnu::always_inline]] bool PrefixCachedList(std::size_t& p, PyRef& list) const {
    const auto* const b = reinterpret_cast<const unsigned char*>(data_);
    if (end_ - p < 16 || list_prefix_.empty()) return false;
    const auto it = list_prefix_.find(PrefixHash(b + p));
    if (it == list_prefix_.end()) return false;
    const CachedList& c = list_cache_items_[it->second];
    if (c.changes != memo_.changes() || end_ - p < c.length + 3 || b[p + c.length] != 'e' ||
        std::memcmp(list_cache_bytes_.data() + c.offset, b + p, c.length) != 0) {
      return false;
    }
    list = c.list;
    p += c.length + 1;
    return true;
  }
  std::string text_;                                              // protocol 0 text arguments
  std::vector<std::pair<std::size_t, std::uint64_t>> streaming_;  // streamed lists open: (stack position, token)
};

absl::Status Reader::AppendTo(std::size_t target, FastVec<PyRef>& items) {
  MS_RETURN_IF_ERROR(OpenTarget(target, PyKind::kList));
  if (items.empty()) return absl::OkStatus();
  Builder* B = &BuilderOf(stack_[target].ref);
  if (B->streamed < 0) {
    B->streamed = 0;
    if (options_.stream_list && (options_.stream_inside_items || !InsideStreamedList(target))) {
      PicklePath p = PathAt(target, 0);
      if (path_too_deep_) return CheckDepth(options_.max_depth + 1);
      B = &BuilderOf(stack_[target].ref);
      B->path = std::move(p);
      B->has_path = true;
      B->streamed = options_.stream_list(B->path) ? 1 : 0;
      if (B->streamed == 1 && !options_.stream_inside_items) {
        (void)InsideStreamedList(0);  // drops the lists that are gone
        streaming_.emplace_back(target, B->token);
      }
    }
  }
  const std::uint64_t max_depth = options_.max_depth;
  if (B->streamed != 1) {
    for (const PyRef& e : items) {
      const std::uint16_t h = IsContainerKind(e.kind) ? AddHeight(e.height) : 1;
      if (h > max_depth) return CheckDepth(h);
      ++B->appended;
      B->height = std::max(B->height, h);
      AddItem(*B, (e.flags & kPyRefRecord) ? BuildRecord(e) : e);
    }
    items.clear();
    return absl::OkStatus();
  }
  // Streamed: each item to on_item, or its record to on_record.
  const std::uint64_t gen = record_gen_ & 0xffffffffu;
  PickleRecord rec;
  rec.arena = arena_.get();
  for (const PyRef& e : items) {
    const std::uint16_t h = IsContainerKind(e.kind) ? AddHeight(e.height) : 1;
    if (h > max_depth) return CheckDepth(h);
    ++B->appended;
    if (e.flags & kPyRefRecord) {  // a record: to on_record, unless something built its dict
      const std::size_t i = static_cast<std::size_t>(e.v & 0xffffffffu);
      if ((e.v >> 32) != gen || i >= records_.size()) {
        record_stale_ = true;
        return Error("internal error: a record outlived its batch");
      }
      const Record& R = records_[i];
      if (R.built) {
        if (options_.on_item) MS_RETURN_IF_ERROR(options_.on_item(B->path, PyView(arena_.get(), R.dict)));
      } else {
        rec.pairs = record_pairs_.data() + 2 * std::size_t{R.first};
        rec.key_index = record_index_.data() + R.first;
        rec.n = R.n;
        MS_RETURN_IF_ERROR(options_.on_record(B->path, rec));
      }
    } else if (options_.on_item) {
      MS_RETURN_IF_ERROR(options_.on_item(B->path, PyView(arena_.get(), e)));
    }
  }
  ReleaseTree(B->tree_mark);
  ReleaseRecords();
  items.clear();
  return absl::OkStatus();
}

std::uint8_t Reader::RecordKeyIndex(const PyRef& key) const {
  const std::string_view text(arena_->chars.data() + key.v, key.n);
  for (std::size_t k = 0; k < options_.record_keys.size(); ++k) {
    if (options_.record_keys[k] == text) return static_cast<std::uint8_t>(k);
  }
  return 0xff;
}

// The dict a record's placeholder stands for (built once; the memo entries
// that pointed at the placeholder then point at the dict, as they would have
// all along without records).
PyRef Reader::BuildRecord(const PyRef& placeholder) {
  const std::size_t i = static_cast<std::size_t>(placeholder.v & 0xffffffffu);
  if ((placeholder.v >> 32) != (record_gen_ & 0xffffffffu) || i >= records_.size()) {
    record_stale_ = true;  // Run reports it
    return ScalarRef(PyKind::kNone, 0);
  }
  Record& R = records_[i];
  if (!R.built) {
    R.dict = Store(PyKind::kDict, record_pairs_.data() + 2 * std::size_t{R.first}, 2 * std::size_t{R.n}, R.height);
    R.built = true;
    for (std::size_t k = 0; k < record_memo_.size(); ++k) {  // record_memo_ grows in SetMemo: by index
      const auto [id, v] = record_memo_[k];
      if (v != placeholder.v) continue;
      const MemoEntry m = memo_.Find(id);
      if ((m.ref.flags & kPyRefRecord) && m.ref.v == v) SetMemo(id, R.dict);
    }
  }
  return R.dict;
}

// The end of a streamed list's batch, which took every placeholder: the memo
// forgets those still named (the general path's dict, in the tree, would be
// released now: ReleaseTree), and the records go.
void Reader::ReleaseRecords() {
  if (records_.empty() && record_memo_.empty()) return;
  for (const auto& [id, v] : record_memo_) memo_.EraseRecord(id, v);
  record_memo_.clear();
  records_.clear();
  record_pairs_.clear();
  record_index_.clear();
  ++record_gen_;
}

absl::Status Reader::SetItems(std::size_t target, FastVec<PyRef>& kv) {
  MS_RETURN_IF_ERROR(OpenTarget(target, PyKind::kDict));
  if (kv.size() % 2 != 0) return Error(absl::StrCat(OpName(op_), " with a key and no value"));
  Builder& B = BuilderOf(stack_[target].ref);
  std::string key_text;
  for (std::size_t k = 0; k < kv.size(); k += 2) {
    const PyRef& val = kv[k + 1];
    if (kv[k].kind == PyKind::kString && B.items.size() < 64) {
      // The common case (every key of a snapshot's dicts): a str key in a
      // small dict, the same steps as below without the general key's.
      const std::uint16_t h = IsContainerKind(val.kind) ? AddHeight(val.height) : 1;
      if (h > options_.max_depth) return CheckDepth(h);
      B.height = std::max(B.height, h);
      if (std::optional<std::size_t> existing = FindStrKey(B, kv[k])) {
        B.items[2 * *existing + 1] = val;
      } else {
        AddItem(B, kv[k]);
        AddItem(B, val);
      }
      continue;
    }
    const PyView key(arena_.get(), kv[k]);
    key_text.clear();
    // The key's text is needed to check a container key's hashability and to
    // index large dicts; small dicts with scalar keys (every dict of a
    // snapshot's trace entries) compare keys directly.
    const bool scalar_key = !IsContainerKind(key.kind());
    const std::size_t pairs = B.items.size() / 2;
    const bool need_text = !scalar_key || pairs >= 32 || !B.key_index.empty();
    if (need_text && !KeyText(key, key_text)) {
      return Error(absl::StrCat("unhashable dict key (", KindName(key.kind()), ")"));
    }
    std::uint16_t h = 1;
    if (IsContainerKind(key.kind())) h = std::max(h, AddHeight(key.ref().height));
    if (IsContainerKind(val.kind)) h = std::max(h, AddHeight(val.height));
    MS_RETURN_IF_ERROR(CheckDepth(h));
    B.height = std::max(B.height, h);
    std::optional<std::size_t> existing;
    if (pairs < 32 && key.kind() == PyKind::kString) {
      existing = FindStrKey(B, kv[k]);
    } else if (pairs < 32) {
      for (std::size_t j = 0; j < pairs; ++j) {
        if (KeysEqual(PyView(arena_.get(), B.items[2 * j]), key)) {
          existing = j;
          break;
        }
      }
    } else {
      if (B.key_index.empty()) {
        for (std::size_t j = 0; j < pairs; ++j) {
          std::string t;
          KeyText(PyView(arena_.get(), B.items[2 * j]), t);
          builder_bytes_ += t.size() + 48;
          B.key_index.emplace(std::move(t), static_cast<std::uint32_t>(j));
        }
      }
      auto it = B.key_index.find(key_text);
      if (it != B.key_index.end()) existing = it->second;
    }
    if (existing) {
      B.items[2 * *existing + 1] = val;
    } else {
      if (!B.key_index.empty()) {
        builder_bytes_ += key_text.size() + 48;
        B.key_index.emplace(key_text, static_cast<std::uint32_t>(pairs));
      }
      AddItem(B, kv[k]);
      AddItem(B, val);
    }
  }
  kv.clear();
  return absl::OkStatus();
}

absl::Status Reader::Memo(std::uint64_t id) {
  MS_RETURN_IF_ERROR(CheckTopValue());
  memo_count_ = std::max(memo_count_, id + 1);
  const Slot& top = stack_.back();
  if (top.open()) {
    Builder& B = BuilderOf(top.ref);
    if (B.memo_ids.size() >= 16) return Error("a list or dict memoized more than 16 times: not supported");
    B.memo_ids.push_back(id);
    memo_.Set(id, top.ref, B.token, base_ + pos_);
  } else {
    SetMemo(id, top.ref);
  }
  return absl::OkStatus();
}

absl::Status Reader::Get(std::uint64_t id) {
  const MemoEntry m = memo_.Find(id);
  if (m.ref.kind == PyKind::kMissing) {
    return Error(absl::StrCat("bad memo reference ", id,
                              " (no such entry, or a container inside an item of a streamed list, "
                              "which this reader releases)"));
  }
  if (m.token != 0) {
    // A list or dict still on the stack: complete and waiting in a MARK
    // batch (PyTorch's segment frames shared with its first block), or being
    // built (a recursive structure: refused when it grows again).
    if ((BuilderOf(m.ref).token & MemoTable::kTokenMask) != m.token)
      return Error(absl::StrCat("bad memo reference ", id));
    return Push(CopyOpen(m.ref));
  }
  if (m.ref.flags & kPyRefRecord) return Push(BuildRecord(m.ref));
  return Push(m.ref);
}

// ---- The dict fast path.
//
// A dict inside an item of a streamed list (a trace entry: EMPTY_DICT,
// MEMOIZE, MARK, key/value pairs, SETITEMS) is decoded here straight from
// the read buffer, on a small stack of its own: no levels, paths, builders
// or budget checks per opcode. It accepts the opcodes such dicts are made
// of (scalars, str, memo references to finished values, memo writes,
// FRAME, small lists, dicts and tuples of those) and builds what the general
// path would: the same Store calls (so the same shared nodes), the same memo
// entries (written when the dict is done, in order), the dict pushed as a
// finished value at the level the general path gives it. It ends when the
// dict is complete and the next opcode is another EMPTY_DICT or APPENDS (so
// nothing can add to the dict later: the general path would keep it open for
// a SETITEM that follows). Anything else returns false having changed
// nothing the general path can see (strings and tree nodes it added are
// dropped; distinct containers it stored in the shared pool are found again
// by the general path), and the general path reads the dict from its
// EMPTY_DICT.

// FastLookup of an id this decode wrote (or one sharing its bit).
bool Reader::FastLookupWritten(std::uint64_t id, PyRef& out) const {
  for (std::size_t k = fast_memo_.size(); k-- > 0;) {
    if (fast_memo_[k].first == id) {
      out = fast_memo_[k].second;
      return true;
    }
  }
  for (std::size_t b = 0; b < fast_nboxes_; ++b) {  // a list/dict of this decode still open
    const FastBox& B = fast_boxes_[b];
    for (std::uint8_t k = 0; k < B.memos; ++k) {
      if (B.memo[k] == id) return false;
    }
  }
  const MemoEntry m = memo_.Find(id);
  // none, open in the general path, or a record's placeholder
  if (m.ref.kind == PyKind::kMissing || m.token != 0 || (m.ref.flags & kPyRefRecord)) return false;
  out = m.ref;
  return true;
}

PyRef Reader::FastStore(std::int32_t box) {
  const FastBox& B = fast_boxes_[static_cast<std::size_t>(box)];
  const PyRef r = Store(B.kind, B.items.data(), B.items.size(), B.height);
  for (std::uint8_t k = 0; k < B.memos; ++k) fast_memo_.emplace_back(B.memo[k], r);
  return r;
}

bool Reader::FastInto(FastBox& box, FastVal* vals, std::size_t n) {
  if (box.kind == PyKind::kList) {
    if (box.items.size() + n > kFastMaxListItems) return false;
    for (std::size_t k = 0; k < n; ++k) {
      const PyRef r = FastFinish(vals[k]);
      if (IsContainerKind(r.kind)) box.height = std::max(box.height, AddHeight(r.height));
      box.items.push_back(r);
    }
    return true;
  }
  if (n % 2 != 0 || box.items.size() + n > kFastMaxDictItems) return false;
  for (std::size_t k = 0; k < n; k += 2) {
    const PyRef& key = vals[k].ref;
    if (vals[k].box >= 0 || key.kind != PyKind::kString) return false;
    const char* chars = arena_->chars.data();
    const std::uint64_t bit = StrKeyBit(chars, key);
    if (box.str_key_bits & bit) {  // maybe a duplicate key: the general path replaces in place
      for (std::size_t j = 0; j < box.items.size(); j += 2) {
        const PyRef& e = box.items[j];
        if (e.n == key.n && (e.v == key.v || std::memcmp(chars + e.v, chars + key.v, key.n) == 0)) return false;
      }
    }
    box.str_key_bits |= bit;
    const PyRef val = FastFinish(vals[k + 1]);
    if (IsContainerKind(val.kind)) box.height = std::max(box.height, AddHeight(val.height));
    box.items.push_back(key);
    box.items.push_back(val);
  }
  return true;
}

// The common shape of a trace entry, read straight into the dict (box 0,
// just opened): [memo] MARK, then key/value pairs: keys str (memo references,
// or SHORT_BINUNICODE and a memo write), values ints, floats, None, bools,
// str and memo references to finished values, or lists of memo references;
// SETITEMS, and next another EMPTY_DICT or APPENDS. Adding each pair to the
// dict as it is read is what the MARK ... SETITEMS batch does at its end.
// False at anything else (the caller starts again on its stack).
//
// kRecord (PickleReadOptions::on_record): the same, and each key's index in
// record_keys too (fast_record_index_), found by where its bytes are (the
// key at the same position of the previous record: a memo reference to the
// same stored string) or else by its text; false for a key not among them,
// one met twice, more than kMaxRecordKeys pairs, or a dict that holds no
// container (the general path would keep it in the shared pool).
template <bool kRecord>
bool Reader::FastPairs(std::size_t& pos) {
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  const std::size_t end = end_;
  std::size_t p = pos;
  PickleArena& a = *arena_;
  FastBox& D = fast_boxes_[0];
  // The next opcode, after FRAMEs; 0 at the end of the buffer (not an opcode this reads).
  const auto next = [&]() __attribute__((always_inline))->std::uint8_t {
    if (p < end && b[p] != 0x95) [[likely]]
      return b[p++];
    while (p < end && b[p] == 0x95) {
      if (end - p < 9) return 0;
      p += 9;
    }
    if (p >= end) return 0;
    return b[p++];
  };
  const auto peek = [&]() __attribute__((always_inline))->std::uint8_t {
    if (p < end && b[p] != 0x95) [[likely]]
      return b[p];
    std::size_t q = p;
    while (q < end && b[q] == 0x95) q += 9;
    return q < end ? b[q] : 0;
  };
  // Whether a frames list may come from list_cache_: not after a memo write
  // of this decode over an existing entry (not counted in memo_.changes()
  // until it is made).
  bool list_cache_ok = true;
  // A memo write (MEMOIZE, BINPUT, LONG_BINPUT) of `r`, if one comes next.
  const auto memo = [&](const PyRef& r, std::uint64_t* id_out) {
    const std::uint8_t op = peek();
    if (op != 0x94 && op != 'q' && op != 'r') return true;
    (void)next();
    std::uint64_t id;
    if (op == 0x94) {
      id = fast_memo_count_;
    } else if (op == 'q') {
      if (end - p < 1) return false;
      id = b[p++];
    } else {
      if (end - p < 4) return false;
      id = b[p] | (std::uint64_t{b[p + 1]} << 8) | (std::uint64_t{b[p + 2]} << 16) | (std::uint64_t{b[p + 3]} << 24);
      p += 4;
    }
    const std::uint64_t bit = std::uint64_t{1} << (id & 63);
    if (const PyRef* d = memo_.Dense(id); d == nullptr || d->kind != PyKind::kMissing) {
      list_cache_ok = false;  // a write over an entry (or one not known to be empty): no cached frames lists
    }
    if (fast_memo_bloom_ & bit) {
      for (const auto& [k, v] : fast_memo_) {
        if (k == id) return false;
      }
      for (std::uint8_t k = 0; k < D.memos; ++k) {
        if (D.memo[k] == id) return false;
      }
    }
    fast_memo_bloom_ |= bit;
    fast_memo_count_ = std::max(fast_memo_count_, id + 1);
    if (id_out != nullptr) {
      *id_out = id;
    } else {
      fast_memo_.emplace_back(id, r);
    }
    return true;
  };
  // The memo write of a value, if one comes next (a list's comes before its items).
  const auto memo_next = [&](const PyRef& r) __attribute__((always_inline)) {
    const std::uint8_t o = peek();
    return (o != 0x94 && o != 'q' && o != 'r') || memo(r, nullptr);
  };
  const std::uint64_t* open_ids = nullptr;  // memo ids of the list being read (not finished: not readable)
  std::uint8_t open_n = 0;
  const auto get = [&](std::uint8_t op, PyRef & r) __attribute__((always_inline)) {
    std::uint64_t id;
    if (op == 'h') {
      if (end - p < 1) return false;
      id = b[p++];
    } else {
      if (end - p < 4) return false;
      id = b[p] | (std::uint64_t{b[p + 1]} << 8) | (std::uint64_t{b[p + 2]} << 16) | (std::uint64_t{b[p + 3]} << 24);
      p += 4;
    }
    for (std::uint8_t k = 0; k < open_n; ++k) {
      if (open_ids[k] == id) return false;
    }
    return FastLookup(id, r);
  };
  // The dict's own memo write, then its MARK.
  std::uint8_t op = next();
  if (op == 0x94 || op == 'q' || op == 'r') {
    --p;
    std::uint64_t id = 0;
    if (!memo(PyRef(), &id)) return false;
    D.memo[D.memos++] = id;
    op = next();
  }
  if (op != '(') return false;
  [[maybe_unused]] std::uint32_t present = 0;  // kRecord: the key indices met
  // kRecord: its pairs go straight to record_pairs_ (room made here; its size set at the end).
  [[maybe_unused]] const std::size_t record_pairs0 = record_pairs_.size();
  [[maybe_unused]] PyRef* record_out = nullptr;
  [[maybe_unused]] std::size_t record_n = 0;
  if constexpr (kRecord) {
    record_pairs_.reserve(record_pairs0 + 2 * kMaxRecordKeys);
    record_out = record_pairs_.data() + record_pairs0;
  }
  for (;;) {
    op = next();
    if (op == 'u') break;
    PyRef key, val;
    [[maybe_unused]] const std::size_t key_pos = p - 1;  // (next() read the opcode at p - 1)
    if (op == 'h' || op == 'j') {
      if (!get(op, key)) return false;
    } else if (op == 0x8c) {
      if (DecodeFastScalar(op, b, p, end, a.chars, key) != FastScalar::kOk || !memo(key, nullptr)) return false;
    } else {
      return false;
    }
    if (key.kind != PyKind::kString) return false;
    op = next();
    switch (op) {
      case 'h':
      case 'j':
        if (!get(op, val)) return false;
        if (IsContainerKind(val.kind)) D.height = std::max(D.height, AddHeight(val.height));
        // A str read by reference and memoized again is left to the general path.
        if (val.kind != PyKind::kString && !memo_next(val)) return false;
        break;
      case ']': {  // a list of memo references (a traceback's frames)
        std::uint64_t ids[4];
        std::uint8_t nids = 0;
        for (std::uint8_t o = peek(); o == 0x94 || o == 'q' || o == 'r'; o = peek()) {
          if (nids == 4 || !memo(PyRef(), &ids[nids])) return false;
          ++nids;
        }
        open_ids = ids;
        open_n = nids;
        scratch_.clear();
        std::uint16_t h = 1;
        const auto item = [&](std::uint8_t o) {
          PyRef r;
          if ((o != 'h' && o != 'j') || !get(o, r)) return false;
          if (IsContainerKind(r.kind)) h = std::max(h, AddHeight(r.height));
          scratch_.push_back(r);
          return true;
        };
        std::uint8_t o = peek();
        bool cached = false, stored = false;
        if (o == '(') {
          (void)next();
          // The items' bytes (BINGET / LONG_BINGET up to APPENDS): a list of
          // the same bytes read before, while no memo entry has changed
          // since, is the same list (list_cache_).
          std::size_t q = p;
          while (end - q >= 5 && (b[q] == 'h' || b[q] == 'j')) q += b[q] == 'h' ? 2 : 5;
          const std::size_t span = q - p;
          const bool cacheable = list_cache_ok && q < end && b[q] == 'e' && span > 0 && span <= kListCacheMaxBytes;
          std::uint64_t span_hash = 0;
          if (cacheable) {
            span_hash = BytesHash(b + p, span);
            if (CachedListOf(b + p, span, span_hash, val)) {
              p = q + 1;
              cached = true;
            }
          }
          // The items: read in a tight loop (a traceback's 10 to 30 frames
          // per entry); anything else (FRAME, the buffer's end) by the steps above.
          scratch_.reserve(kFastMaxListItems);
          PyRef* const out = scratch_.data();
          std::size_t count = 0;
          bool clean = cacheable;  // every item a finished value of the memo as it stands
          for (; !cached;) {
            std::uint64_t id;
            if (end - p >= 5 && b[p] == 'h') [[likely]] {
              id = b[p + 1];
              p += 2;
            } else if (end - p >= 5 && b[p] == 'j') {
              id = b[p + 1] | (std::uint64_t{b[p + 2]} << 8) | (std::uint64_t{b[p + 3]} << 16) |
                   (std::uint64_t{b[p + 4]} << 24);
              p += 5;
            } else {
              o = next();
              if (o == 'e') break;
              clean = false;
              scratch_.set_size(count);
              if (count == kFastMaxListItems || !item(o)) return false;
              ++count;
              continue;
            }
            if (fast_memo_bloom_ & (std::uint64_t{1} << (id & 63))) clean = false;  // maybe this decode's
            if (count == kFastMaxListItems) return false;
            for (std::uint8_t k = 0; k < nids; ++k) {
              if (ids[k] == id) return false;  // the list itself, not finished
            }
            PyRef& r = out[count];
            if (!FastLookup(id, r)) return false;
            if (IsContainerKind(r.kind)) h = std::max(h, AddHeight(r.height));
            ++count;
          }
          stored = true;
          if (!cached) {
            scratch_.set_size(count);
            val = Store(PyKind::kList, scratch_.data(), scratch_.size(), h);
            if (clean && (val.flags & kPyRefShared) && list_cache_items_.size() < kListCacheMaxLists) {
              CacheList(span_hash, b + (q - span), span, val);
            }
          }
        } else if (o == 'h' || o == 'j') {  // one item and APPEND, or empty and the next key
          const std::size_t save = p;
          PyRef r;
          (void)next();
          if (get(o, r) && peek() == 'a') {
            (void)next();
            if (IsContainerKind(r.kind)) h = std::max(h, AddHeight(r.height));
            scratch_.push_back(r);
          } else {
            p = save;
          }
        }
        open_n = 0;
        if (!stored) val = Store(PyKind::kList, scratch_.data(), scratch_.size(), h);
        for (std::uint8_t k = 0; k < nids; ++k) fast_memo_.emplace_back(ids[k], val);
        D.height = std::max(D.height, AddHeight(val.height));
        break;
      }
      default: {  // the scalars and strings FastDict's stack machine reads too
        if (DecodeFastScalar(op, b, p, end, a.chars, val) != FastScalar::kOk) return false;
        // A tuple of up to three numbers (a pool_id: (0, 0), written anew
        // for each entry): more numbers (no key can be one), then TUPLE1/2/3.
        const auto number = [](std::uint8_t o) { return o == 'K' || o == 'M' || o == 'J' || o == 0x8a || o == 'N'; };
        std::uint8_t o = peek();
        if (number(op) && (number(o) || o == 0x85)) {
          PyRef t[3];
          t[0] = val;
          std::size_t n = 1;
          for (; n < 3 && number(o); o = peek()) {
            (void)next();
            if (DecodeFastScalar(o, b, p, end, a.chars, t[n++]) != FastScalar::kOk) return false;
          }
          if (o != 0x84 + n) return false;
          (void)next();
          val = Store(PyKind::kTuple, t, n, 1);
          D.height = std::max(D.height, AddHeight(val.height));
        }
        if (!memo_next(val)) return false;
        break;
      }
    }
    if constexpr (kRecord) {
      // Its key's index (a key met twice, or not a record key: left to the dict paths).
      const std::size_t k = record_n;
      if (k >= kMaxRecordKeys) return false;
      KeyAt& at = record_key_at_[k];
      std::uint8_t index = at.index;
      if (at.v != key.v || at.n != key.n) [[unlikely]] {
        index = RecordKeyIndex(key);
        if (index == 0xff) return false;
        at = KeyAt{key.v, key.n, index};
      }
      const std::uint32_t bit = std::uint32_t{1} << index;
      if (present & bit) return false;
      present |= bit;
      fast_record_index_[k] = index;
      fast_key_pos_[k] = static_cast<std::uint32_t>(key_pos);
      record_out[2 * k] = key;  // straight where the record keeps them
      record_out[2 * k + 1] = val;
      record_n = k + 1;
      continue;
    }
    // Into the dict, as SETITEMS would (a duplicate key: left to the general path).
    if (D.items.size() + 2 > kFastMaxDictItems) return false;
    const char* chars = a.chars.data();
    const std::uint64_t bit = StrKeyBit(chars, key);
    if (D.str_key_bits & bit) {
      for (std::size_t j = 0; j < D.items.size(); j += 2) {
        const PyRef& e = D.items[j];
        if (e.n == key.n && (e.v == key.v || std::memcmp(chars + e.v, chars + key.v, key.n) == 0)) return false;
      }
    }
    D.str_key_bits |= bit;
    D.items.push_back(key);
    D.items.push_back(val);
  }
  if constexpr (kRecord) {
    if (D.height < 2) return false;
    fast_record_pairs_ = static_cast<std::uint32_t>(record_n);
  }
  const std::uint8_t after = peek();
  if (after != '}' && after != 'e') return false;
  if constexpr (kRecord) record_pairs_.set_size(record_pairs0 + 2 * record_n);
  fast_pair_ops_ = (p - pos) / 2;  // about: every opcode here takes 2 bytes or more
  pos = p;
  return true;
}

// ---- The template (records).
//
// Trace entries repeat one shape: the same keys, each the same memo
// reference to the same stored string, in the same order, each with a value
// of the same few opcodes. BuildTemplate keeps, from the last record
// FastPairs<true> read, each key's bytes ('h' and its id, or 'j' and its
// four) and what they gave; TemplatePairs then reads an entry by comparing
// its key bytes with those (one load and a compare each) and decoding each
// value straight from its opcode: no FRAME scan per opcode, no key index
// lookup, no duplicate check (the keys are the template's, distinct). It
// takes a subset of what FastPairs<true> takes, and reads it the same way,
// into the same places: the record's pairs and key indices, the same Store
// calls in the same order, the same memo writes (fast_memo_, D.memo) and
// frames lists cache decisions, the same opcode count. Anything else
// returns false (the caller drops what it read and runs FastPairs<true> from
// the EMPTY_DICT), notably: another key or order, a FRAME anywhere in the
// entry (FastPairs reads through it), a memo write other than MEMOIZE (a
// MEMOIZE writes a new id, never over an entry), a memo reference to
// anything not a finished value of the memo as it stands (this decode's own
// writes included), an opcode it does not decode, the end of the buffer.
//
// The keys' strings are what the memo held when the template was made:
// valid while no entry a finished value could have read has changed
// (memo_.changes()).
//
// Two templates: BuildTemplate makes one of the record's keys (the same keys
// as a template's: that one again, its memo changes count renewed; else in
// place of the one used longer ago), and TemplateRun tries the one used
// last first.
// The masks of the low k bytes of a word (k = 0 to 8).
constexpr std::array<std::uint64_t, 9> kLowBytes = [] {
  std::array<std::uint64_t, 9> m{};
  for (std::size_t k = 0; k < 8; ++k) m[k] = (std::uint64_t{1} << (8 * k)) - 1;
  m[8] = ~std::uint64_t{0};
  return m;
}();

void Reader::BuildTemplate(const PyRef* pairs, std::uint32_t n) {
  Template& T = tmpl_build_;
  T.n = 0;
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  for (std::uint32_t k = 0; k < n; ++k) {
    const std::size_t at = fast_key_pos_[k];
    TmplKey& t = T.keys[k];
    std::uint64_t id;
    if (at + 5 > end_) return;
    if (b[at] == 'h') {
      t.len = 2;
      id = b[at + 1];
    } else if (b[at] == 'j') {
      t.len = 5;
      id = b[at + 1] | (std::uint64_t{b[at + 2]} << 8) | (std::uint64_t{b[at + 3]} << 16) |
           (std::uint64_t{b[at + 4]} << 24);
    } else {
      return;  // a key written out (its first use): no template yet
    }
    t.bytes = 0;
    for (std::size_t j = 0; j < t.len; ++j) t.bytes |= std::uint64_t{b[at + j]} << (8 * j);
    t.mask = t.len == 2 ? 0xffffu : 0xffffffffffu;
    // What the reference reads now (the memo writes of the entry made) is
    // the key the record holds.
    if (!MemoValue(id, t.key) || t.key.kind != PyKind::kString ||
        std::memcmp(&t.key, &pairs[2 * k], sizeof(PyRef)) != 0) {
      return;
    }
    T.index[k] = fast_record_index_[k];
    // The value's shape.
    t.vkind = kVNone;
    t.vbytes = ~std::uint64_t{0};
    t.vmask = 0;
    if (const std::size_t v = at + t.len; v + 2 <= end_) {
      std::uint8_t kind = kVNone, vlen = static_cast<std::uint8_t>(t.len + 1), arg = 0;
      switch (b[v]) {
        case 'h': kind = kVMemo1, arg = 1; break;
        case 'j': kind = kVMemo4, arg = 4; break;
        case 'K': kind = kVInt1, arg = 1; break;
        case 'M': kind = kVInt2, arg = 2; break;
        case 'J': kind = kVInt4, arg = 4; break;
        case 0x8a:
          if (b[v + 1] <= 8) kind = kVLong1, arg = b[v + 1], ++vlen;
          break;
        default: break;
      }
      if (kind != kVNone) {
        t.vkind = kind;
        t.vlen = vlen;
        t.varg = arg;
        t.vmask = kLowBytes[vlen];
        t.vbytes = 0;
        for (std::size_t j = 0; j < vlen; ++j) t.vbytes |= std::uint64_t{b[at + j]} << (8 * j);
        t.varg_mask = kLowBytes[arg];
        t.vsign = arg == 0 ? 0 : std::uint64_t{0x80} << (8 * (arg - 1));
      }
    }
    // The value's bytes, when they alone say what it is.
    t.pair_bytes = ~std::uint64_t{0};
    t.pair_mask = 0;
    const std::size_t v = at + t.len;
    std::size_t vlen = 0;
    if (v < end_) {
      switch (b[v]) {
        case 'h':
        case 'K': vlen = 2; break;
        case 'M': vlen = 3; break;
        case 'j':
        case 'J': vlen = 5; break;
        default: break;
      }
    }
    const PyRef& value = pairs[2 * k + 1];
    if (vlen != 0 && t.len + vlen <= 8 && v + vlen <= end_) {
      // What the bytes read now is the value the record holds (a memo
      // reference's entry; an int, not the first number of a tuple).
      const std::uint32_t u32 = v + 5 > end_ ? 0
                                             : b[v + 1] | (std::uint32_t{b[v + 2]} << 8) |
                                                   (std::uint32_t{b[v + 3]} << 16) | (std::uint32_t{b[v + 4]} << 24);
      PyRef now;
      bool same;
      switch (b[v]) {
        case 'h': same = MemoValue(b[v + 1], now); break;
        case 'j': same = MemoValue(u32, now); break;
        case 'K': now = IntRef(b[v + 1]), same = true; break;
        case 'M': now = IntRef(b[v + 1] | (std::int64_t{b[v + 2]} << 8)), same = true; break;
        default: now = IntRef(static_cast<std::int32_t>(u32)), same = true; break;
      }
      same = same && std::memcmp(&now, &value, sizeof(PyRef)) == 0;
      if (same) {
        t.pair_len = static_cast<std::uint8_t>(t.len + vlen);
        t.pair_bytes = 0;
        for (std::size_t j = 0; j < t.pair_len; ++j) t.pair_bytes |= std::uint64_t{b[at + j]} << (8 * j);
        t.pair_mask = t.pair_len == 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * t.pair_len)) - 1;
        t.value = value;
        t.value_height = IsContainerKind(value.kind) ? AddHeight(value.height) : 1;
      }
    }
  }
  T.n = n;
  T.changes = memo_.changes();
  const auto same_keys = [&](const Template& o) {
    if (o.n != n) return false;
    for (std::uint32_t k = 0; k < n; ++k) {
      if (o.keys[k].bytes != T.keys[k].bytes || o.keys[k].mask != T.keys[k].mask) return false;
    }
    return true;
  };
  std::uint32_t slot = same_keys(tmpl_[tmpl_first_]) ? tmpl_first_ : 1 - tmpl_first_;
  tmpl_[slot] = T;
  tmpl_first_ = slot;
}

// A MEMOIZE of TemplatePairs: the id, as FastPairs' memo() takes it.
[[gnu::always_inline]] inline std::uint64_t Reader::TmplMemoize(TmplState& s) const {
  const std::uint64_t id = s.next_id++;
  if (const PyRef* d = memo_.Dense(id); d == nullptr || d->kind != PyKind::kMissing) s.list_cache_ok = false;
  s.bloom |= std::uint64_t{1} << (id & 63);
  return id;
}

// The opcodes after a number that TmplScalarTail reads (a number, TUPLE1,
// MEMOIZE): one load of this table instead of seven compares.
constexpr std::array<bool, 256> kAfterNumber = [] {
  std::array<bool, 256> t{};
  for (const std::uint8_t o : {std::uint8_t{'K'}, std::uint8_t{'M'}, std::uint8_t{'J'}, std::uint8_t{0x8a},
                               std::uint8_t{'N'}, std::uint8_t{0x85}, std::uint8_t{0x94}}) {
    t[o] = true;
  }
  return t;
}();

// What may follow a number of TemplatePairs (`op`, its value `val`, read up
// to p): more numbers and TUPLE1/2/3 (a tuple), then a MEMOIZE; as FastPairs
// reads them.
bool Reader::TmplScalarTail(std::uint8_t op, std::size_t& p, PyRef& val, TmplState& s) {
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  const std::size_t end = end_;
  const auto number = [](std::uint8_t o) { return o == 'K' || o == 'M' || o == 'J' || o == 0x8a || o == 'N'; };
  if (p >= end) return false;
  std::uint8_t o = b[p];
  if (number(op) && (number(o) || o == 0x85)) {
    PyRef tv[3];
    tv[0] = val;
    std::size_t nt = 1;
    while (nt < 3 && number(o)) {
      ++p;
      if (DecodeFastScalar(o, b, p, end, arena_->chars, tv[nt++]) != FastScalar::kOk || p >= end) return false;
      o = b[p];
    }
    if (o != 0x84 + nt) return false;
    ++p;
    val = Store(PyKind::kTuple, tv, nt, 1);
    FastBox& D = fast_boxes_[0];
    D.height = std::max(D.height, AddHeight(val.height));
    if (p >= end) return false;
  }
  if (b[p] == 0x94) {
    ++p;
    fast_memo_.emplace_back(TmplMemoize(s), val);
  }
  return true;
}

// The values TemplatePairs' loop leaves (`op` read, its argument from p): a
// new list, the other scalars and strings.
bool Reader::TmplValue(std::uint8_t op, std::size_t& p, PyRef& val, TmplState& s) {
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  const std::size_t end = end_;
  const auto u32 = [&](std::size_t q) {
    return b[q] | (std::uint64_t{b[q + 1]} << 8) | (std::uint64_t{b[q + 2]} << 16) | (std::uint64_t{b[q + 3]} << 24);
  };
  if (op != ']') {  // a scalar or string, a tuple of up to three numbers; then maybe its MEMOIZE
    if (DecodeFastScalar(op, b, p, end, arena_->chars, val) != FastScalar::kOk) return false;
    return TmplScalarTail(op, p, val, s);
  }
  // A new list: MEMOIZE, then MARK, memo references, APPENDS; or one and APPEND; or none.
  if (end - p < 2 || b[p] != 0x94) return false;
  ++p;
  const std::uint64_t list_id = TmplMemoize(s);
  scratch_.clear();
  std::uint16_t h = 1;
  const std::uint8_t o = b[p];
  if (o == '(') {
    ++p;
    if (s.list_cache_ok && PrefixCachedList(p, val)) {
      scratch_.reserve(kFastMaxListItems);  // (as below: the same capacities)
      fast_memo_.emplace_back(list_id, val);
      FastBox& D = fast_boxes_[0];
      D.height = std::max(D.height, AddHeight(val.height));
      return true;
    }
    std::size_t q = p;
    while (end - q >= 5 && (b[q] == 'h' || b[q] == 'j')) q += b[q] == 'h' ? 2 : 5;
    if (q >= end || b[q] != 'e') return false;
    const std::size_t span = q - p;
    const bool cacheable = s.list_cache_ok && span > 0 && span <= kListCacheMaxBytes;
    std::uint64_t span_hash = 0;
    bool cached = false;
    if (cacheable) {
      span_hash = BytesHash(b + p, span);
      cached = CachedListOf(b + p, span, span_hash, val);
    }
    scratch_.reserve(kFastMaxListItems);
    if (!cached) {
      PyRef* const items = scratch_.data();
      std::size_t count = 0;
      bool clean = cacheable;
      for (std::size_t r = p; r < q;) {  // the scan above read their opcodes: in the buffer
        std::uint64_t id;
        if (b[r] == 'h') {
          id = b[r + 1];
          r += 2;
        } else {
          id = u32(r + 1);
          r += 5;
        }
        if (s.bloom & (std::uint64_t{1} << (id & 63))) clean = false;
        if (count == kFastMaxListItems || !MemoValue(id, items[count])) return false;
        if (IsContainerKind(items[count].kind)) h = std::max(h, AddHeight(items[count].height));
        ++count;
      }
      scratch_.set_size(count);
      val = Store(PyKind::kList, scratch_.data(), scratch_.size(), h);
      if (clean && (val.flags & kPyRefShared) && list_cache_items_.size() < kListCacheMaxLists) {
        CacheList(span_hash, b + p, span, val);
      }
    }
    p = q + 1;
  } else if ((o == 'h' && end - p >= 3 && b[p + 2] == 'a') || (o == 'j' && end - p >= 6 && b[p + 5] == 'a')) {
    PyRef r;
    if (!MemoValue(o == 'h' ? b[p + 1] : u32(p + 1), r)) return false;
    p += o == 'h' ? 3 : 6;
    if (IsContainerKind(r.kind)) h = std::max(h, AddHeight(r.height));
    scratch_.push_back(r);
    val = Store(PyKind::kList, scratch_.data(), scratch_.size(), h);
  } else {  // empty: the next key follows (anything else fails there)
    val = Store(PyKind::kList, scratch_.data(), 0, h);
  }
  fast_memo_.emplace_back(list_id, val);
  FastBox& D = fast_boxes_[0];
  D.height = std::max(D.height, AddHeight(val.height));
  return true;
}

// The longest a pair TemplatePairs reads inline takes, and the one byte it
// looks at after it: a key (5 bytes at most) and a value of 10 at most
// (LONG1 of 8 bytes). One bound check for the whole entry (MEMOIZE, MARK,
// n such pairs, SETITEMS) lets the pairs read without one each; a value of
// another length (TmplValue, TmplScalarTail) checks again for the pairs left.
constexpr std::size_t kTmplPairBytes = 16;

template <bool kChecked>
bool Reader::TemplatePairs(const Template& T, std::size_t& pos) {
  if (T.changes != memo_.changes()) return false;
  const std::uint32_t n = T.n;
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  const std::size_t end = end_;
  std::size_t p = pos;
  // The dict's MEMOIZE, its MARK; room for every pair and the SETITEMS (kChecked: the
  // end of the buffer is nearer: a check per pair instead, as many bytes wanted).
  if ((kChecked ? end - p < 2 : end - p < 3 + kTmplPairBytes * std::size_t{n}) || b[p] != 0x94 || b[p + 1] != '(') {
    return false;
  }
  p += 2;
  FastBox& D = fast_boxes_[0];
  // (no memo entry changes during the read: its writes are made at its end)
  const PyRef* const dense = memo_.DenseData();
  const std::size_t dense_n = memo_.DenseSize();
  TmplState s;
  s.next_id = fast_memo_count_;
  D.memo[0] = TmplMemoize(s);
  D.memos = 1;
  const std::size_t record_pairs0 = record_pairs_.size();
  record_pairs_.reserve(record_pairs0 + 2 * kMaxRecordKeys);
  PyRef* o = record_pairs_.data() + record_pairs0;
  std::uint16_t height = 1;  // of the values read here (the others raise D.height)
  constexpr PyRef kInt = [] {
    PyRef r;
    r.kind = PyKind::kInt;
    return r;
  }();
  const TmplKey* const t_end = T.keys + n;
  for (const TmplKey* t = T.keys; t != t_end; ++t, o += 2) {
    if constexpr (kChecked) {
      if (end - p < kTmplPairBytes) return false;
    }
    std::uint64_t w;
    std::memcpy(&w, b + p, 8);
    if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
    if ((w & t->pair_mask) == t->pair_bytes) {  // the very bytes of the template's pair: its value
      p += t->pair_len;
      o[0] = t->key;
      o[1] = t->value;
      height = std::max(height, t->value_height);
      continue;
    }
    std::uint64_t id;
    PyRef val = kInt;
    std::uint8_t op;
    if ((w & t->vmask) == t->vbytes) {  // the key and the value's opcode of the template's shape
      o[0] = t->key;
      const unsigned char* const arg = b + p + t->vlen;
      op = b[p + t->len];
      switch (t->vkind) {
        case kVMemo1:
          id = arg[0];
          p += t->vlen + 1;
          goto memo;
        case kVMemo4:
          id = arg[0] | (std::uint64_t{arg[1]} << 8) | (std::uint64_t{arg[2]} << 16) | (std::uint64_t{arg[3]} << 24);
          p += t->vlen + 4;
          goto memo;
        case kVInt1:
          val.v = arg[0];
          p += t->vlen + 1;
          goto number;
        case kVInt2:
          val.v = arg[0] | (std::uint64_t{arg[1]} << 8);
          p += t->vlen + 2;
          goto number;
        case kVInt4:
          val.v = static_cast<std::uint64_t>(std::int64_t{static_cast<std::int32_t>(
              arg[0] | (std::uint32_t{arg[1]} << 8) | (std::uint32_t{arg[2]} << 16) | (std::uint32_t{arg[3]} << 24))});
          p += t->vlen + 4;
          goto number;
        default: {  // kVLong1
          std::uint64_t v;
          std::memcpy(&v, arg, 8);  // (within the pair's 16 bytes)
          if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
          v &= t->varg_mask;
          if (v & t->vsign) {  // negative: by TmplValue
            p += t->len;
            goto other;
          }
          val.v = v;
          p += t->vlen + t->varg;
          goto number;
        }
      }
    }
    if ((w & t->mask) != t->bytes) return false;
    p += t->len;
    o[0] = t->key;
    op = b[p];
    // An int as DecodeFastScalar reads it (BININT1, BININT2, BININT, a
    // non-negative LONG1 of 8 bytes at most), a memo reference; anything
    // else by TmplValue.
    switch (op) {
      case 'h':  // a memo reference (no memo write may follow: the next key or SETITEMS must)
        id = b[p + 1];
        p += 2;
        break;
      case 'j':
        id = b[p + 1] | (std::uint64_t{b[p + 2]} << 8) | (std::uint64_t{b[p + 3]} << 16) |
             (std::uint64_t{b[p + 4]} << 24);
        p += 5;
        break;
      case 'K':
        val.v = b[p + 1];
        p += 2;
        goto number;
      case 'M':
        val.v = b[p + 1] | (std::uint64_t{b[p + 2]} << 8);
        p += 3;
        goto number;
      case 'J':
        val.v = static_cast<std::uint64_t>(std::int64_t{static_cast<std::int32_t>(
            b[p + 1] | (std::uint32_t{b[p + 2]} << 8) | (std::uint32_t{b[p + 3]} << 16) |
            (std::uint32_t{b[p + 4]} << 24))});
        p += 5;
        goto number;
      case 0x8a: {
        const std::size_t nb = b[p + 1];
        if (nb > 8 || (nb != 0 && (b[p + 1 + nb] & 0x80) != 0)) goto other;
        std::uint64_t v;
        if constexpr (std::endian::native == std::endian::little) {
          std::memcpy(&v, b + p + 2, 8);  // (within the pair's 16 bytes)
          v &= kLowBytes[nb];
        } else {
          v = 0;
          for (std::size_t j = nb; j > 0; --j) v = (v << 8) | b[p + 1 + j];
        }
        val.v = v;  // (below 2^63: a plain int)
        p += 2 + nb;
        goto number;
      }
      default:
        goto other;
    }
  memo:  // The memo reference's value: MemoValue, its first case here.
    if (id < dense_n) [[likely]] {
      const PyRef& d = dense[id];
      if (d.kind == PyKind::kMissing || (d.flags & (kPyRefOpen | kPyRefRecord))) return false;
      o[1] = d;
      if (IsContainerKind(d.kind)) height = std::max(height, AddHeight(d.height));
    } else {
      if (!MemoValue(id, o[1])) return false;
      if (IsContainerKind(o[1].kind)) height = std::max(height, AddHeight(o[1].height));
    }
    continue;
  number:
    o[1] = val;
    // A tuple or a MEMOIZE may follow a number.
    if (kAfterNumber[b[p]]) [[unlikely]] {
      std::size_t q = p;
      if (!TmplScalarTail(op, q, o[1], s)) return false;
      p = q;
      if (!kChecked && end - p < 1 + kTmplPairBytes * static_cast<std::size_t>(t_end - t - 1)) return false;
    }
    continue;
  other : {
    std::size_t q = p + 1;
    if (!TmplValue(op, q, o[1], s)) return false;
    p = q;
    if (!kChecked && end - p < 1 + kTmplPairBytes * static_cast<std::size_t>(t_end - t - 1)) return false;
  }
  }
  // SETITEMS, and next (after FRAMEs, as FastPairs peeks) another entry or the APPENDS of the batch.
  D.height = std::max(D.height, height);
  if ((kChecked && p >= end) || b[p] != 'u' || D.height < 2) return false;
  ++p;
  std::size_t q = p;
  while (q < end && b[q] == 0x95) q += 9;
  if (q >= end || (b[q] != '}' && b[q] != 'e')) return false;
  std::memcpy(fast_record_index_, T.index, kMaxRecordKeys);
  fast_record_pairs_ = n;
  record_pairs_.set_size(record_pairs0 + 2 * std::size_t{n});
  fast_memo_count_ = s.next_id;
  fast_memo_bloom_ |= s.bloom;
  fast_pair_ops_ = (p - pos) / 2;
  pos = p;
  return true;
}

// A record of what box 0 read (its pairs in record_pairs_ beyond its size):
// its memo writes made (the decode's, then the dict's own MEMOIZEs, with the
// placeholder), its key indices kept; the placeholder (generation bits
// `gen`), pushed nowhere yet. kOneMemo: the dict has exactly one MEMOIZE
// (a template's), written without the loop.
template <bool kOneMemo>
[[gnu::always_inline]] inline PyRef Reader::CommitRecord(std::uint64_t gen) {
  const FastBox& D = fast_boxes_[0];
  for (const auto& [id, ref] : fast_memo_) SetMemo(id, ref);
  memo_count_ = fast_memo_count_;
  Record R;
  R.first = static_cast<std::uint32_t>(record_index_.size());
  R.n = fast_record_pairs_;
  R.height = D.height;
  record_index_.reserve(R.first + R.n);
  if (record_index_.capacity() >= R.first + kMaxRecordKeys) [[likely]] {  // one fixed-size copy
    std::memcpy(record_index_.data() + R.first, fast_record_index_, kMaxRecordKeys);
  } else {
    std::memcpy(record_index_.data() + R.first, fast_record_index_, R.n);
  }
  record_index_.set_size(R.first + R.n);
  PyRef r;
  r.kind = PyKind::kDict;
  r.flags = kPyRefRecord;
  r.height = D.height;
  r.n = R.n;
  r.v = records_.size() | gen;
  records_.push_back(R);
  if constexpr (kOneMemo) {
    SetMemo(D.memo[0], r);
  } else {
    for (std::uint8_t k = 0; k < D.memos; ++k) SetMemo(D.memo[k], r);
  }
  ++record_count_;
  return r;
}

// FastDict's run of entries read by the templates: a record by a template
// (TemplatePairs from the EMPTY_DICT with the one used last, then the
// other; then PushRecord's work), and while the next opcode is another
// entry's EMPTY_DICT (NextTemplateEntry), on. What stays the same for the
// whole run is found once: the records' level (after the first record, the
// stack's top is the record pushed before, at that level) and their
// generation. True when it ends after a record pushed (Run reads on);
// false having changed nothing the dict paths can see (what it added to
// the arena dropped) when the entry at pos_ is one no template reads, or
// would be too deep: FastDict reads it as without templates.
bool Reader::TemplateRun() {
  PickleArena& a = *arena_;
  if (fast_boxes_.empty()) fast_boxes_.emplace_back();
  FastBox& D = fast_boxes_[0];
  const std::uint32_t level = NextLevel(false);
  const std::uint64_t gen = (record_gen_ & 0xffffffffu) << 32;
  for (;;) {
    // A record by a template: the one used last, then the other.
    const std::size_t chars0 = a.chars.size(), tree0 = a.tree.size();
    std::uint32_t slot = tmpl_first_;
    std::size_t p = 0;
    bool read = false;
    for (std::uint32_t k = 0; k < 2; ++k, slot = 1 - slot) {
      const Template& T = tmpl_[slot];
      if (T.n == 0) break;
      D.height = 1;
      D.memos = 0;
      fast_nboxes_ = 1;
      fast_nmarks_ = 0;
      fast_memo_.clear();
      fast_memo_bloom_ = 0;
      fast_memo_count_ = memo_count_;
      p = pos_;
      read = end_ - p >= 3 + kTmplPairBytes * std::size_t{T.n} ? TemplatePairs<false>(T, p)
                                                                : TemplatePairs<true>(T, p);
      if (read) break;
      a.chars.resize(chars0);
      a.tree.resize(tree0);
    }
    if (!read) return false;
    // PushRecord, from a template.
    if (std::uint64_t{level} + D.height > options_.max_depth || records_.size() >= 0xffffffffu) {
      for (KeyAt& at : record_key_at_) {
        if (at.v != ~std::uint64_t{0} && at.v + at.n > chars0) at = KeyAt{};
      }
      record_pairs_.resize(2 * record_index_.size());
      a.chars.resize(chars0);
      a.tree.resize(tree0);
      return false;  // too deep: so it is without templates
    }
    tmpl_first_ = slot;
    pos_ = p;
    const PyRef r = CommitRecord<true>(gen);  // (TemplatePairs: the dict's one MEMOIZE)
    ++tmpl_count_;
    FastPush(r, level, fast_pair_ops_);
    if (!NextTemplateEntry()) return true;
  }
}

// The end of a record FastPairs<true> or TemplatePairs read (up to p, the
// dict in box 0, its pairs in record_pairs_ beyond its size): its memo
// writes made, its pairs and key indices kept for on_record, a placeholder
// pushed. False, having made none of that, when it would be too deep (the
// caller drops what was read; the general path gives the error).
bool Reader::PushRecord(std::size_t p, std::size_t chars0, bool from_template) {
  const FastBox& D = fast_boxes_[0];
  const std::uint32_t level = NextLevel(false);
  if (std::uint64_t{level} + D.height > options_.max_depth || records_.size() >= 0xffffffffu) {
    for (KeyAt& at : record_key_at_) {
      if (at.v != ~std::uint64_t{0} && at.v + at.n > chars0) at = KeyAt{};
    }
    record_pairs_.resize(2 * record_index_.size());
    return false;
  }
  pos_ = p;
  const PyRef r = CommitRecord<false>((record_gen_ & 0xffffffffu) << 32);
  if (from_template) {
    ++tmpl_count_;
  } else if (options_.fast_template) {
    BuildTemplate(record_pairs_.data() + 2 * std::size_t{records_.back().first}, r.n);
  }
  return FastPush(r, level, fast_pair_ops_);
}

bool Reader::FastDict() {
  // Only inside an item of a streamed list: no path is asked for there.
  if (!InsideStreamedList(stack_.size()) || stack_.size() + kFastMaxStack >= kMaxPickleStack) return false;
  Window(kFastWindow);
  if (tmpl_[tmpl_first_].n != 0) {
    // A run of entries: while the next opcode is another entry's
    // EMPTY_DICT, it is read here, as Run and Step would read it (the same
    // opcode counts and working-memory checks: see NextTemplateEntry),
    // without going back to the opcode loop (TemplateRun). An entry no
    // template reads is read on below, as without the run.
    if (TemplateRun()) return true;  // records pushed; Run reads on
  }
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  const std::size_t end = end_;
  std::size_t p = pos_;
  PickleArena& a = *arena_;
  const std::size_t chars0 = a.chars.size(), tree0 = a.tree.size();
  if (!fast_vals_) fast_vals_ = std::make_unique<FastVal[]>(kFastMaxStack);
  FastVal* const st = fast_vals_.get();
  std::size_t sp = 0;             // values on st
  const auto clear_state = [&] {  // the decoder's marks, boxes and memo writes: none yet
    fast_nmarks_ = 0;
    fast_nboxes_ = 0;
    fast_memo_.clear();
    fast_memo_bloom_ = 0;
    fast_memo_count_ = memo_count_;
  };
  clear_state();
  fast_pair_ops_ = 0;
  std::uint64_t ops = 0;
  const auto fail = [&] {
    a.chars.resize(chars0);
    a.tree.resize(tree0);
    return false;
  };
#define MS_FAST_PUSH(r)                     \
  do {                                      \
    if (sp >= kFastMaxStack) return fail(); \
    st[sp].ref = (r);                       \
    st[sp].box = -1;                        \
    st[sp].mark = false;                    \
    ++sp;                                   \
  } while (0)
  const auto open_box = [&](PyKind kind) {
    if (fast_nboxes_ == kFastMaxBoxes || sp >= kFastMaxStack) return false;
    if (fast_nboxes_ == fast_boxes_.size()) fast_boxes_.emplace_back();
    FastBox& B = fast_boxes_[fast_nboxes_];
    B.items.clear();
    B.str_key_bits = 0;
    B.kind = kind;
    B.height = 1;
    B.memos = 0;
    st[sp].ref = PyRef();
    st[sp].ref.kind = kind;
    st[sp].box = static_cast<std::int32_t>(fast_nboxes_++);
    st[sp].mark = false;
    ++sp;
    return true;
  };
  const auto put = [&](std::uint64_t id) {
    if (sp == 0 || st[sp - 1].mark) return false;
    const std::uint64_t bit = std::uint64_t{1} << (id & 63);
    if (fast_memo_bloom_ & bit) {  // written twice by one dict: left to the general path
      for (const auto& [k, r] : fast_memo_) {
        if (k == id) return false;
      }
      for (std::size_t j = 0; j < fast_nboxes_; ++j) {
        for (std::uint8_t k = 0; k < fast_boxes_[j].memos; ++k) {
          if (fast_boxes_[j].memo[k] == id) return false;
        }
      }
    }
    fast_memo_bloom_ |= bit;
    fast_memo_count_ = std::max(fast_memo_count_, id + 1);
    const FastVal& top = st[sp - 1];
    if (top.box >= 0) {
      FastBox& B = fast_boxes_[static_cast<std::size_t>(top.box)];
      if (B.memos == 4) return false;
      B.memo[B.memos++] = id;
    } else {
      fast_memo_.emplace_back(id, top.ref);
    }
    return true;
  };
  // The topmost n values are values, not MARKs, and do not reach the dict itself.
  const auto values_on_top = [&](std::size_t n) {
    if (sp < n + 1) return false;
    return fast_nmarks_ == 0 || fast_marks_[fast_nmarks_ - 1] < sp - n;
  };
  const auto u32 = [&] {
    const std::uint64_t x =
        b[p] | (std::uint64_t{b[p + 1]} << 8) | (std::uint64_t{b[p + 2]} << 16) | (std::uint64_t{b[p + 3]} << 24);
    p += 4;
    return x;
  };
  const auto restart = [&] {  // again from the EMPTY_DICT
    fail();
    p = pos_;
    clear_state();
    sp = 0;
    return open_box(PyKind::kDict);
  };
  if (!open_box(PyKind::kDict)) return false;
  if (records_on_) {
    if (FastPairs<true>(p)) {
      if (PushRecord(p, chars0, false)) return true;
      return fail();
    }
    record_pairs_.resize(2 * record_index_.size());  // what it wrote there
    // Not a record. The keys it learnt from strings read now (dropped
    // below: their bytes will be reused) are forgotten.
    for (KeyAt& at : record_key_at_) {
      if (at.v != ~std::uint64_t{0} && at.v + at.n > chars0) at = KeyAt{};
    }
    if (!restart()) return false;
  }
  if (FastPairs<false>(p)) goto complete;
  // Not the common shape: again from the EMPTY_DICT, on the stack.
  if (!restart()) return false;
  for (;;) {
    if (sp == 1 && fast_nmarks_ == 0) {
      std::size_t q = p;
      while (q < end && b[q] == 0x95) q += 9;  // FRAME
      if (q >= end) return fail();             // cannot tell what follows
      if (b[q] == '}' || b[q] == 'e') break;   // complete: nothing can add to it
    }
    if (p >= end) return fail();
    const std::uint8_t op = b[p++];
    ++ops;
    const std::size_t left = end - p;
    switch (op) {
      case 'h': {  // BINGET
        if (left < 1) return fail();
        PyRef r;
        if (!FastLookup(b[p++], r)) return fail();
        MS_FAST_PUSH(r);
        break;
      }
      case 'j': {  // LONG_BINGET
        if (left < 4) return fail();
        PyRef r;
        if (!FastLookup(u32(), r)) return fail();
        MS_FAST_PUSH(r);
        break;
      }
      case 0x94:  // MEMOIZE
        if (!put(fast_memo_count_)) return fail();
        break;
      case 'q':  // BINPUT
        if (left < 1 || !put(b[p++])) return fail();
        break;
      case 'r':  // LONG_BINPUT
        if (left < 4 || !put(u32())) return fail();
        break;
      case 0x95:  // FRAME: the frame's opcodes follow
        if (left < 8) return fail();
        p += 8;
        break;
      case '}':
        if (!open_box(PyKind::kDict)) return fail();
        break;
      case ']':
        if (!open_box(PyKind::kList)) return fail();
        break;
      case ')': MS_FAST_PUSH(Store(PyKind::kTuple, nullptr, 0, 1)); break;
      case '(':
        if (fast_nmarks_ == kFastMaxMarks || sp >= kFastMaxStack) return fail();
        fast_marks_[fast_nmarks_++] = sp;
        st[sp].box = -1;
        st[sp].mark = true;
        ++sp;
        break;
      case 'u':
      case 'e': {  // SETITEMS, APPENDS: the values above the MARK into the list/dict below it
        if (fast_nmarks_ == 0) return fail();
        const std::size_t m = fast_marks_[--fast_nmarks_];
        const FastVal& t = st[m - 1];  // m >= 1: the dict itself is at 0
        if (t.mark || t.box < 0) return fail();
        FastBox& B = fast_boxes_[static_cast<std::size_t>(t.box)];
        if (B.kind != (op == 'u' ? PyKind::kDict : PyKind::kList)) return fail();
        if (!FastInto(B, st + m + 1, sp - m - 1)) return fail();
        sp = m;
        break;
      }
      case 's':
      case 'a': {  // SETITEM, APPEND
        const std::size_t n = op == 's' ? 2 : 1;
        if (!values_on_top(n)) return fail();
        const FastVal& t = st[sp - n - 1];
        if (t.mark || t.box < 0) return fail();
        FastBox& B = fast_boxes_[static_cast<std::size_t>(t.box)];
        if (B.kind != (op == 's' ? PyKind::kDict : PyKind::kList)) return fail();
        if (!FastInto(B, st + sp - n, n)) return fail();
        sp -= n;
        break;
      }
      case 0x85:
      case 0x86:
      case 0x87:
      case 't': {  // TUPLE1, TUPLE2, TUPLE3, TUPLE
        std::size_t from;
        if (op == 't') {
          if (fast_nmarks_ == 0) return fail();
          from = fast_marks_[--fast_nmarks_];
        } else {
          const std::size_t n = op - 0x84u;
          if (!values_on_top(n)) return fail();
          from = sp - n;
        }
        const std::size_t first = op == 't' ? from + 1 : from;
        scratch_.clear();
        std::uint16_t h = 1;
        for (std::size_t k = first; k < sp; ++k) {
          const PyRef r = FastFinish(st[k]);
          if (IsContainerKind(r.kind)) h = std::max(h, AddHeight(r.height));
          scratch_.push_back(r);
        }
        sp = from;
        MS_FAST_PUSH(Store(PyKind::kTuple, scratch_.data(), scratch_.size(), h));
        break;
      }
      default: {  // the scalars and strings FastPairs reads too
        PyRef r;
        if (DecodeFastScalar(op, b, p, end, a.chars, r) != FastScalar::kOk) return fail();
        MS_FAST_PUSH(r);
        break;
      }
    }
  }
#undef MS_FAST_PUSH
complete:  // the loop above ends with the dict complete
  ops += fast_pair_ops_;
  const PyRef r = FastFinish(st[0]);
  const std::uint32_t level = NextLevel(false);
  if (std::uint64_t{level} + r.height > options_.max_depth) return fail();
  pos_ = p;
  for (const auto& [id, ref] : fast_memo_) SetMemo(id, ref);
  memo_count_ = fast_memo_count_;
  return FastPush(r, level, ops);
}

absl::Status Reader::Long(const unsigned char* b, std::size_t n) {
  PyRef r;
  if (!LongRef(b, n, r)) return Error("integer too large (not in [-2^63, 2^64))");
  return Push(r);
}

// The dispatch table of the reader: one case per pickle opcode (protocols 0
// to 5), each a few lines, in the order of Python's pickletools. Kept as one
// switch so that a reader can hold it next to pickletools' table; the work of
// each case lives in the helpers above.
absl::Status Reader::Step(std::uint8_t op) {
  std::string& chars = arena_->chars;
  switch (op) {
    // ---- Refused: they import, build objects or call code.
    case 'c':
    case 0x93:
    case 'R':
    case 'b':
    case 'i':
    case 'o':
    case 0x81:
    case 0x92:
    case 0x82:
    case 0x83:
    case 0x84:
    case 'P':
    case 'Q':
    case 0x97:
    case 0x98:
      return Error(absl::StrCat("opcode ", OpName(op), " (", OpCode(op), ") builds objects or calls code: refused"));

    case 0x80: {  // PROTO
      std::uint8_t v;
      if (!ReadByte(v)) return Truncated();
      if (v > 5) return Error(absl::StrCat("unsupported pickle protocol ", v));
      return absl::OkStatus();
    }
    case 0x95: {  // FRAME: the frame's opcodes follow; the buffer reads through.
      std::uint64_t n;
      return ReadLE(n);
    }
    case '.': {  // STOP
      if (!marks_.empty()) return Error("STOP with a MARK still open");
      if (stack_.size() != 1) {
        return Error(absl::StrCat("STOP with ", stack_.size(), " values on the stack (expected 1)"));
      }
      stopped_ = true;
      return absl::OkStatus();
    }
    case '(': {
      if (stack_.size() >= kMaxPickleStack) return Push(PyRef());  // the stack's error
      Slot mark;
      mark.mark = true;
      mark.level = NextLevel(true);
      MS_RETURN_IF_ERROR(CheckDepth(mark.level));
      marks_.push_back(stack_.size());
      stack_.push_back(mark);
      return absl::OkStatus();
    }
    case '0':  // POP
      if (stack_.empty()) return Error("stack underflow in POP");
      if (stack_.back().mark) {
        stack_.pop_back();
        marks_.pop_back();
      } else {
        (void)PopFinished();
      }
      // A dict uncovered in an item of a streamed list (an entry, once what
      // followed it is popped): the dict fast path has finished it (nothing
      // but a POP lets anything add to it) where the general path has not,
      // so a SETITEMS into it next would read differently. Python writes no
      // such POP; refused either way.
      if (!options_.stream_inside_items && !stack_.empty() && !stack_.back().mark &&
          stack_.back().ref.kind == PyKind::kDict && InsideStreamedList(stack_.size())) {
        return Error("POP that uncovers a dict in an item of a streamed list: not supported");
      }
      return absl::OkStatus();
    case '1':  // POP_MARK
      return TakeFromMark(scratch_);
    case '2': {  // DUP
      MS_RETURN_IF_ERROR(CheckTopValue());
      const Slot top = stack_.back();
      return Push(top.open() ? CopyOpen(top.ref) : top.ref);
    }
    case 'N': return Push(ScalarRef(PyKind::kNone, 0));
    case 0x88: return Push(BoolRef(true));
    case 0x89: return Push(BoolRef(false));

    // ---- Integers.
    case 'I': {
      MS_RETURN_IF_ERROR(ReadLine(text_));
      if (text_ == "01") return Push(BoolRef(true));
      if (text_ == "00") return Push(BoolRef(false));
      PyRef v;
      if (!ParseDecimal(text_, v)) return Error("INT: not an integer in [-2^63, 2^64)");
      return Push(v);
    }
    case 'L': {
      MS_RETURN_IF_ERROR(ReadLine(text_));
      if (!text_.empty() && text_.back() == 'L') text_.pop_back();
      PyRef v;
      if (!ParseDecimal(text_, v)) return Error("LONG: not an integer in [-2^63, 2^64)");
      return Push(v);
    }
    case 'J': {
      std::int32_t v;
      MS_RETURN_IF_ERROR(ReadLE(v));
      return Push(IntRef(v));
    }
    case 'K': {
      std::uint8_t v;
      MS_RETURN_IF_ERROR(ReadLE(v));
      return Push(IntRef(v));
    }
    case 'M': {
      std::uint16_t v;
      MS_RETURN_IF_ERROR(ReadLE(v));
      return Push(IntRef(v));
    }
    case 0x8a: {
      std::uint8_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      unsigned char b[255];
      MS_RETURN_IF_ERROR(ReadRaw(b, n));
      return Long(b, n);
    }
    case 0x8b: {
      std::int32_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      if (n < 0) return Error("LONG4 with a negative length");
      if (static_cast<std::uint64_t>(n) > kMaxLongBytes) return Error("integer too large (not in [-2^63, 2^64))");
      text_.clear();
      MS_RETURN_IF_ERROR(AppendBytes(static_cast<std::uint64_t>(n), text_));
      return Long(reinterpret_cast<const unsigned char*>(text_.data()), text_.size());
    }

    // ---- Floats.
    case 'F': {
      MS_RETURN_IF_ERROR(ReadLine(text_));
      double d = 0;
      auto [p, ec] = std::from_chars(text_.data(), text_.data() + text_.size(), d);
      if (ec != std::errc() || p != text_.data() + text_.size()) return Error("FLOAT: not a number");
      return Push(FloatRef(d));
    }
    case 'G': {
      unsigned char b[8];
      MS_RETURN_IF_ERROR(ReadRaw(b, 8));
      std::uint64_t x = 0;
      for (unsigned char c : b) x = (x << 8) | c;
      return Push(FloatRef(std::bit_cast<double>(x)));
    }

    // ---- Bytes and strings.
    case 'S': {  // a Python 2 str literal, as bytes
      MS_RETURN_IF_ERROR(ReadLine(text_));
      const std::string& data = text_;
      if (data.size() < 2 || (data[0] != '\'' && data[0] != '"') || data.back() != data[0]) {
        return Error("STRING: argument is not quoted");
      }
      const std::size_t start = chars.size();
      for (std::size_t k = 1; k + 1 < data.size(); ++k) {
        char c = data[k];
        if (c != '\\') {
          chars += c;
          continue;
        }
        if (++k + 1 >= data.size()) return Error("STRING: bad escape");
        char e = data[k];
        switch (e) {
          case 'n': chars += '\n'; break;
          case 't': chars += '\t'; break;
          case 'r': chars += '\r'; break;
          case 'a': chars += '\a'; break;
          case 'b': chars += '\b'; break;
          case 'f': chars += '\f'; break;
          case 'v': chars += '\v'; break;
          case '\\':
          case '\'':
          case '"': chars += e; break;
          case 'x': {
            if (k + 2 >= data.size() - 1 || HexDigit(data[k + 1]) < 0 || HexDigit(data[k + 2]) < 0) {
              return Error("STRING: bad \\x escape");
            }
            chars += static_cast<char>(HexDigit(data[k + 1]) * 16 + HexDigit(data[k + 2]));
            k += 2;
            break;
          }
          default:
            if (e >= '0' && e <= '7') {
              int v = e - '0';
              for (int d = 0; d < 2 && k + 2 < data.size() && data[k + 1] >= '0' && data[k + 1] <= '7'; ++d) {
                v = v * 8 + (data[++k] - '0');
              }
              chars += static_cast<char>(v & 0xff);
            } else {
              chars += '\\';
              chars += e;
            }
        }
      }
      return PushString(PyKind::kBytes, start);
    }
    case 'T': {
      std::int32_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      if (n < 0) return Error("BINSTRING with a negative length");
      const std::size_t start = chars.size();
      MS_RETURN_IF_ERROR(AppendBytes(static_cast<std::uint64_t>(n), chars));
      return PushString(PyKind::kBytes, start);
    }
    case 'U':
    case 'C': {
      std::uint8_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      const std::size_t start = chars.size();
      MS_RETURN_IF_ERROR(AppendBytes(n, chars));
      return PushString(PyKind::kBytes, start);
    }
    case 'B': {
      std::uint32_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      const std::size_t start = chars.size();
      MS_RETURN_IF_ERROR(AppendBytes(n, chars));
      return PushString(PyKind::kBytes, start);
    }
    case 0x8e:
    case 0x96: {
      std::uint64_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      const std::size_t start = chars.size();
      MS_RETURN_IF_ERROR(AppendBytes(n, chars));
      return PushString(PyKind::kBytes, start);
    }
    case 'V': {  // raw-unicode-escape: latin-1 bytes with \uXXXX and \UXXXXXXXX
      MS_RETURN_IF_ERROR(ReadLine(text_));
      const std::string& data = text_;
      const std::size_t start = chars.size();
      for (std::size_t k = 0; k < data.size(); ++k) {
        unsigned char c = static_cast<unsigned char>(data[k]);
        if (c == '\\' && k + 1 < data.size() && (data[k + 1] == 'u' || data[k + 1] == 'U')) {
          std::size_t digits = data[k + 1] == 'u' ? 4 : 8;
          if (k + 1 + digits >= data.size()) {
            return Error("UNICODE: truncated \\u escape");
          }
          std::uint32_t cp = 0;
          for (std::size_t d = 0; d < digits; ++d) {
            int h = HexDigit(data[k + 2 + d]);
            if (h < 0) return Error("UNICODE: bad \\u escape");
            cp = cp * 16 + static_cast<std::uint32_t>(h);
          }
          if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return Error("invalid UTF-8: code point out of range");
          AppendUtf8(chars, cp);
          k += 1 + digits;
        } else {
          AppendUtf8(chars, c);
        }
      }
      return PushString(PyKind::kString, start);
    }
    case 'X':
    case 0x8c:
    case 0x8d: {
      std::uint64_t n;
      if (op == 'X') {
        std::uint32_t n32;
        MS_RETURN_IF_ERROR(ReadLE(n32));
        n = n32;
      } else if (op == 0x8c) {
        std::uint8_t n8;
        MS_RETURN_IF_ERROR(ReadLE(n8));
        n = n8;
      } else {
        MS_RETURN_IF_ERROR(ReadLE(n));
      }
      const std::size_t start = chars.size();
      MS_RETURN_IF_ERROR(AppendBytes(n, chars));
      if (!ValidUtf8(std::string_view(chars).substr(start))) {
        return Error(absl::StrCat("invalid UTF-8 in ", OpName(op)));
      }
      return PushString(PyKind::kString, start);
    }

    // ---- Containers.
    case ']':
    case 0x8f: return PushNew(PyKind::kList);
    case '}':
      if (fast_dicts_ && FastDict()) return absl::OkStatus();
      return PushNew(PyKind::kDict);
    case ')': return Push(Store(PyKind::kTuple, nullptr, 0, 1));
    case 'a': {  // (a record's placeholder is built by AppendTo unless the list is streamed)
      MS_RETURN_IF_ERROR(CheckTopValue(2));
      scratch_.clear();
      const Slot top = stack_.back();
      stack_.pop_back();
      scratch_.push_back(FinishKeepRecord(top));
      return AppendTo(stack_.size() - 1, scratch_);
    }
    case 'e':
    case 0x90: {
      MS_RETURN_IF_ERROR(TakeFromMark(scratch_, nullptr, op == 'e'));
      if (stack_.empty()) return Error(absl::StrCat("stack underflow in ", OpName(op)));
      return AppendTo(stack_.size() - 1, scratch_);
    }
    case 's': {
      MS_RETURN_IF_ERROR(CheckTopValue(3));
      scratch_.resize(2);
      scratch_[1] = PopFinished();
      scratch_[0] = PopFinished();
      return SetItems(stack_.size() - 1, scratch_);
    }
    case 'u': {
      MS_RETURN_IF_ERROR(TakeFromMark(scratch_));
      if (stack_.empty()) return Error("stack underflow in SETITEMS");
      return SetItems(stack_.size() - 1, scratch_);
    }
    case 'l':
    case 0x91: {  // LIST, FROZENSET: a list holding the values above the MARK
      std::uint32_t level = 0;
      MS_RETURN_IF_ERROR(TakeFromMark(scratch_, &level));
      MS_RETURN_IF_ERROR(PushNew(PyKind::kList));
      stack_.back().level = level;
      return AppendTo(stack_.size() - 1, scratch_);
    }
    case 'd': {
      std::uint32_t level = 0;
      FastVec<PyRef> kv;
      MS_RETURN_IF_ERROR(TakeFromMark(kv, &level));
      MS_RETURN_IF_ERROR(PushNew(PyKind::kDict));
      stack_.back().level = level;
      return SetItems(stack_.size() - 1, kv);
    }
    case 't': {
      std::uint32_t level = 0;
      MS_RETURN_IF_ERROR(TakeFromMark(scratch_, &level));
      return MakeTuple(scratch_, level);
    }
    case 0x85:
    case 0x86:
    case 0x87: {
      std::size_t n = op - 0x84u;
      MS_RETURN_IF_ERROR(CheckTopValue(n));
      const std::uint32_t level = stack_[stack_.size() - n].level;
      scratch_.resize(n);
      for (std::size_t k = n; k-- > 0;) scratch_[k] = PopFinished();
      return MakeTuple(scratch_, level);
    }

    // ---- Memo.
    case 'p': {
      MS_RETURN_IF_ERROR(ReadLine(text_));
      PyRef v;
      if (!ParseDecimal(text_, v) || v.kind != PyKind::kInt ||
          (!(v.flags & kPyRefUnsigned) && static_cast<std::int64_t>(v.v) < 0)) {
        return Error("PUT: bad memo index");
      }
      return Memo(v.v);
    }
    case 'q': {
      std::uint8_t id;
      MS_RETURN_IF_ERROR(ReadLE(id));
      return Memo(id);
    }
    case 'r': {
      std::uint32_t id;
      MS_RETURN_IF_ERROR(ReadLE(id));
      return Memo(id);
    }
    case 0x94: return Memo(memo_count_);
    case 'g': {
      MS_RETURN_IF_ERROR(ReadLine(text_));
      PyRef v;
      if (!ParseDecimal(text_, v) || v.kind != PyKind::kInt ||
          (!(v.flags & kPyRefUnsigned) && static_cast<std::int64_t>(v.v) < 0)) {
        return Error("GET: bad memo index");
      }
      return Get(v.v);
    }
    case 'h': {
      std::uint8_t id;
      MS_RETURN_IF_ERROR(ReadLE(id));
      if (PushMemoFast(id)) return absl::OkStatus();
      return Get(id);
    }
    case 'j': {
      std::uint32_t id;
      MS_RETURN_IF_ERROR(ReadLE(id));
      if (PushMemoFast(id)) return absl::OkStatus();
      return Get(id);
    }
    default: return Error(absl::StrFormat("unknown opcode 0x%02x", op));
  }
}

absl::StatusOr<PickleDoc> Reader::Run(PickleReadStats* stats) {
  fast_dicts_ = options_.fast_dicts && !options_.stream_inside_items;
  records_on_ = fast_dicts_ && options_.fast_records && options_.on_record && !options_.record_keys.empty() &&
                options_.record_keys.size() <= kMaxRecordKeys;
  absl::Status status;
  while (!stopped_) {
    op_offset_ = base_ + pos_;
    if (!ReadByte(op_)) {
      status = Error(op_offset_ == 0 ? std::string("empty input: not a pickle")
                                     : std::string("truncated input: no STOP opcode"));
      break;
    }
    status = Step(op_);
    if (record_stale_) [[unlikely]]
      status = Error("internal error: a record outlived its batch");
    if (!status.ok()) break;
    run_ops_ += 1 + fast_ops_;
    fast_ops_ = 0;
    if (run_ops_ >= run_next_check_) {
      run_next_check_ = run_ops_ + kBudgetCheckEvery;
      status = CheckBudget();
      if (!status.ok()) break;
    }
  }
  PyRef root;
  if (status.ok()) {
    root = Finish(stack_.back());
    stack_.clear();
    status = record_stale_ ? Error("internal error: a record outlived its batch") : CheckBudget();
  }
  if (stats != nullptr) {
    stats->input_bytes = base_ + pos_;
    stats->peak_working_bytes = std::max(peak_, WorkingBytes());
    stats->shared_containers = cons_refs_.size();
    stats->fast_dicts = fast_count_;
    stats->records = record_count_;
    stats->template_records = tmpl_count_;
  }
  if (!status.ok()) return status;
  return PickleDoc(std::move(arena_), root);
}

}  // namespace

absl::StatusOr<PickleDoc> ReadPickle(std::istream& in, const std::string& source, const PickleReadOptions& options,
                                     PickleReadStats* stats) {
  Reader r(in, source, options);
  return r.Run(stats);
}

absl::StatusOr<PickleDoc> ReadPickleBytes(std::string_view data, const std::string& source,
                                          const PickleReadOptions& options, PickleReadStats* stats) {
  Reader r(data, nullptr, source, options);
  return r.Run(stats);
}

absl::StatusOr<PickleDoc> ReadPickleFile(const std::string& path, const PickleReadOptions& options,
                                         PickleReadStats* stats) {
  // A regular file of some bytes is mapped; the stat first, so that nothing
  // else (a FIFO: its writer) is opened twice.
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      MappedInput map;
      const bool mapped = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
                          map.Map(fd, static_cast<std::uint64_t>(st.st_size));
      close(fd);  // (the mapping holds the file)
      if (mapped) {
        Reader r(std::string_view(map.base, map.size), &map, path, options);
        absl::StatusOr<PickleDoc> doc = r.Run(stats);
        if (stats != nullptr) {
          stats->mapped = true;
          stats->released_bytes = map.released;
        }
        return doc;
      }
    }
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  return ReadPickle(in, path, options, stats);
}

}  // namespace memscope
