#include "tensor/blas_workspace.h"

#include <cctype>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

std::optional<std::string> Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::nullopt : std::optional<std::string>(v);
}

// A run of decimal digits at `i` (advanced past it); nullopt when none or on
// overflow.
std::optional<std::size_t> Digits(std::string_view s, std::size_t& i) {
  const std::size_t start = i;
  std::size_t v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    const std::size_t d = static_cast<std::size_t>(s[i] - '0');
    if (v > (std::numeric_limits<std::size_t>::max() - d) / 10) return std::nullopt;
    v = v * 10 + d;
    ++i;
  }
  if (i == start) return std::nullopt;
  return v;
}

// std::regex(":([0-9]+):([0-9]+)") iterated over the value, as
// parseChosenWorkspaceSize does: the sum of SIZE KiB * COUNT, or nullopt
// when nothing matches.
std::optional<std::size_t> ParseCublasConfig(std::string_view s) {
  std::size_t total = 0;
  bool matched = false;
  std::size_t i = 0;
  while (i < s.size()) {
    if (s[i] != ':') {
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    const std::optional<std::size_t> size = Digits(s, j);
    if (!size || j >= s.size() || s[j] != ':') {
      ++i;
      continue;
    }
    ++j;
    const std::optional<std::size_t> count = Digits(s, j);
    if (!count) {
      ++i;
      continue;
    }
    matched = true;
    total += *size * 1024 * *count;
    i = j;
  }
  if (!matched) return std::nullopt;
  return total;
}

// std::stoi: optional spaces and sign, then digits (the rest ignored).
std::optional<long long> Stoi(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  const std::optional<std::size_t> v = Digits(s, i);
  if (!v || *v > static_cast<std::size_t>(std::numeric_limits<int>::max())) return std::nullopt;
  return negative ? -static_cast<long long>(*v) : static_cast<long long>(*v);
}

}  // namespace

BlasWorkspaceEnv BlasWorkspaceEnv::FromEnvironment() {
  return {Env("CUBLAS_WORKSPACE_CONFIG"), Env("CUBLASLT_WORKSPACE_SIZE"), Env("TORCH_CUBLASLT_UNIFIED_WORKSPACE")};
}

BlasWorkspaceSizes ChooseBlasWorkspaceSizes(const BlasWorkspaceEnv& env, bool hopper,
                                            std::vector<std::string>* warnings) {
  auto warn = [warnings](std::string w) {
    if (warnings != nullptr) warnings->push_back(std::move(w));
  };
  BlasWorkspaceSizes out;
  const std::size_t default_size = hopper ? kHopperCublasWorkspace : kDefaultCublasWorkspace;
  out.cublas = default_size;
  if (env.cublas_workspace_config) {
    if (std::optional<std::size_t> parsed = ParseCublasConfig(*env.cublas_workspace_config)) {
      out.cublas = *parsed;
    } else {
      warn(absl::StrCat("Could not parse CUBLAS_WORKSPACE_CONFIG, using default workspace size of ", default_size,
                        " bytes."));
    }
  }
  std::size_t lt_kib = kDefaultCublasLtWorkspace / 1024;
  if (env.cublaslt_workspace_size) {
    const std::optional<long long> v = Stoi(*env.cublaslt_workspace_size);
    if (!v || *v < 0) {
      warn(absl::StrCat("invalid CUBLASLT_WORKSPACE_SIZE, using default workspace size of ", lt_kib, " KiB."));
    } else {
      lt_kib = static_cast<std::size_t>(*v);
    }
  }
  out.cublaslt = lt_kib * 1024;
  const bool unified_explicit = env.cublaslt_unified && *env.cublaslt_unified == "1";
  const bool unified_off = env.cublaslt_unified && *env.cublaslt_unified == "0";
  if (!unified_off && out.cublas < out.cublaslt) {
    warn(absl::StrCat("Requested unified CUBLASLT workspace size of ", out.cublaslt,
                      " bytes exceeds CUBLAS workspace size of ", out.cublas,
                      " bytes. Please increase CUBLAS workspace size via CUBLAS_WORKSPACE_CONFIG or decrease "
                      "requested CUBLASLT_WORKSPACE_SIZE. Otherwise CUBLASLT workspace size will be limited to the "
                      "CUBLAS workspace size."));
    out.cublaslt = out.cublas;
  }
  if (unified_explicit) out.cublaslt = 0;  // cuBLASLt runs in the cuBLAS workspace
  return out;
}

}  // namespace memscope
