#include "train/zero.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "allocator/alloc_tag.h"
#include "tensor/ops.h"

namespace memscope {

std::vector<int> ZeroPartition(const std::vector<std::int64_t>& numels, int world_size) {
  std::vector<std::size_t> order(numels.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return numels[a] > numels[b]; });
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(world_size), 0);
  std::vector<int> rank_of(numels.size(), 0);
  for (std::size_t i : order) {
    // _get_min_index: the first rank holding the fewest elements.
    const auto rank = static_cast<std::size_t>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
    rank_of[i] = static_cast<int>(rank);
    sizes[rank] += numels[i];
  }
  return rank_of;
}

ZeroRedundancy::ZeroRedundancy(std::vector<Tensor*> params, reducer::Communicator& comm, ZeroOptions options)
    : comm_(comm), options_(options), owned_(static_cast<std::size_t>(comm.world_size())) {
  if (params.empty()) throw TensorError("ZeroRedundancyOptimizer: no parameters to optimize");
  ctx_ = &params.front()->ctx();
  std::vector<std::int64_t> numels;
  numels.reserve(params.size());
  for (const Tensor* p : params) numels.push_back(p->numel());
  const std::vector<int> rank_of = ZeroPartition(numels, comm.world_size());
  // Each rank's list in the sorted order (param_group_params_per_rank[rank].append).
  std::vector<std::size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return numels[a] > numels[b]; });
  for (std::size_t i : order) owned_[static_cast<std::size_t>(rank_of[i])].push_back(params[i]);
  if (options_.parameters_as_bucket_view) BuildBuckets();
}

void ZeroRedundancy::BuildBuckets() {
  NoGradGuard no_grad;
  for (std::size_t rank = 0; rank < owned_.size(); ++rank) {
    const std::vector<Tensor*>& params = owned_[rank];
    std::int64_t total = 0;
    for (const Tensor* p : params) total += p->numel();
    const std::string owner = absl::StrCat("zero.bucket.", rank);  // the tag holds a view of it
    ScopedTag tag(Category::kParameter, owner);
    if (total == 0) {  // torch.zeros(1, device=device): a dummy float32 bucket
      buckets_.push_back(Tensor::Zeros(*ctx_, {1}));
      continue;
    }
    Tensor bucket = Tensor::Empty(params.front()->ctx(), {total}, params.front()->dtype());
    std::int64_t offset = 0;
    for (Tensor* p : params) {
      Tensor slot = bucket.AsStrided(p->sizes(), ContiguousStrides(p->sizes()), offset);
      ops::CopyInPlace(slot, *p);
      // param.data = bucket[offset:offset_next].view_as(param.data): the
      // parameter's own block is freed here (nothing else holds it).
      TensorImpl* impl = p->impl();
      impl->storage = bucket.storage();
      impl->strides = ContiguousStrides(impl->sizes);
      impl->offset = offset;
      offset += p->numel();
    }
    buckets_.push_back(std::move(bucket));
  }
}

void ZeroRedundancy::SyncParams() {
  for (int rank = 0; rank < comm_.world_size(); ++rank) {
    if (options_.parameters_as_bucket_view) {
      const Tensor& b = buckets_[static_cast<std::size_t>(rank)];
      comm_.Broadcast(b.raw_data(), static_cast<std::size_t>(b.numel()), b.dtype(), rank);
      continue;
    }
    for (Tensor* p : owned_[static_cast<std::size_t>(rank)]) {
      comm_.Broadcast(p->raw_data(), static_cast<std::size_t>(p->numel()), p->dtype(), rank);
    }
  }
}

std::vector<std::vector<std::string>> ZeroRedundancy::PartitionNames() const {
  std::vector<std::vector<std::string>> names(owned_.size());
  for (std::size_t r = 0; r < owned_.size(); ++r) {
    for (const Tensor* p : owned_[r]) names[r].push_back(p->name());
  }
  return names;
}

std::vector<std::uint64_t> ZeroRedundancy::BucketBytes() const {
  std::vector<std::uint64_t> bytes;
  for (const Tensor& b : buckets_) bytes.push_back(b.nbytes());
  return bytes;
}

}  // namespace memscope
