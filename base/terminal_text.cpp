#include "base/terminal_text.h"

#include "base/utf8.h"

namespace memscope {
namespace {

const unsigned char* Bytes(std::string_view text) { return reinterpret_cast<const unsigned char*>(text.data()); }

// Whether the bytes at text[i] are a C1 control in UTF-8 (C2 80..C2 9F).
bool IsC1(std::string_view text, std::size_t i) {
  return i + 1 < text.size() && Bytes(text)[i] == 0xC2 && Bytes(text)[i + 1] >= 0x80 && Bytes(text)[i + 1] < 0xA0;
}

// Appends the escape of the unsafe character at text[i]; returns its length.
std::size_t AppendEscape(std::string& out, std::string_view text, std::size_t i) {
  static constexpr char kHex[] = "0123456789abcdef";
  const unsigned char c = Bytes(text)[i];
  auto code = [&out](const char* prefix, unsigned char v) {
    out += prefix;
    out += kHex[v >> 4];
    out += kHex[v & 15];
  };
  if (c == '\n') {
    out += "\\n";
  } else if (c == '\t') {
    out += "\\t";
  } else if (c == '\r') {
    out += "\\r";
  } else if (c < 0x80) {
    code("\\u00", c);
  } else if (IsC1(text, i)) {
    code("\\u00", Bytes(text)[i + 1]);
    return 2;
  } else {
    code("\\x", c);
  }
  return 1;
}

// Where a UTF-8 sequence that `text` ends inside begins (text.size() when
// it ends on a whole character): a valid lead byte whose sequence lacks only
// bytes still to come.
std::size_t CutSequenceStart(std::string_view text) {
  const std::size_t n = text.size();
  for (std::size_t i = n > 3 ? n - 3 : 0; i < n; ++i) {
    const unsigned char c = Bytes(text)[i];
    if (c < 0xC2 || c > 0xF4) continue;
    std::size_t bad = 0;
    if (Utf8Sequence(Bytes(text), n, i, &bad) == 0 && bad == n - i) return i;
  }
  return n;
}

}  // namespace

std::size_t TerminalSafeLength(std::string_view text, std::size_t i, TerminalLines lines) {
  const unsigned char c = Bytes(text)[i];
  if (c >= 0x20 && c < 0x7F) return 1;
  if (c == '\n' || c == '\t') return lines == TerminalLines::kKeep ? 1 : 0;
  if (c < 0x80) return 0;  // the other C0 controls and DEL
  if (IsC1(text, i)) return 0;
  return Utf8Sequence(Bytes(text), text.size(), i);
}

void AppendForTerminal(std::string& out, std::string_view text, TerminalLines lines) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = TerminalSafeLength(text, i, lines);
    if (n > 0) {
      out.append(text.data() + i, n);
      i += n;
    } else {
      i += AppendEscape(out, text, i);
    }
  }
}

std::string EscapeForTerminal(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  AppendForTerminal(out, text, TerminalLines::kEscape);
  return out;
}

bool TerminalStreamBuf::Put(const char* s, std::size_t n) {
  if (n == 0 || failed_) return !failed_;
  if (target_->sputn(s, static_cast<std::streamsize>(n)) != static_cast<std::streamsize>(n)) failed_ = true;
  return !failed_;
}

bool TerminalStreamBuf::Drain(bool all) {
  const std::string_view text(pending_);
  const std::size_t end = all ? text.size() : CutSequenceStart(text);
  const std::string_view whole = text.substr(0, end);
  std::size_t run = 0;  // the start of the safe bytes not yet written
  std::string escape;
  for (std::size_t i = 0; i < whole.size();) {
    const std::size_t n = TerminalSafeLength(whole, i, TerminalLines::kKeep);
    if (n > 0) {
      i += n;
      continue;
    }
    Put(whole.data() + run, i - run);
    escape.clear();
    i += AppendEscape(escape, whole, i);
    Put(escape.data(), escape.size());
    run = i;
  }
  Put(whole.data() + run, whole.size() - run);
  pending_.erase(0, end);
  return !failed_;
}

std::streamsize TerminalStreamBuf::xsputn(const char* s, std::streamsize n) {
  pending_.append(s, static_cast<std::size_t>(n));
  return Drain(false) ? n : 0;
}

TerminalStreamBuf::int_type TerminalStreamBuf::overflow(int_type c) {
  if (traits_type::eq_int_type(c, traits_type::eof())) return sync() == 0 ? traits_type::not_eof(c) : c;
  const char ch = traits_type::to_char_type(c);
  return xsputn(&ch, 1) == 1 ? c : traits_type::eof();
}

int TerminalStreamBuf::sync() { return Drain(false) && target_->pubsync() == 0 ? 0 : -1; }

bool TerminalStreamBuf::Finish() { return Drain(true) && target_->pubsync() == 0; }

}  // namespace memscope
