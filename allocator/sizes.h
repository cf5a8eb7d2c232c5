// Size rules of PyTorch's CUDA caching allocator, and size parsing/printing.
//
// These are the constants and rounding functions of
// c10/cuda/CUDACachingAllocator.cpp, kept in one place so that the allocator,
// the replay tool and the tests agree on them.
#ifndef MEMSCOPE_ALLOCATOR_SIZES_H_
#define MEMSCOPE_ALLOCATOR_SIZES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace memscope {

inline constexpr std::size_t kMiB = 1024 * 1024;
// Every request is rounded up to a multiple of this (minimum one block).
inline constexpr std::size_t kMinBlockSize = 512;
// A rounded request <= 1 MiB goes to the small pool.
inline constexpr std::size_t kSmallSize = 1 * kMiB;
// Small-pool segments are 2 MiB.
inline constexpr std::size_t kSmallBuffer = 2 * kMiB;
// Large requests below 10 MiB share a 20 MiB segment...
inline constexpr std::size_t kMinLargeAlloc = 10 * kMiB;
inline constexpr std::size_t kLargeBuffer = 20 * kMiB;
// ...and larger segments are rounded up to a multiple of 2 MiB.
inline constexpr std::size_t kRoundLarge = 2 * kMiB;
// roundup_power2_divisions has one entry per power-of-two interval from
// 1 MiB (index 0) to 64 GiB (index 15).
inline constexpr std::size_t kRoundUpPowerOfTwoIntervals = 16;

// Index into the roundup_power2_divisions table for a size:
// clamp(floor(log2(size)) - 20, 0, 15).
std::size_t RoundupPower2Index(std::size_t size);

// Rounds `size` up to the next 1/divisions step of its power-of-two interval;
// a power of two stays as is. Example: (1200, 4) -> 1280.
std::size_t RoundupPower2NextDivision(std::size_t size, std::size_t divisions);

// The device memory the allocator asks for when no cached block fits a
// rounded request: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else rounded up to
// a multiple of 2 MiB.
constexpr std::size_t AllocationSize(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

// PyTorch's c10 format_size, used in OOM messages: "N bytes" up to 1024,
// then "%.2f KiB", "%.2f MiB", "%.2f GiB".
std::string FormatSize(std::uint64_t bytes);

// A count with its noun, singular for one: "1 block", "3 blocks".
std::string Counted(std::uint64_t n, std::string_view noun);

// Parses a size as users write it: "123", "4KiB", "2.5GiB", "512MB", "1.5 GB".
// KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000, K/M/G/T
// alone are 1024-based (like PyTorch users mean). Errors name the text.
absl::StatusOr<std::uint64_t> ParseSize(std::string_view text);

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_SIZES_H_
