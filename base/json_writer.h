// The streaming JSON writer: text appended to a buffer as values come, no
// tree. Everything memscope writes as JSON by hand goes through it (the
// report's hot parts, the HTML report's data, the Chrome trace, the JSON
// snapshot); nlohmann::json stays for reading and for small documents.
//
// Its output is byte for byte what nlohmann::json's dump(-1, ' ', false,
// error_handler_t::replace) prints for the same values written in the same
// order (a caller wanting nlohmann's std::map key order writes the keys
// sorted), unless a JsonStyle says otherwise:
//   - strings: '"', '\\' and the control characters escaped as nlohmann does
//     (\b \t \n \f \r, the others \u00xx in lower-case hex); text above
//     U+007F written as it is (base/utf8.h decides what is valid); invalid
//     UTF-8 replaced by U+FFFD, one for each maximal invalid subpart (the
//     byte that ended an invalid sequence is read again as a new start), as
//     nlohmann's replace handler does.
//   - numbers: integers as std::to_chars writes them (base/decimal.h).
//     Doubles are not written here: base/ uses no JSON library, and
//     nlohmann's shortest form is not std::to_chars's (exporters/json_double.h
//     writes them, through BeginRawValue).
//
//   std::string text;
//   JsonWriter w(text);                      // or JsonWriter w(out_stream)
//   w.BeginObject();
//   w.Key("bytes"); w.UInt(4096);
//   w.Key("name");  w.String("forward:0");
//   w.EndObject();
//   w.Finish();                              // hands on the rest (the destructor does too)
//   // text == R"({"bytes":4096,"name":"forward:0"})"
//
// A writer fills a buffer of its own and hands the text to its string,
// stream or pieces in blocks; Finish() hands on the rest and returns false if
// the stream failed. The string holds all of the text only after Finish().
//
// Raw mode, for the hot paths of long arrays (the Chrome trace's counter
// samples, the snapshot's entries): BeginRawValue gives room in the buffer,
// the caller writes the value's text there itself, EndRawValue takes its end.
//
// The calls of PickleWriter (exporters/pickle_writer.h) are here too
// (BeginDict, BeginList, BeginTuple, None, ...), so that one template writes a
// document in both formats and the two cannot drift apart.
#ifndef MEMSCOPE_BASE_JSON_WRITER_H_
#define MEMSCOPE_BASE_JSON_WRITER_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "base/decimal.h"

namespace memscope {

// How a JsonWriter writes; the defaults are nlohmann's dump(-1, ' ', false,
// error_handler_t::replace).
struct JsonStyle {
  // '<' becomes \u003c: the JSON of an HTML <script>, where no "</script>"
  // or "<!--" may appear.
  bool escape_lt = false;
  // Invalid UTF-8: one U+FFFD for each byte of it (PickleWriter's rule, and
  // the Chrome trace's) instead of one per maximal invalid subpart.
  bool replace_each_byte = false;
  // 0: all on one line. n > 0: nlohmann's dump(n) layout: each item of a
  // non-empty object or array on its own line, indented n spaces a level,
  // ": " after a key.
  int indent = 0;
};

class JsonWriter {
 public:
  // Appends to `out` (kept as it is; the text goes after it).
  explicit JsonWriter(std::string& out, JsonStyle style = {});
  // Writes to `out` in blocks of at most `block_bytes` (of about that much,
  // with Flush at the caller's own points: the Chrome trace's 64 KiB at an
  // event's end).
  explicit JsonWriter(std::ostream& out, JsonStyle style = {}, std::size_t block_bytes = 1 << 16);
  // Appends the text to `pieces` (kept as it is) in pieces of about 64 KiB:
  // text of megabytes held without the copies and the twice-touched memory
  // of a doubling string. The text is the pieces' concatenation.
  explicit JsonWriter(std::vector<std::string>& pieces, JsonStyle style = {});
  ~JsonWriter();
  JsonWriter(const JsonWriter&) = delete;
  JsonWriter& operator=(const JsonWriter&) = delete;

  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  // An object's key; the next call writes its value.
  void Key(std::string_view key) {
    Separate();
    Quoted(key);
    if (style_.indent > 0) {
      Put(": ", 2);
    } else {
      Put(':');
    }
    skip_separator_ = true;
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
  void Bool(bool v) {
    Separate();
    v ? Put("true", 4) : Put("false", 5);
  }
  void Null() {
    Separate();
    Put("null", 4);
  }

  // PickleWriter's names for the same calls. A tuple is an array in JSON.
  void BeginDict() { BeginObject(); }
  void EndDict() { EndObject(); }
  void BeginList() { BeginArray(); }
  void EndList() { EndArray(); }
  void BeginTuple(std::size_t /*arity*/) { BeginArray(); }
  void EndTuple() { EndArray(); }
  void None() { Null(); }

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
  // Text outside any JSON value (an HTML page around the data, a final
  // newline).
  void Verbatim(std::string_view text) { Put(text.data(), text.size()); }
  // The separator due before the next item, then a line break: the next
  // item starts a line of its own (the Chrome trace's one event a line, in
  // the one-line layout).
  void LineBreak() {
    Separate();
    Put('\n');
    skip_separator_ = true;
  }
  // Raw mode: one whole value (or, in an array, several items with the
  // commas between them) as text the caller writes in place: room for at
  // most `max_bytes` at the pointer returned, then EndRawValue with the end
  // of what was written. The caller writes valid JSON, escaped as above.
  char* BeginRawValue(std::size_t max_bytes) {
    Separate();
    Reserve(max_bytes);
    return data_ + pos_;
  }
  void EndRawValue(const char* end) { pos_ = static_cast<std::size_t>(end - data_); }

  // Hands what is buffered to the string or the stream. Returns false if
  // the stream failed.
  bool Finish();
  // Finish's hand-on, midway: the text so far goes to the target now, and
  // writing goes on. `buffered()` bytes are waiting.
  void Flush();
  std::size_t buffered() const { return pos_; }

  // A JSON string literal of `s`, escaped as `style` says, appended to `out`.
  static void AppendString(std::string& out, std::string_view s, JsonStyle style = {});

 private:
  void Open(char bracket) {
    Separate();
    Put(bracket);
    empty_.push_back(1);
  }
  void Close(char bracket) {
    const bool empty = empty_.back() != 0;
    empty_.pop_back();
    if (style_.indent > 0 && !empty) NewLine();
    Put(bracket);
  }
  void Separate() {
    if (skip_separator_) {
      skip_separator_ = false;
      return;
    }
    if (!empty_.empty()) {
      if (!empty_.back()) Put(',');
      empty_.back() = 0;
      if (style_.indent > 0) NewLine();
    }
  }
  void NewLine();  // '\n' and the indentation of the open containers
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
  JsonStyle style_;
  bool skip_separator_ = false;       // after a key or a line break: the next value needs no separator
  std::vector<unsigned char> empty_;  // per open container: 1 while nothing is written in it
};

}  // namespace memscope

#endif  // MEMSCOPE_BASE_JSON_WRITER_H_
