// torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1) with DDP, as
// people write it:
//
//   model = DDP(model, ...)
//   optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
//                                       parameters_as_bucket_view=False, lr=...)
//
// Read from torch/distributed/optim/zero_redundancy_optimizer.py (the same
// in 1.13 and 2.x, overlap_with_ddp=False):
//
//  - The partition (_partition_parameters): per param group, the parameters
//    sorted by numel, largest first (Python's sorted: stable, ties keep their
//    order), each given to the rank with the fewest elements so far (the
//    first such rank: _get_min_index). Every parameter stays whole.
//  - The local optimizer holds only this rank's parameters, so its state
//    (exp_avg, exp_avg_sq, momentum_buffer) and the foreach temporaries exist
//    only for them. zero_grad() still covers every parameter: the wrapper's
//    param_groups hold them all.
//  - step(): the local step, then _sync_params: for each rank in order, a
//    broadcast from that rank of each of its parameters in place
//    (parameters_as_bucket_view=False), or of its one flat bucket (True).
//    Broadcasts in place allocate nothing.
//  - parameters_as_bucket_view=True (_build_param_buckets, at construction):
//    for each rank, a flat tensor of its trainable parameters' elements (a
//    float32 torch.zeros(1) when it has none), the parameters copied in and
//    `param.data` made a view of it: the parameters' own blocks are freed as
//    each moves, and the device holds world-size flat buckets instead.
//
// memscope builds it inside the "ddp" phase (where the script constructs it,
// after DDP) and needs DDP: without DDP the gradients a rank steps with would
// be its own, which no one trains with. It is given the trainable parameters
// (those memscope's optimizer gets): model.parameters() when nothing is
// frozen; with LoRA, as `[p for p in model.parameters() if p.requires_grad]`.
// Not modelled: overlap_with_ddp=True, several param groups, and
// consolidate_state_dict() (memscope run refuses --zero with checkpoints).
#ifndef MEMSCOPE_TRAIN_ZERO_H_
#define MEMSCOPE_TRAIN_ZERO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "reducer/communicator.h"
#include "tensor/tensor.h"

namespace memscope {

// The rank each parameter is given, in `numels` order (one param group).
std::vector<int> ZeroPartition(const std::vector<std::int64_t>& numels, int world_size);

struct ZeroOptions {
  bool parameters_as_bucket_view = false;
};

class ZeroRedundancy {
 public:
  // Partitions `params` (at least one) over comm's ranks; with bucket view, builds the
  // buckets (tagged PARAMETER, owner "zero.bucket.R").
  ZeroRedundancy(std::vector<Tensor*> params, reducer::Communicator& comm, ZeroOptions options);

  // This rank's parameters, in its param group's order (largest first): the
  // local optimizer's.
  const std::vector<Tensor*>& owned() const { return owned_[static_cast<std::size_t>(comm_.rank())]; }
  // _sync_params: each rank's parameters (or bucket) broadcast from it.
  void SyncParams();

  // Every rank's parameters by name, in each rank's order.
  std::vector<std::vector<std::string>> PartitionNames() const;
  // The buckets' bytes, one per rank (bucket view), else empty.
  std::vector<std::uint64_t> BucketBytes() const;

 private:
  void BuildBuckets();

  reducer::Communicator& comm_;
  DeviceContext* ctx_ = nullptr;  // the parameters'
  ZeroOptions options_;
  std::vector<std::vector<Tensor*>> owned_;  // per rank
  std::vector<Tensor> buckets_;              // per rank (bucket view)
};

}  // namespace memscope

#endif  // MEMSCOPE_TRAIN_ZERO_H_
