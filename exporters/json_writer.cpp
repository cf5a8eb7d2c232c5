#include "exporters/json_writer.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "nlohmann/json.hpp"

namespace memscope {
namespace {

constexpr std::size_t kBlock = 1 << 16;

// Which ASCII bytes a string cannot hold as they are: 1 = escape, 0 = copy.
struct EscapeTable {
  bool plain[256];
  constexpr explicit EscapeTable(bool lt) : plain() {
    for (int c = 0; c < 256; ++c) plain[c] = c >= 0x20 && c < 0x80 && c != '"' && c != '\\' && !(lt && c == '<');
  }
};
constexpr EscapeTable kPlain(false);
constexpr EscapeTable kPlainHtml(true);

// The length of the valid UTF-8 sequence at s[i] (2-4), or, when it is
// invalid, 0 with `bad` = the bytes of its maximal invalid subpart (at least
// 1): the lead byte and the continuation bytes that were still possible.
std::size_t Utf8Sequence(const unsigned char* s, std::size_t n, std::size_t i, std::size_t& bad) {
  const unsigned char c = s[i];
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  }
  bad = 1;
  if (len == 0) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    if (i + k >= n) {  // the text ends inside the sequence: all of it is one U+FFFD
      bad = k;
      return 0;
    }
    const unsigned char b = s[i + k];
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) {
      bad = k;  // the byte that did not fit starts again
      return 0;
    }
  }
  return len;
}

// Escaped `s` through `put(const char*, size)`.
template <typename Put>
void Escape(std::string_view text, bool escape_lt, Put&& put) {
  static constexpr char kHex[] = "0123456789abcdef";
  const bool* plain = escape_lt ? kPlainHtml.plain : kPlain.plain;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t run = 0;  // start of the bytes not yet written
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (plain[c]) {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      std::size_t bad = 0;
      const std::size_t len = Utf8Sequence(s, n, i, bad);
      if (len != 0) {
        i += len;
        continue;
      }
      put(text.data() + run, i - run);
      put("\xEF\xBF\xBD", 3);  // U+FFFD
      i += bad;
      run = i;
      continue;
    }
    put(text.data() + run, i - run);
    switch (c) {
      case '"': put("\\\"", 2); break;
      case '\\': put("\\\\", 2); break;
      case '\b': put("\\b", 2); break;
      case '\t': put("\\t", 2); break;
      case '\n': put("\\n", 2); break;
      case '\f': put("\\f", 2); break;
      case '\r': put("\\r", 2); break;
      default: {  // other control characters, and '<'
        const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
        put(esc, 6);
      }
    }
    ++i;
    run = i;
  }
  put(text.data() + run, n - run);
}

}  // namespace

JsonWriter::JsonWriter(std::string& out, bool escape_lt) : string_(&out), escape_lt_(escape_lt) {
  pos_ = out.size();
  // The string's size is the part written or zero-filled: it grows a block
  // at a time (Grow), so a large reserved capacity is not touched at once.
  out.resize(std::max(pos_ + 4096, std::min(out.capacity(), pos_ + kBlock)));
  data_ = out.data();
  cap_ = out.size();
}

JsonWriter::JsonWriter(std::ostream& out, bool escape_lt) : stream_(&out), escape_lt_(escape_lt) {
  own_.resize(kBlock);
  data_ = own_.data();
  cap_ = own_.size();
}

JsonWriter::~JsonWriter() { Finish(); }

void JsonWriter::Grow(std::size_t n) {
  if (string_ != nullptr) {
    // Capacity doubles (one copy of the text so far), but only a block past
    // what is needed is zero-filled: resizing to twice the size would clear,
    // and fault in, memory that may never be written.
    const std::size_t need = pos_ + n;
    if (need > string_->capacity()) string_->reserve(std::max(need, 2 * string_->capacity()));
    string_->resize(std::min(string_->capacity(), std::max(need, cap_ + kBlock)));
    data_ = string_->data();
    cap_ = string_->size();
    return;
  }
  stream_->write(data_, static_cast<std::streamsize>(pos_));
  pos_ = 0;
  if (n > cap_) {
    own_.resize(n);
    data_ = own_.data();
    cap_ = own_.size();
  }
}

bool JsonWriter::Finish() {
  if (string_ != nullptr) {
    string_->resize(pos_);
    cap_ = pos_;
    data_ = string_->data();
    return true;
  }
  if (pos_ > 0) stream_->write(data_, static_cast<std::streamsize>(pos_));
  pos_ = 0;
  return static_cast<bool>(*stream_);
}

void JsonWriter::Int(std::int64_t v) {
  Separate();
  Reserve(24);
  pos_ = static_cast<std::size_t>(std::to_chars(data_ + pos_, data_ + cap_, v).ptr - data_);
}

void JsonWriter::UInt(std::uint64_t v) {
  Separate();
  Reserve(24);
  pos_ = static_cast<std::size_t>(std::to_chars(data_ + pos_, data_ + cap_, v).ptr - data_);
}

// What nlohmann's serializer does with a double: its to_chars (Grisu2,
// shortest round trip, ".0" for integral values), "null" when not finite.
void JsonWriter::Double(double v) {
  Separate();
  if (!std::isfinite(v)) {
    Put("null", 4);
    return;
  }
  Reserve(64);
  pos_ = static_cast<std::size_t>(nlohmann::detail::to_chars(data_ + pos_, data_ + pos_ + 64, v) - data_);
}

void JsonWriter::Quoted(std::string_view s) {
  Reserve(s.size() + 2);
  const bool* plain = escape_lt_ ? kPlainHtml.plain : kPlain.plain;
  std::size_t i = 0;
  while (i < s.size() && plain[static_cast<unsigned char>(s[i])]) ++i;
  if (i == s.size()) {  // nothing to escape (keys, most values): copied
    data_[pos_] = '"';
    std::memcpy(data_ + pos_ + 1, s.data(), s.size());
    data_[pos_ + 1 + s.size()] = '"';
    pos_ += s.size() + 2;
    return;
  }
  data_[pos_++] = '"';
  Escape(s, escape_lt_, [this](const char* p, std::size_t n) { Put(p, n); });
  Put('"');
}

void JsonWriter::AppendString(std::string& out, std::string_view s, bool escape_lt) {
  out += '"';
  Escape(s, escape_lt, [&out](const char* p, std::size_t n) { out.append(p, n); });
  out += '"';
}

}  // namespace memscope
