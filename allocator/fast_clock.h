// A cheap monotonic clock for stamping allocator events. steady_clock costs
// ~25 ns a call here (a vDSO clock_gettime); with three events per alloc/free
// pair that alone is a third of the recording overhead. On x86-64 this reads
// the TSC (a few ns) and scales it with a ratio calibrated once against
// steady_clock, as PyTorch's getApproximateTime does for its memory trace.
// Elsewhere it falls back to steady_clock.
#ifndef MEMSCOPE_ALLOCATOR_FAST_CLOCK_H_
#define MEMSCOPE_ALLOCATOR_FAST_CLOCK_H_

#include <cstdint>

namespace memscope {

// Nanoseconds on a monotonic clock with the same origin as
// std::chrono::steady_clock (to within the calibration error, well under a
// microsecond per second elapsed).
std::int64_t FastNowNs();

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_FAST_CLOCK_H_
