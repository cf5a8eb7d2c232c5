#include "base/clock.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace memscope {
namespace {

#if defined(__x86_64__)
struct TscScale {
  std::uint64_t tsc0;
  std::int64_t ns0;
  double ns_per_tick;
};

// Measures the TSC rate over ~5 ms of steady_clock, once.
TscScale Calibrate() {
  const std::int64_t ns_start = SteadyNs();
  const std::uint64_t tsc_start = __rdtsc();
  std::int64_t ns_end = ns_start;
  while (ns_end - ns_start < 5'000'000) ns_end = SteadyNs();
  const std::uint64_t tsc_end = __rdtsc();
  const double ratio =
      tsc_end > tsc_start ? static_cast<double>(ns_end - ns_start) / static_cast<double>(tsc_end - tsc_start) : 0.0;
  return {tsc_end, ns_end, ratio};
}
#endif

}  // namespace

std::int64_t FastNowNs() {
#if defined(__x86_64__)
  static const TscScale scale = Calibrate();
  if (scale.ns_per_tick > 0.0) {
    const std::uint64_t tsc = __rdtsc();
    const double delta = static_cast<double>(static_cast<std::int64_t>(tsc - scale.tsc0)) * scale.ns_per_tick;
    return scale.ns0 + static_cast<std::int64_t>(delta);
  }
#endif
  return SteadyNs();
}

}  // namespace memscope
