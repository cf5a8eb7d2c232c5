// DDP's bucket assignment equals PyTorch's: compute_bucket_assignment_by_size
// (torch/csrc/distributed/c10d/reducer.cpp) with the limits
// DistributedDataParallel (PyTorch 2.x, torch/nn/parallel/distributed.py)
// passes it at construction and at the rebuild. Every expected list was
// computed by PyTorch 1.13's torch.distributed._compute_bucket_assignment_by_size
// (the C++ function itself, given PyTorch 2.x's limits) or read from PyTorch
// 1.13's DDP: tests/reducer/bucket_expected.py writes bucket_expected.inc.
//
// The parameter lists are the zoo's (train/models.h), materialized on a meta
// device, so these tests also pin the zoo's parameter names, sizes and order
// to torchvision's ResNet-50, Hugging Face's GPT-2 (124M) and the CIFAR-10
// tutorial Net. The mixed-precision cases keep BatchNorm / LayerNorm
// parameters float32 and make every other parameter float16.
#include "reducer/buckets.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"
#include "tensor/autograd.h"
#include "train/models.h"

namespace memscope::reducer {
namespace {

using Buckets = std::vector<std::vector<std::size_t>>;
using Limits = std::vector<std::size_t>;

struct ExpectedParam {
  const char* name;
  std::int64_t numel;
  bool kept_float32;  // a BatchNorm or LayerNorm parameter
};
struct Expected {
  Buckets buckets;
  Limits size_limits;
};

#include "tests/reducer/bucket_expected.inc"

constexpr std::size_t kMiB = 1024 * 1024;

// A zoo model with its parameters allocated on a meta device.
struct ZooModel {
  explicit ZooModel(const std::string& name, ModelOptions options = {}) {
    absl::StatusOr<std::unique_ptr<Model>> m = CreateModel(name, options);
    REQUIRE(m.ok());
    model = std::move(*m);
    model->Materialize(ctx);
  }
  SimDevice gpu{SimDeviceOptions{.capacity = 80 * kGiB}};
  CachingAllocator alloc{gpu};
  DeviceContext ctx{alloc, ExecMode::kMeta};
  std::unique_ptr<Model> model;
};

bool IsNormParameter(const std::string& name) {
  return name.find("bn") != std::string::npos || name.find("downsample.1.") != std::string::npos ||
         name.find("ln_") != std::string::npos;
}

// The model's parameters as DDP buckets them; `mixed`: float16 except the
// BatchNorm / LayerNorm parameters.
std::vector<BucketTensor> BucketTensors(Model& model, bool mixed = false) {
  std::vector<BucketTensor> out;
  for (const Tensor* p : model.Parameters()) {
    const DType dtype = mixed && !IsNormParameter(p->name()) ? DType::kFloat16 : p->dtype();
    out.push_back({static_cast<std::uint64_t>(p->numel()) * ElementSize(dtype), dtype});
  }
  return out;
}

void CheckEqual(const BucketAssignment& got, const Expected& want) {
  CHECK(got.buckets == want.buckets);
  CHECK(got.size_limits == want.size_limits);
}

// The order in which the model's parameters' AccumulateGrad nodes run in one
// backward: a post hook on each, as PyTorch's Reducer registers them.
std::vector<std::size_t> GradientReadyOrder(ZooModel& zoo) {
  std::vector<Tensor*> params = zoo.model->Parameters();
  std::vector<std::shared_ptr<Node>> accumulators;  // kept alive, as the Reducer keeps them
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::shared_ptr<Node> acc = GradientEdge(*params[i]).fn;
    REQUIRE(acc != nullptr);
    REQUIRE(acc->is_accumulate_grad());
    acc->AddPostHook([&order, i] { order.push_back(i); });
    accumulators.push_back(std::move(acc));
  }
  Batch batch = zoo.model->MakeBatch(zoo.ctx, 0);
  Tensor loss = zoo.model->Loss(zoo.model->Forward(batch), batch);
  Backward({loss});
  return order;
}

// n-1, ..., 1, 0: a given gradient-ready order.
std::vector<std::size_t> ReverseOrder(std::size_t n) {
  std::vector<std::size_t> order(n);
  std::iota(order.rbegin(), order.rend(), std::size_t{0});
  return order;
}

// Construction buckets hold ascending indices; each was closed by its last
// (highest) tensor: without it the bucket is under its limit, with it at or
// over, except the bucket of the last parameter, which may stay open.
void CheckClosedByLastTensor(const std::vector<BucketTensor>& params, const BucketAssignment& a) {
  for (std::size_t b = 0; b < a.buckets.size(); ++b) {
    const std::vector<std::size_t>& bucket = a.buckets[b];
    std::uint64_t total = 0;
    for (std::size_t i : bucket) total += params[i].bytes;
    const std::uint64_t last = params[bucket.back()].bytes;
    CHECK(total - last < a.size_limits[b]);
    if (bucket.back() != params.size() - 1) CHECK(total >= a.size_limits[b]);
  }
}

}  // namespace

TEST_CASE("the no-limit bucket's size limit is sys.maxsize, as PyTorch reports it") {
  // dist._compute_bucket_assignment_by_size([torch.empty(10)] * 2, [sys.maxsize], [False] * 2)
  //   -> ([[0, 1]], [9223372036854775807])
  CHECK(kNoBucketLimit == 9223372036854775807ULL);
  const std::vector<BucketTensor> tensors = {{40, DType::kFloat32}, {40, DType::kFloat32}};
  const BucketAssignment a = InitialBuckets(tensors, /*find_unused_parameters=*/false, /*static_graph=*/false, {});
  CHECK(a.buckets == Buckets{{0, 1}});
  CHECK(a.size_limits == Limits{9223372036854775807ULL});
}

TEST_CASE("the rebuild appends the still-open buckets newest dtype first, as PyTorch's unordered_map iterates") {
  // Parameters 0..5 alternate float32 (400 B) and float16 (200 B); gradients
  // ready in the order 3 (f16), 2 (f32), 1, 0, 5, 4. PyTorch 1.13:
  //   ts = [torch.empty(100, dtype=D[i]) for i in ready]
  //   dist._compute_bucket_assignment_by_size(ts, [10**9], [False] * 6, ready)
  //     -> ([[2, 0, 4], [3, 1, 5]], [10**9, 10**9])
  //   dist._compute_bucket_assignment_by_size(ts, [500, 500], [False] * 6, ready)
  //     -> ([[2, 0], [3, 1, 5], [4]], [500, 500, 500])
  std::vector<BucketTensor> ready_tensors;
  const std::vector<std::size_t> ready = {3, 2, 1, 0, 5, 4};
  for (std::size_t i : ready) {
    ready_tensors.push_back(i % 2 == 0 ? BucketTensor{400, DType::kFloat32} : BucketTensor{200, DType::kFloat16});
  }
  const std::vector<std::size_t> no_limit = {1'000'000'000};
  BucketAssignment a = ComputeBucketAssignmentBySize(ready_tensors, no_limit, ready);
  CHECK(a.buckets == Buckets{{2, 0, 4}, {3, 1, 5}});
  CHECK(a.size_limits == Limits{1'000'000'000, 1'000'000'000});
  const std::vector<std::size_t> limits = {500, 500};
  a = ComputeBucketAssignmentBySize(ready_tensors, limits, ready);
  CHECK(a.buckets == Buckets{{2, 0}, {3, 1, 5}, {4}});
  CHECK(a.size_limits == Limits{500, 500, 500});
}

TEST_CASE("the rebuild's first bucket is 1 MiB only when bucket_cap_mb is unset, else the cap (PyTorch 2.x)") {
  CHECK(RebuildBucketLimits(std::nullopt) == Limits{1024 * 1024, 25 * 1024 * 1024});
  CHECK(RebuildBucketLimits(5.0) == Limits{5 * 1024 * 1024, 5 * 1024 * 1024});
  CHECK(RebuildBucketLimits(0.01) == Limits{10485, 10485});  // int(0.01 * 1024 * 1024)
  // The CIFAR tutorial Net, gradients ready fc3.bias, fc3.weight, ... as DDP
  // records them, bucket_cap_mb=0.01. PyTorch 1.13's DDP with
  // dist._DEFAULT_FIRST_BUCKET_BYTES = 10485 (what 2.x passes for a given cap)
  // rebuilt "9 8 7 6, 5 4, 2 3 0, 1" (rebuilt_per_bucket_param_indices);
  // with a 1 MiB first bucket all 248,024 B would stay in one bucket.
  const std::vector<BucketTensor> params = {
      {1800, DType::kFloat32},   {24, DType::kFloat32},  {9600, DType::kFloat32},  {64, DType::kFloat32},
      {192000, DType::kFloat32}, {480, DType::kFloat32}, {40320, DType::kFloat32}, {336, DType::kFloat32},
      {3360, DType::kFloat32},   {40, DType::kFloat32}};
  const std::vector<std::size_t> ready = {9, 8, 7, 6, 5, 4, 2, 3, 0, 1};
  const BucketAssignment a = RebuiltBuckets(params, ready, 0.01);
  CHECK(a.buckets == Buckets{{9, 8, 7, 6}, {5, 4}, {2, 3, 0}, {1}});
  CHECK(a.size_limits == Limits{10485, 10485, 10485, 10485});
}

TEST_CASE("the zoo's ResNet-50, GPT-2 and CIFAR Net parameters are torchvision's, Hugging Face's and the tutorial's") {
  for (const auto& [name, expected] : std::vector<std::pair<std::string, const std::vector<ExpectedParam>*>>{
           {"resnet50", &kResNet50Params}, {"gpt2", &kGpt2Params}, {"cifar-net", &kCifarNetParams}}) {
    INFO(name);
    ZooModel zoo(name);
    const std::vector<Tensor*> params = zoo.model->Parameters();
    REQUIRE(params.size() == expected->size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      INFO(i);
      CHECK(params[i]->name() == (*expected)[i].name);
      CHECK(params[i]->numel() == (*expected)[i].numel);
      CHECK(params[i]->dtype() == DType::kFloat32);
      CHECK(IsNormParameter(params[i]->name()) == (*expected)[i].kept_float32);
    }
  }
}

TEST_CASE("without find_unused_parameters DDP starts with one bucket of all parameters") {
  ZooModel resnet("resnet50");
  ZooModel gpt2("gpt2");
  for (const bool static_graph : {false, true}) {
    CheckEqual(InitialBuckets(BucketTensors(*resnet.model), false, static_graph, std::nullopt), kResNet50Default);
    CheckEqual(InitialBuckets(BucketTensors(*gpt2.model), false, static_graph, std::nullopt), kGpt2Default);
    // Nor does static_graph bucket, even with find_unused_parameters.
    if (static_graph) {
      CheckEqual(InitialBuckets(BucketTensors(*resnet.model), true, true, 5.0), kResNet50Default);
    }
  }
  CHECK(kResNet50Default.buckets.size() == 1);
  CHECK(kGpt2Default.buckets.size() == 1);
}

TEST_CASE("find_unused_parameters with the default cap: a 1 MiB bucket of the first parameters, then 25 MiB") {
  ZooModel resnet("resnet50");
  ZooModel gpt2("gpt2");
  CHECK(InitialBucketLimits(true, false, std::nullopt) == Limits{kMiB, 25 * kMiB});
  const std::vector<BucketTensor> r = BucketTensors(*resnet.model);
  const std::vector<BucketTensor> g = BucketTensors(*gpt2.model);
  CheckEqual(InitialBuckets(r, true, false, std::nullopt), kResNet50FindUnused);
  CheckEqual(InitialBuckets(g, true, false, std::nullopt), kGpt2FindUnused);
  // Reversed: the 1 MiB bucket of the first-registered parameters comes last.
  CHECK(kResNet50FindUnused.size_limits.back() == kMiB);
  CHECK(kGpt2FindUnused.size_limits.back() == kMiB);
  CheckClosedByLastTensor(r, InitialBuckets(r, true, false, std::nullopt));
  CheckClosedByLastTensor(g, InitialBuckets(g, true, false, std::nullopt));
}

TEST_CASE("PyTorch 1.13 (--torch-version 1.13): the first bucket is 1 MiB whatever bucket_cap_mb says") {
  // 1.13's distributed.py: [dist._DEFAULT_FIRST_BUCKET_BYTES, bucket_bytes_cap] at construction with
  // find_unused_parameters, and dist.Reducer(..., dist._DEFAULT_FIRST_BUCKET_BYTES) for the rebuild.
  CHECK(RebuildBucketLimits(0.01, /*first_bucket_from_cap=*/false) == Limits{1024 * 1024, 10485});
  CHECK(RebuildBucketLimits(std::nullopt, false) == Limits{1024 * 1024, 25 * 1024 * 1024});
  CHECK(InitialBucketLimits(true, false, 5.0, false) == Limits{1024 * 1024, 5 * 1024 * 1024});
  CHECK(InitialBucketLimits(true, false, std::nullopt, false) == Limits{1024 * 1024, 25 * 1024 * 1024});
  CHECK(InitialBucketLimits(false, false, 5.0, false) == Limits{kNoBucketLimit});
  CHECK(InitialBucketLimits(true, true, 5.0, false) == Limits{kNoBucketLimit});
  // The CIFAR Net of the test above, bucket_cap_mb=0.01: 1.13 keeps all
  // 248,024 B in the 1 MiB first bucket; 2.x splits them at 10,485 B.
  const std::vector<BucketTensor> params = {
      {1800, DType::kFloat32},   {24, DType::kFloat32},  {9600, DType::kFloat32},  {64, DType::kFloat32},
      {192000, DType::kFloat32}, {480, DType::kFloat32}, {40320, DType::kFloat32}, {336, DType::kFloat32},
      {3360, DType::kFloat32},   {40, DType::kFloat32}};
  const std::vector<std::size_t> ready = {9, 8, 7, 6, 5, 4, 2, 3, 0, 1};
  const BucketAssignment old = RebuiltBuckets(params, ready, 0.01, /*first_bucket_from_cap=*/false);
  CHECK(old.buckets == Buckets{{9, 8, 7, 6, 5, 4, 2, 3, 0, 1}});
  CHECK(old.size_limits == Limits{1024 * 1024});
  CHECK(RebuiltBuckets(params, ready, 0.01).buckets == Buckets{{9, 8, 7, 6}, {5, 4}, {2, 3, 0}, {1}});
}

TEST_CASE("find_unused_parameters with bucket_cap_mb 1, 5 and 25 given buckets by the cap alone") {
  ZooModel resnet("resnet50");
  ZooModel gpt2("gpt2");
  const std::vector<BucketTensor> r = BucketTensors(*resnet.model);
  const std::vector<BucketTensor> g = BucketTensors(*gpt2.model);
  const std::vector<std::pair<double, std::pair<const Expected*, const Expected*>>> cases = {
      {1.0, {&kResNet50Cap1, &kGpt2Cap1}}, {5.0, {&kResNet50Cap5, &kGpt2Cap5}}, {25.0, {&kResNet50Cap25, &kGpt2Cap25}}};
  for (const auto& [cap, expected] : cases) {
    INFO("bucket_cap_mb " << cap);
    CHECK(InitialBucketLimits(true, false, cap) == Limits{BucketCapBytes(cap)});
    CheckEqual(InitialBuckets(r, true, false, cap), *expected.first);
    CheckEqual(InitialBuckets(g, true, false, cap), *expected.second);
    CheckClosedByLastTensor(r, InitialBuckets(r, true, false, cap));
    CheckClosedByLastTensor(g, InitialBuckets(g, true, false, cap));
  }
}

TEST_CASE(
    "a parameter over the cap closes its bucket, alone when the bucket was empty, so buckets pass the cap by one "
    "tensor") {
  ZooModel resnet("resnet50");
  ZooModel gpt2("gpt2");
  const std::vector<BucketTensor> r = BucketTensors(*resnet.model);
  const std::vector<BucketTensor> g = BucketTensors(*gpt2.model);
  // Each parameter of at least the cap is the last of its bucket: alone
  // when the bucket before it had just closed, else on top of the smaller
  // parameters before it. Counts {alone, on top}.
  const auto count = [](const std::vector<BucketTensor>& params, const BucketAssignment& a, std::size_t cap) {
    std::pair<std::size_t, std::size_t> n;
    for (const std::vector<std::size_t>& bucket : a.buckets) {
      for (std::size_t i : bucket) {
        if (params[i].bytes < cap) continue;
        CHECK(i == bucket.back());
        ++(bucket.size() == 1 ? n.first : n.second);
      }
    }
    return n;
  };
  // GPT-2 with a 1 MiB cap: wte (50257 x 768 float32, 154,389,504 B) and
  // wpe come first and are alone; every c_attn / c_fc weight lands on top of
  // a LayerNorm's parameters, every c_proj weight on top of a bias.
  CHECK(g[0].bytes == 154'389'504);
  const BucketAssignment g1 = InitialBuckets(g, true, false, 1.0);
  CheckEqual(g1, kGpt2Cap1);
  CHECK(count(g, g1, kMiB) == std::make_pair(std::size_t{2}, std::size_t{48}));
  // wte is over every cap: alone in its bucket, the last one after the reversal.
  for (const Expected* e : {&kGpt2Cap1, &kGpt2Cap5, &kGpt2Cap25})
    CHECK(e->buckets.back() == std::vector<std::size_t>{0});
  // ResNet-50 with a 1 MiB cap: every conv weight of 1 MiB or more (e.g.
  // layer4.0.conv2.weight, 512 x 512 x 3 x 3, 9,437,184 B) follows a
  // BatchNorm's parameters, and so does fc.weight: none is alone.
  const BucketAssignment r1 = InitialBuckets(r, true, false, 1.0);
  CheckEqual(r1, kResNet50Cap1);
  CHECK(count(r, r1, kMiB) == std::make_pair(std::size_t{0}, std::size_t{29}));
  CHECK(kResNet50Cap1.buckets[0] == std::vector<std::size_t>{160});  // fc.bias: the open remainder
  CheckClosedByLastTensor(r, r1);
  CheckClosedByLastTensor(g, g1);
}

TEST_CASE("mixed float32 and float16 parameters are bucketed per dtype, each with its own limits") {
  ZooModel resnet("resnet50");
  ZooModel gpt2("gpt2");
  const std::vector<BucketTensor> r = BucketTensors(*resnet.model, /*mixed=*/true);
  const std::vector<BucketTensor> g = BucketTensors(*gpt2.model, /*mixed=*/true);
  CheckEqual(InitialBuckets(r, false, false, std::nullopt), kResNet50MixedDefault);
  CheckEqual(InitialBuckets(g, false, false, std::nullopt), kGpt2MixedDefault);
  CHECK(kResNet50MixedDefault.buckets.size() == 2);  // one per dtype
  CHECK(kGpt2MixedDefault.buckets.size() == 2);
  CheckEqual(InitialBuckets(r, true, false, std::nullopt), kResNet50MixedFindUnused);
  CheckEqual(InitialBuckets(g, true, false, std::nullopt), kGpt2MixedFindUnused);
  CheckEqual(InitialBuckets(r, true, false, 5.0), kResNet50MixedCap5);
  CheckEqual(InitialBuckets(g, true, false, 5.0), kGpt2MixedCap5);
  // The rebuild: the still-open buckets come newest dtype first. ResNet-50's
  // first ready gradient is fc.bias (float16), so the float32 BatchNorm
  // bucket is appended before the float16 one.
  CheckEqual(RebuiltBuckets(r, kResNet50ReadyOrder, std::nullopt), kResNet50MixedRebuilt);
  CheckEqual(RebuiltBuckets(g, ReverseOrder(g.size()), std::nullopt), kGpt2MixedRebuilt);
}

TEST_CASE(
    "the rebuild buckets ResNet-50 in the gradient-ready order DDP recorded, and memscope's autograd has that order") {
  ZooModel resnet("resnet50", {.batch_size = 1});
  const std::vector<BucketTensor> r = BucketTensors(*resnet.model);
  CheckEqual(RebuiltBuckets(r, kResNet50ReadyOrder, std::nullopt), kResNet50Rebuilt);
  CheckEqual(RebuiltBuckets(r, kResNet50ReadyOrder, 5.0), kResNet50RebuiltCap5);
  CHECK(GradientReadyOrder(resnet) == kResNet50ReadyOrder);
}

TEST_CASE("the rebuild of GPT-2 in reverse registration order, default cap and bucket_cap_mb 5") {
  ZooModel gpt2("gpt2");
  const std::vector<BucketTensor> g = BucketTensors(*gpt2.model);
  CheckEqual(RebuiltBuckets(g, ReverseOrder(g.size()), std::nullopt), kGpt2Rebuilt);
  CheckEqual(RebuiltBuckets(g, ReverseOrder(g.size()), 5.0), kGpt2RebuiltCap5);
}

TEST_CASE("the CIFAR Net's gradient-ready order in memscope's autograd is DDP's, and so are its rebuilt buckets") {
  ZooModel cifar("cifar-net");
  const std::vector<std::size_t> ready = GradientReadyOrder(cifar);
  CHECK(ready == kCifarNetReadyOrder);  // fc3.bias, fc3.weight, ..., conv2.weight, conv2.bias, conv1.weight, conv1.bias
  // DDP(net, bucket_cap_mb=0.01) after two iterations: "9 8 7 6, 5 4, 2 3 0, 1".
  CheckEqual(RebuiltBuckets(BucketTensors(*cifar.model), ready, 0.01), kCifarNetRebuilt);
}

}  // namespace memscope::reducer
