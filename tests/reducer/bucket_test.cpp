// DDP's bucket assignment equals PyTorch's: compute_bucket_assignment_by_size
// (torch/csrc/distributed/c10d/reducer.cpp) with the limits
// DistributedDataParallel (PyTorch 2.x, torch/nn/parallel/distributed.py)
// passes it at construction and at the rebuild. Every expected list was
// computed by PyTorch 1.13's torch.distributed._compute_bucket_assignment_by_size.
#include "reducer/buckets.h"

#include <catch2/catch.hpp>

#include <cstddef>
#include <optional>
#include <vector>

namespace memscope::reducer {
namespace {

using Buckets = std::vector<std::vector<std::size_t>>;
using Limits = std::vector<std::size_t>;

}  // namespace

TEST_CASE("the no-limit bucket's size limit is sys.maxsize, as PyTorch reports it") {
  // dist._compute_bucket_assignment_by_size([torch.empty(10)] * 2, [sys.maxsize], [False] * 2)
  //   -> ([[0, 1]], [9223372036854775807])
  CHECK(kNoBucketLimit == 9223372036854775807ULL);
  const std::vector<BucketTensor> tensors = {{40, DType::kFloat32}, {40, DType::kFloat32}};
  const BucketAssignment a = InitialBuckets(tensors, /*find_unused_parameters=*/false, /*static_graph=*/false, {});
  CHECK(a.buckets == Buckets{{0, 1}});
  CHECK(a.size_limits == Limits{9223372036854775807ULL});
}

TEST_CASE("the rebuild appends the still-open buckets newest dtype first, as PyTorch's unordered_map iterates") {
  // Parameters 0..5 alternate float32 (400 B) and float16 (200 B); gradients
  // ready in the order 3 (f16), 2 (f32), 1, 0, 5, 4. PyTorch 1.13:
  //   ts = [torch.empty(100, dtype=D[i]) for i in ready]
  //   dist._compute_bucket_assignment_by_size(ts, [10**9], [False] * 6, ready)
  //     -> ([[2, 0, 4], [3, 1, 5]], [10**9, 10**9])
  //   dist._compute_bucket_assignment_by_size(ts, [500, 500], [False] * 6, ready)
  //     -> ([[2, 0], [3, 1, 5], [4]], [500, 500, 500])
  std::vector<BucketTensor> ready_tensors;
  const std::vector<std::size_t> ready = {3, 2, 1, 0, 5, 4};
  for (std::size_t i : ready) {
    ready_tensors.push_back(i % 2 == 0 ? BucketTensor{400, DType::kFloat32} : BucketTensor{200, DType::kFloat16});
  }
  const std::vector<std::size_t> no_limit = {1'000'000'000};
  BucketAssignment a = ComputeBucketAssignmentBySize(ready_tensors, no_limit, ready);
  CHECK(a.buckets == Buckets{{2, 0, 4}, {3, 1, 5}});
  CHECK(a.size_limits == Limits{1'000'000'000, 1'000'000'000});
  const std::vector<std::size_t> limits = {500, 500};
  a = ComputeBucketAssignmentBySize(ready_tensors, limits, ready);
  CHECK(a.buckets == Buckets{{2, 0}, {3, 1, 5}, {4}});
  CHECK(a.size_limits == Limits{500, 500, 500});
}

TEST_CASE("the rebuild's first bucket is 1 MiB only when bucket_cap_mb is unset, else the cap (PyTorch 2.x)") {
  CHECK(RebuildBucketLimits(std::nullopt) == Limits{1024 * 1024, 25 * 1024 * 1024});
  CHECK(RebuildBucketLimits(5.0) == Limits{5 * 1024 * 1024, 5 * 1024 * 1024});
  CHECK(RebuildBucketLimits(0.01) == Limits{10485, 10485});  // int(0.01 * 1024 * 1024)
  // The CIFAR tutorial Net, gradients ready fc3.bias, fc3.weight, ... as DDP
  // records them, bucket_cap_mb=0.01. PyTorch 1.13's DDP with
  // dist._DEFAULT_FIRST_BUCKET_BYTES = 10485 (what 2.x passes for a given cap)
  // rebuilt "9 8 7 6, 5 4, 2 3 0, 1" (rebuilt_per_bucket_param_indices);
  // with a 1 MiB first bucket all 248,024 B would stay in one bucket.
  const std::vector<BucketTensor> params = {{1800, DType::kFloat32},  {24, DType::kFloat32},  {9600, DType::kFloat32},
                                            {64, DType::kFloat32},    {192000, DType::kFloat32}, {480, DType::kFloat32},
                                            {40320, DType::kFloat32}, {336, DType::kFloat32}, {3360, DType::kFloat32},
                                            {40, DType::kFloat32}};
  const std::vector<std::size_t> ready = {9, 8, 7, 6, 5, 4, 2, 3, 0, 1};
  const BucketAssignment a = RebuiltBuckets(params, ready, 0.01);
  CHECK(a.buckets == Buckets{{9, 8, 7, 6}, {5, 4}, {2, 3, 0}, {1}});
  CHECK(a.size_limits == Limits{10485, 10485, 10485, 10485});
}

}  // namespace memscope::reducer
