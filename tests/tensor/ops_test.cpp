// The ops: gradients against central differences and known values in
// ExecMode::kCpu (float32), and in ExecMode::kMeta the exact bytes each op
// allocates and keeps, as the CUDA op does, including under autocast.
#include "tensor/ops.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"
#include "tensor/autograd.h"
#include "tensor/tensor.h"
#include "tests/tensor/tensor_test_util.h"

using namespace memscope;
using namespace memscope::testing;

namespace {

Tensor Indices(DeviceContext& ctx, const Shape& sizes, const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::Empty(ctx, sizes, DType::kInt64);
  REQUIRE(static_cast<std::size_t>(t.numel()) == values.size());
  for (std::size_t i = 0; i < values.size(); ++i) t.data_i64()[i] = values[i];
  return t;
}

// A leaf that requires grad, filled with U(lo, hi) values whose magnitude is
// at least `min_abs` (away from kinks).
Tensor Leaf(DeviceContext& ctx, const Shape& sizes, std::uint32_t seed, float lo = -1.f, float hi = 1.f,
            float min_abs = 0.f) {
  Tensor t = Tensor::Empty(ctx, sizes);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    float v = u(rng);
    while (std::fabs(v) < min_abs) v = u(rng);
    t.data()[i] = v;
  }
  t.set_requires_grad(true);
  return t;
}

// A leaf with distinct values 0.01 apart, shuffled (max pool: no near ties).
Tensor DistinctLeaf(DeviceContext& ctx, const Shape& sizes, std::uint32_t seed) {
  Tensor t = Tensor::Empty(ctx, sizes);
  std::vector<int> perm(static_cast<std::size_t>(t.numel()));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = 0.01f * static_cast<float>(perm[i]) - 0.3f;
  t.set_requires_grad(true);
  return t;
}

using Fn = std::function<Tensor(const TensorList&)>;

// sum(out * r) for a fixed r, in double, without autograd.
double WeightedSum(const Tensor& out, const std::vector<float>& r) {
  Tensor c = ops::Contiguous(out);
  double s = 0;
  for (std::int64_t i = 0; i < c.numel(); ++i) s += double(c.data()[i]) * r[static_cast<std::size_t>(i)];
  return s;
}

// Checks the gradient of loss = Sum(Mul(f(inputs), r)) for fixed random r
// with respect to every input that requires grad against central
// differences (eps 1e-3), to 1e-2 relative (or absolute near 0).
void GradCheck(DeviceContext& ctx, const TensorList& inputs, const Fn& f, std::uint32_t seed = 99) {
  for (const Tensor& t : inputs) {
    if (t.requires_grad()) t.impl()->grad.reset();
  }
  Tensor out = f(inputs);
  REQUIRE(out.requires_grad());
  Tensor r = Tensor::Empty(ctx, out.sizes());
  std::vector<float> rv(static_cast<std::size_t>(out.numel()));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (std::size_t i = 0; i < rv.size(); ++i) r.data()[i] = rv[i] = u(rng);
  Tensor loss = ops::Sum(ops::Mul(out, r));
  out = Tensor();
  Backward({loss});
  constexpr float kEps = 1e-3f;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    REQUIRE(x.is_contiguous());
    REQUIRE(x.grad().defined());
    REQUIRE(x.grad().sizes() == x.sizes());
    Tensor g;
    {
      NoGradGuard no_grad;
      g = ops::Contiguous(x.grad());
    }
    for (std::int64_t j = 0; j < x.numel(); ++j) {
      const float orig = x.data()[j];
      double plus, minus;
      {
        NoGradGuard no_grad;
        x.data()[j] = orig + kEps;
        plus = WeightedSum(f(inputs), rv);
        x.data()[j] = orig - kEps;
        minus = WeightedSum(f(inputs), rv);
        x.data()[j] = orig;
      }
      const double numeric = (plus - minus) / (2.0 * kEps);
      INFO("input " << k << " element " << j);
      CHECK(g.data()[j] == Approx(numeric).epsilon(1e-2).margin(1e-2));
    }
  }
}

}  // namespace

// ================================================================ gradients (kCpu)

TEST_CASE("linear on a 2-d input: gradients of input, weight and bias match finite differences") {
  CpuGpu d;
  GradCheck(d.ctx, {Leaf(d.ctx, {3, 4}, 1), Leaf(d.ctx, {5, 4}, 2), Leaf(d.ctx, {5}, 3)},
            [](const TensorList& in) { return ops::Linear(in[0], in[1], in[2]); });
}

TEST_CASE("linear on a 3-d contiguous input (view + addmm) matches finite differences") {
  CpuGpu d;
  GradCheck(d.ctx, {Leaf(d.ctx, {2, 3, 4}, 4), Leaf(d.ctx, {5, 4}, 5), Leaf(d.ctx, {5}, 6)},
            [](const TensorList& in) { return ops::Linear(in[0], in[1], in[2]); });
}

TEST_CASE("linear on a 3-d non-contiguous input (matmul + add_) matches finite differences") {
  CpuGpu d;
  GradCheck(d.ctx, {Leaf(d.ctx, {3, 2, 4}, 7), Leaf(d.ctx, {5, 4}, 8), Leaf(d.ctx, {5}, 9)},
            [](const TensorList& in) { return ops::Linear(ops::Transpose(in[0], 0, 1), in[1], in[2]); });
}

TEST_CASE("linear without bias on a 3-d input matches finite differences") {
  CpuGpu d;
  GradCheck(d.ctx, {Leaf(d.ctx, {2, 3, 4}, 10), Leaf(d.ctx, {5, 4}, 11)},
            [](const TensorList& in) { return ops::Linear(in[0], in[1], Tensor()); });
}

TEST_CASE("relu, gelu (erf and tanh), gelu_new, tanh and sigmoid match finite differences") {
  CpuGpu d;
  SECTION("relu") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 12, -1, 1, 0.05f)}, [](const TensorList& in) { return ops::Relu(in[0]); });
  }
  SECTION("gelu") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 13, -3, 3)}, [](const TensorList& in) { return ops::Gelu(in[0]); });
  }
  SECTION("gelu tanh") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 14, -3, 3)}, [](const TensorList& in) { return ops::Gelu(in[0], true); });
  }
  SECTION("gelu_new") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 15, -3, 3)}, [](const TensorList& in) { return ops::GeluNew(in[0]); });
  }
  SECTION("tanh") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 16, -2, 2)}, [](const TensorList& in) { return ops::Tanh(in[0]); });
  }
  SECTION("sigmoid") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 17, -3, 3)}, [](const TensorList& in) { return ops::Sigmoid(in[0]); });
  }
}

TEST_CASE("relu in place matches finite differences") {
  CpuGpu d;
  GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 18, -1, 1, 0.05f)}, [](const TensorList& in) {
    Tensor y = ops::MulScalar(in[0], 1.5f);
    return ops::ReluInPlace(y);
  });
}

TEST_CASE("add, sub, mul and div with broadcasting reduce the gradient to each input's shape") {
  CpuGpu d;
  SECTION("add with alpha, (2,3,4) + (3,1)") {
    GradCheck(d.ctx, {Leaf(d.ctx, {2, 3, 4}, 20), Leaf(d.ctx, {3, 1}, 21)},
              [](const TensorList& in) { return ops::Add(in[0], in[1], 2.f); });
  }
  SECTION("sub, (4) - (3,4)") {
    GradCheck(d.ctx, {Leaf(d.ctx, {4}, 22), Leaf(d.ctx, {3, 4}, 23)},
              [](const TensorList& in) { return ops::Sub(in[0], in[1]); });
  }
  SECTION("mul, (3,4) * (4)") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 4}, 24), Leaf(d.ctx, {4}, 25)},
              [](const TensorList& in) { return ops::Mul(in[0], in[1]); });
  }
  SECTION("mul of a tensor with itself") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 4}, 26)}, [](const TensorList& in) { return ops::Mul(in[0], in[0]); });
  }
  SECTION("div, (3,4) / (3,4)") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 4}, 27), Leaf(d.ctx, {3, 4}, 28, 0.5f, 1.5f)},
              [](const TensorList& in) { return ops::Div(in[0], in[1]); });
  }
  SECTION("div, (2,3) / (1,3)") {
    GradCheck(d.ctx, {Leaf(d.ctx, {2, 3}, 29), Leaf(d.ctx, {1, 3}, 30, -1.5f, -0.5f)},
              [](const TensorList& in) { return ops::Div(in[0], in[1]); });
  }
  SECTION("scalar ops") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 4}, 31)}, [](const TensorList& in) {
      return ops::DivScalar(ops::AddScalar(ops::MulScalar(in[0], 3.f), 1.f), 4.f);
    });
  }
  SECTION("tracked in-place add (residual)") {
    // (not on tanh's output: tanh saves its result, which add_ would modify)
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 4}, 32), Leaf(d.ctx, {4}, 33)}, [](const TensorList& in) {
      Tensor y = ops::MulScalar(ops::Tanh(in[0]), 2.f);
      return ops::AddInPlaceTracked(y, in[1]);
    });
  }
}

TEST_CASE("pow with a scalar exponent matches finite differences") {
  CpuGpu d;
  for (float e : {3.f, 2.f, 0.5f}) {
    INFO("exponent " << e);
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 4}, 34, 0.5f, 1.5f)},
              [e](const TensorList& in) { return ops::PowScalar(in[0], e); });
  }
}

TEST_CASE("conv2d matches finite differences for stride 1 and 2 with padding 1, and without bias") {
  CpuGpu d;
  SECTION("stride 1, padding 1") {
    GradCheck(d.ctx, {Leaf(d.ctx, {2, 2, 5, 5}, 40), Leaf(d.ctx, {3, 2, 3, 3}, 41), Leaf(d.ctx, {3}, 42)},
              [](const TensorList& in) { return ops::Conv2d(in[0], in[1], in[2], 1, 1); });
  }
  SECTION("stride 2, padding 1") {
    GradCheck(d.ctx, {Leaf(d.ctx, {1, 2, 5, 5}, 43), Leaf(d.ctx, {3, 2, 3, 3}, 44), Leaf(d.ctx, {3}, 45)},
              [](const TensorList& in) { return ops::Conv2d(in[0], in[1], in[2], 2, 1); });
  }
  SECTION("no bias, stride 1, padding 0") {
    GradCheck(d.ctx, {Leaf(d.ctx, {1, 2, 4, 4}, 46), Leaf(d.ctx, {2, 2, 3, 3}, 47)},
              [](const TensorList& in) { return ops::Conv2d(in[0], in[1], Tensor(), 1, 0); });
  }
}

TEST_CASE("max_pool2d sends each output's gradient to its argmax") {
  CpuGpu d;
  SECTION("kernel 2, stride 2") {
    GradCheck(d.ctx, {DistinctLeaf(d.ctx, {1, 2, 4, 4}, 50)},
              [](const TensorList& in) { return ops::MaxPool2d(in[0], 2, 2); });
  }
  SECTION("kernel 3, stride 2, padding 1 (overlapping windows)") {
    GradCheck(d.ctx, {DistinctLeaf(d.ctx, {2, 1, 5, 5}, 51)},
              [](const TensorList& in) { return ops::MaxPool2d(in[0], 3, 2, 1); });
  }
}

TEST_CASE("softmax and log_softmax match finite differences") {
  CpuGpu d;
  SECTION("softmax") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 60, -2, 2)}, [](const TensorList& in) { return ops::Softmax(in[0], -1); });
  }
  SECTION("log_softmax") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 61, -2, 2)}, [](const TensorList& in) { return ops::LogSoftmax(in[0], 1); });
  }
  SECTION("softmax of a 3-d tensor") {
    GradCheck(d.ctx, {Leaf(d.ctx, {2, 2, 3}, 62, -2, 2)}, [](const TensorList& in) { return ops::Softmax(in[0], 2); });
  }
}

TEST_CASE("cross entropy (mean, sum, none) with an ignored target matches finite differences") {
  CpuGpu d;
  const Tensor target = Indices(d.ctx, {4}, {1, -100, 3, 0});
  SECTION("mean") {
    GradCheck(d.ctx, {Leaf(d.ctx, {4, 5}, 70, -2, 2)},
              [&](const TensorList& in) { return ops::CrossEntropy(in[0], target, ops::Reduction::kMean, -100); });
  }
  SECTION("sum") {
    GradCheck(d.ctx, {Leaf(d.ctx, {4, 5}, 71, -2, 2)},
              [&](const TensorList& in) { return ops::CrossEntropy(in[0], target, ops::Reduction::kSum, -100); });
  }
  SECTION("none") {
    GradCheck(d.ctx, {Leaf(d.ctx, {4, 5}, 72, -2, 2)},
              [&](const TensorList& in) { return ops::CrossEntropy(in[0], target, ops::Reduction::kNone, -100); });
  }
  SECTION("ignore_index other than -100") {
    const Tensor t2 = Indices(d.ctx, {4}, {2, 2, 4, 1});
    GradCheck(d.ctx, {Leaf(d.ctx, {4, 5}, 73, -2, 2)},
              [&](const TensorList& in) { return ops::CrossEntropy(in[0], t2, ops::Reduction::kMean, 2); });
  }
}

TEST_CASE("embedding's gradient scatters into a dense (V, D) gradient, repeated indices adding up") {
  CpuGpu d;
  const Tensor idx = Indices(d.ctx, {2, 3}, {0, 2, 2, 5, 1, 2});
  GradCheck(d.ctx, {Leaf(d.ctx, {6, 3}, 80)}, [&](const TensorList& in) { return ops::Embedding(in[0], idx); });
}

TEST_CASE("embedding gives the padding_idx row no gradient") {
  CpuGpu d;
  const Tensor idx = Indices(d.ctx, {4}, {0, 2, 2, 1});
  Tensor w = Leaf(d.ctx, {3, 2}, 81);
  Tensor out = ops::Embedding(w, idx, /*padding_idx=*/2);
  CHECK(out.At({1, 0}) == w.data()[4]);  // the padding row is still looked up
  Backward({ops::Sum(out)});
  CHECK(w.grad().data()[0] == 1.f);
  CHECK(w.grad().data()[1] == 1.f);
  CHECK(w.grad().data()[2] == 1.f);
  CHECK(w.grad().data()[3] == 1.f);
  CHECK(w.grad().data()[4] == 0.f);
  CHECK(w.grad().data()[5] == 0.f);
}

TEST_CASE("layer_norm matches finite differences for input, weight and bias") {
  CpuGpu d;
  SECTION("2-d") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 90, -2, 2), Leaf(d.ctx, {5}, 91, 0.5f, 1.5f), Leaf(d.ctx, {5}, 92)},
              [](const TensorList& in) { return ops::LayerNorm(in[0], in[1], in[2]); });
  }
  SECTION("3-d") {
    GradCheck(d.ctx, {Leaf(d.ctx, {2, 2, 4}, 93, -2, 2), Leaf(d.ctx, {4}, 94, 0.5f, 1.5f), Leaf(d.ctx, {4}, 95)},
              [](const TensorList& in) { return ops::LayerNorm(in[0], in[1], in[2]); });
  }
}

TEST_CASE("matmul of 4-d operands with a transposed operand matches finite differences") {
  CpuGpu d;
  SECTION("q @ k.transpose(-1, -2), k contiguous (viewable)") {
    GradCheck(d.ctx, {Leaf(d.ctx, {2, 2, 3, 4}, 100), Leaf(d.ctx, {2, 2, 5, 4}, 101)},
              [](const TensorList& in) { return ops::Matmul(in[0], ops::Transpose(in[1], -1, -2)); });
  }
  SECTION("split-heads permutes (reshape copies)") {
    GradCheck(d.ctx, {Leaf(d.ctx, {2, 3, 2, 4}, 102), Leaf(d.ctx, {2, 3, 2, 4}, 103)}, [](const TensorList& in) {
      Tensor q = ops::Permute(in[0], {0, 2, 1, 3});
      Tensor k = ops::Permute(in[1], {0, 2, 1, 3});
      return ops::Matmul(q, ops::Transpose(k, -1, -2));
    });
  }
  SECTION("3-d @ 2-d, mm and bmm") {
    GradCheck(d.ctx, {Leaf(d.ctx, {2, 3, 4}, 104), Leaf(d.ctx, {4, 2}, 105)},
              [](const TensorList& in) { return ops::Matmul(in[0], in[1]); });
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 4}, 106), Leaf(d.ctx, {4, 2}, 107)},
              [](const TensorList& in) { return ops::Mm(in[0], in[1]); });
    GradCheck(d.ctx, {Leaf(d.ctx, {2, 3, 4}, 108), Leaf(d.ctx, {2, 4, 2}, 109)},
              [](const TensorList& in) { return ops::Bmm(in[0], in[1]); });
    GradCheck(d.ctx, {Leaf(d.ctx, {2}, 110), Leaf(d.ctx, {3, 4}, 111), Leaf(d.ctx, {4, 2}, 112)},
              [](const TensorList& in) { return ops::Addmm(in[0], in[1], in[2]); });
  }
}

TEST_CASE("cat, stack, split, narrow and select route gradients to their slices") {
  CpuGpu d;
  SECTION("cat") {
    GradCheck(d.ctx, {Leaf(d.ctx, {2, 3}, 120), Leaf(d.ctx, {2, 2}, 121)}, [](const TensorList& in) {
      return ops::Cat({in[0], in[1]}, 1);
    });
    GradCheck(d.ctx, {Leaf(d.ctx, {1, 3}, 122), Leaf(d.ctx, {2, 3}, 123)}, [](const TensorList& in) {
      return ops::Cat({in[0], in[1]}, 0);
    });
  }
  SECTION("stack") {
    GradCheck(d.ctx, {Leaf(d.ctx, {2, 3}, 124), Leaf(d.ctx, {2, 3}, 125)}, [](const TensorList& in) {
      return ops::Stack({in[0], in[1]}, 1);
    });
  }
  SECTION("split with an unused part (its gradient is zeros)") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 126)}, [](const TensorList& in) {
      TensorList parts = ops::Split(in[0], 2, 1);
      REQUIRE(parts.size() == 3);
      return ops::Cat({ops::Tanh(parts[2]), parts[0]}, 1);
    });
  }
  SECTION("split with sizes") {
    GradCheck(d.ctx, {Leaf(d.ctx, {4, 3}, 127)}, [](const TensorList& in) {
      TensorList parts = ops::SplitWithSizes(in[0], {1, 3}, 0);
      return ops::Mul(ops::Select(parts[0], 0, 0), parts[1]);
    });
  }
  SECTION("narrow") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 128)}, [](const TensorList& in) { return ops::Narrow(in[0], 1, 1, 3); });
  }
  SECTION("select") {
    GradCheck(d.ctx, {Leaf(d.ctx, {3, 5}, 129)}, [](const TensorList& in) { return ops::Select(in[0], 0, -1); });
  }
}

TEST_CASE("index picks rows by int64 indices, negatives from the end, and accumulates repeated rows' gradients") {
  CpuGpu d;
  const Tensor rows = Indices(d.ctx, {3}, {0, 1, 1});
  const Tensor tokens = Indices(d.ctx, {3}, {2, -1, 0});
  Tensor x = Leaf(d.ctx, {2, 4, 3}, 131);
  Tensor out = ops::Index(x, {rows, tokens});  // x[rows, tokens]: (3, 3)
  REQUIRE(out.sizes() == Shape{3, 3});
  CHECK(out.At({0, 1}) == x.At({0, 2, 1}));
  CHECK(out.At({1, 2}) == x.At({1, 3, 2}));
  CHECK(out.At({2, 0}) == x.At({1, 0, 0}));
  GradCheck(d.ctx, {x}, [&](const TensorList& in) { return ops::Index(in[0], {rows, tokens}); });
  const Tensor again = Indices(d.ctx, {2}, {1, 1});
  GradCheck(d.ctx, {Leaf(d.ctx, {3, 2}, 132)}, [&](const TensorList& in) { return ops::Index(in[0], {again}); });
}

TEST_CASE("index saves its indices, not its input, and its backward makes an input-sized zero tensor") {
  MetaGpu d;
  Tensor logits = Tensor::Empty(d.ctx, {2, 1024, 8});  // 65,536 B
  logits.set_requires_grad(true);
  Tensor rows = Tensor::Empty(d.ctx, {2}, DType::kInt64);  // 16 B -> 512
  Tensor last = Tensor::Empty(d.ctx, {2}, DType::kInt64);
  const std::size_t base = d.alloc.memory_allocated();
  Tensor pooled = ops::Index(logits, {rows, last});  // (2, 8): 64 B -> 512
  CHECK(d.alloc.memory_allocated() == base + 512);
  rows = last = Tensor();
  CHECK(d.alloc.memory_allocated() == base + 512);  // both indices kept by IndexBackward0
  d.alloc.ResetPeakStats();
  Backward({ops::Sum(pooled)});
  // the zeros of the input's shape, beside the ones of sum's gradient
  CHECK(d.alloc.max_memory_allocated() >= base + 512 + 65536);
  pooled = Tensor();
  CHECK(d.alloc.memory_allocated() == base - 1024 + 65536);  // the indices freed; logits.grad
}

TEST_CASE("views (transpose, permute, reshape, flatten, unsqueeze, squeeze, expand) match finite differences") {
  CpuGpu d;
  GradCheck(d.ctx, {Leaf(d.ctx, {2, 3, 4}, 130)}, [](const TensorList& in) {
    Tensor p = ops::Permute(in[0], {2, 0, 1});         // (4, 2, 3)
    Tensor r = ops::Reshape(p, {4, 6});                // a copy
    Tensor f = ops::Flatten(ops::Transpose(r, 0, 1));  // (24)
    return ops::Squeeze(ops::Unsqueeze(f, 0), 0);
  });
  GradCheck(d.ctx, {Leaf(d.ctx, {3, 1}, 131)}, [](const TensorList& in) { return ops::Expand(in[0], {2, 3, 4}); });
  GradCheck(d.ctx, {Leaf(d.ctx, {2, 6}, 132)}, [](const TensorList& in) { return ops::T(ops::View(in[0], {3, 4})); });
}

TEST_CASE("mean, sum and sum over dims match finite differences") {
  CpuGpu d;
  GradCheck(d.ctx, {Leaf(d.ctx, {3, 4}, 140)}, [](const TensorList& in) { return ops::Mean(in[0]); });
  GradCheck(d.ctx, {Leaf(d.ctx, {3, 4}, 141)}, [](const TensorList& in) { return ops::Sum(in[0]); });
  GradCheck(d.ctx, {Leaf(d.ctx, {2, 3, 4}, 142)}, [](const TensorList& in) { return ops::SumDims(in[0], {0, 2}); });
  GradCheck(d.ctx, {Leaf(d.ctx, {2, 3, 4}, 143)}, [](const TensorList& in) { return ops::SumDims(in[0], {-1}, true); });
}

TEST_CASE("where routes the gradient by the condition, broadcast inputs summed back") {
  CpuGpu d;
  Tensor cond = Tensor::Empty(d.ctx, {3, 4}, DType::kBool);
  for (int i = 0; i < 12; ++i) cond.data_u8()[i] = (i * 7) % 3 == 0 ? 1 : 0;
  GradCheck(d.ctx, {Leaf(d.ctx, {3, 4}, 150), Leaf(d.ctx, {4}, 151)},
            [&](const TensorList& in) { return ops::Where(cond, in[0], in[1]); });
}

TEST_CASE("dropout's gradient is the mask times 1/(1-p)") {
  CpuGpu d;
  Tensor x = Leaf(d.ctx, {64}, 160);
  Tensor y = ops::Dropout(x, 0.25f);
  Backward({ops::Sum(y)});
  int kept = 0;
  for (int i = 0; i < 64; ++i) {
    if (y.data()[i] != 0.f) {
      ++kept;
      CHECK(y.data()[i] == Approx(x.data()[i] / 0.75f));
      CHECK(x.grad().data()[i] == Approx(1.f / 0.75f));
    } else {
      CHECK(x.grad().data()[i] == 0.f);
    }
  }
  CHECK(kept > 32);
  CHECK(kept < 64);
}

// ================================================================ forward values (kCpu)

TEST_CASE("forward values: relu, gelu, tanh, sigmoid") {
  CpuGpu d;
  Tensor x = FromValues(d.ctx, {2}, {-1.f, 2.f});
  Tensor r = ops::Relu(x);
  CHECK(r.data()[0] == 0.f);
  CHECK(r.data()[1] == 2.f);
  Tensor one = FromValues(d.ctx, {2}, {1.f, -1.f});
  CHECK(ops::Gelu(one).data()[0] == Approx(0.8413447460685429));
  CHECK(ops::Gelu(one).data()[1] == Approx(-0.15865525393145707));
  CHECK(ops::Gelu(one, true).data()[0] == Approx(0.8411919906082768));
  CHECK(ops::GeluNew(one).data()[0] == Approx(0.8411919906082768));
  Tensor zero = FromValues(d.ctx, {1}, {0.f});
  CHECK(ops::Sigmoid(zero).data()[0] == 0.5f);
  CHECK(ops::Tanh(zero).data()[0] == 0.f);
  CHECK(ops::PowScalar(FromValues(d.ctx, {1}, {3.f}), 2.f).data()[0] == Approx(9.f));
}

TEST_CASE("forward values: softmax of [0, ln 3] is [0.25, 0.75]") {
  CpuGpu d;
  Tensor x = FromValues(d.ctx, {1, 2}, {0.f, std::log(3.f)});
  Tensor s = ops::Softmax(x, -1);
  CHECK(s.data()[0] == Approx(0.25));
  CHECK(s.data()[1] == Approx(0.75));
  Tensor ls = ops::LogSoftmax(x, -1);
  CHECK(ls.data()[0] == Approx(-1.3862943611198906));
  CHECK(ls.data()[1] == Approx(-0.2876820724517809));
}

TEST_CASE("forward values: cross entropy of uniform 4-class logits is ln 4 per row") {
  CpuGpu d;
  Tensor logits = Tensor::Zeros(d.ctx, {2, 4});
  Tensor target = Indices(d.ctx, {2}, {3, 0});
  CHECK(ops::CrossEntropy(logits, target).data()[0] == Approx(1.3862943611198906));
  CHECK(ops::CrossEntropy(logits, target, ops::Reduction::kSum).data()[0] == Approx(2 * 1.3862943611198906));
  Tensor none = ops::CrossEntropy(logits, target, ops::Reduction::kNone);
  CHECK(none.sizes() == Shape{2});
  CHECK(none.data()[1] == Approx(1.3862943611198906));
  // an ignored row counts neither in the sum nor in the mean's denominator
  Tensor logits2 = FromValues(d.ctx, {2, 2}, {0.f, 0.f, 5.f, 0.f});
  Tensor target2 = Indices(d.ctx, {2}, {1, -100});
  CHECK(ops::CrossEntropy(logits2, target2).data()[0] == Approx(std::log(2.0)));
  Tensor none2 = ops::CrossEntropy(logits2, target2, ops::Reduction::kNone);
  CHECK(none2.data()[1] == 0.f);
}

TEST_CASE("forward values: linear, layer_norm, conv2d, max_pool2d, embedding, where, mean") {
  CpuGpu d;
  Tensor x = FromValues(d.ctx, {1, 2}, {1.f, 2.f});
  Tensor w = FromValues(d.ctx, {3, 2}, {1.f, 0.f, 0.f, 1.f, 1.f, 1.f});
  Tensor b = FromValues(d.ctx, {3}, {0.5f, 0.f, -1.f});
  Tensor y = ops::Linear(x, w, b);
  CHECK(y.sizes() == Shape{1, 3});
  CHECK(y.data()[0] == 1.5f);
  CHECK(y.data()[1] == 2.f);
  CHECK(y.data()[2] == 2.f);

  Tensor ln = ops::LayerNorm(FromValues(d.ctx, {1, 3}, {1.f, 2.f, 3.f}), FromValues(d.ctx, {3}, {1.f, 1.f, 1.f}),
                             FromValues(d.ctx, {3}, {0.f, 0.f, 0.f}));
  CHECK(ln.data()[0] == Approx(-1.2247356859083902));
  CHECK(ln.data()[1] == Approx(0.0).margin(1e-6));
  CHECK(ln.data()[2] == Approx(1.2247356859083902));

  Tensor ones = Tensor::Full(d.ctx, {1, 1, 3, 3}, 1.0);
  Tensor k = Tensor::Full(d.ctx, {1, 1, 3, 3}, 1.0);
  Tensor conv = ops::Conv2d(ones, k, FromValues(d.ctx, {1}, {0.5f}), 1, 1);
  CHECK(conv.sizes() == Shape{1, 1, 3, 3});
  const std::vector<float> expected{4.5f, 6.5f, 4.5f, 6.5f, 9.5f, 6.5f, 4.5f, 6.5f, 4.5f};
  for (int i = 0; i < 9; ++i) CHECK(conv.data()[i] == expected[static_cast<std::size_t>(i)]);
  CHECK(ops::Conv2d(ones, k, Tensor(), 2, 1).sizes() == Shape{1, 1, 2, 2});

  std::vector<float> ramp(16);
  std::iota(ramp.begin(), ramp.end(), 0.f);
  Tensor pool = ops::MaxPool2d(FromValues(d.ctx, {1, 1, 4, 4}, ramp), 2, 2);
  CHECK(pool.sizes() == Shape{1, 1, 2, 2});
  CHECK(pool.data()[0] == 5.f);
  CHECK(pool.data()[1] == 7.f);
  CHECK(pool.data()[2] == 13.f);
  CHECK(pool.data()[3] == 15.f);

  Tensor table = FromValues(d.ctx, {3, 2}, {0.f, 1.f, 10.f, 11.f, 20.f, 21.f});
  Tensor e = ops::Embedding(table, Indices(d.ctx, {2}, {2, 0}));
  CHECK(e.sizes() == Shape{2, 2});
  CHECK(e.data()[0] == 20.f);
  CHECK(e.data()[1] == 21.f);
  CHECK(e.data()[2] == 0.f);

  Tensor cond = Tensor::Empty(d.ctx, {2}, DType::kBool);
  cond.data_u8()[0] = 1;
  cond.data_u8()[1] = 0;
  Tensor wh = ops::Where(cond, FromValues(d.ctx, {2}, {1.f, 2.f}), FromValues(d.ctx, {1}, {-7.f}));
  CHECK(wh.data()[0] == 1.f);
  CHECK(wh.data()[1] == -7.f);

  Tensor m = ops::Mean(FromValues(d.ctx, {2, 2}, {1.f, 2.f, 3.f, 4.f}));
  CHECK(m.dim() == 0);
  CHECK(m.data()[0] == 2.5f);
  Tensor sd = ops::SumDims(FromValues(d.ctx, {2, 2}, {1.f, 2.f, 3.f, 4.f}), {0});
  CHECK(sd.data()[0] == 4.f);
  CHECK(sd.data()[1] == 6.f);
}

TEST_CASE("forward values: matmul of a 4-d operand with a transposed 4-d operand") {
  CpuGpu d;
  std::vector<float> av(2 * 3), bv(2 * 3);
  std::iota(av.begin(), av.end(), 1.f);
  std::iota(bv.begin(), bv.end(), 1.f);
  Tensor a = FromValues(d.ctx, {1, 1, 2, 3}, av);
  Tensor b = FromValues(d.ctx, {1, 1, 2, 3}, bv);
  Tensor c = ops::Matmul(a, ops::Transpose(b, -1, -2));  // a @ a^T
  CHECK(c.sizes() == Shape{1, 1, 2, 2});
  CHECK(c.data()[0] == 14.f);
  CHECK(c.data()[1] == 32.f);
  CHECK(c.data()[2] == 32.f);
  CHECK(c.data()[3] == 77.f);
}

TEST_CASE("ops without a CPU kernel throw in kCpu") {
  CpuGpu d;
  Tensor x = Tensor::Zeros(d.ctx, {1, 2, 4, 4});
  CHECK_THROWS_AS(ops::AdaptiveAvgPool2d(x, 1, 1), TensorError);
}

TEST_CASE("shape errors throw TensorError") {
  MetaGpu d;
  Tensor a = Tensor::Empty(d.ctx, {2, 3});
  Tensor b = Tensor::Empty(d.ctx, {4, 5});
  CHECK_THROWS_AS(ops::Mm(a, b), TensorError);
  CHECK_THROWS_AS(ops::Add(a, b), TensorError);
  CHECK_THROWS_AS(ops::View(ops::T(a), {6}), TensorError);
  CHECK_THROWS_AS(ops::View(a, {4, -1}), TensorError);
}

// ================================================================ memory (kMeta)

TEST_CASE(
    "reshape of a permuted tensor copies numel * 4 bytes, view and reshape of a contiguous one allocate nothing") {
  MetaGpu d;
  Tensor x = Tensor::Empty(d.ctx, {8, 16, 32});  // 16,384 B
  CHECK(d.alloc.memory_allocated() == 16384);
  Tensor v = ops::View(x, {128, 32});
  Tensor r0 = ops::Reshape(x, {8, 512});
  Tensor f = ops::Flatten(x);
  CHECK(d.alloc.memory_allocated() == 16384);
  Tensor p = ops::Permute(x, {1, 0, 2});
  CHECK(d.alloc.memory_allocated() == 16384);
  Tensor r = ops::Reshape(p, {16, 256});
  CHECK(d.alloc.memory_allocated() == 2 * 16384);
  CHECK(r.is_contiguous());
  CHECK(r.storage() != x.storage());
  CHECK_THROWS_AS(ops::View(p, {16, 256}), TensorError);
  // merging only the contiguous inner dims of the permuted tensor is a view
  Tensor r2 = ops::Reshape(p, {16 * 8, 32});
  CHECK(d.alloc.memory_allocated() == 3 * 16384);  // (16,8) -> 128 is not viewable either
  Tensor r3 = ops::Reshape(ops::Permute(x, {0, 2, 1}), {8, 32, 16});
  CHECK(d.alloc.memory_allocated() == 3 * 16384);  // no-op reshape: a view
  CHECK(r3.storage() == x.storage());
}

TEST_CASE("contiguous() copies only a non-contiguous tensor, clone always copies") {
  MetaGpu d;
  Tensor x = Tensor::Empty(d.ctx, {64, 64});  // 16,384 B
  Tensor c = ops::Contiguous(x);
  CHECK(c.impl() == x.impl());
  CHECK(d.alloc.memory_allocated() == 16384);
  Tensor t = ops::Contiguous(ops::T(x));
  CHECK(d.alloc.memory_allocated() == 2 * 16384);
  Tensor cl = ops::Clone(x);
  CHECK(d.alloc.memory_allocated() == 3 * 16384);
  CHECK(ops::To(x, DType::kFloat32).impl() == x.impl());
  Tensor h = ops::To(x, DType::kFloat16);
  CHECK(d.alloc.memory_allocated() == 3 * 16384 + 8192);
}

TEST_CASE("max_pool2d allocates the output and int64 indices of the output's shape") {
  MetaGpu d;
  Tensor x = Tensor::Empty(d.ctx, {2, 16, 32, 32});  // 131,072 B
  x.set_requires_grad(true);
  Tensor y = ops::MaxPool2d(x, 2, 2);
  CHECK(y.sizes() == Shape{2, 16, 16, 16});
  // 8,192 elements: 32,768 B fp32 output + 65,536 B int64 indices (kept for backward)
  CHECK(d.alloc.memory_allocated() == 131072 + 32768 + 65536);
  Backward({ops::Sum(y)});
  y = Tensor();
  CHECK(d.alloc.memory_allocated() == 2 * 131072);  // x and x.grad
}

TEST_CASE("dropout allocates the output and a bool mask of numel bytes, p = 0 and eval allocate nothing") {
  MetaGpu d;
  Tensor x = Tensor::Empty(d.ctx, {4096});  // 16,384 B
  x.set_requires_grad(true);
  Tensor y = ops::Dropout(x, 0.1f);
  CHECK(d.alloc.memory_allocated() == 16384 + 16384 + 4096);
  CHECK(y.dtype() == DType::kFloat32);
  CHECK(ops::Dropout(x, 0.f).impl() == x.impl());
  CHECK(ops::Dropout(x, 0.5f, /*training=*/false).impl() == x.impl());
  CHECK(d.alloc.memory_allocated() == 16384 + 16384 + 4096);
  y = Tensor();  // the mask goes with the graph
  CHECK(d.alloc.memory_allocated() == 16384);
}

TEST_CASE("layer_norm allocates the output and float32 mean and rstd of shape (*leading, 1)") {
  MetaGpu d;
  Tensor w = Tensor::Empty(d.ctx, {64});  // 512 B
  Tensor b = Tensor::Empty(d.ctx, {64});  // 512 B
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor x = Tensor::Empty(d.ctx, {4, 8, 64});  // 8,192 B
  const std::size_t before = d.alloc.memory_allocated();
  Tensor y = ops::LayerNorm(x, w, b);
  // out 8,192 B; mean and rstd 4*8*1 floats = 128 B -> 512 B each
  CHECK(d.alloc.memory_allocated() - before == 8192 + 512 + 512);
  x = Tensor();
  CHECK(d.alloc.memory_allocated() - before == 8192 + 512 + 512);  // the input is saved
  y = Tensor();
  CHECK(d.alloc.memory_allocated() == before - 8192);
}

TEST_CASE(
    "cross entropy keeps the (N, C) log_softmax until backward, whose nll_loss step allocates a full (N, C) gradient") {
  MetaGpu d;
  Tensor logits = Tensor::Empty(d.ctx, {64, 1000});  // 256,000 B (500 blocks of 512)
  logits.set_requires_grad(true);
  Tensor target = Tensor::Empty(d.ctx, {64}, DType::kInt64);  // 512 B
  const std::size_t base = d.alloc.memory_allocated();
  CHECK(base == 256000 + 512);
  Tensor loss = ops::CrossEntropy(logits, target);
  // log_softmax 256,000 B (saved), the 0-d loss 512 B, total_weight 512 B (saved)
  CHECK(d.alloc.memory_allocated() == base + 256000 + 512 + 512);
  d.alloc.ResetPeakStats();
  Backward({loss});
  // peak in LogSoftmaxBackward0: logits, log_softmax, nll grad (N, C), its own grad (N, C), loss, target,
  // and the ones backward() made for the loss (held until it returns, as torch.autograd.backward does)
  CHECK(d.alloc.max_memory_allocated() == base + 3 * 256000 + 512 + 512);
  // log_softmax and total_weight released; logits.grad stolen from LogSoftmaxBackward0
  CHECK(d.alloc.memory_allocated() == base + 256000 + 512);
  CHECK(logits.grad().sizes() == Shape{64, 1000});
}

TEST_CASE("embedding's backward allocates a dense (V, D) gradient") {
  MetaGpu d;
  Tensor w = Tensor::Empty(d.ctx, {1000, 64});  // 256,000 B
  w.set_requires_grad(true);
  Tensor idx = Tensor::Empty(d.ctx, {4, 8}, DType::kInt64);  // 256 B -> 512
  Tensor y = ops::Embedding(w, idx);                         // 8,192 B
  CHECK(d.alloc.memory_allocated() == 256000 + 512 + 8192);
  Backward({ops::Sum(y)});
  y = Tensor();
  CHECK(d.alloc.memory_allocated() == 2 * 256000 + 512);
}

TEST_CASE("matmul of split-heads permuted operands saves contiguous copies, a viewable transpose is saved as a view") {
  MetaGpu d;
  // (B, T, H, hd) = (2, 16, 4, 8) fp32: 4,096 B each
  Tensor q = Tensor::Empty(d.ctx, {2, 16, 4, 8});
  Tensor k = Tensor::Empty(d.ctx, {2, 16, 4, 8});
  q.set_requires_grad(true);
  k.set_requires_grad(true);
  const std::size_t before = d.alloc.memory_allocated();
  {
    Tensor s = ops::Matmul(ops::Permute(q, {0, 2, 1, 3}), ops::Transpose(ops::Permute(k, {0, 2, 1, 3}), -1, -2));
    CHECK(s.sizes() == Shape{2, 4, 16, 16});
    // two reshape copies (4,096 B each, saved by bmm) + the (2,4,16,16) output 8,192 B
    CHECK(d.alloc.memory_allocated() - before == 4096 + 4096 + 8192);
  }
  CHECK(d.alloc.memory_allocated() == before);
  {
    Tensor qc = Tensor::Empty(d.ctx, {2, 4, 16, 8});
    Tensor kc = Tensor::Empty(d.ctx, {2, 4, 16, 8});
    qc.set_requires_grad(true);
    kc.set_requires_grad(true);
    const std::size_t b2 = d.alloc.memory_allocated();
    Tensor s = ops::Matmul(qc, ops::Transpose(kc, -1, -2));
    CHECK(d.alloc.memory_allocated() - b2 == 8192);  // output only
  }
}

TEST_CASE("cat and stack allocate their output once and save nothing") {
  MetaGpu d;
  Tensor a = Tensor::Empty(d.ctx, {16, 32});  // 2,048 B
  Tensor b = Tensor::Empty(d.ctx, {16, 32});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  const std::size_t before = d.alloc.memory_allocated();
  Tensor c = ops::Cat({a, b}, 0);
  Tensor s = ops::Stack({a, b}, 0);
  CHECK(d.alloc.memory_allocated() - before == 4096 + 4096);
  CHECK(s.sizes() == Shape{2, 16, 32});
}

// ================================================================ autocast (kMeta)

TEST_CASE("under autocast(float16) linear outputs float16 and casts a weight once per autocast region") {
  MetaGpu d;
  Tensor w = Tensor::Empty(d.ctx, {256, 128});  // 131,072 B
  Tensor b = Tensor::Empty(d.ctx, {256});       // 1,024 B
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor x0 = Tensor::Empty(d.ctx, {32, 128});  // 16,384 B
  x0.set_requires_grad(true);
  // An activation (requires grad, not a leaf): cast on every call, and
  // addmm saves w16.t() only because mat1 requires grad.
  Tensor x = ops::MulScalar(x0, 1.f);  // 16,384 B
  const std::size_t base = d.alloc.memory_allocated();
  Tensor out1, out2;
  {
    AutocastGuard autocast(DType::kFloat16);
    CHECK(AutocastGuard::current() == DType::kFloat16);
    out1 = ops::Linear(x, w, b);
    CHECK(out1.dtype() == DType::kFloat16);
    // x16 8,192 + w16 65,536 + b16 512 + out (32,256) fp16 16,384
    CHECK(d.alloc.memory_allocated() - base == 8192 + 65536 + 512 + 16384);
    out2 = ops::Linear(x, w, b);
    // the weight and bias casts come from the cache; x is cast again (not a leaf)
    CHECK(d.alloc.memory_allocated() - base == 2 * (8192 + 16384) + 65536 + 512);
    // fp32 lists: layer_norm and softmax outputs are float32; relu keeps its input's dtype
    Tensor g = Tensor::Empty(d.ctx, {256});
    CHECK(ops::Softmax(out1, -1).dtype() == DType::kFloat32);
    CHECK(ops::LogSoftmax(out1, -1).dtype() == DType::kFloat32);
    CHECK(ops::LayerNorm(out1, g, g).dtype() == DType::kFloat32);
    CHECK(ops::Relu(out1).dtype() == DType::kFloat16);
    CHECK(ops::Relu(x).dtype() == DType::kFloat32);
  }
  CHECK_FALSE(AutocastGuard::current().has_value());
  // Leaving autocast clears the cache: b16 (not saved by addmm) is freed;
  // w16 stays, saved by both AddmmBackward0 nodes (as mat2 = w16.t()), as do
  // both x16 (mat1).
  CHECK(d.alloc.memory_allocated() - base == 2 * (8192 + 16384) + 65536);
  out1 = Tensor();
  CHECK(d.alloc.memory_allocated() - base == 8192 + 16384 + 65536);
  out2 = Tensor();
  CHECK(d.alloc.memory_allocated() == base);
}

TEST_CASE("under autocast the weight cast is not saved when the input does not require grad: it goes with the cache") {
  // addmm saves mat2 (w16.t()) only for mat1's gradient.
  MetaGpu d;
  Tensor w = Tensor::Empty(d.ctx, {256, 128});
  w.set_requires_grad(true);
  Tensor x = Tensor::Empty(d.ctx, {32, 128});  // a batch: no grad
  const std::size_t base = d.alloc.memory_allocated();
  Tensor out;
  {
    AutocastGuard autocast(DType::kFloat16);
    out = ops::Linear(x, w, Tensor());
    CHECK(d.alloc.memory_allocated() - base == 8192 + 65536 + 16384);  // x16 (saved as mat1), w16, out
  }
  CHECK(d.alloc.memory_allocated() - base == 8192 + 16384);
}

TEST_CASE("under autocast and no_grad the weight cast lives exactly until the outermost autocast exits") {
  MetaGpu d;
  Tensor w = Tensor::Empty(d.ctx, {256, 128});  // 131,072 B
  Tensor b = Tensor::Empty(d.ctx, {256});
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor x = Tensor::Empty(d.ctx, {32, 128});
  const std::size_t base = d.alloc.memory_allocated();
  NoGradGuard no_grad;
  Tensor out;
  {
    AutocastGuard outer(DType::kFloat16);
    {
      AutocastGuard inner(DType::kFloat16);
      out = ops::Linear(x, w, b);
      // x16 is freed at once (nothing saves it)
      CHECK(d.alloc.memory_allocated() - base == 65536 + 512 + 16384);
    }
    CHECK(d.alloc.memory_allocated() - base == 65536 + 512 + 16384);  // inner exit keeps the cache
    out = ops::Linear(x, w, b);
    CHECK(d.alloc.memory_allocated() - base == 65536 + 512 + 16384);
  }
  CHECK(d.alloc.memory_allocated() - base == 16384);
}

TEST_CASE("under autocast a weight that does not require grad is cast on every call (not cached)") {
  MetaGpu d;
  Tensor w = Tensor::Empty(d.ctx, {256, 128});  // frozen
  Tensor x = Tensor::Empty(d.ctx, {32, 128});
  const std::size_t base = d.alloc.memory_allocated();
  AutocastGuard autocast(DType::kFloat16);
  d.alloc.ResetPeakStats();
  Tensor out1 = ops::Linear(x, w, Tensor());
  Tensor out2 = ops::Linear(x, w, Tensor());
  CHECK(d.alloc.memory_allocated() - base == 2 * 16384);
  CHECK(All(d.alloc.GetStats().allocation).allocated == 2 + 2 * 3);  // w, x; per call x16, w16, out
}

TEST_CASE("under autocast layer_norm casts a float16 input to a float32 copy it saves, and outputs float32") {
  MetaGpu d;
  Tensor w = Tensor::Empty(d.ctx, {64});
  Tensor b = Tensor::Empty(d.ctx, {64});
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor x16 = Tensor::Empty(d.ctx, {4, 8, 64}, DType::kFloat16);  // 4,096 B
  const std::size_t before = d.alloc.memory_allocated();
  AutocastGuard autocast(DType::kFloat16);
  Tensor y = ops::LayerNorm(x16, w, b);
  CHECK(y.dtype() == DType::kFloat32);
  // fp32 copy 8,192 (saved) + out 8,192 + mean 512 + rstd 512
  CHECK(d.alloc.memory_allocated() - before == 8192 + 8192 + 512 + 512);
}

TEST_CASE(
    "under autocast softmax of a float16 input allocates only its float32 output (half_to_float, no input copy)") {
  // PyTorch: softmax/log_softmax are fp32_set_opt_dtype ops; on CUDA,
  // at::softmax(half, dim, float) calls _softmax(x, dim, half_to_float=true):
  // no float32 copy of the input. memscope casts the input first (AutocastFp32).
  MetaGpu d;
  Tensor x16 = Tensor::Empty(d.ctx, {64, 1024}, DType::kFloat16);  // 131,072 B
  const std::size_t before = d.alloc.memory_allocated();
  AutocastGuard autocast(DType::kFloat16);
  d.alloc.ResetPeakStats();
  Tensor y = ops::Softmax(x16, -1);
  CHECK(y.dtype() == DType::kFloat32);
  CHECK(d.alloc.memory_allocated() - before == 262144);
  CHECK(d.alloc.max_memory_allocated() - before == 262144);
}

TEST_CASE("under autocast sum of a float16 tensor is float32 (fp32_set_opt_dtype list)") {
  MetaGpu d;
  Tensor x16 = Tensor::Empty(d.ctx, {64}, DType::kFloat16);
  AutocastGuard autocast(DType::kFloat16);
  CHECK(ops::Sum(x16).dtype() == DType::kFloat32);
}

TEST_CASE("under autocast the float16 gradient of a cast weight is cast back to float32 as the weight's .grad") {
  MetaGpu d;
  Tensor w = Tensor::Empty(d.ctx, {256, 128});  // 131,072 B
  w.set_requires_grad(true);
  w.impl()->name.assign("weight");
  Tensor x = Tensor::Empty(d.ctx, {32, 128});
  Tensor loss;
  {
    AutocastGuard autocast(DType::kFloat16);
    loss = ops::Sum(ops::Linear(x, w, Tensor()));
  }
  CHECK(loss.dtype() == DType::kFloat32);  // sum is on the fp32 list
  Backward({loss});
  REQUIRE(w.grad().defined());
  CHECK(w.grad().dtype() == DType::kFloat32);
  CHECK(w.grad().sizes() == w.sizes());
  loss = Tensor();
  CHECK(d.alloc.memory_allocated() == 2 * 131072 + 16384);  // w, w.grad, x
}

TEST_CASE("flash attention returns a (B, H, T, D) view of (B, T, H, D) memory, so merging heads copies nothing") {
  MetaGpu d;
  Tensor q = Tensor::Empty(d.ctx, {2, 4, 16, 8}, DType::kFloat16);
  const std::size_t before = d.alloc.memory_allocated();
  Tensor out = ops::FlashAttention(q, q, q);
  CHECK(out.sizes() == Shape{2, 4, 16, 8});
  CHECK(!out.is_contiguous());
  CHECK(ops::Permute(out, {0, 2, 1, 3}).is_contiguous());
  // out: 2x4x16x8 fp16 = 2048 B; the logsumexp goes at once when no backward needs it
  CHECK(d.alloc.memory_allocated() - before == 2048);
}
