// cuBLAS/cuBLASLt workspaces: the sizes PyTorch picks (CublasHandlePool.cpp)
// and when the matmuls allocate them (tensor/blas_workspace.h).
#include "tensor/blas_workspace.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "allocator/alloc_tag.h"
#include "recording/timeline.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/tensor_test_util.h"

using namespace memscope;
using namespace memscope::testing;

namespace {

BlasWorkspaceSizes Sizes(BlasWorkspaceEnv env, bool hopper = false, std::vector<std::string>* warnings = nullptr) {
  return ChooseBlasWorkspaceSizes(env, hopper, warnings);
}

struct Alloc {
  Category category;
  std::string owner;
  std::uint64_t size;
  bool operator==(const Alloc&) const = default;
};

std::vector<Alloc> Allocs(const Timeline& t) {
  std::vector<Alloc> out;
  for (const Event& e : t.events) {
    if (e.type == EventType::kAlloc) out.push_back({e.category, t.str(e.name), e.size});
  }
  return out;
}

}  // namespace

TEST_CASE("PyTorch's default cuBLAS workspace is :4096:2:16:8 (8519680 B), 32 MiB on Hopper, cuBLASLt's 1 MiB") {
  CHECK(Sizes({}) == BlasWorkspaceSizes{8519680, 1048576});
  CHECK(Sizes({}, /*hopper=*/true) == BlasWorkspaceSizes{33554432, 1048576});
}

TEST_CASE("CUBLAS_WORKSPACE_CONFIG sums its :SIZE:COUNT pairs (KiB), a value without one warns, default kept") {
  CHECK(Sizes({":4096:8", {}, {}}).cublas == 33554432);
  CHECK(Sizes({":4096:2:16:8", {}, {}}).cublas == 8519680);
  std::vector<std::string> warnings;
  CHECK(Sizes({"4096", {}, {}}, false, &warnings).cublas == 8519680);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] == "Could not parse CUBLAS_WORKSPACE_CONFIG, using default workspace size of 8519680 bytes.");
}

TEST_CASE("CUBLASLT_WORKSPACE_SIZE is KiB, limited to the cuBLAS workspace unless unified is turned off") {
  CHECK(Sizes({{}, "4096", {}}).cublaslt == 4194304);
  std::vector<std::string> warnings;
  // :16:8 = 128 KiB of cuBLAS workspace: cuBLASLt's 1 MiB is cut to it, with PyTorch's warning.
  CHECK(Sizes({":16:8", {}, {}}, false, &warnings) == BlasWorkspaceSizes{131072, 131072});
  CHECK(warnings.size() == 1);
  CHECK(Sizes({":16:8", {}, "0"}) == BlasWorkspaceSizes{131072, 1048576});
  warnings.clear();
  CHECK(Sizes({{}, "lots", {}}, false, &warnings).cublaslt == 1048576);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] == "invalid CUBLASLT_WORKSPACE_SIZE, using default workspace size of 1024 KiB.");
  // TORCH_CUBLASLT_UNIFIED_WORKSPACE=1: cuBLASLt runs in the cuBLAS workspace.
  CHECK(Sizes({{}, {}, "1"}) == BlasWorkspaceSizes{8519680, 0});
}

TEST_CASE("the first nn.Linear allocates its output, then the cuBLAS and cuBLASLt workspaces, kept for good") {
  MetaGpu d;
  d.ctx.set_blas_workspaces(Sizes({}));
  Tensor x = Tensor::Empty(d.ctx, {4, 8});
  Tensor w = Tensor::Empty(d.ctx, {16, 8});
  Tensor b = Tensor::Empty(d.ctx, {16});
  REQUIRE(d.session.Start().ok());
  Tensor y = ops::Linear(x, w, b);  // addmm with a bias: cuBLASLt
  // x, w, b, y: 512 B blocks each; then 8519680 + 1048576.
  CHECK(d.alloc.memory_allocated() == 4 * 512 + 8519680 + 1048576);
  y = Tensor();
  Tensor y2 = ops::Linear(x, w, b);  // nothing more
  Tensor z = ops::Mm(x, ops::Transpose(w, 0, 1));
  CHECK(d.alloc.memory_allocated() == 5 * 512 + 8519680 + 1048576);
  y2 = Tensor();
  z = Tensor();
  x = w = b = Tensor();
  CHECK(d.alloc.memory_allocated() == 8519680 + 1048576);  // pytorch/pytorch#95668
  REQUIRE(d.session.Finish().ok());
  const std::vector<Alloc> allocs = Allocs(d.session.timeline());
  REQUIRE(allocs.size() == 5);
  CHECK(allocs[1] == Alloc{Category::kOther, "cublas_workspace", 8519680});
  CHECK(allocs[2] == Alloc{Category::kOther, "cublaslt_workspace", 1048576});
}

TEST_CASE("mm and bmm use cuBLAS only, a bias-free Linear allocates no cuBLASLt workspace") {
  MetaGpu d;
  d.ctx.set_blas_workspaces(Sizes({}, /*hopper=*/true));
  Tensor a = Tensor::Empty(d.ctx, {2, 4, 8});
  Tensor b = Tensor::Empty(d.ctx, {2, 8, 4});
  Tensor c = ops::Bmm(a, b);
  CHECK(d.alloc.memory_allocated() == 3 * 512 + 33554432);
  Tensor w = Tensor::Empty(d.ctx, {16, 8});
  Tensor y = ops::Linear(ops::Select(a, 0, 0), w, Tensor());
  CHECK(d.alloc.memory_allocated() == 5 * 512 + 33554432);
}

TEST_CASE("without workspace sizes (the default of a DeviceContext) matmuls allocate only their outputs") {
  MetaGpu d;
  Tensor x = Tensor::Empty(d.ctx, {4, 8});
  Tensor w = Tensor::Empty(d.ctx, {16, 8});
  Tensor b = Tensor::Empty(d.ctx, {16});
  Tensor y = ops::Linear(x, w, b);
  CHECK(d.alloc.memory_allocated() == 4 * 512);
}
