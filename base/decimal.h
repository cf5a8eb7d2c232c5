// Integers as decimal text, the bytes std::to_chars writes (no leading
// zeros, '-' for negatives), in fewer instructions: a value is cut into
// 8-digit parts by at most two 64-bit divisions, and each part is written
// two digits at a time with 32-bit arithmetic. The hot path of the Chrome
// trace's counter samples and of the JSON writer's numbers.
//
//   char buf[kMaxDecimalBytes];
//   char* end = PutDecimal(buf, std::uint64_t{4096});  // "4096"
#ifndef MEMSCOPE_BASE_DECIMAL_H_
#define MEMSCOPE_BASE_DECIMAL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace memscope {

// The most bytes PutDecimal writes: 20 digits, or '-' and 19.
inline constexpr std::size_t kMaxDecimalBytes = 20;

namespace decimal_internal {

inline constexpr char kPairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

// Two digits of v < 100.
inline void Put2(char* p, std::uint32_t v) { std::memcpy(p, kPairs + 2 * v, 2); }
// Exactly four digits of v < 10000 (leading zeros kept).
inline void Put4(char* p, std::uint32_t v) {
  Put2(p, v / 100);
  Put2(p + 2, v % 100);
}
// Exactly eight digits of v < 10^8.
inline void Put8(char* p, std::uint32_t v) {
  Put4(p, v / 10000);
  Put4(p + 4, v % 10000);
}
// 1 to 4 digits of v < 10000, no leading zeros.
inline char* PutUpTo4(char* p, std::uint32_t v) {
  if (v < 10) {
    *p = static_cast<char>('0' + v);
    return p + 1;
  }
  if (v < 100) {
    Put2(p, v);
    return p + 2;
  }
  if (v < 1000) {
    *p = static_cast<char>('0' + v / 100);
    Put2(p + 1, v % 100);
    return p + 3;
  }
  Put4(p, v);
  return p + 4;
}
// 1 to 8 digits of v < 10^8, no leading zeros.
inline char* PutUpTo8(char* p, std::uint32_t v) {
  if (v < 10000) return PutUpTo4(p, v);
  p = PutUpTo4(p, v / 10000);
  Put4(p, v % 10000);
  return p + 4;
}

}  // namespace decimal_internal

inline char* PutDecimal(char* p, std::uint64_t v) {
  using namespace decimal_internal;
  constexpr std::uint64_t k1e8 = 100000000;
  if (v < k1e8) return PutUpTo8(p, static_cast<std::uint32_t>(v));
  if (v < k1e8 * k1e8) {
    p = PutUpTo8(p, static_cast<std::uint32_t>(v / k1e8));
    Put8(p, static_cast<std::uint32_t>(v % k1e8));
    return p + 8;
  }
  const std::uint64_t rest = v % (k1e8 * k1e8);
  p = PutUpTo4(p, static_cast<std::uint32_t>(v / (k1e8 * k1e8)));  // at most 1844
  Put8(p, static_cast<std::uint32_t>(rest / k1e8));
  Put8(p + 8, static_cast<std::uint32_t>(rest % k1e8));
  return p + 16;
}

inline char* PutDecimal(char* p, std::int64_t v) {
  if (v >= 0) return PutDecimal(p, static_cast<std::uint64_t>(v));
  *p = '-';
  return PutDecimal(p + 1, 0 - static_cast<std::uint64_t>(v));
}

}  // namespace memscope

#endif  // MEMSCOPE_BASE_DECIMAL_H_
