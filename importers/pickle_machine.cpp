// The pickle reader's general opcode machine: Step (one case per opcode),
// Run (the loop), and the container and memo opcodes' work.

#include "importers/pickle_internal.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_format.h"

namespace memscope::pickle_internal {

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

namespace {

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

// A protocol 0 memo index (PUT, GET's argument): a decimal integer in [0, 2^64).
bool ParseMemoIndex(std::string_view t, std::uint64_t& id) {
  PyRef v;
  if (!ParseDecimal(t, v) || v.kind != PyKind::kInt ||
      (!(v.flags & kPyRefUnsigned) && static_cast<std::int64_t>(v.v) < 0)) {
    return false;
  }
  id = v.v;
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

}  // namespace

[[gnu::always_inline]] std::optional<std::size_t> Reader::FindStrKey(Builder& B, const PyRef& kr) {
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

absl::Status Reader::MakeTuple(FastVec<PyRef>& items, std::uint32_t level) {
  std::uint16_t h = 1;
  for (const PyRef& e : items) {
    if (IsContainerKind(e.kind)) h = std::max<std::uint16_t>(h, AddHeight(e.height));
  }
  MEMSCOPE_RETURN_IF_ERROR(CheckDepth(h));
  PyRef r = Store(PyKind::kTuple, items.data(), items.size(), h);
  Slot s;
  s.ref = r;
  s.level = level;
  stack_.push_back(s);
  return absl::OkStatus();
}

absl::Status Reader::SetItems(std::size_t target, FastVec<PyRef>& kv) {
  MEMSCOPE_RETURN_IF_ERROR(OpenTarget(target, PyKind::kDict));
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
    MEMSCOPE_RETURN_IF_ERROR(CheckDepth(h));
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
  MEMSCOPE_RETURN_IF_ERROR(CheckTopValue());
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

absl::Status Reader::Long(const unsigned char* b, std::size_t n) {
  PyRef r;
  if (!LongRef(b, n, r)) return Error("integer too large (not in [-2^63, 2^64))");
  return Push(r);
}

// The dispatch table of the reader: one case per pickle opcode (protocols 0
// to 5), each a few lines, in the order of Python's pickletools. Kept as one
// switch so that a reader can hold it next to pickletools' table; the work of
// each case lives in the helpers above and in the Reader class (pickle_internal.h).
absl::Status Reader::Step(std::uint8_t op) {
  // opcode dispatch: one case per pickle opcode (exempt from the 120-line rule)
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
      MEMSCOPE_RETURN_IF_ERROR(CheckDepth(mark.level));
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
      MEMSCOPE_RETURN_IF_ERROR(CheckTopValue());
      const Slot top = stack_.back();
      return Push(top.open() ? CopyOpen(top.ref) : top.ref);
    }
    case 'N': return Push(ScalarRef(PyKind::kNone, 0));
    case 0x88: return Push(BoolRef(true));
    case 0x89: return Push(BoolRef(false));

    // ---- Integers.
    case 'I': {
      MEMSCOPE_RETURN_IF_ERROR(ReadLine(text_));
      if (text_ == "01") return Push(BoolRef(true));
      if (text_ == "00") return Push(BoolRef(false));
      PyRef v;
      if (!ParseDecimal(text_, v)) return Error("INT: not an integer in [-2^63, 2^64)");
      return Push(v);
    }
    case 'L': {
      MEMSCOPE_RETURN_IF_ERROR(ReadLine(text_));
      if (!text_.empty() && text_.back() == 'L') text_.pop_back();
      PyRef v;
      if (!ParseDecimal(text_, v)) return Error("LONG: not an integer in [-2^63, 2^64)");
      return Push(v);
    }
    case 'J': {
      std::int32_t v;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(v));
      return Push(IntRef(v));
    }
    case 'K': {
      std::uint8_t v;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(v));
      return Push(IntRef(v));
    }
    case 'M': {
      std::uint16_t v;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(v));
      return Push(IntRef(v));
    }
    case 0x8a: {
      std::uint8_t n;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(n));
      unsigned char b[255];
      MEMSCOPE_RETURN_IF_ERROR(ReadRaw(b, n));
      return Long(b, n);
    }
    case 0x8b: {
      std::int32_t n;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(n));
      if (n < 0) return Error("LONG4 with a negative length");
      if (static_cast<std::uint64_t>(n) > kMaxLongBytes) return Error("integer too large (not in [-2^63, 2^64))");
      text_.clear();
      MEMSCOPE_RETURN_IF_ERROR(AppendBytes(static_cast<std::uint64_t>(n), text_));
      return Long(reinterpret_cast<const unsigned char*>(text_.data()), text_.size());
    }

    // ---- Floats.
    case 'F': {
      MEMSCOPE_RETURN_IF_ERROR(ReadLine(text_));
      double d = 0;
      auto [p, ec] = std::from_chars(text_.data(), text_.data() + text_.size(), d);
      if (ec != std::errc() || p != text_.data() + text_.size()) return Error("FLOAT: not a number");
      return Push(FloatRef(d));
    }
    case 'G': {
      unsigned char b[8];
      MEMSCOPE_RETURN_IF_ERROR(ReadRaw(b, 8));
      std::uint64_t x = 0;
      for (unsigned char c : b) x = (x << 8) | c;
      return Push(FloatRef(std::bit_cast<double>(x)));
    }

    // ---- Bytes and strings.
    case 'S': {  // a Python 2 str literal, as bytes
      MEMSCOPE_RETURN_IF_ERROR(ReadLine(text_));
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
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(n));
      if (n < 0) return Error("BINSTRING with a negative length");
      const std::size_t start = chars.size();
      MEMSCOPE_RETURN_IF_ERROR(AppendBytes(static_cast<std::uint64_t>(n), chars));
      return PushString(PyKind::kBytes, start);
    }
    case 'U':
    case 'C': {
      std::uint8_t n;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(n));
      const std::size_t start = chars.size();
      MEMSCOPE_RETURN_IF_ERROR(AppendBytes(n, chars));
      return PushString(PyKind::kBytes, start);
    }
    case 'B': {
      std::uint32_t n;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(n));
      const std::size_t start = chars.size();
      MEMSCOPE_RETURN_IF_ERROR(AppendBytes(n, chars));
      return PushString(PyKind::kBytes, start);
    }
    case 0x8e:
    case 0x96: {
      std::uint64_t n;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(n));
      const std::size_t start = chars.size();
      MEMSCOPE_RETURN_IF_ERROR(AppendBytes(n, chars));
      return PushString(PyKind::kBytes, start);
    }
    case 'V': {  // raw-unicode-escape: latin-1 bytes with \uXXXX and \UXXXXXXXX
      MEMSCOPE_RETURN_IF_ERROR(ReadLine(text_));
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
        MEMSCOPE_RETURN_IF_ERROR(ReadLE(n32));
        n = n32;
      } else if (op == 0x8c) {
        std::uint8_t n8;
        MEMSCOPE_RETURN_IF_ERROR(ReadLE(n8));
        n = n8;
      } else {
        MEMSCOPE_RETURN_IF_ERROR(ReadLE(n));
      }
      const std::size_t start = chars.size();
      MEMSCOPE_RETURN_IF_ERROR(AppendBytes(n, chars));
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
      MEMSCOPE_RETURN_IF_ERROR(CheckTopValue(2));
      scratch_.clear();
      const Slot top = stack_.back();
      stack_.pop_back();
      scratch_.push_back(FinishKeepRecord(top));
      return AppendTo(stack_.size() - 1, scratch_);
    }
    case 'e':
    case 0x90: {
      MEMSCOPE_RETURN_IF_ERROR(TakeFromMark(scratch_, nullptr, op == 'e'));
      if (stack_.empty()) return Error(absl::StrCat("stack underflow in ", OpName(op)));
      return AppendTo(stack_.size() - 1, scratch_);
    }
    case 's': {
      MEMSCOPE_RETURN_IF_ERROR(CheckTopValue(3));
      scratch_.resize(2);
      scratch_[1] = PopFinished();
      scratch_[0] = PopFinished();
      return SetItems(stack_.size() - 1, scratch_);
    }
    case 'u': {
      MEMSCOPE_RETURN_IF_ERROR(TakeFromMark(scratch_));
      if (stack_.empty()) return Error("stack underflow in SETITEMS");
      return SetItems(stack_.size() - 1, scratch_);
    }
    case 'l':
    case 0x91: {  // LIST, FROZENSET: a list holding the values above the MARK
      std::uint32_t level = 0;
      MEMSCOPE_RETURN_IF_ERROR(TakeFromMark(scratch_, &level));
      MEMSCOPE_RETURN_IF_ERROR(PushNew(PyKind::kList));
      stack_.back().level = level;
      return AppendTo(stack_.size() - 1, scratch_);
    }
    case 'd': {
      std::uint32_t level = 0;
      FastVec<PyRef> kv;
      MEMSCOPE_RETURN_IF_ERROR(TakeFromMark(kv, &level));
      MEMSCOPE_RETURN_IF_ERROR(PushNew(PyKind::kDict));
      stack_.back().level = level;
      return SetItems(stack_.size() - 1, kv);
    }
    case 't': {
      std::uint32_t level = 0;
      MEMSCOPE_RETURN_IF_ERROR(TakeFromMark(scratch_, &level));
      return MakeTuple(scratch_, level);
    }
    case 0x85:
    case 0x86:
    case 0x87: {
      std::size_t n = op - 0x84u;
      MEMSCOPE_RETURN_IF_ERROR(CheckTopValue(n));
      const std::uint32_t level = stack_[stack_.size() - n].level;
      scratch_.resize(n);
      for (std::size_t k = n; k-- > 0;) scratch_[k] = PopFinished();
      return MakeTuple(scratch_, level);
    }

    // ---- Memo.
    case 'p': {
      MEMSCOPE_RETURN_IF_ERROR(ReadLine(text_));
      std::uint64_t id;
      if (!ParseMemoIndex(text_, id)) return Error("PUT: bad memo index");
      return Memo(id);
    }
    case 'q': {
      std::uint8_t id;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(id));
      return Memo(id);
    }
    case 'r': {
      std::uint32_t id;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(id));
      return Memo(id);
    }
    case 0x94: return Memo(memo_count_);
    case 'g': {
      MEMSCOPE_RETURN_IF_ERROR(ReadLine(text_));
      std::uint64_t id;
      if (!ParseMemoIndex(text_, id)) return Error("GET: bad memo index");
      return Get(id);
    }
    case 'h': {
      std::uint8_t id;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(id));
      if (PushMemoFast(id)) return absl::OkStatus();
      return Get(id);
    }
    case 'j': {
      std::uint32_t id;
      MEMSCOPE_RETURN_IF_ERROR(ReadLE(id));
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

}  // namespace memscope::pickle_internal
