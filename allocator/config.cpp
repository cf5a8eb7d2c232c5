#include "allocator/config.h"

#include <atomic>
#include <bit>
#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

// Splits like PyTorch's lexer: ',', ':', '[' and ']' are tokens of their
// own; spaces are dropped.
std::vector<std::string> Lex(std::string_view text) {
  std::vector<std::string> tokens;
  std::string buf;
  for (char c : text) {
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      if (!buf.empty()) tokens.push_back(std::move(buf));
      buf.clear();
      tokens.emplace_back(1, c);
    } else if (c != ' ') {
      buf.push_back(c);
    }
  }
  if (!buf.empty()) tokens.push_back(std::move(buf));
  return tokens;
}

class Parser {
 public:
  explicit Parser(std::vector<std::string> tokens) : t_(std::move(tokens)) {}

  absl::Status Run(AllocatorConfig& config) {
    while (i_ < t_.size()) {
      const std::string key = t_[i_++];
      if (key == ",") return Error("empty setting (two commas in a row)");
      if (absl::Status s = Expect(key, ":"); !s.ok()) return s;
      absl::Status s;
      if (key == "max_split_size_mb") {
        s = ParseMb(key, config.max_split_size);
      } else if (key == "max_non_split_rounding_mb") {
        s = ParseMb(key, config.max_non_split_rounding_size);
      } else if (key == "garbage_collection_threshold") {
        s = ParseThreshold(key, config.garbage_collection_threshold);
      } else if (key == "roundup_power2_divisions") {
        if (i_ < t_.size() && t_[i_] == "[") config.roundup_power2_divisions_list = true;
        s = ParseDivisions(key, config.roundup_power2_divisions);
      } else if (key == "per_process_memory_fraction") {
        s = ParseFraction(key, config.per_process_memory_fraction);
      } else if (key == "expandable_segments") {
        s = ParseBool(key, config.expandable_segments);
      } else if (key == "release_lock_on_cudamalloc" || key == "pinned_use_cuda_host_register" ||
                 key == "pinned_use_host_register") {
        bool ignored = false;
        s = ParseBool(key, ignored);
      } else if (key == "pinned_num_register_threads") {
        std::size_t ignored = 0;
        s = ParseUnsigned(key, ignored);
      } else if (key == "backend") {
        const std::string* v = Next();
        if (v == nullptr) return Error(absl::StrCat("'", key, "' needs a value"));
        if (*v != "native") {
          return Error(
              absl::StrCat("backend '", *v, "' is not supported: memscope models the native caching allocator"));
        }
      } else {
        return Error(absl::StrCat("unknown key '", key, "'"));
      }
      if (!s.ok()) return s;
      config.keys.push_back(key);
      if (i_ < t_.size()) {
        if (t_[i_] != ",")
          return Error(absl::StrCat("expected ',' after the value of '", key, "', got '", t_[i_], "'"));
        ++i_;
        if (i_ == t_.size()) return Error("trailing ','");
      }
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status Error(absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("invalid allocator setting: ", what));
  }
  const std::string* Next() { return i_ < t_.size() ? &t_[i_++] : nullptr; }
  absl::Status Expect(absl::string_view key, absl::string_view token) {
    const std::string* v = Next();
    if (v == nullptr || *v != token) {
      return Error(absl::StrCat("expected '", token, "' after '", key, "'"));
    }
    return absl::OkStatus();
  }
  absl::Status ParseUnsigned(absl::string_view key, std::size_t& out) {
    const std::string* v = Next();
    std::uint64_t value = 0;
    if (v == nullptr || !absl::SimpleAtoi(*v, &value)) {
      return Error(absl::StrCat("'", key, "' needs a non-negative integer, got '", v ? *v : "", "'"));
    }
    out = value;
    return absl::OkStatus();
  }
  absl::Status ParseMb(absl::string_view key, std::size_t& out) {
    std::size_t mb = 0;
    if (absl::Status s = ParseUnsigned(key, mb); !s.ok()) return s;
    if (mb < kLargeBuffer / kMiB) {
      return Error(absl::StrCat("'", key, "' must be >= ", kLargeBuffer / kMiB, " (MB), got ", mb));
    }
    const std::size_t max_mb = std::numeric_limits<std::size_t>::max() / kMiB;
    out = (mb > max_mb ? max_mb : mb) * kMiB;
    return absl::OkStatus();
  }
  absl::Status ParseThreshold(absl::string_view key, double& out) {
    const std::string* v = Next();
    double value = 0;
    if (v == nullptr || !absl::SimpleAtod(*v, &value) || !(value > 0.0 && value < 1.0)) {
      return Error(absl::StrCat("'", key, "' must be a number in (0.0, 1.0), got '", v ? *v : "", "'"));
    }
    out = value;
    return absl::OkStatus();
  }
  // PyTorch: "per_process_memory_fraction is invalid, set it in [0.0, 1.0]".
  absl::Status ParseFraction(absl::string_view key, double& out) {
    const std::string* v = Next();
    double value = 0;
    if (v == nullptr || !absl::SimpleAtod(*v, &value) || !(value >= 0.0 && value <= 1.0)) {
      return Error(absl::StrCat("'", key, "' must be a number in [0.0, 1.0], got '", v ? *v : "", "'"));
    }
    out = value;
    return absl::OkStatus();
  }
  absl::Status ParseBool(absl::string_view key, bool& out) {
    const std::string* v = Next();
    if (v == nullptr || (*v != "True" && *v != "False")) {
      return Error(absl::StrCat("'", key, "' must be True or False, got '", v ? *v : "", "'"));
    }
    out = *v == "True";
    return absl::OkStatus();
  }
  absl::Status ParseDivisionValue(absl::string_view key, std::size_t& out) {
    if (absl::Status s = ParseUnsigned(key, out); !s.ok()) return s;
    if (out != 0 && !std::has_single_bit(out)) {
      return Error(absl::StrCat("'", key, "' divisions must be a power of 2 (or 0), got ", out));
    }
    return absl::OkStatus();
  }
  // Either one power of two for every interval, or [MB:div,...,>:div]. The
  // list semantics are PyTorch's, including its quirks: the first entry also
  // fills every interval below it, intervals not named stay 0, and '>' fills
  // from the last named interval (inclusive) to the end.
  absl::Status ParseDivisions(absl::string_view key, std::array<std::size_t, kRoundUpPowerOfTwoIntervals>& out) {
    if (i_ < t_.size() && t_[i_] != "[") {
      std::size_t d = 0;
      if (absl::Status s = ParseDivisionValue(key, d); !s.ok()) return s;
      if (d == 0) return Error(absl::StrCat("'", key, "' must be a power of 2, got 0"));
      out.fill(d);
      return absl::OkStatus();
    }
    if (i_ >= t_.size()) return Error(absl::StrCat("'", key, "' needs a value"));
    ++i_;  // '['
    bool first = true;
    std::size_t last_index = 0;
    while (true) {
      const std::string* interval = Next();
      if (interval == nullptr) return Error(absl::StrCat("'", key, "' list is missing ']'"));
      if (*interval == "]") break;
      if (absl::Status s = Expect(key, ":"); !s.ok()) return s;
      std::size_t d = 0;
      if (absl::Status s = ParseDivisionValue(key, d); !s.ok()) return s;
      if (*interval == ">") {
        for (std::size_t j = last_index; j < out.size(); ++j) out[j] = d;
      } else {
        std::uint64_t mb = 0;
        if (!absl::SimpleAtoi(*interval, &mb) || !std::has_single_bit(mb)) {
          return Error(absl::StrCat("'", key, "' intervals must be powers of 2 (in MB) or '>', got '", *interval, "'"));
        }
        std::size_t index = static_cast<std::size_t>(63 - std::countl_zero(mb));
        if (index > out.size() - 1) index = out.size() - 1;
        if (first) {
          for (std::size_t j = 0; j < index; ++j) out[j] = d;
          first = false;
        }
        out[index] = d;
        last_index = index;
      }
      if (i_ < t_.size() && t_[i_] == ",") ++i_;
    }
    return absl::OkStatus();
  }

  std::vector<std::string> t_;
  std::size_t i_ = 0;
};

}  // namespace

namespace {
std::atomic<std::uint64_t> parse_count{0};
}  // namespace

std::uint64_t AllocatorConfig::ParseCount() { return parse_count.load(std::memory_order_relaxed); }

absl::StatusOr<AllocatorConfig> AllocatorConfig::Parse(std::string_view text) {
  parse_count.fetch_add(1, std::memory_order_relaxed);
  AllocatorConfig config;
  config.text = std::string(text);
  Parser parser(Lex(text));
  if (absl::Status s = parser.Run(config); !s.ok()) return s;
  return config;
}

absl::StatusOr<AllocatorConfig> AllocatorConfig::FromEnvironment() {
  for (const char* name : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    if (const char* value = std::getenv(name); value != nullptr) {
      auto config = Parse(value);
      if (!config.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", config.status().message()));
      }
      return config;
    }
  }
  return AllocatorConfig{};
}

}  // namespace memscope
