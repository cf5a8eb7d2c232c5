#include "tensor/autograd.h"

#include <limits>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "tensor/ops.h"

namespace memscope {
namespace {

thread_local std::uint64_t sequence_counter = 0;
constexpr std::uint64_t kAccumulateGradSequenceNr = std::numeric_limits<std::uint64_t>::max();

class FunctionNode final : public Node {
 public:
  FunctionNode(std::string_view name, BackwardFn fn) : Node(name, sequence_counter++), fn_(std::move(fn)) {}
  TensorList Apply(TensorList& grads) override {
    if (!fn_) throw TensorError(absl::StrCat(std::string(name()), ": backward through the graph a second time"));
    return fn_(*this, grads);
  }
  void ReleaseSaved() override { fn_ = nullptr; }

 private:
  BackwardFn fn_;
};

}  // namespace

// torch/csrc/autograd/functions/accumulate_grad.h
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& variable)
      : Node("AccumulateGrad", kAccumulateGradSequenceNr), variable_(variable), owner_(variable->name) {}
  bool is_accumulate_grad() const override { return true; }
  std::string_view param_name() const { return owner_; }

  TensorList Apply(TensorList& grads) override {
    Tensor new_grad = std::move(grads[0]);
    grads[0] = Tensor();
    const std::shared_ptr<TensorImpl>& var = variable_;
    if (!new_grad.defined()) return {};
    // A leaf that is not a parameter (checkpoint's recompute input) holds an
    // activation's gradient.
    ScopedTag tag(owner_.empty() ? Category::kAutogradDetail : Category::kGradient, owner_);
    if (!var->grad) {
      // Steal the buffer when this is its only reference and its layout is
      // the parameter's (obeys_layout_contract); else clone.
      const bool stealable = new_grad.use_count() == 1 && new_grad.is_contiguous() && new_grad.dtype() == var->dtype &&
                             new_grad.sizes() == var->sizes && new_grad.storage()->nbytes() >= new_grad.nbytes();
      var->grad =
          stealable ? new_grad.impl_ptr()
                    : ops::Clone(new_grad.dtype() == var->dtype ? new_grad : ops::To(new_grad, var->dtype)).impl_ptr();
    } else {
      Tensor g(var->grad);
      ops::AddInPlace(g, new_grad);
    }
    return {};
  }

 private:
  std::shared_ptr<TensorImpl> variable_;  // as PyTorch: the graph keeps its leaves alive
  std::string_view owner_;
};

Node::Node(std::string_view name, std::uint64_t sequence_nr)
    : name_(name), sequence_nr_(sequence_nr), owner_(ScopedTag::current_owner()) {}

namespace {
// The node a gradient finally lands in: pure view nodes (which pass the
// gradient on as a view) are looked through, so a weight's gradient that
// reaches AccumulateGrad through TransposeBackward0 is the parameter's.
const Node* GradientTarget(const Node* n) {
  while (n != nullptr && !n->is_accumulate_grad() && n->next_edges.size() == 1) {
    const std::string_view name = n->name();
    if (name != "TransposeBackward0" && name != "ViewBackward0" && name != "PermuteBackward0" &&
        name != "UnsqueezeBackward0" && name != "SqueezeBackward1") {
      break;
    }
    n = n->next_edges[0].fn.get();
  }
  return n;
}

const AccumulateGrad* ParameterTarget(const Node& node, std::size_t input) {
  if (input >= node.next_edges.size()) return nullptr;
  const Node* target = GradientTarget(node.next_edges[input].fn.get());
  if (target == nullptr || !target->is_accumulate_grad()) return nullptr;
  const auto* acc = static_cast<const AccumulateGrad*>(target);
  return acc->param_name().empty() ? nullptr : acc;
}
}  // namespace

namespace {
ScopedTag TagForGradient(const Node& node, std::size_t input) {
  const AccumulateGrad* parameter = ParameterTarget(node, input);
  if (parameter) return ScopedTag(Category::kGradient, parameter->param_name());
  // DataParallel: a replica's parameter gradient goes to the Broadcast that
  // made the replica (it is reduced onto the module's .grad there).
  if (input < node.next_edges.size()) {
    const Node* target = GradientTarget(node.next_edges[input].fn.get());
    if (target != nullptr && target->name() == "BroadcastBackward") return ScopedTag(Category::kGradient, node.owner());
  }
  return ScopedTag(Category::kAutogradDetail, node.owner());
}
}  // namespace

GradTag::GradTag(const Node& node, std::size_t input) : tag_(TagForGradient(node, input)) {}

std::uint64_t NextSequenceNr() { return sequence_counter; }

bool NeedsGrad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor* t : inputs) {
    if (t != nullptr && t->defined() && t->requires_grad()) return true;
  }
  return false;
}

Edge GradientEdge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  TensorImpl* impl = t.impl();
  if (impl->grad_fn) return {impl->grad_fn, impl->output_nr};
  std::shared_ptr<Node> acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl->grad_accumulator = acc;
  }
  return {acc, 0};
}

std::shared_ptr<Node> RecordOp(std::string_view name, const std::vector<const Tensor*>& inputs,
                               const std::vector<Tensor*>& outputs, BackwardFn fn) {
  auto node = std::make_shared<FunctionNode>(name, std::move(fn));
  node->next_edges.reserve(inputs.size());
  node->input_dtypes.reserve(inputs.size());
  for (const Tensor* t : inputs) {
    node->next_edges.push_back(t ? GradientEdge(*t) : Edge{});
    node->input_dtypes.push_back(t && t->defined() ? t->dtype() : DType::kFloat32);
  }
  node->num_outputs = static_cast<std::uint32_t>(outputs.size());
  std::uint32_t nr = 0;
  for (Tensor* out : outputs) {
    if (out != nullptr && out->defined()) {
      TensorImpl* impl = out->impl();
      impl->requires_grad = true;
      impl->grad_fn = node;
      impl->output_nr = nr;
    }
    ++nr;
  }
  return node;
}

std::shared_ptr<Node> RecordOp(std::string_view name, std::initializer_list<const Tensor*> inputs,
                               std::initializer_list<Tensor*> outputs, BackwardFn fn) {
  return RecordOp(name, std::vector<const Tensor*>(inputs), std::vector<Tensor*>(outputs), std::move(fn));
}

namespace {
// The final callbacks of the outermost running Backward (null outside one).
thread_local std::vector<std::function<void()>>* final_callbacks = nullptr;
thread_local TorchBehaviour torch_behaviour;
void RunGraph(const TensorList& roots, TensorList root_grads);
}  // namespace

void QueueBackwardCallback(std::function<void()> callback) {
  if (final_callbacks == nullptr) throw TensorError("queue_callback: no backward pass is running");
  final_callbacks->push_back(std::move(callback));
}

TorchBehaviour& CurrentTorchBehaviour() { return torch_behaviour; }

void Backward(const TensorList& roots, TensorList root_grads) {
  if (final_callbacks != nullptr) {  // reentrant (checkpoint): callbacks go to the outermost pass
    RunGraph(roots, std::move(root_grads));
    return;
  }
  std::vector<std::function<void()>> callbacks;
  final_callbacks = &callbacks;
  struct Reset {
    ~Reset() { final_callbacks = nullptr; }
  } reset;
  RunGraph(roots, std::move(root_grads));
  // A callback may queue more (as in PyTorch, they run in order until none is left).
  for (std::size_t i = 0; i < callbacks.size(); ++i) {
    std::function<void()> cb = std::move(callbacks[i]);
    cb();
  }
}

namespace {
void RunGraph(const TensorList& roots, TensorList root_grads) {
  NoGradGuard no_grad;
  root_grads.resize(roots.size());
  // Dependencies: how many edges point at each node reachable from the roots.
  absl::flat_hash_map<Node*, int> dependencies;
  absl::flat_hash_map<Node*, TensorList> buffers;
  std::vector<Node*> stack;
  for (const Tensor& r : roots) {
    const Edge e = GradientEdge(r);
    if (!e.fn) throw TensorError("backward: a root does not require grad and has no grad_fn");
    if (dependencies.emplace(e.fn.get(), 0).second) stack.push_back(e.fn.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      auto [it, inserted] = dependencies.emplace(e.fn.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(e.fn.get());
    }
  }

  struct Ready {
    std::uint64_t sequence_nr;
    std::uint64_t order;
    Node* node;
    bool operator<(const Ready& o) const {
      if (sequence_nr != o.sequence_nr) return sequence_nr < o.sequence_nr;
      return order > o.order;  // FIFO among equals
    }
  };
  std::priority_queue<Ready> ready;
  std::uint64_t order = 0;
  // Keeps every node of the graph alive while it runs (the roots hold them).
  std::vector<std::shared_ptr<Node>> root_nodes;

  auto add_to_buffer = [&](const Edge& e, Tensor grad) {
    TensorList& buf = buffers[e.fn.get()];
    if (buf.size() < e.fn->num_outputs) buf.resize(e.fn->num_outputs);
    Tensor& slot = buf[e.input_nr];
    if (!slot.defined()) {
      slot = std::move(grad);
    } else {
      ScopedTag tag(Category::kAutogradDetail, e.fn->owner());
      if (CurrentTorchBehaviour().inplace_accumulation && slot.use_count() == 1 &&
          slot.storage().use_count() == 1 && slot.is_contiguous()) {
        ops::AddInPlace(slot, grad);
      } else {
        slot = ops::Add(slot, grad);
      }
    }
  };

  for (std::size_t i = 0; i < roots.size(); ++i) {
    const Edge e = GradientEdge(roots[i]);
    root_nodes.push_back(e.fn);
    Tensor g = root_grads[i];
    if (!g.defined()) {
      if (roots[i].numel() != 1) throw TensorError("grad can be implicitly created only for scalar outputs");
      ScopedTag tag(Category::kAutogradDetail, e.fn->owner());
      g = ops::OnesLike(roots[i]);
      // torch.autograd.backward's Python frame holds the gradients it made
      // (_make_grads) until the engine returns: the ones live through backward.
      root_grads[i] = g;
    }
    add_to_buffer(e, std::move(g));
  }
  for (const auto& n : root_nodes) {
    if (dependencies[n.get()] == 0) {
      dependencies[n.get()] = -1;  // queued
      ready.push({n->sequence_nr(), order++, n.get()});
    }
  }

  while (!ready.empty()) {
    Node* node = ready.top().node;
    ready.pop();
    TensorList outputs;
    {
      TensorList inputs;
      auto it = buffers.find(node);
      if (it != buffers.end()) {
        inputs = std::move(it->second);
        buffers.erase(it);
      }
      inputs.resize(node->num_outputs);
      // What a backward allocates without a tag of its own (temporaries,
      // gradients not made under GradTag) is autograd's, for the node's owner.
      ScopedTag tag(Category::kAutogradDetail, node->owner());
      outputs = node->Apply(inputs);
      for (const auto& hook : node->post_hooks()) hook();
    }  // the incoming gradients are freed here
    node->ReleaseSaved();
    for (std::size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.fn) continue;
      if (i < outputs.size() && outputs[i].defined()) {
        if (i < node->input_dtypes.size() && outputs[i].dtype() != node->input_dtypes[i]) {
          GradTag tag(*node, i);
          outputs[i] = ops::To(outputs[i], node->input_dtypes[i]);
        }
        add_to_buffer(e, std::move(outputs[i]));
      }
      int& deps = dependencies[e.fn.get()];
      if (--deps == 0) {
        deps = -1;
        ready.push({e.fn->sequence_nr(), order++, e.fn.get()});
      }
    }
  }
}
}  // namespace

Tensor Checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  const std::uint64_t seed = input.ctx().seed();
  const std::optional<DType> autocast = AutocastGuard::current();
  Tensor out;
  {
    NoGradGuard no_grad;
    out = fn(input);
  }
  if (NeedsGrad({&input})) {
    RecordOp("CheckpointFunctionBackward", {&input}, {&out},
             [fn, saved = input.Detach(), seed, autocast](Node& n, TensorList& g) {
               DeviceContext& ctx = saved.ctx();
               const std::uint64_t now = ctx.seed();
               ctx.set_seed(seed);
               Tensor x = saved.Detach();
               x.set_requires_grad(true);
               Tensor y;
               {
                 EnableGradGuard grad;
                 ScopedTag tag(Category::kActivation, n.owner());
                 std::optional<AutocastGuard> cast;
                 if (autocast) cast.emplace(*autocast);
                 y = fn(x);
               }
               ctx.set_seed(now);
               Backward({y}, {g[0]});
               return TensorList{x.grad()};
             });
  }
  return out;
}

}  // namespace memscope
