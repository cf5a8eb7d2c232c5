// The values of every option, checked in one place before CLI11 converts
// them (CheckOptionValues in cli/commands.h).
#include <cerrno>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"

namespace memscope::cli {
namespace {

// The options where an empty value means something: --alloc-conf '' is the
// allocator's defaults (over $PYTORCH_CUDA_ALLOC_CONF).
bool EmptyMeansSomething(const CLI::Option& option) { return option.get_name() == "--alloc-conf"; }

// "" when `text` is an integer CLI11 reads as it is written (strtoll or
// strtoull with base 0, as CLI11 does), else why not: CLI11 itself would read
// 2^63 as INT64_MAX and -1 as 2^64 - 1 for an unsigned option.
std::string IntegerProblem(const std::string& text, bool is_unsigned) {
  if (text.empty()) return "";  // said by the empty check
  errno = 0;
  char* end = nullptr;
  if (is_unsigned) {
    if (text.find('-') != std::string::npos) return absl::StrCat(text, " is negative (use 0 or more)");
    (void)std::strtoull(text.c_str(), &end, 0);
    if (errno == ERANGE) return absl::StrCat(text, " is out of range (at most 18446744073709551615)");
  } else {
    (void)std::strtoll(text.c_str(), &end, 0);
    if (errno == ERANGE) {
      return absl::StrCat(text, " is out of range (", absl::StartsWith(text, "-") ? "at least -9223372036854775808"
                                                                               : "at most 9223372036854775807",
                          ")");
    }
  }
  return "";  // not a number at all: CLI11 says so
}

void CheckValues(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    if (option->get_type_size() == 0) continue;  // a flag: no value
    const std::string type = option->get_type_name();
    const bool is_integer = absl::StartsWith(type, "INT") || absl::StartsWith(type, "UINT");
    const bool is_unsigned = absl::StartsWith(type, "UINT");
    const bool refuse_empty = !EmptyMeansSomething(*option);
    option->check(CLI::Validator(
        [=](std::string& value) -> std::string {
          if (value.empty() && refuse_empty) return "the value is empty (give one, or leave the option out)";
          return is_integer ? IntegerProblem(value, is_unsigned) : "";
        },
        ""));
  }
  for (CLI::App* sub : app.get_subcommands({})) CheckValues(*sub);
}

}  // namespace

void CheckOptionValues(CLI::App& app) { CheckValues(app); }

}  // namespace memscope::cli
