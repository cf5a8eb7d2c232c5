#include "allocator/sizes.h"

#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace memscope {

std::size_t RoundupPower2Index(std::size_t size) {
  const int log_size = 63 - std::countl_zero(static_cast<std::uint64_t>(size | 1));
  int index = log_size - 20;  // 2^20 = 1 MiB starts interval 0
  if (index < 0) index = 0;
  if (index > static_cast<int>(kRoundUpPowerOfTwoIntervals) - 1) {
    index = static_cast<int>(kRoundUpPowerOfTwoIntervals) - 1;
  }
  return static_cast<std::size_t>(index);
}

std::size_t RoundupPower2NextDivision(std::size_t size, std::size_t divisions) {
  if (std::has_single_bit(size)) return size;
  const std::size_t power2_floor = std::bit_floor(size);
  // divisions is a power of two >= 2; step = floor / divisions.
  const std::size_t step = power2_floor >> (63 - std::countl_zero(static_cast<std::uint64_t>(divisions)));
  if (step == 0) return power2_floor << 1;
  const std::size_t floor_to_step = size & ~(step - 1);
  return floor_to_step == size ? size : floor_to_step + step;
}

std::string FormatSize(std::uint64_t bytes) {
  if (bytes <= 1024) return absl::StrCat(bytes, " bytes");
  if (bytes <= 1048576) {
    return absl::StrFormat("%.2f KiB", static_cast<double>(bytes) / 1024.0);
  }
  if (bytes <= 1073741824ULL) {
    return absl::StrFormat("%.2f MiB", static_cast<double>(bytes) / 1048576.0);
  }
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / 1073741824.0);
}

std::string Counted(std::uint64_t n, std::string_view noun) {
  return absl::StrCat(n, " ", absl::string_view(noun.data(), noun.size()), n == 1 ? "" : "s");
}

absl::StatusOr<std::uint64_t> ParseSize(std::string_view std_text) {
  const absl::string_view text(std_text.data(), std_text.size());
  absl::string_view s = absl::StripAsciiWhitespace(text);
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  const absl::string_view number = s.substr(0, i);
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(i)));
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid size '", text, "': expected a number with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"));
  };
  if (number.empty()) return bad();
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value) || value < 0) return bad();
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "k" || unit == "kib")
    scale = 1024.0;
  else if (unit == "m" || unit == "mib")
    scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  else
    return bad();
  const double bytes = value * scale;
  if (bytes >= 18446744073709551615.0) {
    return absl::InvalidArgumentError(absl::StrCat("invalid size '", text, "': too large"));
  }
  if (bytes != std::floor(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid size '", text, "': not a whole number of bytes"));
  }
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace memscope
