// The clocks memscope stamps events with: steady_clock in nanoseconds, and a
// cheaper one for the allocator's hot path.
//
// SteadyNs: std::chrono::steady_clock as nanoseconds since its epoch (a vDSO
// clock_gettime, about 25 ns a call here).
//
// FastNowNs: the same clock, cheaper. With three events per alloc/free pair,
// steady_clock alone is a third of the recording overhead. On x86-64 this
// reads the TSC (a few ns) and scales it with a ratio calibrated once (its
// first call spins 5 ms) against steady_clock, as PyTorch's
// getApproximateTime does for its memory trace. Elsewhere it is SteadyNs.
//
//   const std::int64_t start = SteadyNs();
//   ...
//   const std::int64_t elapsed_ns = SteadyNs() - start;
#ifndef MEMSCOPE_BASE_CLOCK_H_
#define MEMSCOPE_BASE_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace memscope {

// Nanoseconds on std::chrono::steady_clock.
inline std::int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Nanoseconds on a monotonic clock with the same origin as SteadyNs (to
// within the calibration error, well under a microsecond per second
// elapsed).
std::int64_t FastNowNs();

}  // namespace memscope

#endif  // MEMSCOPE_BASE_CLOCK_H_
