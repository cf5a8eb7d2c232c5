// The one rule for text that reaches a terminal: what a file says (an owner,
// a frame's name, a phase label, a path) must not move the cursor, recolour
// the screen, set the window title or split a line. Every byte memscope
// prints goes through it: messages one line at a time (EscapeForTerminal),
// standard output and standard error as a stream (TerminalStreamBuf, which
// cli/main.cpp puts under std::cout and std::cerr), text and JSON alike.
//
// Escaped, everything else passing as it is:
//   - control characters: C0 (U+0000..U+001F: NUL, SOH, ESC, BEL, ...), DEL
//     (U+007F) and C1 (U+0080..U+009F, UTF-8 C2 80..C2 9F: CSI is U+009B,
//     OSC U+009D), as JSON writes them: \u001b, \u007f, \u009b. In a stream
//     of lines, the line break and the tab are kept (they are the tables'
//     own); in a one-line message they are \n and \t, and \r is \r.
//   - bytes that are not UTF-8 (base/utf8.h decides; a lone 0x9b is CSI to an
//     8-bit terminal) as \xNN, one per byte.
// JSON output stays valid JSON with the same values: its writers escape C0
// inside strings already and replace invalid UTF-8 by U+FFFD, so only DEL
// and C1 change, to JSON's own \u escapes.
//
//   EscapeForTerminal("own\x1b[31m\n\xff");  // "own\\u001b[31m\\n\\xff"
#ifndef MEMSCOPE_BASE_TERMINAL_TEXT_H_
#define MEMSCOPE_BASE_TERMINAL_TEXT_H_

#include <cstddef>
#include <streambuf>
#include <string>
#include <string_view>

namespace memscope {

// Whether line breaks and tabs pass (a stream of lines: the tables) or are
// escaped (one line: a message, a name inside a table row).
enum class TerminalLines { kKeep, kEscape };

// The length of the character at text[i] when a terminal may be given it as
// it is (1 for printable ASCII, 2 to 4 for valid UTF-8 above U+009F, and 1
// for \n and \t under kKeep); 0 when it must be escaped.
std::size_t TerminalSafeLength(std::string_view text, std::size_t i, TerminalLines lines);

// Appends `text` to `out` with every unsafe character escaped as above.
void AppendForTerminal(std::string& out, std::string_view text, TerminalLines lines);

// `text` fit for one line of a terminal (kEscape).
std::string EscapeForTerminal(std::string_view text);

// A stream buffer that escapes what is written to it (kKeep) and hands it on
// to `target` at once (no buffering of its own: the target buffers). A UTF-8
// sequence cut between two writes is held until its end comes; Finish()
// escapes a cut one left at the end. A failed write of the target makes
// sync() and the writes fail, so the stream's state says so.
class TerminalStreamBuf : public std::streambuf {
 public:
  explicit TerminalStreamBuf(std::streambuf* target) : target_(target) {}
  // Hands on what is held (a cut sequence, escaped) and syncs the target.
  // Returns false if the target failed.
  bool Finish();

 protected:
  int_type overflow(int_type c) override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;
  int sync() override;

 private:
  // Writes pending_ on, escaped; keeps a cut sequence at its end unless `all`.
  bool Drain(bool all);
  bool Put(const char* s, std::size_t n);

  std::streambuf* target_;
  std::string pending_;  // what came since the last write: at most a cut sequence between writes
  bool failed_ = false;
};

}  // namespace memscope

#endif  // MEMSCOPE_BASE_TERMINAL_TEXT_H_
