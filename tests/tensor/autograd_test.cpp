// The autograd engine's memory behaviour, with the exact byte counts PyTorch's
// caching allocator reports (every block is a multiple of 512 B) and the
// engine rules of torch/csrc/autograd/engine.cpp and accumulate_grad.cpp.
#include "tensor/autograd.h"

#include <algorithm>
#include <optional>

#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "allocator/alloc_tag.h"
#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"
#include "recording/timeline.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/tensor_test_util.h"

using namespace memscope;
using namespace memscope::testing;

namespace {

// An nn.Parameter: a leaf that requires grad, with a name for the profiler.
Tensor Param(DeviceContext& ctx, const Shape& sizes, const std::string& name) {
  Tensor p = Tensor::Empty(ctx, sizes);
  p.impl()->name = name;
  p.set_requires_grad(true);
  return p;
}

std::int64_t NumAllocs(const CachingAllocator& a) { return All(a.GetStats().allocation).allocated; }

// Allocations recorded in a timeline, in order.
struct Recorded {
  Category category;
  std::string owner;
  std::uint64_t addr;
  std::uint64_t size;
};
std::vector<Recorded> Allocs(const Timeline& t) {
  std::vector<Recorded> out;
  for (const Event& e : t.events) {
    if (e.type == EventType::kAlloc) out.push_back({e.category, t.str(e.name), e.addr, e.size});
  }
  return out;
}

// fc2(relu(fc1(x))) summed, on `d`; its backward recorded in `timeline`.
struct TwoLayerBackward {
  Tensor w1, b1, w2, b2;
  Timeline timeline;
  explicit TwoLayerBackward(MetaGpu& d)
      : w1(Param(d.ctx, {64, 32}, "fc1.weight")),
        b1(Param(d.ctx, {64}, "fc1.bias")),
        w2(Param(d.ctx, {10, 64}, "fc2.weight")),
        b2(Param(d.ctx, {10}, "fc2.bias")) {
    Tensor x = Tensor::Empty(d.ctx, {64, 32});
    Tensor loss = ops::Sum(ops::Linear(ops::Relu(ops::Linear(x, w1, b1)), w2, b2));
    REQUIRE(d.session.Start().ok());
    Backward({loss});
    REQUIRE(d.session.Finish().ok());
    timeline = d.session.timeline();
  }
};

// The last allocation at the address of p.grad (the gradient's own block)
// is GRADIENT of p.
void CheckGradientBlock(const Timeline& timeline, const Tensor& p) {
  const DevicePtr ptr = p.grad().storage()->ptr();
  std::optional<Recorded> last;
  for (const Recorded& r : Allocs(timeline)) {
    if (r.addr == ptr) last = r;
  }
  REQUIRE(last.has_value());
  INFO(p.name());
  CHECK(last->category == Category::kGradient);
  CHECK(last->owner == p.name());
}

}  // namespace

// ---------------------------------------------------------------- lifetime

TEST_CASE("a tensor's block is freed exactly when its last handle or view goes, views allocate nothing") {
  MetaGpu d;
  Tensor a = Tensor::Empty(d.ctx, {10, 100});  // 4,000 B -> one 4,096 B block
  CHECK(d.alloc.memory_allocated() == 4096);
  Tensor v = ops::View(a, {1000});
  Tensor t = ops::Transpose(a, 0, 1);
  Tensor n = ops::Narrow(a, 1, 10, 20);
  Tensor s = ops::Select(a, 0, 3);
  TensorList parts = ops::Split(a, 4, 0);
  Tensor e = ops::Expand(ops::Unsqueeze(a, 0), {3, 10, 100});
  Tensor p = ops::Permute(a, {1, 0});
  Tensor r = ops::Reshape(a, {100, 10});  // contiguous: a view
  Tensor det = a.Detach();
  CHECK(d.alloc.memory_allocated() == 4096);
  CHECK(NumAllocs(d.alloc) == 1);

  a = Tensor();
  v = Tensor();
  t = Tensor();
  n = Tensor();
  s = Tensor();
  parts.clear();
  e = Tensor();
  p = Tensor();
  r = Tensor();
  CHECK(d.alloc.memory_allocated() == 4096);  // `det` still views the storage
  det = Tensor();
  CHECK(d.alloc.memory_allocated() == 0);
}

TEST_CASE("views of a tensor that requires grad record nodes but still allocate nothing") {
  MetaGpu d;
  Tensor w = Param(d.ctx, {8, 64}, "w");  // 2,048 B
  Tensor v = ops::View(w, {512});
  Tensor t = ops::T(w);
  Tensor s = ops::Select(w, 0, 1);
  CHECK(d.alloc.memory_allocated() == 2048);
  CHECK(v.grad_fn() != nullptr);
  CHECK(t.grad_fn() != nullptr);
  CHECK(s.grad_fn() != nullptr);
  CHECK(v.storage() == w.storage());
}

TEST_CASE("relu saves its result, not its input: the input is freed when its handle goes") {
  MetaGpu d;
  Tensor p = Param(d.ctx, {1024}, "p");  // 4,096 B
  Tensor x = ops::MulScalar(p, 2.f);     // 4,096 B; MulBackward1 saves nothing
  Tensor y = ops::Relu(x);               // 4,096 B, saved by ReluBackward0
  CHECK(d.alloc.memory_allocated() == 3 * 4096);
  x = Tensor();
  CHECK(d.alloc.memory_allocated() == 2 * 4096);
  y = Tensor();  // the graph goes with the last handle; relu's saved result with it
  CHECK(d.alloc.memory_allocated() == 4096);
}

TEST_CASE("tanh and sigmoid save their results, gelu and pow save their inputs") {
  MetaGpu d;
  Tensor p = Param(d.ctx, {1024}, "p");  // 4,096 B
  const std::size_t base = d.alloc.memory_allocated();
  {
    Tensor x = ops::MulScalar(p, 2.f);
    Tensor y = ops::Tanh(x);
    x = Tensor();
    CHECK(d.alloc.memory_allocated() == base + 4096);
  }
  {
    Tensor x = ops::MulScalar(p, 2.f);
    Tensor y = ops::Sigmoid(x);
    x = Tensor();
    CHECK(d.alloc.memory_allocated() == base + 4096);
  }
  {
    Tensor x = ops::MulScalar(p, 2.f);
    Tensor y = ops::Gelu(x);
    x = Tensor();
    CHECK(d.alloc.memory_allocated() == base + 2 * 4096);
  }
  {
    Tensor x = ops::MulScalar(p, 2.f);
    Tensor y = ops::PowScalar(x, 3.f);
    x = Tensor();
    CHECK(d.alloc.memory_allocated() == base + 2 * 4096);
  }
  CHECK(d.alloc.memory_allocated() == base);
}

TEST_CASE("linear saves its input: it stays allocated after its handle goes, until backward frees it") {
  MetaGpu d;
  Tensor w = Param(d.ctx, {16, 32}, "fc.weight");  // 2,048 B
  Tensor b = Param(d.ctx, {16}, "fc.bias");        // 64 B -> 512 B
  Tensor x = Tensor::Empty(d.ctx, {64, 32});       // 8,192 B, an input that does not require grad
  Tensor out = ops::Linear(x, w, b);               // 4,096 B
  CHECK(d.alloc.memory_allocated() == 2048 + 512 + 8192 + 4096);
  x = Tensor();
  CHECK(d.alloc.memory_allocated() == 2048 + 512 + 8192 + 4096);  // saved by AddmmBackward0 (mat1)
  Tensor loss = ops::Sum(out);                                    // 512 B
  Backward({loss});
  // x is released with AddmmBackward0's saved tensors; the ones gradient of
  // the loss is freed; .grad of both parameters remains.
  CHECK(d.alloc.memory_allocated() == 2048 + 512 + 4096 + 512 + 2048 + 512);
  CHECK(w.grad().defined());
  CHECK(b.grad().defined());
  CHECK(w.grad().sizes() == Shape{16, 32});
  CHECK(w.grad().is_contiguous());
  CHECK(b.grad().sizes() == Shape{16});
}

TEST_CASE("a second backward through a released graph throws") {
  MetaGpu d;
  Tensor w = Param(d.ctx, {4}, "w");
  Tensor loss = ops::Sum(ops::MulScalar(w, 3.f));
  Backward({loss});
  CHECK_THROWS_AS(Backward({loss}), TensorError);
}

TEST_CASE("backward without a gradient needs a scalar root") {
  MetaGpu d;
  Tensor w = Param(d.ctx, {4}, "w");
  Tensor y = ops::MulScalar(w, 3.f);
  CHECK_THROWS_AS(Backward({y}), TensorError);
  Tensor plain = Tensor::Empty(d.ctx, {});
  CHECK_THROWS_AS(Backward({plain}), TensorError);  // no grad_fn, does not require grad
}

TEST_CASE("after backward of a 2-layer MLP only the parameters, their grads and the held handles remain") {
  MetaGpu d;
  Tensor w1 = Param(d.ctx, {64, 32}, "fc1.weight");  // 8,192 B
  Tensor b1 = Param(d.ctx, {64}, "fc1.bias");        // 256 B -> 512
  Tensor w2 = Param(d.ctx, {10, 64}, "fc2.weight");  // 2,560 B
  Tensor b2 = Param(d.ctx, {10}, "fc2.bias");        // 40 B -> 512
  const std::size_t params = 8192 + 512 + 2560 + 512;
  Tensor x = Tensor::Empty(d.ctx, {64, 32});  // 8,192 B
  Tensor loss;
  {
    Tensor h = ops::Linear(x, w1, b1);    // 16,384 B, saved by relu? no: relu saves its result
    Tensor a = ops::Relu(h);              // 16,384 B, saved (ReluBackward0 result, AddmmBackward0 mat1)
    Tensor out = ops::Linear(a, w2, b2);  // 2,560 B
    loss = ops::Sum(out);                 // 512 B
  }
  // h is not saved by anyone (relu saves its result): freed with its handle.
  CHECK(d.alloc.memory_allocated() == params + 8192 + 16384 + 512);
  Backward({loss});
  CHECK(d.alloc.memory_allocated() == 2 * params + 8192 + 512);
  loss = Tensor();
  CHECK(d.alloc.memory_allocated() == 2 * params + 8192);
  x = Tensor();
  CHECK(d.alloc.memory_allocated() == 2 * params);
  CHECK(w1.grad().sizes() == w1.sizes());
  CHECK(b1.grad().sizes() == b1.sizes());
  CHECK(w2.grad().sizes() == w2.sizes());
  CHECK(b2.grad().sizes() == b2.sizes());
}

TEST_CASE("the output and the saved tensors are freed when the graph goes without backward") {
  MetaGpu d;
  Tensor w = Param(d.ctx, {64, 32}, "fc.weight");  // 8,192 B
  Tensor b = Param(d.ctx, {64}, "fc.bias");        // 512 B
  {
    Tensor x = Tensor::Empty(d.ctx, {64, 32});
    Tensor loss = ops::Sum(ops::Relu(ops::Linear(x, w, b)));
    CHECK(d.alloc.memory_allocated() > 8192 + 512);
  }
  CHECK(d.alloc.memory_allocated() == 8192 + 512);
}

// ---------------------------------------------------------------- AccumulateGrad

TEST_CASE("AccumulateGrad steals the first gradient and adds the second in place") {
  CpuGpu d;
  Tensor w = Param(d.ctx, {4}, "w");
  for (int i = 0; i < 4; ++i) w.data()[i] = static_cast<float>(i);
  const Timeline& timeline = d.session.timeline();
  REQUIRE(d.session.Start().ok());

  const std::size_t before = d.alloc.memory_allocated();  // 512
  const std::int64_t allocs_before = NumAllocs(d.alloc);
  {
    Tensor loss = ops::Sum(ops::MulScalar(w, 3.f));  // y and loss: 2 blocks
    Backward({loss});                                // ones + MulBackward1's gradient: 2 blocks
  }
  // No clone: exactly the 4 allocations above; .grad is the backward formula's output.
  CHECK(NumAllocs(d.alloc) - allocs_before == 4);
  const std::size_t after_first = d.alloc.memory_allocated();
  CHECK(after_first == before + 512);
  const std::vector<Recorded> allocs = Allocs(timeline);
  REQUIRE(allocs.size() == 4);
  CHECK(allocs[3].category == Category::kGradient);
  CHECK(allocs[3].owner == "w");
  CHECK(allocs[3].addr == w.grad().storage()->ptr());
  for (int i = 0; i < 4; ++i) CHECK(w.grad().data()[i] == 3.f);

  const DevicePtr grad_ptr = w.grad().storage()->ptr();
  {
    Tensor loss = ops::Sum(ops::MulScalar(w, 3.f));
    Backward({loss});
  }
  CHECK(d.alloc.memory_allocated() == after_first);
  CHECK(w.grad().storage()->ptr() == grad_ptr);  // accumulated in place
  for (int i = 0; i < 4; ++i) CHECK(w.grad().data()[i] == 6.f);
  REQUIRE(d.session.Finish().ok());
}

TEST_CASE("AccumulateGrad clones a gradient that does not obey the layout contract (an expanded ones)") {
  CpuGpu d;
  Tensor w = Param(d.ctx, {4}, "w");
  Tensor loss = ops::Sum(w);  // SumBackward1 hands over ones().expand(4): stride 0
  const std::int64_t allocs_before = NumAllocs(d.alloc);
  Backward({loss});
  CHECK(NumAllocs(d.alloc) - allocs_before == 2);  // ones, then the clone as .grad
  CHECK(w.grad().is_contiguous());
  CHECK(w.grad().strides() == Shape{1});
  CHECK(w.grad().storage() != nullptr);
  for (int i = 0; i < 4; ++i) CHECK(w.grad().data()[i] == 1.f);
  // the ones block is freed: only w, .grad and the loss remain
  CHECK(d.alloc.memory_allocated() == 3 * 512);
}

TEST_CASE("one gradient tensor flowing to two parameters is cloned for the first and stolen by the second") {
  CpuGpu d;
  Tensor p = Param(d.ctx, {4}, "p");
  Tensor q = Param(d.ctx, {4}, "q");
  Tensor loss = ops::Sum(ops::MulScalar(ops::Add(p, q), 2.f));
  const std::int64_t allocs_before = NumAllocs(d.alloc);
  Backward({loss});
  // ones, MulBackward1's gradient (passed to both inputs by AddBackward0), one clone
  CHECK(NumAllocs(d.alloc) - allocs_before == 3);
  CHECK(p.grad().storage() != q.grad().storage());
  for (int i = 0; i < 4; ++i) {
    CHECK(p.grad().data()[i] == 2.f);
    CHECK(q.grad().data()[i] == 2.f);
  }
}

TEST_CASE("two gradients for the same input are summed in the input buffer (x * x)") {
  CpuGpu d;
  Tensor x = Param(d.ctx, {3}, "x");
  for (int i = 0; i < 3; ++i) x.data()[i] = static_cast<float>(i + 1);
  Tensor loss = ops::Sum(ops::Mul(x, x));
  Backward({loss});
  for (int i = 0; i < 3; ++i) CHECK(x.grad().data()[i] == Approx(2.f * static_cast<float>(i + 1)));
}

TEST_CASE("a parameter used in a live graph stays allocated after its handle goes (AccumulateGrad owns it)") {
  // PyTorch: AccumulateGrad::variable is a strong reference, and the
  // tensor's grad_accumulator_ a weak one. memscope has it the other way
  // round (TensorImpl::grad_accumulator shared, AccumulateGrad::variable_
  // weak), so the parameter is freed here and its gradient silently dropped.
  MetaGpu d;
  Tensor w = Param(d.ctx, {1024}, "w");  // 4,096 B
  Tensor y = ops::MulScalar(w, 2.f);     // 4,096 B
  w = Tensor();
  CHECK(d.alloc.memory_allocated() == 2 * 4096);
}

TEST_CASE("the weight gradient of a bias-free linear on an input without grad is stolen, not cloned") {
  // mm_mat2_backward gets mat2's strides even when mat2 itself is not saved
  // (derivatives.yaml: mat2.sym_strides()), so W.t()'s gradient is
  // column-major and W.grad is contiguous: no clone.
  MetaGpu d;
  Tensor w = Param(d.ctx, {64, 32}, "w");  // 8,192 B
  Tensor x = Tensor::Empty(d.ctx, {16, 32});
  Tensor loss = ops::Sum(ops::Linear(x, w, Tensor()));
  const std::int64_t allocs_before = NumAllocs(d.alloc);
  Backward({loss});
  CHECK(NumAllocs(d.alloc) - allocs_before == 2);  // ones + the (64, 32) gradient
  CHECK(w.grad().is_contiguous());
}

// ---------------------------------------------------------------- order and categories

TEST_CASE("the engine runs the highest sequence number first and AccumulateGrad as soon as it is ready") {
  MetaGpu d;
  const Timeline& timeline = d.session.timeline();
  Tensor a = Param(d.ctx, {256}, "a");
  Tensor b = Param(d.ctx, {512}, "b");
  // Two independent branches; b's is recorded last, so it runs first.
  Tensor ya = ops::MulScalar(a, 2.f);  // seq k
  Tensor yb = ops::MulScalar(b, 2.f);  // seq k+1
  Tensor loss = ops::Add(ops::Sum(ya), ops::Sum(yb));
  ya = Tensor();
  yb = Tensor();
  REQUIRE(d.session.Start().ok());
  Backward({loss});
  REQUIRE(d.session.Finish().ok());
  std::vector<std::string> grads;
  for (const Recorded& r : Allocs(timeline)) {
    if (r.category == Category::kGradient) grads.push_back(r.owner);
  }
  CHECK(grads == std::vector<std::string>{"b", "a"});
}

TEST_CASE("AccumulateGrad runs as soon as it is ready, before an older function node that is also ready") {
  // t = tanh(w1) (seq k), s2 = sum(w2) (k+1), s1 = sum(t) (k+2), loss = s1 + s2.
  // After s1 and s2 ran, AccumulateGrad(w2) and TanhBackward0 are both ready:
  // AccumulateGrad goes first, so w2's clone (its gradient is an expanded
  // ones) is allocated before w1's gradient.
  MetaGpu d;
  Tensor w1 = Param(d.ctx, {1024}, "w1");
  Tensor w2 = Param(d.ctx, {1024}, "w2");
  Tensor t = ops::Tanh(w1);
  Tensor s2 = ops::Sum(w2);
  Tensor s1 = ops::Sum(t);
  Tensor loss = ops::Add(s1, s2);
  t = Tensor();
  const Timeline& timeline = d.session.timeline();
  REQUIRE(d.session.Start().ok());
  Backward({loss});
  REQUIRE(d.session.Finish().ok());
  std::vector<std::pair<Category, std::string>> seq;
  for (const Recorded& r : Allocs(timeline)) seq.emplace_back(r.category, r.owner);
  REQUIRE(seq.size() == 3);
  CHECK(seq[0] == std::make_pair(Category::kAutogradDetail, std::string()));  // ones
  CHECK(seq[1] == std::make_pair(Category::kGradient, std::string("w2")));
  CHECK(seq[2] == std::make_pair(Category::kGradient, std::string("w1")));
}

TEST_CASE("mul's gradient for an intermediate is AUTOGRAD_DETAIL, for a parameter GRADIENT of that parameter") {
  MetaGpu d;
  Tensor w1 = Param(d.ctx, {1024}, "w1");
  Tensor w2 = Param(d.ctx, {1024}, "w2");
  Tensor loss = ops::Sum(ops::Mul(ops::Relu(ops::MulScalar(w1, 2.f)), w2));
  const Timeline& timeline = d.session.timeline();
  REQUIRE(d.session.Start().ok());
  Backward({loss});
  REQUIRE(d.session.Finish().ok());
  std::vector<std::pair<Category, std::string>> seq;
  for (const Recorded& r : Allocs(timeline)) seq.emplace_back(r.category, r.owner);
  // ones; MulBackward0: relu output's gradient, then w2's; ReluBackward0's; MulBackward1: w1's
  REQUIRE(seq.size() == 5);
  CHECK(seq[0].first == Category::kAutogradDetail);
  CHECK(seq[1] == std::make_pair(Category::kAutogradDetail, std::string()));
  CHECK(seq[2] == std::make_pair(Category::kGradient, std::string("w2")));
  CHECK(seq[3] == std::make_pair(Category::kAutogradDetail, std::string()));
  CHECK(seq[4] == std::make_pair(Category::kGradient, std::string("w1")));
}

TEST_CASE("saved tensors of a node are freed right after it runs, before older nodes run") {
  MetaGpu d;
  Tensor w = Param(d.ctx, {1024}, "w");  // 4,096 B
  Tensor loss;
  {
    Tensor h = ops::MulScalar(w, 2.f);  // freed with its handle (not saved)
    Tensor t = ops::Tanh(h);            // saved result, 4,096 B
    Tensor s = ops::Sigmoid(t);         // saved result, 4,096 B
    loss = ops::Sum(s);                 // 512 B
  }
  CHECK(d.alloc.memory_allocated() == 4096 + 4096 + 4096 + 512);
  d.alloc.ResetPeakStats();
  Backward({loss});
  // Peak during SigmoidBackward0: w, tanh out, sigmoid out, loss, ones, sigmoid grad.
  // Then ones and sigmoid's result are freed before TanhBackward0 allocates.
  CHECK(d.alloc.max_memory_allocated() == 4096 * 4 + 512 + 512);
  CHECK(d.alloc.memory_allocated() == 4096 + 4096 + 512);  // w, w.grad, loss
}

TEST_CASE("parameter gradients are GRADIENT of the parameter, intermediate gradients are AUTOGRAD_DETAIL") {
  MetaGpu d;
  TwoLayerBackward net(d);
  std::vector<std::string> grads;
  int detail = 0;
  for (const Recorded& r : Allocs(net.timeline)) {
    if (r.category == Category::kGradient) {
      grads.push_back(r.owner);
    } else {
      CHECK(r.category == Category::kAutogradDetail);
      ++detail;
    }
  }
  // The bias gradient is AccumulateGrad-bound directly.
  CHECK(std::find(grads.begin(), grads.end(), "fc2.bias") != grads.end());
  CHECK(std::find(grads.begin(), grads.end(), "fc1.bias") != grads.end());
  CHECK(detail >= 3);  // ones, grad of relu's output (fc2's input), relu's gradient
  // The allocations that become the biases' .grad are GRADIENT of them.
  for (const Tensor* p : {&net.b1, &net.b2}) CheckGradientBlock(net.timeline, *p);
}

TEST_CASE(
    "weight gradients flowing through W.t() are GRADIENT, each layer's weight before its bias (the engine sums the "
    "bias gradient after AddmmBackward0's mms)") {
  // GradTag looks only at the next edge: AddmmBackward0's edge for W.t() ends
  // at TBackward0 (a view node), not at AccumulateGrad, so the (stolen)
  // weight gradient is tagged AUTOGRAD_DETAIL. The PyTorch memory profiler
  // categorises by storage: the tensor AccumulateGrad receives is GRADIENT.
  MetaGpu d;
  TwoLayerBackward net(d);
  std::vector<std::string> grads;
  for (const Recorded& r : Allocs(net.timeline)) {
    if (r.category == Category::kGradient) grads.push_back(r.owner);
  }
  CHECK(grads == std::vector<std::string>{"fc2.weight", "fc2.bias", "fc1.weight", "fc1.bias"});
  int detail = 0;
  for (const Recorded& r : Allocs(net.timeline)) detail += r.category == Category::kAutogradDetail ? 1 : 0;
  CHECK(detail == 3);
  for (const Tensor* p : {&net.w1, &net.w2}) CheckGradientBlock(net.timeline, *p);
}

// ---------------------------------------------------------------- grad mode

TEST_CASE("under NoGradGuard ops record no node and save nothing") {
  MetaGpu d;
  Tensor w = Param(d.ctx, {16, 32}, "fc.weight");  // 2,048 B
  Tensor b = Param(d.ctx, {16}, "fc.bias");        // 512 B
  NoGradGuard no_grad;
  Tensor x = Tensor::Empty(d.ctx, {64, 32});  // 8,192 B
  Tensor out = ops::Linear(x, w, b);          // 4,096 B
  Tensor y = ops::Relu(out);                  // 4,096 B
  CHECK(out.grad_fn() == nullptr);
  CHECK_FALSE(out.requires_grad());
  CHECK(y.grad_fn() == nullptr);
  CHECK_FALSE(y.requires_grad());
  x = Tensor();
  out = Tensor();
  CHECK(d.alloc.memory_allocated() == 2048 + 512 + 4096);
  CHECK_FALSE(NeedsGrad({&w}));
}

TEST_CASE("NoGradGuard restores the previous mode, EnableGradGuard re-enables inside it") {
  CHECK(GradMode::enabled());
  {
    NoGradGuard a;
    CHECK_FALSE(GradMode::enabled());
    {
      EnableGradGuard b;
      CHECK(GradMode::enabled());
    }
    CHECK_FALSE(GradMode::enabled());
  }
  CHECK(GradMode::enabled());
}

TEST_CASE("backward runs without grad mode: gradients have no history") {
  MetaGpu d;
  Tensor w = Param(d.ctx, {8}, "w");
  Tensor loss = ops::Sum(ops::Tanh(w));
  Backward({loss});
  CHECK(w.grad().grad_fn() == nullptr);
  CHECK_FALSE(w.grad().requires_grad());
  CHECK(GradMode::enabled());
}

TEST_CASE("Detach shares the storage without history") {
  MetaGpu d;
  Tensor w = Param(d.ctx, {8}, "w");
  Tensor y = ops::MulScalar(w, 2.f);
  Tensor det = y.Detach();
  CHECK(det.storage() == y.storage());
  CHECK(det.grad_fn() == nullptr);
  CHECK_FALSE(det.requires_grad());
  CHECK(det.is_leaf());
}

TEST_CASE("sequence numbers increase with each recorded node") {
  MetaGpu d;
  Tensor w = Param(d.ctx, {8}, "w");
  const std::uint64_t s0 = NextSequenceNr();
  Tensor y = ops::MulScalar(w, 2.f);
  Tensor z = ops::Tanh(y);
  CHECK(y.grad_fn()->sequence_nr() == s0);
  CHECK(z.grad_fn()->sequence_nr() == s0 + 1);
  CHECK(NextSequenceNr() == s0 + 2);
  CHECK(y.grad_fn()->name() == "MulBackward1");
  CHECK(z.grad_fn()->name() == "TanhBackward0");
}

TEST_CASE("backward with an explicit root gradient uses it instead of ones") {
  CpuGpu d;
  Tensor w = Param(d.ctx, {3}, "w");
  for (int i = 0; i < 3; ++i) w.data()[i] = 1.f;
  Tensor y = ops::MulScalar(w, 2.f);
  Tensor g = FromValues(d.ctx, {3}, {1.f, 10.f, 100.f});
  Backward({y}, {g});
  CHECK(w.grad().data()[0] == 2.f);
  CHECK(w.grad().data()[1] == 20.f);
  CHECK(w.grad().data()[2] == 200.f);
}

TEST_CASE("post hooks on AccumulateGrad run once per backward, in ready order, with the gradient already set") {
  // y = relu(linear(x, w, b)): AddmmBackward0 makes b's gradient ready at once
  // and w's only after TBackward0, so b's hook runs first (as PyTorch's
  // Reducer sees them: fc.bias, then fc.weight).
  MetaGpu d;
  Tensor w = Param(d.ctx, {16, 32}, "fc.weight");
  Tensor b = Param(d.ctx, {16}, "fc.bias");
  Tensor x = Tensor::Empty(d.ctx, {4, 32});
  // The Reducer keeps the accumulators alive: the parameters only hold them weakly.
  std::vector<std::shared_ptr<Node>> accumulators;
  std::vector<std::string> ready;
  for (Tensor* p : {&w, &b}) {
    std::shared_ptr<Node> acc = GradientEdge(*p).fn;
    REQUIRE(acc != nullptr);
    REQUIRE(acc->is_accumulate_grad());
    acc->AddPostHook([p, &ready] {
      CHECK(p->grad().defined());
      ready.push_back(p->name());
    });
    accumulators.push_back(std::move(acc));
  }
  for (int step = 0; step < 2; ++step) {
    Tensor loss = ops::Sum(ops::Relu(ops::Linear(x, w, b)));
    Backward({loss});
  }
  CHECK(ready == std::vector<std::string>{"fc.bias", "fc.weight", "fc.bias", "fc.weight"});
}

// What a backward function allocates without a tag of its own (a copy that
// reshapes a gradient, as ViewBackward0 makes of a non-contiguous one, the
// zeros of WhereBackward0) is AUTOGRAD_DETAIL of the node's owner, the
// module that ran the op, never OTHER without an owner.
TEST_CASE("an untagged allocation inside a backward is AUTOGRAD_DETAIL of the node's owner") {
  MetaGpu d;
  Tensor x = Param(d.ctx, {256}, "w");
  Tensor y;
  {
    ScopedTag tag(Category::kActivation, "transformer.h.3");
    y = Tensor::Empty(d.ctx, {256});
    RecordOp("CopyingBackward", {&x}, {&y}, [](Node&, TensorList& g) { return TensorList{ops::Clone(g[0])}; });
  }
  Tensor g = Tensor::Empty(d.ctx, {256});
  REQUIRE(d.session.Start().ok());
  Backward({y}, {g});
  REQUIRE(d.session.Finish().ok());
  const std::vector<Recorded> allocs = Allocs(d.session.timeline());
  REQUIRE(allocs.size() == 1);  // the clone, stolen by AccumulateGrad as w.grad
  CHECK(allocs[0].category == Category::kAutogradDetail);
  CHECK(allocs[0].owner == "transformer.h.3");
}
