// --torch-version (run/torch_version.h): the versions accepted, each
// release's defaults, the flags that override them, the allocator settings
// an old release refuses, and what reaches a rank's plan.
#include <catch2/catch.hpp>

#include "run/run_request.h"
#include "run/torch_version.h"

namespace memscope {
namespace {

constexpr const char* kRange = "use 1.10 to 1.13 or 2.0 to 2.9 (the PyTorch releases memscope models)";

TEST_CASE("torch version: 1.10 to 1.13 and 2.0 to 2.9 are accepted, anything else is refused naming the range") {
  for (const char* text : {"1.10", "1.11", "1.12", "1.13", "2.0", "2.1", "2.6", "2.8", "2.9"}) {
    absl::StatusOr<TorchVersion> v = ParseTorchVersion(text);
    REQUIRE(v.ok());
    CHECK(TorchVersionText(*v) == text);
  }
  for (const char* text : {"1.9", "1.14", "2.10", "2.11", "3.0", "2", "2.9.1", "v2.9", "2.x", "", ".9", "-1.13"}) {
    absl::StatusOr<TorchVersion> v = ParseTorchVersion(text);
    REQUIRE(!v.ok());
    CHECK(v.status().message() == std::string("--torch-version '") + text + "': " + kRange);
  }
  CHECK(RunRequest{}.torch_version == TorchVersionText(kNewestTorchVersion));
}

TEST_CASE("torch version: 1.13's defaults against 2.9's") {
  const TorchDefaults old = TorchDefaultsOf({1, 13});
  CHECK(old.zero_grad == "zeros");
  CHECK(old.optimizer_impl == "for-loop");
  CHECK(!old.cublas_workspace_in_allocator);
  CHECK(!old.cublaslt_persistent_workspace);
  CHECK(!old.first_bucket_from_cap);
  CHECK(!old.behaviour.inplace_accumulation);
  CHECK(old.behaviour.mean_dim_saves_input);
  CHECK(!old.behaviour.softmax_saves_input);
  // Up to 1.10, softmax saved its input as well as its result; 1.10 is 1.13 otherwise.
  const TorchDefaults v110 = TorchDefaultsOf({1, 10});
  CHECK(v110.behaviour.softmax_saves_input);
  CHECK(v110.zero_grad == old.zero_grad);
  CHECK(v110.optimizer_impl == old.optimizer_impl);
  CHECK(v110.behaviour.inplace_accumulation == old.behaviour.inplace_accumulation);
  CHECK(!TorchDefaultsOf({1, 11}).behaviour.softmax_saves_input);

  const TorchDefaults newest = TorchDefaultsOf(kNewestTorchVersion);
  CHECK(newest.zero_grad == "none");
  CHECK(newest.optimizer_impl == "foreach");
  CHECK(newest.cublas_workspace_in_allocator);
  CHECK(newest.cublaslt_persistent_workspace);
  CHECK(newest.first_bucket_from_cap);
  // The newest release's behaviours are TorchBehaviour's defaults (the oracle's 2.x).
  CHECK(newest.behaviour.inplace_accumulation == TorchBehaviour{}.inplace_accumulation);
  CHECK(newest.behaviour.mean_dim_saves_input == TorchBehaviour{}.mean_dim_saves_input);
  CHECK(newest.behaviour.inplace_accumulation);
  CHECK(!newest.behaviour.mean_dim_saves_input);

  // 2.0 to 2.7: cuBLAS in the allocator, no persistent cuBLASLt workspace.
  for (int minor = 0; minor <= 7; ++minor) {
    const TorchDefaults d = TorchDefaultsOf({2, minor});
    CHECK(d.zero_grad == "none");
    CHECK(d.optimizer_impl == "foreach");
    CHECK(d.cublas_workspace_in_allocator);
    CHECK(!d.cublaslt_persistent_workspace);
  }
  CHECK(TorchDefaultsOf({2, 8}).cublaslt_persistent_workspace);
}

RunRequest Mlp(const char* version) {
  RunRequest r;
  r.model = "mlp";
  r.torch_version = version;
  return r;
}

TEST_CASE("torch version: the rank plan of 1.13 and of 2.9, and explicit flags winning over the version") {
  RunRequest r = Mlp("1.13");
  REQUIRE(ApplyTorchVersion(r).ok());
  CHECK(r.zero_grad == "zeros");
  CHECK(r.optimizer_impl == "for-loop");
  CHECK(r.cublas_workspace == "off");
  absl::StatusOr<RankPlan> p = MakeRankPlan(r, "copy", 2);
  REQUIRE(p.ok());
  CHECK(!p->train.zero_grad_set_to_none);
  CHECK(p->train.optimizer.impl == OptimizerImpl::kForLoop);
  CHECK(p->blas_workspaces == BlasWorkspaceSizes{0, 0});
  CHECK(!p->torch_behaviour.inplace_accumulation);
  CHECK(p->torch_behaviour.mean_dim_saves_input);
  REQUIRE(p->train.ddp.has_value());
  CHECK(!p->train.ddp->first_bucket_from_cap);

  RunRequest n = Mlp("2.9");
  REQUIRE(ApplyTorchVersion(n).ok());
  CHECK(n.zero_grad == "none");
  CHECK(n.optimizer_impl == "foreach");
  CHECK(n.cublas_workspace == "default");
  p = MakeRankPlan(n, "copy", 2);
  REQUIRE(p.ok());
  CHECK(p->train.zero_grad_set_to_none);
  CHECK(p->train.optimizer.impl == OptimizerImpl::kForeach);
  CHECK(p->blas_workspaces == BlasWorkspaceSizes{kDefaultCublasWorkspace, kDefaultCublasLtWorkspace});
  CHECK(p->torch_behaviour.inplace_accumulation);
  CHECK(!p->torch_behaviour.mean_dim_saves_input);
  CHECK(p->train.ddp->first_bucket_from_cap);

  // 2.7: the cuBLAS workspace, no cuBLASLt one.
  RunRequest s = Mlp("2.7");
  REQUIRE(ApplyTorchVersion(s).ok());
  p = MakeRankPlan(s, "off", 1);
  REQUIRE(p.ok());
  CHECK(p->blas_workspaces == BlasWorkspaceSizes{kDefaultCublasWorkspace, 0});

  // Flags given win over 1.13's defaults.
  RunRequest g = Mlp("1.13");
  g.zero_grad = "none";
  g.zero_grad_given = true;
  g.optimizer_impl = "fused";
  g.optimizer_impl_given = true;
  g.cublas_workspace = "hopper";
  g.cublas_workspace_given = true;
  REQUIRE(ApplyTorchVersion(g).ok());
  CHECK(g.zero_grad == "none");
  CHECK(g.optimizer_impl == "fused");
  CHECK(g.cublas_workspace == "hopper");
  p = MakeRankPlan(g, "off", 1);
  REQUIRE(p.ok());
  CHECK(p->train.zero_grad_set_to_none);
  CHECK(p->train.optimizer.impl == OptimizerImpl::kFused);
  CHECK(p->blas_workspaces == BlasWorkspaceSizes{kHopperCublasWorkspace, 0});

  RunRequest bad = Mlp("2.10");
  CHECK(ApplyTorchVersion(bad).message() == std::string("--torch-version '2.10': ") + kRange);
  CHECK(MakeRankPlan(bad, "off", 1).status().message() == std::string("--torch-version '2.10': ") + kRange);
}

TEST_CASE("torch version: a setting the pinned release does not have is refused, naming it and its release") {
  struct Case {
    const char* version;
    const char* conf;
    const char* error;  // "" when accepted
  };
  const Case cases[] = {
      {"1.13", "expandable_segments:True",
       "--alloc-conf \"expandable_segments:True\": expandable_segments needs PyTorch 2.1 or later "
       "(pytorch/pytorch#100184); this run is --torch-version 1.13"},
      {"2.0", "max_split_size_mb:128,expandable_segments:False",
       "--alloc-conf \"max_split_size_mb:128,expandable_segments:False\": expandable_segments needs PyTorch 2.1 or "
       "later (pytorch/pytorch#100184); this run is --torch-version 2.0"},
      {"2.1", "expandable_segments:True", ""},
      {"2.5", "max_non_split_rounding_mb:40",
       "--alloc-conf \"max_non_split_rounding_mb:40\": max_non_split_rounding_mb needs PyTorch 2.6 or later "
       "(pytorch/pytorch#136174); this run is --torch-version 2.5"},
      {"2.6", "max_non_split_rounding_mb:40", ""},
      {"2.8", "per_process_memory_fraction:0.5",
       "--alloc-conf \"per_process_memory_fraction:0.5\": per_process_memory_fraction needs PyTorch 2.9 or later "
       "(CUDAAllocatorConfig.cpp of 2.9); this run is --torch-version 2.8"},
      {"1.13", "roundup_power2_divisions:[256:1,>:4]",
       "--alloc-conf \"roundup_power2_divisions:[256:1,>:4]\": roundup_power2_divisions as a per-interval list "
       "needs PyTorch 2.0 or later (pytorch/pytorch#87290); this run is --torch-version 1.13"},
      {"2.0", "roundup_power2_divisions:[256:1,>:4]", ""},
      {"1.13", "roundup_power2_divisions:4,max_split_size_mb:128,garbage_collection_threshold:0.6", ""},
      {"2.9", "expandable_segments:True,max_non_split_rounding_mb:40,per_process_memory_fraction:0.5", ""},
  };
  for (const Case& c : cases) {
    INFO(c.version << " " << c.conf);
    RunRequest r = Mlp(c.version);
    r.alloc_conf = c.conf;
    r.alloc_conf_given = true;
    absl::StatusOr<RankPlan> p = MakeRankPlan(r, "off", 1);
    if (*c.error == '\0') {
      CHECK(p.ok());
    } else {
      REQUIRE(!p.ok());
      CHECK(p.status().message() == c.error);
    }
  }
}

TEST_CASE("torch version: the settings parsed keep their keys and the list form") {
  absl::StatusOr<AllocatorConfig> c = AllocatorConfig::Parse("max_split_size_mb:128,roundup_power2_divisions:[>:2]");
  REQUIRE(c.ok());
  CHECK(c->keys == std::vector<std::string>{"max_split_size_mb", "roundup_power2_divisions"});
  CHECK(c->roundup_power2_divisions_list);
  c = AllocatorConfig::Parse("roundup_power2_divisions:2");
  REQUIRE(c.ok());
  CHECK(!c->roundup_power2_divisions_list);
}

TEST_CASE("torch version: a rank's command line carries it, and run.json records it") {
  RunRequest r = Mlp("1.13");
  REQUIRE(ApplyTorchVersion(r).ok());
  const std::vector<std::string> args = ToArgs(r, "off");
  const auto at = std::find(args.begin(), args.end(), "--torch-version");
  REQUIRE(at != args.end());
  CHECK(*(at + 1) == "1.13");
  const auto zero = std::find(args.begin(), args.end(), "--zero-grad");
  REQUIRE(zero != args.end());
  CHECK(*(zero + 1) == "zeros");
  const auto cublas = std::find(args.begin(), args.end(), "--cublas-workspace");
  REQUIRE(cublas != args.end());
  CHECK(*(cublas + 1) == "off");
  absl::StatusOr<RankPlan> p = MakeRankPlan(r, "off", 1);
  REQUIRE(p.ok());
  const RunRecord record = MakeRecord(r, *p, 1, {}, -1);
  CHECK(record.training.torch_version == "1.13");
  CHECK(record.training.zero_grad == "zeros");
  CHECK(record.training.optimizer_impl == "for-loop");
}

}  // namespace
}  // namespace memscope
