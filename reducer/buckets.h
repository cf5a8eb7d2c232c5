// DDP's bucket assignment, as torch/csrc/distributed/c10d/reducer.cpp's
// compute_bucket_assignment_by_size and the limits distributed.py passes it.
#ifndef MEMSCOPE_REDUCER_BUCKETS_H_
#define MEMSCOPE_REDUCER_BUCKETS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "tensor/tensor.h"

namespace memscope::reducer {

// What assignment needs of a tensor: its bytes (numel * element size) and its
// dtype (buckets are per (dtype, device); one device per rank here).
struct BucketTensor {
  std::uint64_t bytes = 0;
  DType dtype = DType::kFloat32;
};

struct BucketAssignment {
  std::vector<std::vector<std::size_t>> buckets;  // tensor indices per bucket
  std::vector<std::size_t> size_limits;           // the limit each bucket was closed against
};

// sys.maxsize (2**63 - 1 on 64-bit Python), which PyTorch reports as that bucket's limit.
inline constexpr std::size_t kNoBucketLimit = std::numeric_limits<std::int64_t>::max();
inline constexpr std::size_t kDefaultFirstBucketBytes = 1024 * 1024;  // dist._DEFAULT_FIRST_BUCKET_BYTES
inline constexpr double kDefaultBucketCapMb = 25.0;

// compute_bucket_assignment_by_size: walk the tensors in order, one open bucket
// and one pointer into `limits` per dtype; close a bucket when its bytes reach
// the current limit and advance the pointer (never past the last limit); then
// append the still-open buckets in REVERSE order of their dtype's first
// appearance. PyTorch iterates a std::unordered_map<BucketKey, ...> there, and
// libstdc++ puts each new key at the front of its node list: PyTorch 1.13
// returns that order for every ordering of up to 5 of float32, float16,
// bfloat16, float64, int64, int32, uint8 (float16 first seen before float32:
// [float32 bucket, float16 bucket]). The order only shows without the sort,
// i.e. in the rebuild.
// Without `tensor_indices` the buckets are sorted by their smallest index;
// with them (the rebuild, tensors in gradient-ready order) tensor i is
// reported as tensor_indices[i] and there is no sort.
BucketAssignment ComputeBucketAssignmentBySize(std::span<const BucketTensor> tensors,
                                               std::span<const std::size_t> limits,
                                               std::span<const std::size_t> tensor_indices = {});

// The bytes of bucket_cap_mb (MiB: int(bucket_cap_mb * 1024 * 1024)).
std::size_t BucketCapBytes(double bucket_cap_mb);

// The limits DistributedDataParallel passes at construction (PyTorch 2.x):
// [sys.maxsize] without find_unused_parameters or with static_graph (one
// bucket per dtype for the first iteration); else [1 MiB, 25 MiB] when
// bucket_cap_mb was left unset (None), [cap] when it was given.
// `first_bucket_from_cap` false is PyTorch 1.13 (its distributed.py, read
// from Debian's python3-torch): [1 MiB, cap] whether the cap was given or not.
std::vector<std::size_t> InitialBucketLimits(bool find_unused_parameters, bool static_graph,
                                             std::optional<double> bucket_cap_mb, bool first_bucket_from_cap = true);

// The limits of the rebuild after the first backward: [first, cap], where
// DDP passes the Reducer first_bucket_bytes_cap =
// dist._DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb was left unset (None),
// else the cap itself (distributed.py _ddp_init_helper; reducer.cpp
// rebuild_buckets pushes first_bucket_bytes_cap_, bucket_bytes_cap_). So
// [1 MiB, 25 MiB] when unset, [cap, cap] when given. (PyTorch 1.x always
// passed 1 MiB first: `first_bucket_from_cap` false, 1.13's
// dist.Reducer(..., dist._DEFAULT_FIRST_BUCKET_BYTES); DDP_SET_LAST_BUCKET_CAP=1,
// which makes the small bucket the last one, is not modelled.)
std::vector<std::size_t> RebuildBucketLimits(std::optional<double> bucket_cap_mb, bool first_bucket_from_cap = true);

// DDP's construction: assignment over the parameters in registration order,
// then the bucket list REVERSED (bucket 0 holds the last-registered
// parameters: their gradients are ready first).
BucketAssignment InitialBuckets(std::span<const BucketTensor> params, bool find_unused_parameters, bool static_graph,
                                std::optional<double> bucket_cap_mb, bool first_bucket_from_cap = true);

// The rebuild: parameters in the order their gradients became ready
// (`ready_order[i]` is a parameter index); no sort, no reversal.
BucketAssignment RebuiltBuckets(std::span<const BucketTensor> params, std::span<const std::size_t> ready_order,
                                std::optional<double> bucket_cap_mb, bool first_bucket_from_cap = true);

}  // namespace memscope::reducer

#endif  // MEMSCOPE_REDUCER_BUCKETS_H_
