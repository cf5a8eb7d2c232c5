// Internals of the pickle reader (importers/pickle_reader.h), below the
// Reader class (pickle_internal.h): the limits, a value's 16-byte reference
// made from a scalar, the growable arrays, list/dict builders and stack
// slots, the memo table, and the scalar decoders the fast paths share.
// Private to importers/pickle_*.cpp. What the fast paths call per opcode is
// inline here, as it was in the single file they came from.
#ifndef MEMSCOPE_IMPORTERS_PICKLE_VALUES_H_
#define MEMSCOPE_IMPORTERS_PICKLE_VALUES_H_

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "base/status.h"
#include "base/utf8.h"
#include "importers/pickle_reader.h"
#include "importers/prefault.h"
#include "importers/zero_array.h"

namespace memscope::pickle_internal {

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

// The opcode's name as pickletools gives it (null for none), its byte as
// text, and a kind's Python name: for error messages (pickle_machine.cpp).
const char* OpName(std::uint8_t op);
std::string OpCode(std::uint8_t op);
const char* KindName(PyKind k);

inline PyRef ScalarRef(PyKind kind, std::uint64_t v, std::uint8_t flags = 0) {
  PyRef r;
  r.kind = kind;
  r.flags = flags;
  r.v = v;
  return r;
}
inline PyRef IntRef(std::int64_t v) { return ScalarRef(PyKind::kInt, static_cast<std::uint64_t>(v)); }
inline PyRef UIntRef(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return ScalarRef(PyKind::kInt, v);
  return ScalarRef(PyKind::kInt, v, kPyRefUnsigned);
}
inline PyRef BoolRef(bool b) { return ScalarRef(PyKind::kBool, b ? 1 : 0); }
inline PyRef FloatRef(double d) { return ScalarRef(PyKind::kFloat, std::bit_cast<std::uint64_t>(d)); }

inline bool IsContainerKind(PyKind k) { return k == PyKind::kList || k == PyKind::kTuple || k == PyKind::kDict; }
inline bool IsMutableKind(PyKind k) { return k == PyKind::kList || k == PyKind::kDict; }

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
inline std::uint64_t StrKeyBit(const char* chars, const PyRef& k) {
  if (k.n == 0) return 1;
  const unsigned first = static_cast<unsigned char>(chars[k.v]);
  const unsigned last = static_cast<unsigned char>(chars[k.v + k.n - 1]);
  return std::uint64_t{1} << ((k.n * 7 + last + first * 3) & 63);
}

// A LONG1/LONG4 argument (little-endian two's complement) as an int; false
// outside [-2^63, 2^64).
inline bool LongRef(const unsigned char* b, std::size_t n, PyRef& out) {
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

// The little-endian 32-bit integer at b (a LONG_BINGET's id, a BININT).
[[gnu::always_inline]] inline std::uint32_t LoadLE32(const unsigned char* b) {
  return b[0] | (std::uint32_t{b[1]} << 8) | (std::uint32_t{b[2]} << 16) | (std::uint32_t{b[3]} << 24);
}

// The end of the run of memo references (BINGET, LONG_BINGET) from q: each
// read only where 5 bytes of the buffer are left from its opcode (a frames
// list's items, scanned for where they end).
[[gnu::always_inline]] inline std::size_t ScanMemoRefs(const unsigned char* b, std::size_t q, std::size_t end) {
  while (end - q >= 5 && (b[q] == 'h' || b[q] == 'j')) q += b[q] == 'h' ? 2 : 5;
  return q;
}

// The opcodes of a number the fast paths read as one of a tuple's (BININT1,
// BININT2, BININT, LONG1, NONE).
inline bool IsTupleNumberOp(std::uint8_t o) { return o == 'K' || o == 'M' || o == 'J' || o == 0x8a || o == 'N'; }

// A hash of a span of input bytes (a frames list's memo references).
inline std::uint64_t BytesHash(const unsigned char* b, std::size_t n) {
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

inline std::uint16_t AddHeight(std::uint16_t h) { return h == std::numeric_limits<std::uint16_t>::max() ? h : h + 1; }

}  // namespace memscope::pickle_internal

#endif  // MEMSCOPE_IMPORTERS_PICKLE_VALUES_H_
