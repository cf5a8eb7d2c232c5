// Counter thinning: which of a rank's counter samples (the state after each
// memory-changing event) a long run keeps, so that its Chrome trace and its
// HTML page stay loadable without losing a maximum. One component, two
// policies (the Chrome trace's and the viewer's, documented in
// exporters/chrome_trace.h and viewer/html_report.h).
//
//   const SampleSpan span = SampleSpanOf(timeline);   // a scan, no model
//   CounterThinning<Payload> thin(ThinningPolicy::Viewer(8000), span);
//   // for every sample, in event order (e.g. from a WalkListener):
//   thin.Observe(e.time_ns, model.allocated(), model.reserved(), payload);
//   for (const auto& s : thin.Kept()) ...  // ascending ordinals, each once
//
// With at most max_samples samples nothing is thinned and Kept() is every
// sample. Otherwise the time span between the first and the last sample is
// cut into `buckets` equal buckets, and each bucket holding samples keeps the
// sample where allocated is highest and the one where reserved is highest
// (the earliest on ties): the global maxima are bucket maxima, so they always
// survive. The policy adds, per bucket, its first sample and the one where
// allocated is lowest, and its last sample either always or, with the room
// left under max_samples, largest drop from the bucket's maximum first; and
// optionally the rank's final sample.
#ifndef MEMSCOPE_ANALYSIS_COUNTER_THINNING_H_
#define MEMSCOPE_ANALYSIS_COUNTER_THINNING_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "recording/event.h"

namespace memscope {

// The counter samples of a timeline: how many, and the earliest and latest
// time among them.
struct SampleSpan {
  std::uint64_t samples = 0;
  std::int64_t t0 = 0;
  std::int64_t t1 = 0;
};
SampleSpan SampleSpanOf(const Timeline& timeline);

struct ThinningPolicy {
  // The Chrome trace's (exporters/chrome_trace.h): at most M samples (values
  // below 3 count as 3), B = (M - 1) / 2 buckets, each bucket's maxima, the
  // final sample, then buckets' last samples by largest drop while room is
  // left.
  static ThinningPolicy ChromeTrace(std::size_t max_samples);
  // The viewer's (viewer/html_report.h): more than M samples (values below 10
  // count as 10) thin to M / 5 buckets, each keeping its first sample, the
  // highest and lowest allocated, the highest reserved and its last sample.
  static ThinningPolicy Viewer(std::size_t max_samples);

  std::size_t max_samples = 0;      // thin when there are more samples than this
  std::size_t buckets = 0;          // when thinning
  bool keep_first = false;          // each bucket's first sample
  bool keep_min_allocated = false;  // each bucket's lowest allocated
  bool keep_last_always = false;    // each bucket's last (else by largest drop, within max_samples)
  bool keep_final = false;          // the rank's final sample
};

// Chooses the kept samples in one pass; `Payload` is what the caller keeps
// of each (nothing for the Chrome trace, the sampled values for the viewer).
// Memory: O(buckets) when thinning, O(max_samples) otherwise.
template <typename Payload>
class CounterThinning {
 public:
  struct Sample {
    std::uint64_t ordinal = 0;  // index among the rank's samples
    std::uint64_t allocated = 0;
    std::uint64_t reserved = 0;
    Payload payload{};
  };

  CounterThinning(const ThinningPolicy& policy, const SampleSpan& span)
      : policy_(policy),
        thinned_(span.samples > policy.max_samples),
        start_(static_cast<double>(span.t0)),
        span_(static_cast<double>(span.t1) -
              static_cast<double>(span.t0)),  // in double: corrupt times must not overflow
        buckets_(thinned_ ? policy.buckets : 0) {}

  bool thinned() const { return thinned_; }
  // Samples observed so far.
  std::uint64_t observed() const { return ordinal_; }

  // The next sample, in event order.
  void Observe(std::int64_t t, std::uint64_t allocated, std::uint64_t reserved, const Payload& payload = {}) {
    const Sample s{ordinal_++, allocated, reserved, payload};
    if (!thinned_) {
      kept_.push_back(s);
      return;
    }
    std::size_t b = 0;
    const std::size_t n = buckets_.size();
    if (span_ > 0) {
      const double x = (static_cast<double>(t) - start_) / span_ * static_cast<double>(n);
      b = x <= 0 ? 0 : std::min(n - 1, static_cast<std::size_t>(x));
    }
    Bucket& bucket = buckets_[b];
    if (!bucket.used) {
      bucket.used = true;
      bucket.first = bucket.max_allocated = bucket.min_allocated = bucket.max_reserved = s;
    }
    if (s.allocated > bucket.max_allocated.allocated) bucket.max_allocated = s;
    if (s.allocated < bucket.min_allocated.allocated) bucket.min_allocated = s;
    if (s.reserved > bucket.max_reserved.reserved) bucket.max_reserved = s;
    bucket.last = s;
    final_ = s;
  }

  // The kept samples, ascending by ordinal, each once. Call once, after the
  // last Observe.
  std::vector<Sample> Kept() {
    if (!thinned_) return std::move(kept_);
    std::vector<Sample> keep;
    for (const Bucket& b : buckets_) {
      if (!b.used) continue;
      keep.push_back(b.max_allocated);
      keep.push_back(b.max_reserved);
      if (policy_.keep_first) keep.push_back(b.first);
      if (policy_.keep_min_allocated) keep.push_back(b.min_allocated);
      if (policy_.keep_last_always) keep.push_back(b.last);
    }
    if (policy_.keep_final && ordinal_ > 0) keep.push_back(final_);
    SortUnique(keep);
    if (!policy_.keep_last_always) AddLastsByDrop(keep);
    return keep;
  }

 private:
  struct Bucket {
    bool used = false;
    Sample first, max_allocated, min_allocated, max_reserved, last;
  };

  static void SortUnique(std::vector<Sample>& v) {
    const auto by_ordinal = [](const Sample& x, const Sample& y) { return x.ordinal < y.ordinal; };
    std::sort(v.begin(), v.end(), by_ordinal);
    v.erase(std::unique(v.begin(), v.end(), [](const Sample& x, const Sample& y) { return x.ordinal == y.ordinal; }),
            v.end());
  }

  // The buckets' last samples (the level after a drop) not kept yet, largest
  // drop from the bucket's maximum first, while room is left.
  void AddLastsByDrop(std::vector<Sample>& keep) const {
    const auto by_ordinal = [](const Sample& x, const Sample& y) { return x.ordinal < y.ordinal; };
    std::vector<std::pair<std::uint64_t, const Sample*>> lasts;  // (drop, sample)
    for (const Bucket& b : buckets_) {
      if (!b.used || std::binary_search(keep.begin(), keep.end(), b.last, by_ordinal)) continue;
      lasts.emplace_back(
          std::max(b.max_allocated.allocated - b.last.allocated, b.max_reserved.reserved - b.last.reserved), &b.last);
    }
    const std::size_t room = policy_.max_samples > keep.size() ? policy_.max_samples - keep.size() : 0;
    if (lasts.size() > room) {
      const auto larger_drop = [](const auto& x, const auto& y) {
        return x.first > y.first || (x.first == y.first && x.second->ordinal < y.second->ordinal);
      };
      std::nth_element(lasts.begin(), lasts.begin() + static_cast<std::ptrdiff_t>(room), lasts.end(), larger_drop);
      lasts.resize(room);
    }
    for (const auto& last : lasts) keep.push_back(*last.second);
    std::sort(keep.begin(), keep.end(), by_ordinal);
  }

  ThinningPolicy policy_;
  bool thinned_;
  double start_;
  double span_;
  std::vector<Bucket> buckets_;
  std::vector<Sample> kept_;  // every sample, when not thinning
  Sample final_;
  std::uint64_t ordinal_ = 0;
};

}  // namespace memscope

#endif  // MEMSCOPE_ANALYSIS_COUNTER_THINNING_H_
