// Reverse-mode autograd with PyTorch's memory behaviour.
//
// A differentiable op records a Node that holds exactly the tensors PyTorch
// saves for its backward (tools/autograd/derivatives.yaml), and edges to the
// nodes of its inputs. A leaf that requires grad (a parameter) is reached
// through its AccumulateGrad node.
//
// Backward() follows torch/csrc/autograd/engine.cpp:
//  - dependencies are counted from the root; a node runs once every gradient
//    for it has arrived; among ready nodes the one created last (highest
//    sequence number) runs first, and AccumulateGrad nodes (sequence number
//    UINT64_MAX) run as soon as they are ready;
//  - a node's incoming gradients are freed right after it runs, then its saved
//    tensors (release_variables), then its outputs go to the next nodes' input
//    buffers, where two gradients for the same input are added in place when
//    the buffer owns its storage alone, else out of place (InputBuffer; in
//    PyTorch 1.x always out of place: TorchBehaviour);
//  - AccumulateGrad steals the incoming gradient as .grad when .grad is
//    undefined and nothing else references it (no copy), clones it otherwise,
//    and adds in place when .grad is defined.
#ifndef MEMSCOPE_TENSOR_AUTOGRAD_H_
#define MEMSCOPE_TENSOR_AUTOGRAD_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "allocator/alloc_tag.h"
#include "tensor/tensor.h"

namespace memscope {

using TensorList = std::vector<Tensor>;

struct Edge {
  std::shared_ptr<Node> fn;
  std::uint32_t input_nr = 0;
};

class Node {
 public:
  Node(std::string_view name, std::uint64_t sequence_nr);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // `grads` has one entry per forward output of the op (undefined where no
  // gradient flowed); returns one gradient per next edge (undefined allowed).
  virtual TensorList Apply(TensorList& grads) = 0;
  // Frees the saved tensors (after the node ran, as release_variables()).
  virtual void ReleaseSaved() {}
  virtual bool is_accumulate_grad() const { return false; }

  // Post hooks (Node::add_post_hook): Backward() runs them, in the order they
  // were added, right after the node's Apply, while its incoming gradients are
  // still held (engine.cpp call_function). DDP's Reducer adds one to each
  // parameter's AccumulateGrad (GradientEdge(param).fn, which it keeps alive)
  // to learn when that gradient is ready.
  void AddPostHook(std::function<void()> hook) { post_hooks_.push_back(std::move(hook)); }
  void ClearPostHooks() { post_hooks_.clear(); }
  const std::vector<std::function<void()>>& post_hooks() const { return post_hooks_; }

  std::string_view name() const { return name_; }
  std::uint64_t sequence_nr() const { return sequence_nr_; }
  // Module path that was current when the op ran ("" outside any module).
  std::string_view owner() const { return owner_; }

  std::vector<Edge> next_edges;
  // The dtype of each input: a gradient of another dtype is cast to it
  // (the engine's validate_outputs), which allocates.
  std::vector<DType> input_dtypes;
  std::uint32_t num_outputs = 1;

 private:
  std::string_view name_;
  std::uint64_t sequence_nr_;
  std::string_view owner_;
  std::vector<std::function<void()>> post_hooks_;
};

// Tags the allocations of the gradient for a node's input `i`: GRADIENT of
// the parameter when the edge ends at an AccumulateGrad, AUTOGRAD_DETAIL of
// the node's owner otherwise.
class GradTag {
 public:
  GradTag(const Node& node, std::size_t input);

 private:
  ScopedTag tag_;
};

// The backward of an op as a function. Its captures are the saved tensors:
// ReleaseSaved() destroys the function, and with it what it captured.
using BackwardFn = std::function<TensorList(Node& node, TensorList& grads)>;

// True when grad mode is on and any defined input requires grad.
bool NeedsGrad(std::initializer_list<const Tensor*> inputs);

// Records a node for an op with these differentiable inputs and outputs
// (outputs get grad_fn and output_nr). For an in-place op, pass the
// modified tensor among the inputs and as the output: its previous history
// becomes an edge and the node its new grad_fn. `name` must be a literal.
std::shared_ptr<Node> RecordOp(std::string_view name, std::initializer_list<const Tensor*> inputs,
                               std::initializer_list<Tensor*> outputs, BackwardFn fn);
std::shared_ptr<Node> RecordOp(std::string_view name, const std::vector<const Tensor*>& inputs,
                               const std::vector<Tensor*>& outputs, BackwardFn fn);

// The edge a gradient for `t` flows along (its grad_fn, or the
// AccumulateGrad of a leaf that requires grad; empty otherwise).
Edge GradientEdge(const Tensor& t);

// loss.backward() / torch.autograd.backward(roots, grads): a root without a
// gradient gets ones (a scalar's default). Throws TensorError.
void Backward(const TensorList& roots, TensorList root_grads = {});

// Engine::queue_callback: runs `callback` when the outermost running
// Backward() has finished its graph (DDP's finalize_backward). Throws
// TensorError outside a backward pass.
void QueueBackwardCallback(std::function<void()> callback);

// torch.utils.checkpoint.checkpoint(fn, input) (use_reentrant=True, the
// default): runs fn without recording history and saves only `input`; in
// backward, reruns fn with grad enabled (same dropout seeds and autocast state)
// and backpropagates through the recomputed part at once.
Tensor Checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

// Autograd-visible sequence counter (the next node's number).
std::uint64_t NextSequenceNr();

// Behaviours of the autograd engine and of ops that changed between PyTorch
// releases (on this thread). The defaults are the newest release's; the
// oracle of tests/oracle/ runs memscope as the torch it compares with.
struct TorchBehaviour {
  // InputBuffer adds a second gradient for the same input into the first in
  // place when it owns its storage alone (can_accumulate_inplace,
  // torch/csrc/autograd/input_buffer.cpp, PyTorch 2.x); PyTorch 1.13 always
  // adds out of place (measured by the oracle).
  bool inplace_accumulation = true;
  // mean(dim) saves its input for backward in PyTorch 1.13 (MeanBackward1's
  // _saved_self, measured by the oracle); 2.x saves its sizes and numel only
  // (derivatives.yaml: mean_backward(grad, self.sym_sizes(), dim, self.sym_numel(), keepdim)).
  bool mean_dim_saves_input = false;
  // softmax and log_softmax save their input as well as their result in
  // PyTorch 1.10 and earlier (derivatives.yaml: _softmax_backward_data(grad,
  // result, dim, self); issue #49600); 1.11 saves the result only (#65242).
  bool softmax_saves_input = false;
};
TorchBehaviour& CurrentTorchBehaviour();

}  // namespace memscope

#endif  // MEMSCOPE_TENSOR_AUTOGRAD_H_
