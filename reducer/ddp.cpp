#include "reducer/ddp.h"

#include <algorithm>
#include <deque>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/ops.h"

namespace memscope::reducer {
namespace {

bool SameStorage(const Tensor& a, const Tensor& b) { return a.defined() && b.defined() && a.storage() == b.storage(); }

Tensor SlotView(const Tensor& flat, const Tensor& like, std::int64_t offset) {
  return flat.AsStrided(like.sizes(), ContiguousStrides(like.sizes()), offset);
}

}  // namespace

std::vector<std::uint64_t> BroadcastCoalesced(const std::vector<Tensor*>& tensors, Communicator& comm, int root,
                                              std::uint64_t bucket_bytes) {
  NoGradGuard no_grad;
  // take_tensors: one open group per dtype, closed once it reaches the limit.
  std::vector<std::vector<Tensor*>> groups;
  std::map<DType, std::pair<std::vector<Tensor*>, std::uint64_t>> open;
  for (Tensor* t : tensors) {
    auto& [members, size] = open[t->dtype()];
    members.push_back(t);
    size += t->nbytes();
    if (size >= bucket_bytes) {
      groups.push_back(std::move(members));
      members.clear();
      size = 0;
    }
  }
  for (auto& [dtype, group] : open) {
    if (!group.first.empty()) groups.push_back(std::move(group.first));
  }

  struct InFlight {
    std::vector<Tensor*> members;
    Tensor flat;  // undefined for a single tensor (broadcast in place)
  };
  std::deque<InFlight> in_flight;
  auto finish = [&] {
    InFlight& f = in_flight.front();
    if (f.flat.defined()) {  // unflatten: views, copied back into the tensors
      std::int64_t offset = 0;
      for (Tensor* t : f.members) {
        ops::CopyInPlace(*t, SlotView(f.flat, *t, offset));
        offset += t->numel();
      }
    }
    in_flight.pop_front();  // frees the flat tensor
  };
  std::vector<std::uint64_t> sizes;
  for (std::vector<Tensor*>& members : groups) {
    if (in_flight.size() >= 2) finish();
    InFlight f{std::move(members), Tensor()};
    const Tensor& first = *f.members.front();
    std::uint64_t bytes = 0;
    std::int64_t numel = 0;
    for (Tensor* t : f.members) {
      bytes += t->nbytes();
      numel += t->numel();
    }
    sizes.push_back(bytes);
    if (f.members.size() == 1) {
      comm.Broadcast(first.raw_data(), static_cast<std::size_t>(numel), first.dtype(), root);
    } else {
      {
        ScopedTag tag(Category::kCommTemp, "ddp.broadcast_coalesced");
        f.flat = Tensor::Empty(first.ctx(), {numel}, first.dtype());
      }
      std::int64_t offset = 0;
      for (Tensor* t : f.members) {
        Tensor slot = SlotView(f.flat, *t, offset);
        ops::CopyInPlace(slot, *t);
        offset += t->numel();
      }
      comm.Broadcast(f.flat.raw_data(), static_cast<std::size_t>(numel), first.dtype(), root);
    }
    in_flight.push_back(std::move(f));
  }
  while (!in_flight.empty()) finish();
  return sizes;
}

DistributedDataParallel::DistributedDataParallel(std::vector<Tensor*> params, std::vector<Tensor*> buffers,
                                                 Communicator& comm, const DdpOptions& options)
    : buffers_(std::move(buffers)), comm_(comm), options_(options) {
  NoGradGuard no_grad;
  // 1. Trainable parameters, shared ones once.
  absl::flat_hash_set<const TensorImpl*> seen;
  for (Tensor* p : params) {
    if (p->requires_grad() && seen.insert(p->impl()).second) vars_.push_back(Variable{p, nullptr, 0, 0});
  }
  if (vars_.empty()) throw TensorError("DDP: the module has no parameter that requires gradients");
  ctx_ = &vars_.front().param->ctx();
  if (options_.comm_hook != CommHook::kNone && ctx_->computes()) {
    throw TensorError("DDP: --comm-hook fp16|bf16 needs --exec meta (the CPU kernels compute float32)");
  }
  // 2. Same model everywhere.
  VerifyParams();
  // 3. Everyone starts from rank 0's parameters (and buffers).
  std::vector<Tensor*> states;
  for (const Variable& v : vars_) states.push_back(v.param);
  if (options_.broadcast_buffers) states.insert(states.end(), buffers_.begin(), buffers_.end());
  BroadcastCoalesced(states, comm_, 0);
  // 4. Buckets.
  std::vector<BucketTensor> tensors;
  for (const Variable& v : vars_) tensors.push_back({v.param->nbytes(), v.param->dtype()});
  InitializeBuckets(
      InitialBuckets(tensors, options_.find_unused_parameters, options_.static_graph, options_.bucket_cap_mb,
                     options_.first_bucket_from_cap),
      &initial_buckets_);
  if (options_.find_unused_parameters) {
    ScopedTag tag(Category::kDdpBucket, "ddp.local_used_map");
    local_used_map_dev_ = Tensor::Zeros(*ctx_, {static_cast<std::int64_t>(vars_.size())}, DType::kInt32);
  }
  local_used_.assign(vars_.size(), 0);
  marked_.assign(vars_.size(), false);
  // 5. A hook on each parameter's AccumulateGrad.
  for (std::size_t i = 0; i < vars_.size(); ++i) {
    vars_[i].grad_accumulator = GradientEdge(*vars_[i].param).fn;
    vars_[i].grad_accumulator->AddPostHook([this, i] { AutogradHook(i); });
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (Variable& v : vars_) {
    if (v.grad_accumulator) v.grad_accumulator->ClearPostHooks();
  }
}

void DistributedDataParallel::VerifyParams() {
  // Sizes and strides of every parameter, gathered from every rank.
  std::vector<std::int64_t> metadata;
  for (const Variable& v : vars_) {
    metadata.insert(metadata.end(), v.param->sizes().begin(), v.param->sizes().end());
    metadata.insert(metadata.end(), v.param->strides().begin(), v.param->strides().end());
  }
  const auto n = static_cast<std::int64_t>(metadata.size());
  std::vector<std::int64_t> gathered(metadata.size() * static_cast<std::size_t>(comm_.world_size()));
  {
    // The device copies PyTorch makes: metadata.to(device) and one output per rank.
    ScopedTag tag(Category::kCommTemp, "ddp.verify_params");
    std::vector<Tensor> device;
    device.push_back(Tensor::Empty(*ctx_, {n}, DType::kInt64));
    for (int r = 0; r < comm_.world_size(); ++r) device.push_back(Tensor::Empty(*ctx_, {n}, DType::kInt64));
    comm_.Allgather(metadata.data(), gathered.data(), metadata.size(), DType::kInt64);
  }
  for (int r = 0; r < comm_.world_size(); ++r) {
    if (!std::equal(metadata.begin(), metadata.end(), gathered.begin() + r * n)) {
      throw TensorError(absl::StrCat("DDP expects the same model on every rank, but rank ", r,
                                     "'s parameter sizes or strides differ from rank ", comm_.rank(), "'s"));
    }
  }
}

void DistributedDataParallel::InitializeBuckets(const BucketAssignment& assignment, std::vector<BucketInfo>* info) {
  NoGradGuard no_grad;
  buckets_.clear();  // the old buckets go first (gradient views may keep theirs alive)
  info->clear();
  bucket_names_.clear();
  for (std::size_t b = 0; b < assignment.buckets.size(); ++b) bucket_names_.push_back(absl::StrCat("ddp.bucket", b));
  buckets_.resize(assignment.buckets.size());
  for (std::size_t b = 0; b < assignment.buckets.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.vars = assignment.buckets[b];
    const DType dtype = vars_[bucket.vars.front()].param->dtype();
    std::int64_t numel = 0;
    for (std::size_t v : bucket.vars) numel += vars_[v].param->numel();
    {
      ScopedTag tag(Category::kDdpBucket, bucket_names_[b]);
      bucket.flat = Tensor::Empty(*ctx_, {numel}, dtype);
    }
    BucketInfo bi{bucket.flat.nbytes(), dtype, {}};
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < bucket.vars.size(); ++k) {
      Variable& var = vars_[bucket.vars[k]];
      var.bucket = b;
      var.slot = k;
      bucket.views.push_back(SlotView(bucket.flat, *var.param, offset));
      offset += var.param->numel();
      bi.params.push_back(var.param->name());
      // View mode: a gradient that is set moves into its slot now.
      Tensor grad = var.param->grad();
      if (options_.gradient_as_bucket_view && grad.defined() && !SameStorage(grad, bucket.flat)) {
        ops::CopyInPlace(bucket.views.back(), grad);
        var.param->set_grad(bucket.views.back());
      }
    }
    info->push_back(std::move(bi));
  }
}

std::uint64_t DistributedDataParallel::bucket_bytes() const {
  std::uint64_t total = 0;
  for (const Bucket& b : buckets_) total += b.flat.nbytes();
  return total;
}

void DistributedDataParallel::PreForward() {
  if (expect_autograd_hooks_) {
    std::vector<std::string> missing;
    for (std::size_t i = 0; i < vars_.size(); ++i) {
      if (!marked_[i]) missing.push_back(vars_[i].param->name());
    }
    throw TensorError(absl::StrCat(
        "DDP: expected to have finished reduction in the prior iteration before starting a new one; parameters "
        "that received no gradient: ",
        absl::StrJoin(missing, ", "), " (use --find-unused-parameters)"));
  }
  if (ShouldRebuild() && ready_order_.size() == vars_.size()) {
    // Every rank uses rank 0's order (sync_bucket_indices).
    std::vector<std::int64_t> order(ready_order_.begin(), ready_order_.end());
    comm_.Broadcast(order.data(), order.size(), DType::kInt64, 0);
    std::vector<std::size_t> ready(order.begin(), order.end());
    std::vector<BucketTensor> tensors;
    for (const Variable& v : vars_) tensors.push_back({v.param->nbytes(), v.param->dtype()});
    InitializeBuckets(RebuiltBuckets(tensors, ready, options_.bucket_cap_mb, options_.first_bucket_from_cap), &rebuilt_buckets_);
    has_rebuilt_ = true;
    ready_order_.clear();
  }
  if (options_.broadcast_buffers && require_forward_param_sync_ && !buffers_.empty()) {
    BroadcastCoalesced(buffers_, comm_, 0);
  }
}

Tensor DistributedDataParallel::PostForward(const Tensor& output) {
  Tensor out = output;
  const bool find_unused = options_.find_unused_parameters && !options_.static_graph;
  if (find_unused) {
    ScopedTag tag(Category::kActivation, "ddp");  // _DDPSink clones the outputs (also under no_sync)
    out = ops::Clone(output);
  }
  if (!GradMode::enabled() || !require_backward_grad_sync_) {
    require_forward_param_sync_ = false;
    return out;
  }
  require_forward_param_sync_ = true;
  unused_.clear();
  if (find_unused) {
    // Which parameters' AccumulateGrad can the backward reach?
    absl::flat_hash_set<const Node*> reached;
    std::vector<const Node*> stack;
    if (output.grad_fn()) stack.push_back(output.grad_fn().get());
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      if (!reached.insert(n).second) continue;
      for (const Edge& e : n->next_edges) {
        if (e.fn) stack.push_back(e.fn.get());
      }
    }
    for (std::size_t i = 0; i < vars_.size(); ++i) {
      if (!reached.contains(vars_[i].grad_accumulator.get())) unused_.push_back(i);
    }
  }
  // prepare_for_backward
  expect_autograd_hooks_ = true;
  next_bucket_ = 0;
  for (Bucket& b : buckets_) b.pending = b.vars.size();
  std::fill(marked_.begin(), marked_.end(), false);
  has_marked_unused_ = false;
  return out;
}

void DistributedDataParallel::AutogradHook(std::size_t index) {
  // Used in this iteration, no_sync micro-batches included, when a gradient
  // was produced; reset when the synced backward finalizes.
  if (options_.find_unused_parameters && vars_[index].param->grad().defined()) local_used_[index] = 1;
  if (!expect_autograd_hooks_) return;
  if (options_.find_unused_parameters && !has_marked_unused_) {
    has_marked_unused_ = true;
    for (std::size_t u : unused_) MarkVariableReady(u);
  }
  MarkVariableReady(index);
}

void DistributedDataParallel::MarkVariableReady(std::size_t index) {
  if (marked_[index]) {
    throw TensorError(absl::StrCat("DDP: parameter ", vars_[index].param->name(),
                                   " was marked ready twice in one backward (used in several reentrant passes?)"));
  }
  marked_[index] = true;
  // static_graph's first backward only records which hooks fire (and delays
  // its allreduce); the ready order comes from the second.
  if (ShouldRebuild() && !(options_.static_graph && finalized_backwards_ == 0)) ready_order_.push_back(index);
  MarkVariableReadyDense(index);
  Bucket& bucket = buckets_[vars_[index].bucket];
  if (--bucket.pending == 0) ReduceReadyBuckets();
  if (next_bucket_ == buckets_.size()) QueueBackwardCallback([this] { FinalizeBackward(); });
}

void DistributedDataParallel::MarkVariableReadyDense(std::size_t index) {
  NoGradGuard no_grad;
  Variable& var = vars_[index];
  Tensor& view = buckets_[var.bucket].views[var.slot];
  Tensor grad = var.param->grad();
  const bool divide = options_.comm_hook == CommHook::kNone;
  const float scale = 1.0f / static_cast<float>(comm_.world_size());
  if (grad.defined()) {
    if (!SameStorage(grad, view)) {
      ops::CopyInPlace(view, grad);  // at::mul_out(bucket_view, grad, 1 / world_size)
      if (divide) ops::MulInPlace(view, scale);
      if (options_.gradient_as_bucket_view) var.param->set_grad(view);  // the separate gradient is released
    } else if (divide) {
      ops::MulInPlace(view, scale);
    }
  } else {
    ops::ZeroInPlace(view);
  }
}

void DistributedDataParallel::ReduceReadyBuckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) AllreduceBucket(next_bucket_++);
}

void DistributedDataParallel::AllreduceBucket(std::size_t b) {
  NoGradGuard no_grad;
  Bucket& bucket = buckets_[b];
  const auto numel = static_cast<std::size_t>(bucket.flat.numel());
  if (options_.comm_hook == CommHook::kNone) {
    comm_.AllreduceSum(bucket.flat.raw_data(), numel, bucket.flat.dtype());
    return;
  }
  // fp16_compress_hook / bf16_compress_hook: buffer.to(half).div_(world_size),
  // allreduce, then decompress in place into the bucket.
  const DType half = options_.comm_hook == CommHook::kFp16 ? DType::kFloat16 : DType::kBFloat16;
  Tensor compressed;
  {
    ScopedTag tag(Category::kCommTemp, bucket_names_[b]);
    compressed = ops::To(bucket.flat, half);
  }
  comm_.AllreduceSum(compressed.raw_data(), numel, half);
  if (compressed.storage() != bucket.flat.storage()) ops::CopyInPlace(bucket.flat, compressed);
}

void DistributedDataParallel::FinalizeBackward() {
  NoGradGuard no_grad;
  expect_autograd_hooks_ = false;
  ++finalized_backwards_;
  std::vector<std::int32_t> used = local_used_;
  std::fill(local_used_.begin(), local_used_.end(), 0);
  if (options_.find_unused_parameters) {
    // PyTorch copies the host map into local_used_map_dev_ and allreduces it
    // there (no allocation); here the host copy is reduced.
    comm_.AllreduceSum(used.data(), used.size(), DType::kInt32);
  }
  for (Bucket& bucket : buckets_) {
    for (std::size_t k = 0; k < bucket.vars.size(); ++k) {
      Variable& var = vars_[bucket.vars[k]];
      const bool globally_unused = options_.find_unused_parameters && used[bucket.vars[k]] == 0;
      if (globally_unused) continue;  // .grad left untouched
      Tensor& view = bucket.views[k];
      Tensor grad = var.param->grad();
      if (!options_.gradient_as_bucket_view) {
        if (!grad.defined()) {
          ScopedTag tag(Category::kGradient, var.param->name());
          var.param->set_grad(ops::Clone(view));
        } else {
          ops::CopyInPlace(grad, view);
        }
      } else if (!grad.defined()) {
        var.param->set_grad(view);
      } else if (!SameStorage(grad, view)) {
        throw TensorError(absl::StrCat("DDP: the gradient of ", var.param->name(),
                                       " is not the expected bucket view with gradient_as_bucket_view=True"));
      }
    }
  }
}

}  // namespace memscope::reducer
