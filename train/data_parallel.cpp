#include "train/data_parallel.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/alloc_tag.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "train/step_loop.h"

namespace memscope {
namespace {

constexpr const char* kReplicate = "DataParallel.replicate";
constexpr const char* kScatter = "DataParallel.scatter";
constexpr const char* kGather = "DataParallel.gather";
constexpr const char* kReduceAdd = "DataParallel.reduce_add";

// torch._utils._take_tensors(tensors, size_limit) (fine_grained=False): one
// open group per dtype, closed as soon as it reaches the limit; the groups
// still open come last, by dtype.
std::vector<std::vector<std::size_t>> TakeTensors(const std::vector<Tensor>& tensors, std::size_t limit) {
  std::vector<std::vector<std::size_t>> results;
  std::map<int, std::pair<std::vector<std::size_t>, std::size_t>> open;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    auto& [members, bytes] = open[static_cast<int>(tensors[i].dtype())];
    members.push_back(i);
    bytes += tensors[i].nbytes();
    if (bytes >= limit) {
      results.push_back(std::move(members));
      members.clear();
      bytes = 0;
    }
  }
  for (auto& [dtype, group] : open) {
    if (!group.first.empty()) results.push_back(std::move(group.first));
  }
  return results;
}

// utils::flatten_dense_tensors: one tensor is viewed flat (no allocation);
// several are copied into one new buffer on the first one's device.
Tensor FlattenDense(const std::vector<Tensor>& tensors) {
  if (tensors.size() == 1) return ops::View(ops::Contiguous(tensors[0]), {-1});
  std::int64_t total = 0;
  for (const Tensor& t : tensors) total += t.numel();
  Tensor flat = Tensor::Empty(tensors[0].ctx(), {total}, tensors[0].dtype());
  std::int64_t offset = 0;
  for (const Tensor& t : tensors) {
    Tensor part = flat.AsStrided(t.sizes(), ContiguousStrides(t.sizes()), offset);
    ops::CopyInPlace(part, t);
    offset += t.numel();
  }
  return flat;
}

// utils::unflatten_dense_tensors: views of `flat` shaped like `like`.
std::vector<Tensor> UnflattenDense(const Tensor& flat, const std::vector<Tensor>& like) {
  std::vector<Tensor> out;
  std::int64_t offset = flat.impl()->offset;
  for (const Tensor& t : like) {
    out.push_back(flat.AsStrided(t.sizes(), ContiguousStrides(t.sizes()), offset));
    offset += t.numel();
  }
  return out;
}

Tensor CopyTo(DeviceContext& ctx, const Tensor& t) {
  Tensor out = Tensor::Empty(ctx, t.sizes(), t.dtype());
  ops::CopyInPlace(out, t);
  return out;
}

// comm.broadcast_coalesced(tensors, devices) (torch/csrc/cuda/comm.cpp):
// device 0 gets the tensors themselves; per group of take_tensors, the group
// is flattened on device 0 (a temporary when it has several tensors) and
// broadcast into one new buffer per other device, whose views are that
// device's copies.
std::vector<std::vector<Tensor>> BroadcastCoalesced(const std::vector<Tensor>& tensors,
                                                    const std::vector<DeviceContext*>& devices, Category copies) {
  NoGradGuard no_grad;
  std::vector<std::vector<Tensor>> out(devices.size(), std::vector<Tensor>(tensors.size()));
  out[0] = tensors;
  for (const std::vector<std::size_t>& group : TakeTensors(tensors, kDataParallelBufferSize)) {
    std::vector<Tensor> members;
    for (std::size_t i : group) members.push_back(tensors[i].Detach());
    Tensor flat;
    {
      ScopedTag tag(Category::kCommTemp, kReplicate);
      flat = FlattenDense(members);
    }
    for (std::size_t d = 1; d < devices.size(); ++d) {
      Tensor copy;
      {
        ScopedTag tag(copies, kReplicate);
        copy = CopyTo(*devices[d], flat);
      }
      std::vector<Tensor> views = UnflattenDense(copy, members);
      for (std::size_t k = 0; k < group.size(); ++k) out[d][group[k]] = std::move(views[k]);
    }
  }
  return out;
}

// ReduceAddCoalesced.forward (comm.reduce_add_coalesced, destination device
// 0): `grads` are Broadcast's gradient outputs, device-major (P per device).
// Per group of take_tensors: each device's gradients flattened (a new buffer
// when the group has several), then reduce_add into a new buffer on device 0
// (NCCL: empty_like + reduce), whose views are the results. The Python
// variables flat_tensors and flat_result hold the previous group's buffers
// until the next group's are made.
struct ParamShape {
  Shape sizes;
  DType dtype;
};

TensorList ReduceAddCoalesced(TensorList& grads, std::size_t params, const std::vector<DeviceContext*>& devices,
                              const std::vector<ParamShape>& like) {
  const std::size_t n = devices.size();
  std::vector<std::vector<Tensor>> dense(n);
  for (std::size_t d = 0; d < n; ++d) {
    for (std::size_t k = 0; k < params; ++k) {
      Tensor& g = grads[d * params + k];
      if (!g.defined()) {  // materialize_grads: an output without a gradient gets zeros
        ScopedTag tag(Category::kAutogradDetail, kReduceAdd);
        g = Tensor::Zeros(*devices[d], like[k].sizes, like[k].dtype);
      }
      dense[d].push_back(g);
    }
  }
  TensorList out(params);
  std::vector<Tensor> flats;
  Tensor flat_result;
  for (const std::vector<std::size_t>& group : TakeTensors(dense[0], kDataParallelBufferSize)) {
    std::vector<Tensor> next;
    std::vector<Tensor> members0;
    for (std::size_t d = 0; d < n; ++d) {
      std::vector<Tensor> members;
      for (std::size_t i : group) members.push_back(dense[d][i]);
      ScopedTag tag(Category::kCommTemp, kReduceAdd);
      next.push_back(FlattenDense(members));
      if (d == 0) members0 = std::move(members);
    }
    flats = std::move(next);
    Tensor result;
    {
      ScopedTag tag(Category::kGradient, kReduceAdd);
      result = Tensor::Empty(*devices[0], flats[0].sizes(), flats[0].dtype());
    }
    ops::CopyInPlace(result, flats[0]);
    for (std::size_t d = 1; d < n; ++d) ops::AddInPlace(result, flats[d]);
    flat_result = result;
    std::vector<Tensor> views = UnflattenDense(flat_result, members0);
    for (std::size_t k = 0; k < group.size(); ++k) out[group[k]] = std::move(views[k]);
  }
  // The module's .grad is released with `out` by the engine, the replicas'
  // gradients (`grads`) right after this node.
  dense.clear();
  return out;
}

// replicate(module, devices)'s parameters: Broadcast.apply(devices, *params).
// Device 0's copies are new handles of the parameters themselves (a Function
// returning its inputs), the others' are BroadcastCoalesced's; every copy's
// gradient flows to the one BroadcastBackward node.
std::vector<std::vector<Tensor>> ReplicateParameters(const std::vector<Tensor>& params,
                                                     const std::vector<DeviceContext*>& devices) {
  std::vector<std::vector<Tensor>> copies = BroadcastCoalesced(params, devices, Category::kParameter);
  for (std::size_t k = 0; k < params.size(); ++k) copies[0][k] = params[k].Detach();
  if (!GradMode::enabled() || params.empty()) return copies;
  std::vector<const Tensor*> inputs;
  for (const Tensor& p : params) inputs.push_back(&p);
  std::vector<Tensor*> outputs;
  for (std::vector<Tensor>& device : copies) {
    for (Tensor& t : device) outputs.push_back(&t);
  }
  std::vector<ParamShape> like;
  for (const Tensor& p : params) like.push_back({p.sizes(), p.dtype()});
  RecordOp("BroadcastBackward", inputs, outputs, [n = params.size(), devices, like](Node&, TensorList& grads) {
    return ReduceAddCoalesced(grads, n, devices, like);
  });
  return copies;
}

// comm.scatter of the input (on device 0) into torch.chunk pieces along dim
// 0: device 0's is a view, the others copies on their devices.
std::vector<Tensor> ScatterInput(const Tensor& input, const std::vector<std::int64_t>& chunks,
                                 const std::vector<DeviceContext*>& devices) {
  NoGradGuard no_grad;
  std::vector<Tensor> out;
  std::int64_t start = 0;
  for (std::size_t d = 0; d < chunks.size(); ++d) {
    Tensor piece = ops::Narrow(input, 0, start, chunks[d]);
    start += chunks[d];
    if (d == 0) {
      out.push_back(piece);
    } else {
      ScopedTag tag(Category::kInput, kScatter);
      out.push_back(CopyTo(*devices[d], piece));
    }
  }
  return out;
}

// Gather.apply(output_device 0, dim 0, *outputs): one new tensor on device 0
// with each replica's output copied in. Its backward is Scatter.apply: the
// gradient's chunk 0 as a view, the others copied to their devices.
Tensor GatherOutputs(const std::vector<Tensor>& outputs, const std::vector<DeviceContext*>& devices) {
  Shape shape = outputs[0].sizes();
  std::vector<std::int64_t> sizes;
  shape[0] = 0;
  for (const Tensor& o : outputs) {
    sizes.push_back(o.size(0));
    shape[0] += o.size(0);
  }
  Tensor result;
  {
    ScopedTag tag(Category::kActivation, kGather);
    result = Tensor::Empty(*devices[0], shape, outputs[0].dtype());
  }
  {
    NoGradGuard no_grad;
    std::int64_t start = 0;
    for (const Tensor& o : outputs) {
      Tensor part = ops::Narrow(result, 0, start, o.size(0));
      ops::CopyInPlace(part, o);
      start += o.size(0);
    }
  }
  std::vector<const Tensor*> inputs;
  for (const Tensor& o : outputs) inputs.push_back(&o);
  bool needs_grad = false;
  for (const Tensor& o : outputs) needs_grad = needs_grad || o.requires_grad();
  if (GradMode::enabled() && needs_grad) {
    RecordOp("GatherBackward", inputs, {&result}, [sizes, devices](Node& node, TensorList& g) {
      TensorList grads;
      std::int64_t start = 0;
      for (std::size_t d = 0; d < sizes.size(); ++d) {
        Tensor piece = ops::Narrow(g[0], 0, start, sizes[d]);
        start += sizes[d];
        if (d == 0) {
          grads.push_back(piece);
        } else {
          GradTag tag(node, d);
          grads.push_back(CopyTo(*devices[d], piece));
        }
      }
      return grads;
    });
  }
  return result;
}

// The replicas of one step: a model per used device (its batch is that
// device's chunk) whose parameter and buffer slots are set to the copies.
struct Replicas {
  std::vector<std::unique_ptr<Model>> models;
};

absl::StatusOr<Replicas> MakeReplicaModels(const TrainOptions& options, const std::vector<std::int64_t>& chunks) {
  Replicas r;
  for (std::int64_t chunk : chunks) {
    ModelOptions mo = options.model_options;
    mo.batch_size = chunk;
    absl::StatusOr<std::unique_ptr<Model>> m = CreateModel(options.model, mo);
    if (!m.ok()) return m.status();
    r.models.push_back(std::move(*m));
  }
  return r;
}

// replicate(): parameters with autograd (Broadcast.apply), frozen parameters
// and buffers detached (comm.broadcast_coalesced); returns nothing: the
// copies live in the replicas' slots.
void Replicate(Model& module, Replicas& replicas, const std::vector<DeviceContext*>& devices) {
  std::vector<Tensor*> slots = module.AllParameters();
  std::vector<Tensor> trainable, frozen;
  std::vector<std::size_t> trainable_at, frozen_at;
  for (std::size_t k = 0; k < slots.size(); ++k) {
    (slots[k]->requires_grad() ? trainable : frozen).push_back(*slots[k]);
    (slots[k]->requires_grad() ? trainable_at : frozen_at).push_back(k);
  }
  std::vector<std::vector<Tensor>> params = ReplicateParameters(trainable, devices);
  std::vector<std::vector<Tensor>> fixed = BroadcastCoalesced(frozen, devices, Category::kParameter);
  std::vector<Tensor*> module_buffers = module.Buffers();
  std::vector<Tensor> buffers;
  for (Tensor* b : module_buffers) buffers.push_back(*b);
  std::vector<std::vector<Tensor>> buffer_copies = BroadcastCoalesced(buffers, devices, Category::kOther);
  for (std::size_t d = 0; d < replicas.models.size(); ++d) {
    std::vector<Tensor*> rp = replicas.models[d]->AllParameters();
    for (std::size_t i = 0; i < trainable_at.size(); ++i) *rp[trainable_at[i]] = params[d][i];
    for (std::size_t i = 0; i < frozen_at.size(); ++i) *rp[frozen_at[i]] = d == 0 ? fixed[0][i].Detach() : fixed[d][i];
    std::vector<Tensor*> rb = replicas.models[d]->Buffers();
    for (std::size_t i = 0; i < rb.size(); ++i) *rb[i] = buffer_copies[d][i];
  }
}

// The replicas go when DataParallel.forward returns: what the autograd graph
// saved of them stays until backward releases it.
void DropReplicas(Replicas& replicas) {
  for (std::unique_ptr<Model>& m : replicas.models) {
    for (Tensor* p : m->AllParameters()) *p = Tensor();
    for (Tensor* b : m->Buffers()) *b = Tensor();
  }
}

// DataParallel.forward on `batch` (global, on device 0).
Tensor DataParallelForward(Model& module, Replicas& replicas, const Batch& batch,
                           const std::vector<std::int64_t>& chunks, const std::vector<DeviceContext*>& devices) {
  std::vector<DeviceContext*> used(devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(chunks.size()));
  std::vector<Tensor> inputs = ScatterInput(batch.input, chunks, used);
  Replicate(module, replicas, used);
  std::vector<Tensor> outputs;
  for (std::size_t d = 0; d < chunks.size(); ++d) {
    ScopedTag tag(Category::kActivation, "");
    outputs.push_back(replicas.models[d]->Forward(Batch{inputs[d], Tensor()}));
  }
  inputs.clear();
  DropReplicas(replicas);
  return GatherOutputs(outputs, used);
}

// The training loop (step_loop.h's, one micro-batch per step) under
// DataParallel: forward is DataParallelForward, phases are marked on every
// device's timeline, and each step's batch must be batch-first.
void TrainSteps(const TrainOptions& options, Model& module, Replicas& replicas, const std::vector<std::int64_t>& chunks,
                const std::vector<DeviceContext*>& devices, const std::vector<Recorder*>& recorders,
                TrainResult& result) {
  StepLoop loop(options, module, *devices[0]);
  StepLoopParts parts;
  parts.recorders = recorders;
  parts.forward = [&](const Batch& batch, std::int64_t, Tensor& output) {
    output = DataParallelForward(module, replicas, batch, chunks, devices);
  };
  parts.check_batch = [&](const Batch& batch) {
    if (batch.input.dim() == 0 || batch.input.size(0) != module.batch_size()) {
      throw TensorError(absl::StrCat("--dp: ", std::string(module.name()), "'s input ", ShapeText(batch.input.sizes()),
                                     " is not batch-first (DataParallel scatters dim 0)"));
    }
  };
  loop.Run(parts, result);
}

}  // namespace

std::vector<std::int64_t> ChunkSizes(std::int64_t n, int chunks) {
  std::vector<std::int64_t> out;
  if (n <= 0 || chunks <= 0) return out;
  const std::int64_t size = (n + chunks - 1) / chunks;
  for (std::int64_t start = 0; start < n; start += size) out.push_back(std::min(size, n - start));
  return out;
}

namespace {
absl::Status CheckOptions(const TrainOptions& options, std::size_t devices, const Model& model, bool cpu) {
  if (devices < 2) return absl::InvalidArgumentError("--dp needs at least 2 devices");
  if (options.steps < 1) return absl::InvalidArgumentError("--steps must be at least 1");
  if (options.ddp) return absl::InvalidArgumentError("--dp is DataParallel: it does not combine with DDP");
  if (options.grad_accum != 1) return absl::InvalidArgumentError("--dp with --grad-accum is not modelled");
  if (options.record_values) return absl::InvalidArgumentError("--dp does not record parameter values");
  if (options.model_options.checkpoint_activations) {
    // Reentrant checkpoint's backward reruns the block and backpropagates
    // through it at once, which reaches the replicas' Broadcast node.
    return absl::InvalidArgumentError("--dp with --checkpoint-activations is not modelled");
  }
  if (model.ContainsCudnnRnn()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dp: ", std::string(model.name()),
                     " has cuDNN RNN layers, whose flattened weights DataParallel's replicas do not "
                     "model here; use a model without GRU/LSTM layers"));
  }
  if (cpu) {
    bool kernels = false;
    for (const ModelInfo& m : ListModels()) kernels = kernels || (m.name == options.model && m.cpu);
    if (!kernels)
      return absl::InvalidArgumentError(
          absl::StrCat("--exec cpu runs mlp and cifar-net; ", options.model, " needs --exec meta"));
    if (options.amp) return absl::InvalidArgumentError("--amp needs --exec meta (the CPU kernels compute float32)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDataParallelOptions(const TrainOptions& options, int devices, bool cpu) {
  absl::StatusOr<std::unique_ptr<Model>> created = CreateModel(options.model, options.model_options);
  if (!created.ok()) return created.status();
  return CheckOptions(options, static_cast<std::size_t>(std::max(devices, 0)), **created, cpu);
}

absl::StatusOr<DataParallelResult> TrainDataParallel(const TrainOptions& options,
                                                     const std::vector<DeviceContext*>& devices,
                                                     const std::vector<Recorder*>& recorders) {
  absl::StatusOr<std::unique_ptr<Model>> created = CreateModel(options.model, options.model_options);
  if (!created.ok()) return created.status();
  Model& module = **created;
  if (devices.empty()) return absl::InvalidArgumentError("--dp needs at least 2 devices");
  if (absl::Status s = CheckOptions(options, devices.size(), module, devices[0]->computes()); !s.ok()) return s;
  DataParallelResult out;
  out.chunk_sizes = ChunkSizes(module.batch_size(), static_cast<int>(devices.size()));
  absl::StatusOr<Replicas> replicas = MakeReplicaModels(options, out.chunk_sizes);
  if (!replicas.ok()) return replicas.status();
  TrainResult& result = out.train;
  result.parameters = module.NumParameters();
  try {
    {
      PhaseScope phase(recorders, Phase::kModel, kNoStep);
      module.Materialize(*devices[0]);
    }
    TrainSteps(options, module, *replicas, out.chunk_sizes, devices, recorders, result);
  } catch (const TensorError& e) {
    result.oom = e.out_of_memory();
    result.error = e.what();
    if (result.oom) {
      for (std::size_t d = 0; d < devices.size() && out.oom_device < 0; ++d) {
        if (devices[d]->allocator().GetStats().num_ooms > 0) out.oom_device = static_cast<int>(d);
      }
    }
  } catch (const TrainStopped& e) {
    result.interrupted = e.signal;
    result.error = e.error;
  }
  return out;
}

}  // namespace memscope
