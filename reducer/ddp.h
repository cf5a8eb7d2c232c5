// DistributedDataParallel and its Reducer, with PyTorch's memory behaviour
// (torch/nn/parallel/distributed.py, torch/csrc/distributed/c10d/reducer.cpp,
// comm.cpp). What each step allocates, and why:
//
// Construction (the phase "ddp"):
//  1. _verify_params_across_processes: sizes and strides of every parameter in
//     an int64 device tensor, allgathered into world_size more (COMM_TEMP,
//     tiny, freed at once); a mismatch is an error naming the rank.
//  2. broadcast_coalesced of the parameters (and buffers, unless
//     broadcast_buffers=False) from rank 0 in groups that close at 250 MiB per
//     dtype; each group of more than one tensor is flattened into a NEW tensor
//     (COMM_TEMP), broadcast and copied back; at most two groups are in flight.
//  3. Bucket assignment (reducer/buckets.h), then one flat gradient tensor per
//     bucket (DDP_BUCKET, uninitialised, the parameters' dtype), alive for the
//     life of the Reducer: why a model's memory doubles under DDP.
//  4. A post hook on each parameter's AccumulateGrad.
//
// Backward: when a parameter's gradient is accumulated, its hook copies it
// into the bucket slot divided by the world size (copy mode,
// gradient_as_bucket_view=False) or additionally makes .grad a view of that
// slot (view mode; the separate gradient is released). A bucket whose
// gradients are all ready is SUM-allreduced in place, in bucket order. When
// the last bucket is ready, finalize_backward runs as the engine's final
// callback: copy mode copies each slot back into .grad (cloning when .grad is
// undefined); view mode points an undefined .grad at its slot.
//
// The first backward records the order in which gradients became ready; the
// next forward rebuilds the buckets in that order (limits [1 MiB, cap]),
// once, unless find_unused_parameters without static_graph. Copy mode frees
// the old buckets before allocating the new ones; in view mode, gradients
// still set (zero_grad(set_to_none=False)) are views that keep their old
// bucket alive until each is copied into the new one.
//
// Also: no_sync (hooks do nothing; gradients accumulate in .grad),
// find_unused_parameters (an int32 used-map on the device, the output cloned
// once, unused parameters' slots zeroed and their .grad left alone when no
// rank used them), the fp16/bf16 compression hooks (a half-size COMM_TEMP
// copy of each bucket, divided by the world size, alive until it is
// decompressed into the bucket), and buffers re-broadcast before every
// forward when broadcast_buffers.
//
// static_graph: one bucket for the first iteration, and the rebuild in the
// ready order of the SECOND backward (the first one only records which hooks
// fire), so before step 2. Not modelled: static_graph's delayed first
// allreduce and its unused-parameter bookkeeping (its memory is the
// default's), sparse gradients, DDP over several devices per process.
#ifndef MEMSCOPE_REDUCER_DDP_H_
#define MEMSCOPE_REDUCER_DDP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "reducer/buckets.h"
#include "reducer/communicator.h"
#include "tensor/autograd.h"
#include "tensor/tensor.h"

namespace memscope::reducer {

enum class CommHook { kNone, kFp16, kBf16 };

struct DdpOptions {
  bool gradient_as_bucket_view = false;  // --ddp view (PyTorch's default is copy)
  std::optional<double> bucket_cap_mb;   // None: 25 MiB, and a 1 MiB first bucket where it applies
  bool find_unused_parameters = false;
  bool static_graph = false;
  bool broadcast_buffers = true;
  CommHook comm_hook = CommHook::kNone;
  // A given bucket_cap_mb also caps the first bucket (PyTorch 2.x); false:
  // the first bucket is 1 MiB whatever the cap (1.13; reducer/buckets.h).
  bool first_bucket_from_cap = true;
};

// 250 MiB: DDP's broadcast_bucket_size.
inline constexpr std::uint64_t kBroadcastBucketBytes = 250ull * 1024 * 1024;

// One bucket as report.json lists it: bytes and parameter names in the
// bucket's order (its layout, and the order their gradients are expected).
struct BucketInfo {
  std::uint64_t bytes = 0;
  DType dtype = DType::kFloat32;
  std::vector<std::string> params;
};

// broadcast_coalesced(tensors, 250 MiB, root): groups per dtype closing at
// `bucket_bytes`, each flattened into a COMM_TEMP tensor when it holds more
// than one tensor, at most two in flight. Returns the group sizes in bytes.
std::vector<std::uint64_t> BroadcastCoalesced(const std::vector<Tensor*>& tensors, Communicator& comm, int root,
                                              std::uint64_t bucket_bytes = kBroadcastBucketBytes);

class DistributedDataParallel {
 public:
  // `params` in named_parameters() order (those that require grad), with
  // their names set; `buffers` in named_buffers() order. Throws CommError or
  // TensorError (an OOM while allocating buckets).
  DistributedDataParallel(std::vector<Tensor*> params, std::vector<Tensor*> buffers, Communicator& comm,
                          const DdpOptions& options);
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // DDP.forward before the module runs: the one-time rebuild, the buffer
  // broadcast, prepare_for_forward.
  void PreForward();
  // DDP.forward after the module ran: with find_unused_parameters the output
  // is cloned (_DDPSink) and the graph searched for unused parameters;
  // arms the hooks for this backward unless in no_sync.
  Tensor PostForward(const Tensor& output);
  // model.no_sync(): while false, hooks do nothing and gradients accumulate.
  void set_require_backward_grad_sync(bool sync) { require_backward_grad_sync_ = sync; }

  const std::vector<BucketInfo>& initial_buckets() const { return initial_buckets_; }
  // After the rebuild (empty until it happened).
  const std::vector<BucketInfo>& rebuilt_buckets() const { return rebuilt_buckets_; }
  std::uint64_t bucket_bytes() const;  // all buckets now
  const DdpOptions& options() const { return options_; }

 private:
  struct Bucket {
    Tensor flat;                    // DDP_BUCKET
    std::vector<std::size_t> vars;  // parameter indices, in slot order
    std::vector<Tensor> views;      // slot views of `flat`
    std::size_t pending = 0;
  };
  struct Variable {
    Tensor* param = nullptr;
    std::shared_ptr<Node> grad_accumulator;  // kept alive with its hook
    std::size_t bucket = 0;
    std::size_t slot = 0;
  };

  void VerifyParams();
  void InitializeBuckets(const BucketAssignment& assignment, std::vector<BucketInfo>* info);
  void AutogradHook(std::size_t index);
  void MarkVariableReady(std::size_t index);
  void MarkVariableReadyDense(std::size_t index);
  void ReduceReadyBuckets();
  void AllreduceBucket(std::size_t b);
  void FinalizeBackward();
  bool ShouldRebuild() const { return (options_.static_graph || !options_.find_unused_parameters) && !has_rebuilt_; }

  std::vector<Variable> vars_;
  std::vector<Tensor*> buffers_;
  Communicator& comm_;
  DdpOptions options_;
  DeviceContext* ctx_ = nullptr;
  std::vector<Bucket> buckets_;
  std::vector<BucketInfo> initial_buckets_;
  std::vector<BucketInfo> rebuilt_buckets_;
  std::vector<std::string> bucket_names_;  // "ddp.bucket0", ... (tag owners)

  bool require_backward_grad_sync_ = true;
  bool require_forward_param_sync_ = true;
  bool has_marked_unused_ = false;
  bool expect_autograd_hooks_ = false;
  bool has_rebuilt_ = false;
  std::vector<std::size_t> ready_order_;  // first backward's gradient-ready order
  std::vector<bool> marked_;              // ready in this backward
  std::size_t next_bucket_ = 0;
  std::int64_t finalized_backwards_ = 0;  // synced backward passes so far
  Tensor local_used_map_dev_;             // find_unused: int32 per parameter
  std::vector<std::int32_t> local_used_;  // host copy
  std::vector<std::size_t> unused_;       // found by the graph search
};

}  // namespace memscope::reducer

#endif  // MEMSCOPE_REDUCER_DDP_H_
