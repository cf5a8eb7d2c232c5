#include "base/json_writer.h"

#include <algorithm>
#include <memory>

#include "base/utf8.h"

namespace memscope {
namespace {

constexpr std::size_t kBlock = 1 << 16;
constexpr std::size_t kStringBlock = 1 << 12;

// Which ASCII bytes a string cannot hold as they are: 1 = escape, 0 = copy.
struct EscapeTable {
  bool plain[256];
  constexpr explicit EscapeTable(bool lt) : plain() {
    for (int c = 0; c < 256; ++c) plain[c] = c >= 0x20 && c < 0x80 && c != '"' && c != '\\' && !(lt && c == '<');
  }
};
constexpr EscapeTable kPlain(false);
constexpr EscapeTable kPlainHtml(true);

// Escaped `s` through `put(const char*, size)`.
template <typename Put>
void Escape(std::string_view text, const JsonStyle& style, Put&& put) {
  static constexpr char kHex[] = "0123456789abcdef";
  const bool* plain = style.escape_lt ? kPlainHtml.plain : kPlain.plain;
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
      const std::size_t len = Utf8Sequence(s, n, i, &bad);
      if (len != 0) {
        i += len;
        continue;
      }
      put(text.data() + run, i - run);
      put("\xEF\xBF\xBD", 3);  // U+FFFD
      i += style.replace_each_byte ? 1 : bad;
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

// Every writer fills a buffer of its own (never zero-filled: a string's
// resize would write every byte twice) and hands it to the target when full.
JsonWriter::JsonWriter(std::string& out, JsonStyle style) : string_(&out), style_(style) {
  own_ = std::make_unique_for_overwrite<char[]>(kStringBlock);
  data_ = own_.get();
  cap_ = kStringBlock;
}

JsonWriter::JsonWriter(std::ostream& out, JsonStyle style, std::size_t block_bytes) : stream_(&out), style_(style) {
  own_ = std::make_unique_for_overwrite<char[]>(block_bytes);
  data_ = own_.get();
  cap_ = block_bytes;
}

JsonWriter::JsonWriter(std::vector<std::string>& pieces, JsonStyle style) : pieces_(&pieces), style_(style) {
  own_ = std::make_unique_for_overwrite<char[]>(kBlock);
  data_ = own_.get();
  cap_ = kBlock;
}

JsonWriter::~JsonWriter() { Finish(); }

void JsonWriter::Hand(const char* s, std::size_t n) {
  if (string_ != nullptr) {
    string_->append(s, n);
  } else if (pieces_ != nullptr) {
    if (n > 0) pieces_->emplace_back(s, n);
  } else {
    stream_->write(s, static_cast<std::streamsize>(n));
  }
}

void JsonWriter::RawPieces(std::vector<std::string>&& pieces) {
  if (pieces_ == nullptr) return RawPieces(static_cast<const std::vector<std::string>&>(pieces));
  Separate();
  if (pos_ > 0) Hand(data_, pos_);
  pos_ = 0;
  for (std::string& piece : pieces) {
    if (!piece.empty()) pieces_->push_back(std::move(piece));
  }
  pieces.clear();
}

void JsonWriter::NewLine() {
  const std::size_t spaces = static_cast<std::size_t>(style_.indent) * empty_.size();
  Reserve(1 + spaces);
  data_[pos_] = '\n';
  std::memset(data_ + pos_ + 1, ' ', spaces);
  pos_ += 1 + spaces;
}

void JsonWriter::Grow(std::size_t n) {
  Hand(data_, pos_);
  pos_ = 0;
  if (n > cap_) {
    own_ = std::make_unique_for_overwrite<char[]>(n);
    data_ = own_.get();
    cap_ = n;
  }
}

void JsonWriter::PutLong(const char* s, std::size_t n) {
  Hand(data_, pos_);
  pos_ = 0;
  Hand(s, n);
}

void JsonWriter::Flush() {
  if (pos_ > 0) Hand(data_, pos_);
  pos_ = 0;
}

bool JsonWriter::Finish() {
  Flush();
  return stream_ == nullptr || static_cast<bool>(*stream_);
}

void JsonWriter::Quoted(std::string_view s) {
  Reserve(s.size() + 2);
  const bool* plain = style_.escape_lt ? kPlainHtml.plain : kPlain.plain;
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
  Escape(s, style_, [this](const char* p, std::size_t n) { Put(p, n); });
  Put('"');
}

void JsonWriter::AppendString(std::string& out, std::string_view s, JsonStyle style) {
  out += '"';
  Escape(s, style, [&out](const char* p, std::size_t n) { out.append(p, n); });
  out += '"';
}

}  // namespace memscope
