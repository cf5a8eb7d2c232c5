#include "reducer/buckets.h"

#include <algorithm>
#include <cmath>

namespace memscope::reducer {

BucketAssignment ComputeBucketAssignmentBySize(std::span<const BucketTensor> tensors,
                                               std::span<const std::size_t> limits,
                                               std::span<const std::size_t> tensor_indices) {
  struct Open {
    DType dtype;
    std::vector<std::size_t> indices;
    std::uint64_t size = 0;
    std::size_t size_limit = 0;
    std::size_t limit_pos = 0;
  };
  std::vector<Open> open;  // per dtype, in order of first appearance
  std::vector<std::pair<std::vector<std::size_t>, std::size_t>> result;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::size_t index = tensor_indices.empty() ? i : tensor_indices[i];
    auto it = std::find_if(open.begin(), open.end(), [&](const Open& o) { return o.dtype == tensors[i].dtype; });
    if (it == open.end()) it = open.insert(open.end(), Open{tensors[i].dtype, {}, 0, 0, 0});
    Open& bucket = *it;
    bucket.indices.push_back(index);
    bucket.size += tensors[i].bytes;
    bucket.size_limit = limits[bucket.limit_pos];
    if (bucket.size >= bucket.size_limit) {
      result.emplace_back(std::move(bucket.indices), bucket.size_limit);
      bucket.indices.clear();
      bucket.size = 0;
      if (bucket.limit_pos + 1 < limits.size()) ++bucket.limit_pos;
    }
  }
  // Newest dtype first: the iteration order of PyTorch's unordered_map (libstdc++).
  for (auto it = open.rbegin(); it != open.rend(); ++it) {
    if (!it->indices.empty()) result.emplace_back(std::move(it->indices), it->size_limit);
  }
  if (tensor_indices.empty()) {
    std::stable_sort(result.begin(), result.end(), [](const auto& a, const auto& b) {
      return *std::min_element(a.first.begin(), a.first.end()) < *std::min_element(b.first.begin(), b.first.end());
    });
  }
  BucketAssignment out;
  for (auto& [indices, limit] : result) {
    out.buckets.push_back(std::move(indices));
    out.size_limits.push_back(limit);
  }
  return out;
}

std::size_t BucketCapBytes(double bucket_cap_mb) { return static_cast<std::size_t>(bucket_cap_mb * 1024 * 1024); }

std::vector<std::size_t> InitialBucketLimits(bool find_unused_parameters, bool static_graph,
                                             std::optional<double> bucket_cap_mb, bool first_bucket_from_cap) {
  if (static_graph || !find_unused_parameters) return {kNoBucketLimit};
  if (!bucket_cap_mb) return {kDefaultFirstBucketBytes, BucketCapBytes(kDefaultBucketCapMb)};
  if (!first_bucket_from_cap) return {kDefaultFirstBucketBytes, BucketCapBytes(*bucket_cap_mb)};
  return {BucketCapBytes(*bucket_cap_mb)};
}

std::vector<std::size_t> RebuildBucketLimits(std::optional<double> bucket_cap_mb, bool first_bucket_from_cap) {
  if (!bucket_cap_mb) return {kDefaultFirstBucketBytes, BucketCapBytes(kDefaultBucketCapMb)};
  const std::size_t cap = BucketCapBytes(*bucket_cap_mb);
  return {first_bucket_from_cap ? cap : kDefaultFirstBucketBytes, cap};
}

BucketAssignment InitialBuckets(std::span<const BucketTensor> params, bool find_unused_parameters, bool static_graph,
                                std::optional<double> bucket_cap_mb, bool first_bucket_from_cap) {
  const std::vector<std::size_t> limits =
      InitialBucketLimits(find_unused_parameters, static_graph, bucket_cap_mb, first_bucket_from_cap);
  BucketAssignment a = ComputeBucketAssignmentBySize(params, limits);
  std::reverse(a.buckets.begin(), a.buckets.end());
  std::reverse(a.size_limits.begin(), a.size_limits.end());
  return a;
}

BucketAssignment RebuiltBuckets(std::span<const BucketTensor> params, std::span<const std::size_t> ready_order,
                                std::optional<double> bucket_cap_mb, bool first_bucket_from_cap) {
  std::vector<BucketTensor> ordered;
  ordered.reserve(ready_order.size());
  for (std::size_t index : ready_order) ordered.push_back(params[index]);
  const std::vector<std::size_t> limits = RebuildBucketLimits(bucket_cap_mb, first_bucket_from_cap);
  return ComputeBucketAssignmentBySize(ordered, limits, ready_order);
}

}  // namespace memscope::reducer
