#include "importers/pickle_reader.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace memscope {

const PyValue* PyValue::Get(std::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : dict) {
    if (k.kind == Kind::kString && k.s == key) return &v;
  }
  return nullptr;
}

std::optional<std::int64_t> PyValue::AsInt() const {
  if (kind == Kind::kBool) return b ? 1 : 0;
  if (kind != Kind::kInt || is_unsigned) return std::nullopt;
  return i;
}

std::optional<std::uint64_t> PyValue::AsUInt() const {
  if (kind == Kind::kBool) return b ? 1u : 0u;
  if (kind != Kind::kInt) return std::nullopt;
  if (is_unsigned) return u;
  if (i < 0) return std::nullopt;
  return static_cast<std::uint64_t>(i);
}

const std::string* PyValue::AsString() const { return kind == Kind::kString ? &s : nullptr; }

namespace {

#define MS_RETURN_IF_ERROR(expr)              \
  do {                                        \
    if (absl::Status s_ = (expr); !s_.ok()) { \
      return s_;                              \
    }                                         \
  } while (0)

constexpr std::size_t kBufferSize = 1 << 16;
constexpr std::size_t kMaxLine = 1 << 20;            // text opcodes (protocol 0)
constexpr std::size_t kMaxMemoFlatItems = 64;        // see the header's memo notes
constexpr std::uint64_t kMemoBudget = 128ull << 20;  // estimated bytes of kept memo values
constexpr std::uint64_t kMaxLongBytes = 1 << 20;

using Kind = PyValue::Kind;

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

bool IsContainer(const PyValue& v) { return v.kind == Kind::kList || v.kind == Kind::kTuple || v.kind == Kind::kDict; }

bool ValidUtf8(const std::string& s) {
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

PyValue MakeInt(std::int64_t v) {
  PyValue r;
  r.kind = Kind::kInt;
  r.i = v;
  return r;
}

PyValue MakeUInt(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return MakeInt(static_cast<std::int64_t>(v));
  }
  PyValue r;
  r.kind = Kind::kInt;
  r.u = v;
  r.is_unsigned = true;
  return r;
}

PyValue MakeBool(bool v) {
  PyValue r;
  r.kind = Kind::kBool;
  r.b = v;
  return r;
}

PyValue MakeFloat(double v) {
  PyValue r;
  r.kind = Kind::kFloat;
  r.f = v;
  return r;
}

PyValue MakeStr(Kind kind, std::string s) {
  PyValue r;
  r.kind = kind;
  r.s = std::move(s);
  return r;
}

// Parses a decimal integer (optional sign) into a PyValue; false if it is not
// one or is outside [-2^63, 2^64).
bool ParseDecimal(std::string_view t, PyValue& out) {
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
    out = MakeUInt(v);
    return true;
  }
  if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + 1) return false;
  out = MakeInt(static_cast<std::int64_t>(0 - v));
  return true;
}

// Canonical text of a hashable key, equal for keys Python considers equal
// (1 == 1.0 == True). False if the key is unhashable.
bool KeyText(const PyValue& v, std::string& out) {
  switch (v.kind) {
    case Kind::kNone: out += 'N'; return true;
    case Kind::kBool: out += v.b ? "i1;" : "i0;"; return true;
    case Kind::kInt:
      absl::StrAppend(&out, "i", v.is_unsigned ? absl::StrCat(v.u) : absl::StrCat(v.i), ";");
      return true;
    case Kind::kFloat:
      if (std::isfinite(v.f) && v.f == std::floor(v.f) && v.f >= -9223372036854775808.0 &&
          v.f < 18446744073709551616.0) {
        if (v.f < 0) {
          absl::StrAppend(&out, "i", static_cast<std::int64_t>(v.f), ";");
        } else {
          PyValue n = MakeUInt(static_cast<std::uint64_t>(v.f));
          return KeyText(n, out);
        }
        return true;
      }
      absl::StrAppend(&out, "f", std::bit_cast<std::uint64_t>(v.f), ";");
      return true;
    case Kind::kString: absl::StrAppend(&out, "s", v.s.size(), ":", v.s); return true;
    case Kind::kBytes: absl::StrAppend(&out, "b", v.s.size(), ":", v.s); return true;
    case Kind::kTuple:
      out += '(';
      for (const PyValue& e : v.items) {
        if (!KeyText(e, out)) return false;
      }
      out += ')';
      return true;
    default: return false;
  }
}

bool KeysEqual(const PyValue& a, const PyValue& b) {
  std::string x, y;
  return KeyText(a, x) && KeyText(b, y) && x == y;
}

std::string KindName(Kind k) {
  switch (k) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
  }
  return "?";
}

// Bookkeeping for a list or dict on the stack.
struct ContainerState {
  std::uint64_t token = 0;         // identifies it for pending memo entries
  std::uint64_t appended = 0;      // items appended so far, streamed or kept
  int streamed = -1;               // -1: not decided yet
  std::optional<PicklePath> path;  // cached
  std::vector<std::uint64_t> memo_ids;
  std::unordered_map<std::string, std::size_t> key_index;  // large dicts only
};

struct Entry {
  bool mark = false;
  PyValue value;
  std::uint64_t height = 0;  // nesting height: 0 for scalars
  std::unique_ptr<ContainerState> state;
  // Tokens of containers still on the stack that this value holds copies of
  // (GET while pending): one going into itself is a recursive structure.
  std::vector<std::uint64_t> pending_copies;
};

struct MemoEntry {
  enum class State { kValue, kPending } state = State::kValue;
  PyValue value;
  std::uint64_t height = 0;
  std::uint64_t token = 0;
};

class Reader {
 public:
  Reader(std::istream& in, const std::string& source, const PickleReadOptions& options)
      : in_(in), source_(source), options_(options), buf_(kBufferSize) {}

  absl::StatusOr<PyValue> Run();

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
    in_.read(buf_.data(), static_cast<std::streamsize>(buf_.size()));
    end_ = static_cast<std::size_t>(in_.gcount());
    if (end_ == 0) {
      eof_ = true;
      return false;
    }
    return true;
  }
  bool ReadByte(std::uint8_t& b) {
    if (pos_ == end_ && !Refill()) return false;
    b = static_cast<std::uint8_t>(buf_[pos_++]);
    return true;
  }
  absl::Status ReadRaw(void* dst, std::size_t n) {
    auto* d = static_cast<char*>(dst);
    while (n > 0) {
      if (pos_ == end_ && !Refill()) return Truncated();
      std::size_t k = std::min(n, end_ - pos_);
      std::memcpy(d, buf_.data() + pos_, k);
      pos_ += k;
      d += k;
      n -= k;
    }
    return absl::OkStatus();
  }
  // Reads n bytes, growing `out` only as data actually arrives.
  absl::Status ReadString(std::uint64_t n, std::string& out) {
    out.clear();
    while (n > 0) {
      if (pos_ == end_ && !Refill()) return Truncated();
      std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, end_ - pos_));
      out.append(buf_.data() + pos_, k);
      pos_ += k;
      n -= k;
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
  absl::Status ReadLE(T& v) {
    unsigned char b[sizeof(T)];
    MS_RETURN_IF_ERROR(ReadRaw(b, sizeof(T)));
    std::uint64_t x = 0;
    for (std::size_t k = 0; k < sizeof(T); ++k) x |= static_cast<std::uint64_t>(b[k]) << (8 * k);
    v = static_cast<T>(x);
    return absl::OkStatus();
  }

  // ---- Stack.
  absl::Status Push(PyValue v, std::uint64_t height = 0) {
    Entry e;
    e.height = (IsContainer(v) && height == 0) ? 1 : height;
    if (v.kind == Kind::kList || v.kind == Kind::kDict) {
      e.state = std::make_unique<ContainerState>();
      e.state->token = ++next_token_;
      e.state->appended = v.kind == Kind::kList ? v.items.size() : 0;
    }
    e.value = std::move(v);
    stack_.push_back(std::move(e));
    return absl::OkStatus();
  }
  absl::Status CheckDepth(std::uint64_t height) const {
    if (height > options_.max_depth) {
      return Error(absl::StrCat("nesting deeper than max_depth (", options_.max_depth, ")"));
    }
    return absl::OkStatus();
  }
  // The value entry at the top; error for an empty stack or a MARK.
  absl::Status CheckTopValue(std::size_t n = 1) const {
    if (stack_.size() < n) return Error(absl::StrCat("stack underflow in ", OpName(op_)));
    for (std::size_t k = stack_.size() - n; k < stack_.size(); ++k) {
      if (stack_[k].mark) return Error(absl::StrCat("unexpected MARK on the stack in ", OpName(op_)));
    }
    return absl::OkStatus();
  }
  // Called when a value leaves the stack: a container memoized while it was
  // being built gets its final memo entry.
  void Complete(Entry& e) {
    if (!e.state || e.state->memo_ids.empty()) return;
    pending_.erase(e.state->token);
    for (std::uint64_t id : e.state->memo_ids) {
      auto it = memo_.find(id);
      if (it == memo_.end() || it->second.state != MemoEntry::State::kPending || it->second.token != e.state->token) {
        continue;
      }
      Keep(id, e.value, e.height);
    }
  }
  static bool FlatSmall(const PyValue& v) {
    std::size_t n = v.kind == Kind::kDict ? v.dict.size() : v.items.size();
    if (n > kMaxMemoFlatItems) return false;
    for (const PyValue& x : v.items) {
      if (IsContainer(x)) return false;
    }
    for (const auto& [k, x] : v.dict) {
      if (IsContainer(k) || IsContainer(x)) return false;
    }
    return true;
  }
  static std::uint64_t Cost(const PyValue& v) {
    std::uint64_t c = sizeof(PyValue) + v.s.size();
    for (const PyValue& x : v.items) c += Cost(x);
    for (const auto& [k, x] : v.dict) c += Cost(k) + Cost(x);
    return c;
  }
  // Keeps a copy of `v` under memo `id` if it is a scalar or a flat, small
  // container and the budget allows; otherwise forgets the entry (a later GET
  // of it is an error).
  void Keep(std::uint64_t id, const PyValue& v, std::uint64_t height) {
    if (!IsContainer(v) || FlatSmall(v)) {
      std::uint64_t c = Cost(v) + 64;  // 64: the map node
      if (memo_bytes_ + c <= kMemoBudget) {
        memo_bytes_ += c;
        MemoEntry& m = memo_[id];
        m.state = MemoEntry::State::kValue;
        m.value = v;
        m.height = height;
        return;
      }
    }
    memo_.erase(id);
  }
  Entry PopEntry() {
    Entry e = std::move(stack_.back());
    stack_.pop_back();
    Complete(e);
    return e;
  }

  // ---- Paths (see the header).
  std::string KeyLabel(const PyValue& k) const {
    if (k.kind == Kind::kString) return k.s;
    if (k.kind == Kind::kInt) return k.is_unsigned ? absl::StrCat(k.u) : absl::StrCat(k.i);
    return "[?]";
  }
  static bool IsMutable(const Entry& e) {
    return !e.mark && (e.value.kind == Kind::kList || e.value.kind == Kind::kDict);
  }
  static std::uint64_t Count(const Entry& e) { return e.state ? e.state->appended : e.value.items.size(); }
  PicklePath Unknown(PicklePath p) const {
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
    if (q < stack_.size() && !stack_[q].mark && stack_[q].state && stack_[q].state->path) {
      return *stack_[q].state->path;
    }
    PicklePath p = ComputePath(q, level);
    if (q < stack_.size() && !stack_[q].mark && stack_[q].state) stack_[q].state->path = p;
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
    const Entry& owner = stack_[m - 1];
    if (owner.value.kind == Kind::kList) {
      PicklePath p = PathAt(m - 1, level + 1);
      p.push_back(absl::StrCat("[", Count(owner) + (q - lo), "]"));
      return p;
    }
    // A dict's batch: key, value, key, value...
    for (std::size_t j = lo;; j += 2) {
      if (j >= q) return Unknown(PathAt(m - 1, level + 1));
      if (j + 1 == q) {
        PicklePath p = PathAt(m - 1, level + 1);
        p.push_back(KeyLabel(stack_[j].value));
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
      const Entry& e = stack_[c];
      if (!IsMutable(e)) return Unknown(std::move(p));
      std::size_t next;
      if (e.value.kind == Kind::kList) {
        p.push_back(absl::StrCat("[", Count(e), "]"));
        next = c + 1;
      } else {
        if (c + 1 >= q) return Unknown(std::move(p));
        p.push_back(KeyLabel(stack_[c + 1].value));
        next = c + 2;
      }
      if (next == q) return p;
      if (next > q || p.size() > options_.max_depth) return Unknown(std::move(p));
      c = next;
    }
  }

  // ---- Containers.
  absl::Status AppendTo(std::size_t target, std::vector<Entry>& items);
  absl::Status SetItems(std::size_t target, std::vector<Entry>& kv);
  absl::Status TakeFromMark(std::vector<Entry>& out) {
    if (marks_.empty()) return Error(absl::StrCat("no MARK for ", OpName(op_)));
    std::size_t m = marks_.back();
    marks_.pop_back();
    out.clear();
    out.reserve(stack_.size() - m - 1);
    for (std::size_t k = m + 1; k < stack_.size(); ++k) {
      out.push_back(std::move(stack_[k]));
      Complete(out.back());
    }
    stack_.resize(m);
    return absl::OkStatus();
  }
  absl::Status MakeSequence(Kind kind, std::vector<Entry>& items) {
    PyValue v;
    v.kind = kind;
    std::uint64_t h = 1;
    v.items.reserve(items.size());
    std::vector<std::uint64_t> copies;
    for (Entry& e : items) {
      MS_RETURN_IF_ERROR(Absorb(copies, e, 0));
      h = std::max(h, e.height + 1);
      v.items.push_back(std::move(e.value));
    }
    MS_RETURN_IF_ERROR(CheckDepth(h));
    MS_RETURN_IF_ERROR(Push(std::move(v), h));
    stack_.back().pending_copies = std::move(copies);
    return absl::OkStatus();
  }
  absl::Status Absorb(std::vector<std::uint64_t>& into, const Entry& item, std::uint64_t target) {
    for (std::uint64_t t : item.pending_copies) {
      if (t == target) {
        return Error(absl::StrCat(OpName(op_), ": a container inside itself (recursive structure): not supported"));
      }
      if (pending_.count(t) && std::find(into.begin(), into.end(), t) == into.end()) into.push_back(t);
    }
    return absl::OkStatus();
  }
  absl::Status Memo(std::uint64_t id);
  absl::Status Get(std::uint64_t id);
  absl::Status Long(const std::string& bytes);
  absl::Status Step(std::uint8_t op);

  std::istream& in_;
  const std::string& source_;
  const PickleReadOptions& options_;
  std::vector<char> buf_;
  std::size_t pos_ = 0, end_ = 0;
  std::uint64_t base_ = 0;
  bool eof_ = false;
  std::uint64_t op_offset_ = 0;
  std::uint8_t op_ = 0;

  std::vector<Entry> stack_;
  std::vector<std::size_t> marks_;  // positions of the MARKs in stack_
  std::unordered_map<std::uint64_t, MemoEntry> memo_;
  std::unordered_map<std::uint64_t, std::size_t> pending_;  // token -> stack position
  std::uint64_t memo_bytes_ = 0;
  std::uint64_t memo_count_ = 0;  // MEMOIZE's index: entries ever memoized
  std::uint64_t next_token_ = 0;
  bool path_too_deep_ = false;
  bool stopped_ = false;
  std::vector<Entry> scratch_;
};

absl::Status Reader::AppendTo(std::size_t target, std::vector<Entry>& items) {
  if (target >= stack_.size() || stack_[target].mark || stack_[target].value.kind != Kind::kList) {
    return Error(absl::StrCat(OpName(op_), " to something that is not a list"));
  }
  if (items.empty()) return absl::OkStatus();
  Entry& list = stack_[target];
  ContainerState& st = *list.state;
  if (st.streamed < 0) {
    st.streamed = 0;
    if (options_.stream_list) {
      PicklePath p = PathAt(target, 0);
      if (path_too_deep_) return CheckDepth(options_.max_depth + 1);
      st.path = std::move(p);
      st.streamed = options_.stream_list(*st.path) ? 1 : 0;
    }
  }
  for (Entry& e : items) {
    MS_RETURN_IF_ERROR(CheckDepth(e.height + 1));
    MS_RETURN_IF_ERROR(Absorb(list.pending_copies, e, st.token));
    ++st.appended;
    if (st.streamed == 1) {
      if (options_.on_item) MS_RETURN_IF_ERROR(options_.on_item(*st.path, std::move(e.value)));
    } else {
      list.height = std::max(list.height, e.height + 1);
      list.value.items.push_back(std::move(e.value));
    }
  }
  items.clear();
  return absl::OkStatus();
}

absl::Status Reader::SetItems(std::size_t target, std::vector<Entry>& kv) {
  if (target >= stack_.size() || stack_[target].mark || stack_[target].value.kind != Kind::kDict) {
    return Error(absl::StrCat(OpName(op_), " to something that is not a dict"));
  }
  if (kv.size() % 2 != 0) return Error(absl::StrCat(OpName(op_), " with a key and no value"));
  Entry& d = stack_[target];
  ContainerState& st = *d.state;
  std::string key_text;
  for (std::size_t k = 0; k < kv.size(); k += 2) {
    Entry& key = kv[k];
    Entry& val = kv[k + 1];
    key_text.clear();
    // The key's text is needed to check a container key's hashability and to
    // index large dicts; small dicts with scalar keys (every dict of a
    // snapshot's trace entries) compare keys directly.
    const bool scalar_key =
        key.value.kind != Kind::kList && key.value.kind != Kind::kDict && key.value.kind != Kind::kTuple;
    const bool need_text = !scalar_key || d.value.dict.size() >= 32 || !st.key_index.empty();
    if (need_text && !KeyText(key.value, key_text)) {
      return Error(absl::StrCat("unhashable dict key (", KindName(key.value.kind), ")"));
    }
    MS_RETURN_IF_ERROR(Absorb(d.pending_copies, key, st.token));
    MS_RETURN_IF_ERROR(Absorb(d.pending_copies, val, st.token));
    std::uint64_t h = std::max(key.height, val.height) + 1;
    MS_RETURN_IF_ERROR(CheckDepth(h));
    d.height = std::max(d.height, h);
    auto& pairs = d.value.dict;
    std::optional<std::size_t> existing;
    if (pairs.size() < 32) {
      for (std::size_t j = 0; j < pairs.size(); ++j) {
        if (KeysEqual(pairs[j].first, key.value)) {
          existing = j;
          break;
        }
      }
    } else {
      if (st.key_index.empty()) {
        for (std::size_t j = 0; j < pairs.size(); ++j) {
          std::string t;
          KeyText(pairs[j].first, t);
          st.key_index.emplace(std::move(t), j);
        }
      }
      auto it = st.key_index.find(key_text);
      if (it != st.key_index.end()) existing = it->second;
    }
    if (existing) {
      pairs[*existing].second = std::move(val.value);
    } else {
      if (!st.key_index.empty()) st.key_index.emplace(key_text, pairs.size());
      pairs.push_back(PyItem{std::move(key.value), std::move(val.value)});
    }
  }
  kv.clear();
  return absl::OkStatus();
}

absl::Status Reader::Memo(std::uint64_t id) {
  MS_RETURN_IF_ERROR(CheckTopValue());
  memo_count_ = std::max(memo_count_, id + 1);
  Entry& top = stack_.back();
  if (top.state) {
    MemoEntry& m = memo_[id];
    m.state = MemoEntry::State::kPending;
    m.value = PyValue();
    m.token = top.state->token;
    top.state->memo_ids.push_back(id);
    pending_[m.token] = stack_.size() - 1;
  } else {
    Keep(id, top.value, top.height);  // scalars and tuples are complete when made
  }
  return absl::OkStatus();
}

absl::Status Reader::Get(std::uint64_t id) {
  auto it = memo_.find(id);
  if (it == memo_.end()) {
    return Error(absl::StrCat("bad memo reference ", id,
                              " (no such entry, or a shared container or memo beyond the budget "
                              "that this reader does not keep)"));
  }
  const MemoEntry& m = it->second;
  switch (m.state) {
    case MemoEntry::State::kPending: {
      // Still on the stack: being built (a recursive reference), or complete
      // but waiting in a MARK batch (a frame dict shared within one list).
      auto pos = pending_.find(m.token);
      if (pos != pending_.end() && FlatSmall(stack_[pos->second].value)) {
        const Entry& e = stack_[pos->second];
        MS_RETURN_IF_ERROR(CheckDepth(e.height));
        MS_RETURN_IF_ERROR(Push(e.value, e.height));
        stack_.back().pending_copies.push_back(m.token);
        return absl::OkStatus();
      }
      return Error(absl::StrCat("memo reference ", id,
                                " to a container still being built (recursive structure) or holding "
                                "containers: not supported"));
    }
    case MemoEntry::State::kValue: break;
  }
  MS_RETURN_IF_ERROR(CheckDepth(m.height));
  return Push(m.value, m.height);
}

absl::Status Reader::Long(const std::string& bytes) {
  // Little-endian two's complement.
  std::string b = bytes;
  if (b.empty()) return Push(MakeInt(0));
  bool neg = (static_cast<unsigned char>(b.back()) & 0x80) != 0;
  if (!neg) {
    while (b.size() > 8 && b.back() == 0) b.pop_back();
    if (b.size() > 8) return Error("integer too large (not in [-2^63, 2^64))");
    std::uint64_t v = 0;
    for (std::size_t k = 0; k < b.size(); ++k)
      v |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[k])) << (8 * k);
    return Push(MakeUInt(v));
  }
  while (b.size() > 8 && static_cast<unsigned char>(b.back()) == 0xff &&
         (static_cast<unsigned char>(b[b.size() - 2]) & 0x80) != 0) {
    b.pop_back();
  }
  if (b.size() > 8) return Error("integer too large (not in [-2^63, 2^64))");
  std::uint64_t v = ~std::uint64_t{0};
  for (std::size_t k = 0; k < b.size(); ++k) {
    v &= ~(std::uint64_t{0xff} << (8 * k));
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[k])) << (8 * k);
  }
  return Push(MakeInt(static_cast<std::int64_t>(v)));
}

// The dispatch table of the reader: one case per pickle opcode (protocols 0
// to 5), each a few lines, in the order of Python's pickletools. Kept as one
// switch so that a reader can hold it next to pickletools' table; the work of
// each case lives in the helpers above.
absl::Status Reader::Step(std::uint8_t op) {
  std::string data;
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
    case '(':
      marks_.push_back(stack_.size());
      {
        Entry mark;
        mark.mark = true;
        stack_.push_back(std::move(mark));
      }
      return absl::OkStatus();
    case '0':  // POP
      if (stack_.empty()) return Error("stack underflow in POP");
      if (stack_.back().mark) {
        stack_.pop_back();
        marks_.pop_back();
      } else {
        PopEntry();
      }
      return absl::OkStatus();
    case '1':  // POP_MARK
      return TakeFromMark(scratch_);
    case '2': {  // DUP
      MS_RETURN_IF_ERROR(CheckTopValue());
      if (IsContainer(stack_.back().value)) return Error("DUP of a container: not supported");
      PyValue v = stack_.back().value;
      return Push(std::move(v));
    }
    case 'N': return Push(PyValue());
    case 0x88: return Push(MakeBool(true));
    case 0x89: return Push(MakeBool(false));

    // ---- Integers.
    case 'I': {
      MS_RETURN_IF_ERROR(ReadLine(data));
      if (data == "01") return Push(MakeBool(true));
      if (data == "00") return Push(MakeBool(false));
      PyValue v;
      if (!ParseDecimal(data, v)) return Error("INT: not an integer in [-2^63, 2^64)");
      return Push(std::move(v));
    }
    case 'L': {
      MS_RETURN_IF_ERROR(ReadLine(data));
      if (!data.empty() && data.back() == 'L') data.pop_back();
      PyValue v;
      if (!ParseDecimal(data, v)) return Error("LONG: not an integer in [-2^63, 2^64)");
      return Push(std::move(v));
    }
    case 'J': {
      std::int32_t v;
      MS_RETURN_IF_ERROR(ReadLE(v));
      return Push(MakeInt(v));
    }
    case 'K': {
      std::uint8_t v;
      MS_RETURN_IF_ERROR(ReadLE(v));
      return Push(MakeInt(v));
    }
    case 'M': {
      std::uint16_t v;
      MS_RETURN_IF_ERROR(ReadLE(v));
      return Push(MakeInt(v));
    }
    case 0x8a: {
      std::uint8_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      MS_RETURN_IF_ERROR(ReadString(n, data));
      return Long(data);
    }
    case 0x8b: {
      std::int32_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      if (n < 0) return Error("LONG4 with a negative length");
      if (static_cast<std::uint64_t>(n) > kMaxLongBytes) return Error("integer too large (not in [-2^63, 2^64))");
      MS_RETURN_IF_ERROR(ReadString(static_cast<std::uint64_t>(n), data));
      return Long(data);
    }

    // ---- Floats.
    case 'F': {
      MS_RETURN_IF_ERROR(ReadLine(data));
      double d = 0;
      auto [p, ec] = std::from_chars(data.data(), data.data() + data.size(), d);
      if (ec != std::errc() || p != data.data() + data.size()) return Error("FLOAT: not a number");
      return Push(MakeFloat(d));
    }
    case 'G': {
      unsigned char b[8];
      MS_RETURN_IF_ERROR(ReadRaw(b, 8));
      std::uint64_t x = 0;
      for (unsigned char c : b) x = (x << 8) | c;
      return Push(MakeFloat(std::bit_cast<double>(x)));
    }

    // ---- Bytes and strings.
    case 'S': {  // a Python 2 str literal, as bytes
      MS_RETURN_IF_ERROR(ReadLine(data));
      if (data.size() < 2 || (data[0] != '\'' && data[0] != '"') || data.back() != data[0]) {
        return Error("STRING: argument is not quoted");
      }
      std::string out;
      for (std::size_t k = 1; k + 1 < data.size(); ++k) {
        char c = data[k];
        if (c != '\\') {
          out += c;
          continue;
        }
        if (++k + 1 >= data.size()) return Error("STRING: bad escape");
        char e = data[k];
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'a': out += '\a'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'v': out += '\v'; break;
          case '\\':
          case '\'':
          case '"': out += e; break;
          case 'x': {
            if (k + 2 >= data.size() - 1 || HexDigit(data[k + 1]) < 0 || HexDigit(data[k + 2]) < 0) {
              return Error("STRING: bad \\x escape");
            }
            out += static_cast<char>(HexDigit(data[k + 1]) * 16 + HexDigit(data[k + 2]));
            k += 2;
            break;
          }
          default:
            if (e >= '0' && e <= '7') {
              int v = e - '0';
              for (int d = 0; d < 2 && k + 2 < data.size() && data[k + 1] >= '0' && data[k + 1] <= '7'; ++d) {
                v = v * 8 + (data[++k] - '0');
              }
              out += static_cast<char>(v & 0xff);
            } else {
              out += '\\';
              out += e;
            }
        }
      }
      return Push(MakeStr(Kind::kBytes, std::move(out)));
    }
    case 'T': {
      std::int32_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      if (n < 0) return Error("BINSTRING with a negative length");
      MS_RETURN_IF_ERROR(ReadString(static_cast<std::uint64_t>(n), data));
      return Push(MakeStr(Kind::kBytes, std::move(data)));
    }
    case 'U':
    case 'C': {
      std::uint8_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      MS_RETURN_IF_ERROR(ReadString(n, data));
      return Push(MakeStr(Kind::kBytes, std::move(data)));
    }
    case 'B': {
      std::uint32_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      MS_RETURN_IF_ERROR(ReadString(n, data));
      return Push(MakeStr(Kind::kBytes, std::move(data)));
    }
    case 0x8e:
    case 0x96: {
      std::uint64_t n;
      MS_RETURN_IF_ERROR(ReadLE(n));
      MS_RETURN_IF_ERROR(ReadString(n, data));
      return Push(MakeStr(Kind::kBytes, std::move(data)));
    }
    case 'V': {  // raw-unicode-escape: latin-1 bytes with \uXXXX and \UXXXXXXXX
      MS_RETURN_IF_ERROR(ReadLine(data));
      std::string out;
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
          AppendUtf8(out, cp);
          k += 1 + digits;
        } else {
          AppendUtf8(out, c);
        }
      }
      return Push(MakeStr(Kind::kString, std::move(out)));
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
      MS_RETURN_IF_ERROR(ReadString(n, data));
      if (!ValidUtf8(data)) return Error(absl::StrCat("invalid UTF-8 in ", OpName(op)));
      return Push(MakeStr(Kind::kString, std::move(data)));
    }

    // ---- Containers.
    case ']':
    case 0x8f: {
      PyValue v;
      v.kind = Kind::kList;
      return Push(std::move(v));
    }
    case '}': {
      PyValue v;
      v.kind = Kind::kDict;
      return Push(std::move(v));
    }
    case ')': {
      PyValue v;
      v.kind = Kind::kTuple;
      return Push(std::move(v), 1);
    }
    case 'a': {
      MS_RETURN_IF_ERROR(CheckTopValue(2));
      scratch_.clear();
      scratch_.push_back(PopEntry());
      return AppendTo(stack_.size() - 1, scratch_);
    }
    case 'e':
    case 0x90: {
      MS_RETURN_IF_ERROR(TakeFromMark(scratch_));
      if (stack_.empty()) return Error(absl::StrCat("stack underflow in ", OpName(op)));
      return AppendTo(stack_.size() - 1, scratch_);
    }
    case 's': {
      MS_RETURN_IF_ERROR(CheckTopValue(3));
      scratch_.clear();
      Entry v = PopEntry();
      Entry k = PopEntry();
      scratch_.push_back(std::move(k));
      scratch_.push_back(std::move(v));
      return SetItems(stack_.size() - 1, scratch_);
    }
    case 'u': {
      MS_RETURN_IF_ERROR(TakeFromMark(scratch_));
      if (stack_.empty()) return Error("stack underflow in SETITEMS");
      return SetItems(stack_.size() - 1, scratch_);
    }
    case 'l':
    case 0x91: {
      MS_RETURN_IF_ERROR(TakeFromMark(scratch_));
      return MakeSequence(Kind::kList, scratch_);
    }
    case 't': {
      MS_RETURN_IF_ERROR(TakeFromMark(scratch_));
      return MakeSequence(Kind::kTuple, scratch_);
    }
    case 0x85:
    case 0x86:
    case 0x87: {
      std::size_t n = op - 0x84u;
      MS_RETURN_IF_ERROR(CheckTopValue(n));
      scratch_.clear();
      for (std::size_t k = 0; k < n; ++k) scratch_.push_back(PopEntry());
      std::reverse(scratch_.begin(), scratch_.end());
      return MakeSequence(Kind::kTuple, scratch_);
    }
    case 'd': {
      std::vector<Entry> kv;
      MS_RETURN_IF_ERROR(TakeFromMark(kv));
      PyValue v;
      v.kind = Kind::kDict;
      MS_RETURN_IF_ERROR(Push(std::move(v)));
      return SetItems(stack_.size() - 1, kv);
    }

    // ---- Memo.
    case 'p': {
      MS_RETURN_IF_ERROR(ReadLine(data));
      PyValue v;
      if (!ParseDecimal(data, v) || v.kind != Kind::kInt || (!v.is_unsigned && v.i < 0)) {
        return Error("PUT: bad memo index");
      }
      return Memo(v.is_unsigned ? v.u : static_cast<std::uint64_t>(v.i));
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
      MS_RETURN_IF_ERROR(ReadLine(data));
      PyValue v;
      if (!ParseDecimal(data, v) || v.kind != Kind::kInt || (!v.is_unsigned && v.i < 0)) {
        return Error("GET: bad memo index");
      }
      return Get(v.is_unsigned ? v.u : static_cast<std::uint64_t>(v.i));
    }
    case 'h': {
      std::uint8_t id;
      MS_RETURN_IF_ERROR(ReadLE(id));
      return Get(id);
    }
    case 'j': {
      std::uint32_t id;
      MS_RETURN_IF_ERROR(ReadLE(id));
      return Get(id);
    }
    default: return Error(absl::StrFormat("unknown opcode 0x%02x", op));
  }
}

absl::StatusOr<PyValue> Reader::Run() {
  while (!stopped_) {
    op_offset_ = base_ + pos_;
    if (!ReadByte(op_)) {
      return Error(op_offset_ == 0 ? std::string("empty input: not a pickle")
                                   : std::string("truncated input: no STOP opcode"));
    }
    MS_RETURN_IF_ERROR(Step(op_));
  }
  Entry root = PopEntry();
  return std::move(root.value);
}

}  // namespace

absl::StatusOr<PyValue> ReadPickle(std::istream& in, const std::string& source, const PickleReadOptions& options) {
  Reader r(in, source, options);
  return r.Run();
}

}  // namespace memscope
