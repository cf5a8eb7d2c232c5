// A streaming JSON writer: text appended to a buffer as values come, no tree.
// Its output is byte for byte what nlohmann::json's dump(-1, ' ', false,
// error_handler_t::replace) prints for the same values written in the same
// order (a caller wanting nlohmann's std::map key order writes the keys
// sorted):
//   - strings: '"', '\\' and the control characters escaped as nlohmann does
//     (\b \t \n \f \r, the others \u00xx in lower-case hex); text above
//     U+007F written as it is; invalid UTF-8 replaced by U+FFFD, one for each
//     maximal invalid subpart (the byte that ended an invalid sequence is
//     read again as a new start), as nlohmann's replace handler does. With
//     `escape_lt`, '<' becomes \u003c (the JSON of an HTML <script>, where no
//     "</script>" or "<!--" may appear).
//   - doubles: nlohmann's own shortest round-trip form (1.0, 0.1, 1e-05,
//     1e+20); not finite: null.
//
//   std::string text;
//   JsonWriter w(text);                      // or JsonWriter w(out_stream)
//   w.BeginObject();
//   w.Key("bytes"); w.UInt(4096);
//   w.Key("name");  w.String("forward:0");
//   w.EndObject();
//   w.Finish();                              // hands on the rest (the destructor does too)
//
// A writer fills a buffer of its own and hands the text to its string,
// stream or pieces in blocks; Finish() hands on the rest and returns false if the
// stream failed. The string holds all of the text only after Finish().
#ifndef MEMSCOPE_EXPORTERS_JSON_WRITER_H_
#define MEMSCOPE_EXPORTERS_JSON_WRITER_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "exporters/decimal.h"

namespace memscope {

class JsonWriter {
 public:
  // Appends to `out` (kept as it is; the text goes after it).
  explicit JsonWriter(std::string& out, bool escape_lt = false);
  // Writes to `out` in blocks of about 64 KiB.
  explicit JsonWriter(std::ostream& out, bool escape_lt = false);
  // Appends the text to `pieces` (kept as it is) in pieces of about 64 KiB:
  // text of megabytes held without the copies and the twice-touched memory
  // of a doubling string. The text is the pieces' concatenation.
  explicit JsonWriter(std::vector<std::string>& pieces, bool escape_lt = false);
  ~JsonWriter();
  JsonWriter(const JsonWriter&) = delete;
  JsonWriter& operator=(const JsonWriter&) = delete;

  void BeginObject() {
    Separate();
    Put('{');
    first_.push_back(1);
  }
  void EndObject() {
    first_.pop_back();
    Put('}');
  }
  void BeginArray() {
    Separate();
    Put('[');
    first_.push_back(1);
  }
  void EndArray() {
    first_.pop_back();
    Put(']');
  }
  // An object's key; the next call writes its value.
  void Key(std::string_view key) {
    Separate();
    Quoted(key);
    Put(':');
    after_key_ = true;
  }
  void String(std::string_view s) {
    Separate();
    Quoted(s);
  }
  void Int(std::int64_t v) {
    Separate();
    Reserve(kMaxDecimalBytes);
    pos_ = static_cast<std::size_t>(PutDecimal(data_ + pos_, v) - data_);
  }
  void UInt(std::uint64_t v) {
    Separate();
    Reserve(kMaxDecimalBytes);
    pos_ = static_cast<std::size_t>(PutDecimal(data_ + pos_, v) - data_);
  }
  void Double(double v);
  void Bool(bool v) {
    Separate();
    v ? Put("true", 4) : Put("false", 5);
  }
  void Null() {
    Separate();
    Put("null", 4);
  }
  // A value already in JSON text (written by another JsonWriter or by
  // nlohmann's dump), copied as it is.
  void Raw(std::string_view json) {
    Separate();
    Put(json.data(), json.size());
  }
  // Raw() of a value whose text is the concatenation of `pieces`. A writer
  // to pieces moves them in as they are (no copy; `pieces` is left empty);
  // the others copy them.
  void RawPieces(const std::vector<std::string>& pieces) {
    Separate();
    for (const std::string& piece : pieces) Put(piece.data(), piece.size());
  }
  void RawPieces(std::vector<std::string>&& pieces);
  // Text outside any JSON value (an HTML page around the data).
  void Verbatim(std::string_view text) { Put(text.data(), text.size()); }
  // One whole value as text the caller writes in place (the hot paths of
  // long arrays): room for at most `max_bytes`, then EndRawValue with the
  // end of what was written. The caller writes valid JSON, escaped as above.
  char* BeginRawValue(std::size_t max_bytes) {
    Separate();
    Reserve(max_bytes);
    return data_ + pos_;
  }
  void EndRawValue(const char* end) { pos_ = static_cast<std::size_t>(end - data_); }

  // Hands what is buffered to the string or the stream. Returns false if
  // the stream failed.
  bool Finish();

  // A JSON string literal of `s`, escaped as above, appended to `out`.
  static void AppendString(std::string& out, std::string_view s, bool escape_lt = false);

 private:
  void Separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) Put(',');
      first_.back() = 0;
    }
  }
  void Reserve(std::size_t n) {
    if (pos_ + n > cap_) Grow(n);
  }
  void Put(char c) {
    Reserve(1);
    data_[pos_++] = c;
  }
  void Put(const char* s, std::size_t n) {
    if (n >= 4096) return PutLong(s, n);  // long texts (a rank's data) go to the target as they are
    Reserve(n);
    std::memcpy(data_ + pos_, s, n);
    pos_ += n;
  }
  void Grow(std::size_t n);
  void PutLong(const char* s, std::size_t n);
  void Hand(const char* s, std::size_t n);  // to the string or the stream
  void Quoted(std::string_view s);

  std::string* string_ = nullptr;   // the target, or:
  std::ostream* stream_ = nullptr;  // or:
  std::vector<std::string>* pieces_ = nullptr;
  std::unique_ptr<char[]> own_;  // the buffer: its first pos_ bytes are the text not yet handed on
  char* data_ = nullptr;
  std::size_t pos_ = 0;  // bytes written into data_
  std::size_t cap_ = 0;
  bool escape_lt_ = false;
  bool after_key_ = false;
  std::vector<unsigned char> first_;  // per open container: 1 while nothing is written in it
};

}  // namespace memscope

#endif  // MEMSCOPE_EXPORTERS_JSON_WRITER_H_
