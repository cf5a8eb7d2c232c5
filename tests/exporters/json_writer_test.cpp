// The streaming JSON writer (base/json_writer.h) prints what nlohmann's
// dump(-1, ' ', false, replace) prints for the same values: exact strings for
// tricky doubles (exporters/json_double.h) and escapes, and agreement with
// nlohmann on many random byte strings (invalid UTF-8 included); with an
// indent, dump(indent)'s layout.
#include "base/json_writer.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <string_view>

#include "exporters/json_double.h"
#include "exporters/report.h"
#include "nlohmann/json.hpp"

using namespace memscope;
using nlohmann::json;

namespace {

std::string Dumped(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string WrittenDouble(double v) {
  std::string out;
  JsonWriter w(out);
  WriteJsonDouble(w, v);
  w.Finish();
  return out;
}

std::string WrittenString(const std::string& s, bool escape_lt = false) {
  std::string out;
  JsonWriter w(out, {.escape_lt = escape_lt});
  w.String(s);
  w.Finish();
  return out;
}

}  // namespace

TEST_CASE("json writer: doubles as nlohmann prints them") {
  // The exact strings, then agreement with nlohmann on each.
  CHECK(WrittenDouble(0.0) == "0.0");
  CHECK(WrittenDouble(-0.0) == "-0.0");
  CHECK(WrittenDouble(1.0) == "1.0");
  CHECK(WrittenDouble(0.1) == "0.1");
  CHECK(WrittenDouble(1.0 / 3.0) == "0.3333333333333333");
  CHECK(WrittenDouble(0.527) == "0.527");
  CHECK(WrittenDouble(1e-5) == "1e-05");
  CHECK(WrittenDouble(1e20) == "1e+20");
  CHECK(WrittenDouble(123456789012345680.0) == "1.2345678901234568e+17");
  CHECK(WrittenDouble(5e-324) == "5e-324");
  CHECK(WrittenDouble(std::numeric_limits<double>::max()) == "1.7976931348623157e+308");
  CHECK(WrittenDouble(std::nan("")) == "null");
  CHECK(WrittenDouble(std::numeric_limits<double>::infinity()) == "null");
  std::mt19937_64 rng(7);
  for (double v : {0.0, -0.0, 1.0, 0.1, 1.0 / 3.0, 0.527, 1e-5, 1e20, 1764093600123456.7, 123456789012345680.0, 5e-324,
                   std::numeric_limits<double>::max(), 100.0, 1e15, 1e16, 0.0001, 0.00001}) {
    CHECK(WrittenDouble(v) == Dumped(json(v)));
  }
  for (int i = 0; i < 20000; ++i) {
    const std::uint64_t bits = rng();
    double v;
    std::memcpy(&v, &bits, sizeof v);
    if (!std::isfinite(v)) continue;
    REQUIRE(WrittenDouble(v) == Dumped(json(v)));
    const double small = static_cast<double>(rng() % 1000000) / 1000.0;  // times in microseconds, fractions
    REQUIRE(WrittenDouble(small) == Dumped(json(small)));
  }
}

TEST_CASE("json writer: strings escaped as nlohmann escapes them") {
  CHECK(WrittenString("plain") == "\"plain\"");
  CHECK(WrittenString("q\"b\\s/") == "\"q\\\"b\\\\s/\"");
  CHECK(WrittenString("\b\t\n\f\r\x01\x1f\x7f") == "\"\\b\\t\\n\\f\\r\\u0001\\u001f\x7f\"");
  CHECK(WrittenString(std::string("nul\0x", 5)) == "\"nul\\u0000x\"");
  CHECK(WrittenString("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80") == "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"");
  // Invalid UTF-8: one U+FFFD per maximal invalid subpart.
  CHECK(WrittenString("a\xFFz") == "\"a\xEF\xBF\xBDz\"");
  CHECK(WrittenString("a\xE2\x82z") == "\"a\xEF\xBF\xBDz\"");                          // truncated 3-byte sequence: one
  CHECK(WrittenString("a\xE2\x82") == "\"a\xEF\xBF\xBD\"");                            // ... at the end too
  CHECK(WrittenString("\xE0\x80") == "\"\xEF\xBF\xBD\xEF\xBF\xBD\"");                  // overlong: two
  CHECK(WrittenString("\xED\xA0\x80") == "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"");  // a surrogate: three
  CHECK(WrittenString("\xC3\xC3\xA9") == "\"\xEF\xBF\xBD\xC3\xA9\"");
  // For HTML: '<' as \u003c, so "</script>" cannot end the data.
  CHECK(WrittenString("</script><!--", true) == "\"\\u003c/script>\\u003c!--\"");
  CHECK(WrittenString("</script>", false) == "\"</script>\"");

  // Random strings of tricky bytes agree with nlohmann, byte for byte.
  const unsigned char kBytes[] = {'a',  '<',  '"',  '\\', '\n', 0x01, 0x1f, 0x7f, 0x80, 0xbf, 0xc0, 0xc2,
                                  0xdf, 0xe0, 0xa0, 0xed, 0x9f, 0xef, 0xf0, 0x90, 0xf4, 0x8f, 0xf5, 0xff};
  std::mt19937 rng(42);
  for (int i = 0; i < 50000; ++i) {
    std::string s(rng() % 9, 'x');
    for (char& c : s) c = static_cast<char>(kBytes[rng() % sizeof kBytes]);
    std::string lt = Dumped(json(s));
    std::string escaped;
    for (char c : lt) escaped += c == '<' ? std::string("\\u003c") : std::string(1, c);
    REQUIRE(WrittenString(s) == lt);
    REQUIRE(WrittenString(s, true) == escaped);
    std::string appended;
    JsonWriter::AppendString(appended, s);
    REQUIRE(appended == lt);
  }
}

TEST_CASE("json writer: containers, keys and numbers as nlohmann dumps a tree") {
  const json tree = {{"a", json::array({1, -2, std::uint64_t{18446744073709551615ULL}, nullptr, true, false})},
                     {"b", json::object()},
                     {"c", {{"d", json::array()}, {"e", "x\ny"}}},
                     {"f", std::int64_t{-9223372036854775807LL - 1}},
                     {"g", 0.5}};
  std::string out = "prefix ";
  {
    JsonWriter w(out);
    w.BeginObject();
    w.Key("a");
    w.BeginArray();
    w.Int(1);
    w.Int(-2);
    w.UInt(18446744073709551615ULL);
    w.Null();
    w.Bool(true);
    w.Bool(false);
    w.EndArray();
    w.Key("b");
    w.BeginObject();
    w.EndObject();
    w.Key("c");
    w.BeginObject();
    w.Key("d");
    w.BeginArray();
    w.EndArray();
    w.Key("e");
    w.String("x\ny");
    w.EndObject();
    w.Key("f");
    w.Int(-9223372036854775807LL - 1);
    w.Key("g");
    w.Raw("0.5");
    w.EndObject();
  }  // the destructor finishes
  CHECK(out == "prefix " + Dumped(tree));

  // A stream writer writes the same text, across many blocks.
  std::ostringstream stream;
  std::string expected = "[";
  {
    JsonWriter w(stream);
    w.BeginArray();
    for (int i = 0; i < 100000; ++i) {
      w.String("item");
      expected += i == 0 ? "\"item\"" : ",\"item\"";
    }
    w.EndArray();
    CHECK(w.Finish());
  }
  expected += "]";
  CHECK(stream.str() == expected);
}

TEST_CASE("json writer: a writer to pieces writes the string writer's text, pieces moved in whole") {
  // Long strings (direct to the target), many small values (across blocks),
  // and a value already in pieces.
  const std::string long_text(70000, 'x');
  auto write = [&](JsonWriter& w, std::vector<std::string> inner) {
    w.BeginObject();
    w.Key("a");
    w.BeginArray();
    for (int i = 0; i < 30000; ++i) w.Int(i);
    w.EndArray();
    w.Key("b");
    w.String(long_text);
    w.Key("c");
    w.RawPieces(std::move(inner));
    w.Key("d");
    w.String("<end>");
    w.EndObject();
    w.Finish();
  };
  const std::vector<std::string> inner = {"[1,", "2", ",3]"};
  std::string expected;
  {
    JsonWriter w(expected, {.escape_lt = true});
    write(w, inner);
  }
  REQUIRE(expected.size() > 150000);
  CHECK(expected.find("\\u003cend>") != std::string::npos);
  CHECK(expected.find(",\"c\":[1,2,3],\"d\"") != std::string::npos);
  std::vector<std::string> pieces = {"kept "};
  {
    JsonWriter w(pieces, {.escape_lt = true});
    write(w, inner);
  }
  std::string joined;
  for (const std::string& p : pieces) joined += p;
  CHECK(joined == "kept " + expected);
  CHECK(pieces.size() > 3);
  CHECK(std::find(pieces.begin(), pieces.end(), std::string("2")) != pieces.end());  // moved in as it was
  for (const std::string& p : pieces) CHECK(!p.empty());
  // To a stream: copied.
  std::ostringstream stream;
  {
    JsonWriter w(stream, {.escape_lt = true});
    write(w, inner);
  }
  CHECK(stream.str() == expected);
}

TEST_CASE("json writer: the fragmentation object streamed is report.json's FRAG") {
  FragmentationInfo f;
  f.reserved = 20971520;
  f.allocated = 6291456;
  f.reserved_minus_allocated = 14680064;
  f.inactive_split_bytes = 14680064;
  f.free_in_segments = 14680064;
  f.largest_free_block = 8388608;
  f.fragmentation = 1.0 - 8388608.0 / 14680064.0;
  f.segments = 1;
  f.free_blocks = 2;
  f.fragmented_bytes = 14680064;  // all of it beside the live block
  f.fragmented_segments = 1;
  std::string out;
  JsonWriter w(out);
  WriteFragmentationJson(w, f);
  w.Finish();
  CHECK(out == Dumped(FragmentationJson(f)));
  CHECK(out ==
        "{\"allocated_bytes\":6291456,\"fragmentation\":0.4285714285714286,\"fragmented_bytes\":14680064,"
        "\"fragmented_ratio\":0.7,\"fragmented_segments\":1,\"free_blocks\":2,"
        "\"free_in_segments_bytes\":14680064,\"inactive_split_bytes\":14680064,\"largest_free_block_bytes\":8388608,"
        "\"releasable_bytes\":0,\"releasable_ratio\":0.0,\"releasable_segments\":0,"
        "\"reserved_bytes\":20971520,\"reserved_minus_allocated_bytes\":14680064,\"segments\":1}");
}

TEST_CASE("PutDecimal writes what std::to_chars writes") {
  const auto check_u = [](std::uint64_t v) {
    char want[32], got[32];
    const std::string_view w(want, static_cast<std::size_t>(std::to_chars(want, want + 32, v).ptr - want));
    const std::string_view g(got, static_cast<std::size_t>(PutDecimal(got, v) - got));
    INFO(v);
    REQUIRE(g == w);
  };
  const auto check_i = [](std::int64_t v) {
    char want[32], got[32];
    const std::string_view w(want, static_cast<std::size_t>(std::to_chars(want, want + 32, v).ptr - want));
    const std::string_view g(got, static_cast<std::size_t>(PutDecimal(got, v) - got));
    INFO(v);
    REQUIRE(g == w);
  };
  // Every power of ten and its neighbours (each length and each split point).
  std::uint64_t p = 1;
  for (int k = 0; k < 20; ++k, p *= 10) {
    for (const std::uint64_t v : {p - 1, p, p + 1, 2 * p - 1, 9 * p, p / 2}) {
      check_u(v);
      check_i(static_cast<std::int64_t>(v));
      check_i(-static_cast<std::int64_t>(v & 0x7fffffffffffffffULL));
    }
  }
  check_u(std::numeric_limits<std::uint64_t>::max());
  check_i(std::numeric_limits<std::int64_t>::max());
  check_i(std::numeric_limits<std::int64_t>::min());
  check_u(0);
  check_i(0);
  // Random values of every length.
  std::mt19937_64 rng(18);
  for (int i = 0; i < 200000; ++i) {
    const std::uint64_t bits = rng();
    const std::uint64_t v = bits >> (rng() % 64);
    check_u(v);
    check_i(static_cast<std::int64_t>(bits));
    check_i(static_cast<std::int64_t>(v));
  }
  // And in the JSON writer.
  std::string out;
  JsonWriter w(out);
  w.BeginArray();
  w.Int(-1);
  w.UInt(18446744073709551615ULL);
  w.Int(std::numeric_limits<std::int64_t>::min());
  w.UInt(0);
  w.EndArray();
  w.Finish();
  CHECK(out == "[-1,18446744073709551615,-9223372036854775808,0]");
}

TEST_CASE("json writer: with an indent, nlohmann's dump(indent) layout, PickleWriter's calls included") {
  const json tree = {{"a", json::array({1, "x", nullptr, json::array({2, 3})})},
                     {"b", json::object()},
                     {"c", {{"d", json::array()}, {"e", "\xff"}}},
                     {"f", 0.25}};
  for (const int indent : {1, 2}) {
    std::string out;
    JsonWriter w(out, {.indent = indent});
    w.BeginDict();
    w.Key("a");
    w.BeginList();
    w.Int(1);
    w.String("x");
    w.None();
    w.BeginTuple(2);
    w.UInt(2);
    w.UInt(3);
    w.EndTuple();
    w.EndList();
    w.Key("b");
    w.BeginDict();
    w.EndDict();
    w.Key("c");
    w.BeginDict();
    w.Key("d");
    w.BeginList();
    w.EndList();
    w.Key("e");
    w.String("\xff");
    w.EndDict();
    w.Key("f");
    WriteJsonDouble(w, 0.25);
    w.EndDict();
    w.Finish();
    INFO(indent);
    CHECK(out == tree.dump(indent, ' ', false, json::error_handler_t::replace));
  }
}

TEST_CASE("json writer: replace_each_byte writes one U+FFFD for each byte of invalid UTF-8") {
  const std::string truncated = "a\xF0\x9F\x98z";  // a 4-byte sequence cut after 3 bytes
  std::string subpart, each;
  JsonWriter::AppendString(subpart, truncated);
  JsonWriter::AppendString(each, truncated, {.replace_each_byte = true});
  CHECK(subpart == "\"a\xEF\xBF\xBDz\"");
  CHECK(each == "\"a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDz\"");
  std::string written;
  {
    JsonWriter w(written, {.replace_each_byte = true});
    w.String(truncated);
  }
  CHECK(written == each);
}

TEST_CASE("json writer: LineBreak puts the next item on a line of its own, after its comma") {
  std::string out;
  {
    JsonWriter w(out);
    w.BeginObject();
    w.Key("k");
    w.String("v");
    w.LineBreak();
    w.Key("items");
    w.BeginArray();
    for (int i = 0; i < 2; ++i) {
      w.LineBreak();
      w.Int(i);
    }
    w.LineBreak();
    char* p = w.BeginRawValue(2);  // raw mode after a line break
    std::memcpy(p, "{}", 2);
    w.EndRawValue(p + 2);
    w.Verbatim("\n");
    w.EndArray();
    w.EndObject();
  }
  CHECK(out == "{\"k\":\"v\",\n\"items\":[\n0,\n1,\n{}\n]}");
}
