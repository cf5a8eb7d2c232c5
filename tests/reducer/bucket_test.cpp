// DDP's bucket assignment equals PyTorch's: compute_bucket_assignment_by_size
// (torch/csrc/distributed/c10d/reducer.cpp) with the limits
// DistributedDataParallel (PyTorch 2.x, torch/nn/parallel/distributed.py)
// passes it at construction and at the rebuild. Every expected list was
// computed by PyTorch 1.13's torch.distributed._compute_bucket_assignment_by_size.
#include "reducer/buckets.h"

#include <catch2/catch.hpp>

#include <cstddef>
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

}  // namespace memscope::reducer
