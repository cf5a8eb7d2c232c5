#include "analysis/counter_thinning.h"

namespace memscope {

SampleSpan SampleSpanOf(const Timeline& timeline) {
  SampleSpan span;
  for (const Event& e : timeline.events) {
    if (!ChangesMemory(e.type)) continue;
    if (span.samples++ == 0) {
      span.t0 = span.t1 = e.time_ns;
    } else {
      span.t0 = std::min(span.t0, e.time_ns);
      span.t1 = std::max(span.t1, e.time_ns);
    }
  }
  return span;
}

ThinningPolicy ThinningPolicy::ChromeTrace(std::size_t max_samples) {
  ThinningPolicy p;
  p.max_samples = std::max<std::size_t>(max_samples, 3);
  p.buckets = (p.max_samples - 1) / 2;  // 2 maxima per bucket and the final sample fit in M
  p.keep_final = true;
  return p;
}

ThinningPolicy ThinningPolicy::Viewer(std::size_t max_samples) {
  ThinningPolicy p;
  p.max_samples = std::max<std::size_t>(max_samples, 10);
  p.buckets = p.max_samples / 5;  // 5 samples per bucket fit in M
  p.keep_first = true;
  p.keep_min_allocated = true;
  p.keep_last_always = true;
  return p;
}

}  // namespace memscope
