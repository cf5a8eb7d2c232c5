// The one UTF-8 check: whether the bytes at a non-ASCII byte form one valid
// sequence (no overlong forms, no surrogates, nothing above U+10FFFF, as
// Python's decoder and nlohmann's say). The writers that must emit valid text
// (the JSON writer, the pickle's str) and the terminal escaping of messages
// (cli/main.cpp) all ask it. What a caller puts in place of an invalid
// sequence is its own rule: the JSON writer one U+FFFD per maximal invalid
// subpart (nlohmann's) or per byte (the Chrome trace's), the pickle one per
// byte, the terminal \xNN per byte.
//
//   const auto* s = reinterpret_cast<const unsigned char*>("\xC3\xA9t\xC3");  // "\u00e9t" and a cut sequence
//   Utf8Sequence(s, 4, 0);  // 2: "\u00e9"
//   Utf8Sequence(s, 4, 3);  // 0: the text ends inside the sequence
#ifndef MEMSCOPE_BASE_UTF8_H_
#define MEMSCOPE_BASE_UTF8_H_

#include <cstddef>
#include <string_view>

namespace memscope {

// The length (2 to 4) of the valid UTF-8 sequence starting with the byte
// s[i] >= 0x80 of the n bytes at s, or 0 when there is none; then, if `bad`
// is given, *bad = the bytes of its maximal invalid subpart (at least 1): the
// lead byte and the continuation bytes that were still possible (the text
// ending inside the sequence makes all of it one subpart).
inline std::size_t Utf8Sequence(const unsigned char* s, std::size_t n, std::size_t i, std::size_t* bad = nullptr) {
  const unsigned char c = s[i];
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
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
  if (bad != nullptr) *bad = 1;
  if (len == 0) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    if (i + k >= n) {
      if (bad != nullptr) *bad = k;
      return 0;
    }
    const unsigned char b = s[i + k];
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) {
      if (bad != nullptr) *bad = k;  // the byte that did not fit starts again
      return 0;
    }
  }
  return len;
}

// Whether `text` is valid UTF-8 throughout (the pickle reader's rule for a
// str: Python's decoder refuses anything else).
inline bool ValidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    const std::size_t len = Utf8Sequence(s, n, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

}  // namespace memscope

#endif  // MEMSCOPE_BASE_UTF8_H_
