#include "run/torch_version.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace memscope {
namespace {

// A PYTORCH_CUDA_ALLOC_CONF setting and the release that added it. Settings
// not listed are accepted under every modelled release: max_split_size_mb,
// garbage_collection_threshold and roundup_power2_divisions (one number) are
// in 1.13; the release of backend, release_lock_on_cudamalloc and the
// pinned_* keys was not verified (they do not change device memory here).
struct AddedSetting {
  const char* key;
  TorchVersion since;
  const char* change;
};
constexpr AddedSetting kAddedSettings[] = {
    {"expandable_segments", {2, 1}, "pytorch/pytorch#100184"},
    {"max_non_split_rounding_mb", {2, 6}, "pytorch/pytorch#136174"},
    {"per_process_memory_fraction", {2, 9}, "CUDAAllocatorConfig.cpp of 2.9"},
};
constexpr AddedSetting kRoundupList = {"roundup_power2_divisions", {2, 0}, "pytorch/pytorch#87290"};

absl::Status Refuse(const AddedSetting& s, const char* what, TorchVersion v) {
  return absl::InvalidArgumentError(absl::StrCat(s.key, what, " needs PyTorch ", TorchVersionText(s.since),
                                                 " or later (", s.change, "); this run is --torch-version ",
                                                 TorchVersionText(v)));
}

}  // namespace

absl::StatusOr<TorchVersion> ParseTorchVersion(std::string_view given) {
  const absl::string_view text(given.data(), given.size());
  const std::vector<absl::string_view> parts = absl::StrSplit(text, '.');
  TorchVersion v{0, 0};
  const bool digits = parts.size() == 2 && !parts[0].empty() && !parts[1].empty() &&
                      parts[0].find_first_not_of("0123456789") == absl::string_view::npos &&
                      parts[1].find_first_not_of("0123456789") == absl::string_view::npos && parts[0].size() <= 3 &&
                      parts[1].size() <= 3;
  if (!digits || !absl::SimpleAtoi(parts[0], &v.major) || !absl::SimpleAtoi(parts[1], &v.minor) ||
      v < kOldestTorchVersion || v > kNewestTorchVersion || (v.major == 1 && v.minor > 13)) {
    return absl::InvalidArgumentError(absl::StrCat("--torch-version '", text, "': use ",
                                                   TorchVersionText(kOldestTorchVersion), " to 1.13 or 2.0 to ",
                                                   TorchVersionText(kNewestTorchVersion),
                                                   " (the PyTorch releases memscope models)"));
  }
  return v;
}

std::string TorchVersionText(TorchVersion v) { return absl::StrCat(v.major, ".", v.minor); }

TorchDefaults TorchDefaultsOf(TorchVersion v) {
  TorchDefaults d;
  const bool two = v >= TorchVersion{2, 0};
  d.zero_grad = two ? "none" : "zeros";
  d.optimizer_impl = two ? "foreach" : "for-loop";
  d.cublas_workspace_in_allocator = two;
  d.cublaslt_persistent_workspace = v >= TorchVersion{2, 8};
  d.first_bucket_from_cap = two;
  d.behaviour.inplace_accumulation = two;
  d.behaviour.mean_dim_saves_input = !two;
  // softmax and log_softmax save their input too up to 1.10 (issue #49600);
  // pytorch/pytorch#65242 (September 2021, after 1.10's branch) saves the
  // result only.
  d.behaviour.softmax_saves_input = v <= TorchVersion{1, 10};
  return d;
}

absl::Status CheckAllocatorSettings(const AllocatorConfig& config, TorchVersion v) {
  for (const std::string& key : config.keys) {
    for (const AddedSetting& s : kAddedSettings) {
      if (key == s.key && v < s.since) return Refuse(s, "", v);
    }
  }
  if (config.roundup_power2_divisions_list && v < kRoundupList.since) {
    return Refuse(kRoundupList, " as a per-interval list", v);
  }
  return absl::OkStatus();
}

}  // namespace memscope
