// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax.
//
//   auto config = AllocatorConfig::Parse("max_split_size_mb:128,expandable_segments:True");
//   if (!config.ok()) { /* config.status().message() names the key */ }
//
// Keys (as in PyTorch 2.x): max_split_size_mb (>= 20), max_non_split_rounding_mb
// (>= 20), roundup_power2_divisions (a power of two, or a list such as
// [256:1,512:2,1024:4,>:8] with keys in MB), garbage_collection_threshold
// (0 < t < 1), expandable_segments (True/False), per_process_memory_fraction
// (0 <= f <= 1; PyTorch 2.9+ CUDAAllocatorConfig: the allocator of each device
// starts with set_per_process_memory_fraction(f), and 1.0 means no cap).
// PyTorch's other keys
// (backend:native, release_lock_on_cudamalloc, pinned_use_cuda_host_register,
// pinned_num_register_threads) are accepted and have no effect on device
// memory. Anything else is an error that names the key.
#ifndef MEMSCOPE_ALLOCATOR_CONFIG_H_
#define MEMSCOPE_ALLOCATOR_CONFIG_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/sizes.h"

namespace memscope {

struct AllocatorConfig {
  // Blocks >= this are never split; "unlimited" (SIZE_MAX) by default.
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  // A request >= max_split_size may take a cached block smaller than
  // request + this (default 20 MiB).
  std::size_t max_non_split_rounding_size = kLargeBuffer;
  // Divisions per power-of-two interval (0 or 1 = plain 512 B rounding).
  std::array<std::size_t, kRoundUpPowerOfTwoIntervals> roundup_power2_divisions{};
  // Fraction of the allowed memory above which cached blocks are
  // garbage-collected; 0 = off. Only active with a memory fraction set.
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  // torch.cuda.set_per_process_memory_fraction applied when the allocator is
  // created; 1.0 (the default) sets no cap.
  double per_process_memory_fraction = 1.0;
  // The settings text this config was parsed from ("" for defaults).
  std::string text;
  // The keys the text set, in its order, and whether roundup_power2_divisions
  // was given as a per-interval list ([256:1,>:8]) rather than one number:
  // what `memscope run --torch-version` checks against the release.
  std::vector<std::string> keys;
  bool roundup_power2_divisions_list = false;

  // Parses PYTORCH_CUDA_ALLOC_CONF syntax. Empty text gives the defaults.
  static absl::StatusOr<AllocatorConfig> Parse(std::string_view text);
  // How many times Parse has run in this process: the tests prove with it
  // that a load parses each recording's settings once (tests/load/).
  static std::uint64_t ParseCount();

  // Parses PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF, else defaults.
  static absl::StatusOr<AllocatorConfig> FromEnvironment();

  // Divisions that apply to a request of `size` bytes.
  std::size_t DivisionsFor(std::size_t size) const { return roundup_power2_divisions[RoundupPower2Index(size)]; }

  // round_size: what a request of `size` bytes occupies in a block.
  std::size_t RoundSize(std::size_t size) const {
    if (size < kMinBlockSize) return kMinBlockSize;
    const std::size_t divisions = DivisionsFor(size);
    if (divisions > 1 && size > kMinBlockSize * divisions) {
      return RoundupPower2NextDivision(size, divisions);
    }
    return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
  }

  bool max_split_size_unlimited() const { return max_split_size == std::numeric_limits<std::size_t>::max(); }
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_CONFIG_H_
