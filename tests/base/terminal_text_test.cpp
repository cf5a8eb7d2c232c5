// The one terminal-escaping rule: what a file says cannot drive the terminal.
#include "base/terminal_text.h"

#include <catch2/catch.hpp>
#include <sstream>
#include <string>

using namespace memscope;

TEST_CASE("control characters are escaped as JSON writes them and bytes that are not UTF-8 one by one") {
  CHECK(EscapeForTerminal("plain owner.layer1 \xc3\xa9\xe2\x82\xac") == "plain owner.layer1 \xc3\xa9\xe2\x82\xac");
  CHECK(EscapeForTerminal("\x1b[31mred") == "\\u001b[31mred");              // ESC (CSI)
  CHECK(EscapeForTerminal("\x1b]0;title\x07") == "\\u001b]0;title\\u0007");  // OSC title, BEL
  CHECK(EscapeForTerminal(std::string("a\0b\x01", 4)) == "a\\u0000b\\u0001");
  CHECK(EscapeForTerminal("del\x7f") == "del\\u007f");
  CHECK(EscapeForTerminal("line\nbreak\ttab\rcr") == "line\\nbreak\\ttab\\rcr");
  // C1 as UTF-8 (U+009B CSI, U+0085 NEL) and as raw bytes; U+00A0 is printable.
  CHECK(EscapeForTerminal("\xc2\x9b" "1m\xc2\x85\xc2\xa0") == "\\u009b1m\\u0085\xc2\xa0");
  CHECK(EscapeForTerminal("\x9b" "1m\xff\xc3") == "\\x9b1m\\xff\\xc3");
  CHECK(EscapeForTerminal("\xed\xa0\x80") == "\\xed\\xa0\\x80");  // a surrogate is not UTF-8
}

TEST_CASE("a stream of lines keeps its line breaks and tabs and escapes the rest") {
  std::string out;
  AppendForTerminal(out, "rank 0\tok\n\x1b[2J\n", TerminalLines::kKeep);
  CHECK(out == "rank 0\tok\n\\u001b[2J\n");
  CHECK(TerminalSafeLength("\n", 0, TerminalLines::kKeep) == 1);
  CHECK(TerminalSafeLength("\n", 0, TerminalLines::kEscape) == 0);
  CHECK(TerminalSafeLength("\xe2\x82\xac", 0, TerminalLines::kKeep) == 3);
  CHECK(TerminalSafeLength("\xc2\x9b", 0, TerminalLines::kKeep) == 0);
}

TEST_CASE("the stream buffer escapes what passes through it, a UTF-8 sequence cut between writes kept whole") {
  std::ostringstream target;
  TerminalStreamBuf buf(target.rdbuf());
  std::ostream out(&buf);
  out << "owner \xe2\x82";  // the euro sign, cut
  out.flush();
  CHECK(target.str() == "owner ");
  out << "\xac and \x1b[31m\n" << "\xc2";
  out << "\x9b" << 'x' << "\x7f";
  CHECK(target.str() == "owner \xe2\x82\xac and \\u001b[31m\n\\u009bx\\u007f");
  out << "\xf0\x9f";  // a cut sequence at the very end is escaped by Finish
  CHECK(buf.Finish());
  CHECK(target.str() == "owner \xe2\x82\xac and \\u001b[31m\n\\u009bx\\u007f\\xf0\\x9f");
  CHECK(out.good());
}

TEST_CASE("JSON through the stream stays JSON with the same values: DEL and C1 become JSON's own escapes") {
  std::ostringstream target;
  TerminalStreamBuf buf(target.rdbuf());
  std::ostream out(&buf);
  out << "{\"owner\":\"a\x7f\xc2\x9b\\u001b\"}\n";
  CHECK(target.str() == "{\"owner\":\"a\\u007f\\u009b\\u001b\"}\n");
}
