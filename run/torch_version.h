// `memscope run --torch-version X.Y`: the PyTorch release whose behaviours a
// run reproduces, where they changed between releases. Each behaviour below
// names the release and the PyTorch change; docs/run.md has the table, and
// what could not be verified (and so is not modelled per release).
//
//   absl::StatusOr<TorchVersion> v = ParseTorchVersion("1.13");
//   TorchDefaults d = TorchDefaultsOf(*v);  // d.zero_grad == "zeros"
#ifndef MEMSCOPE_RUN_TORCH_VERSION_H_
#define MEMSCOPE_RUN_TORCH_VERSION_H_

#include <compare>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "tensor/autograd.h"

namespace memscope {

struct TorchVersion {
  int major = 2;
  int minor = 9;
  auto operator<=>(const TorchVersion&) const = default;
};

// The releases memscope models: 1.10 to 1.13 and 2.0 to 2.9. 2.9 is the newest, the
// release whose sources memscope follows (CublasHandlePool.cpp,
// CUDAAllocatorConfig.cpp), and the default.
inline constexpr TorchVersion kOldestTorchVersion{1, 10};
inline constexpr TorchVersion kNewestTorchVersion{2, 9};

// "X.Y" within the range. Errors: one line naming the option and the range
// ("--torch-version '3.0': use 1.10 to 1.13 or 2.0 to 2.9 (the PyTorch releases memscope models)").
absl::StatusOr<TorchVersion> ParseTorchVersion(std::string_view text);

// "1.13", "2.9".
std::string TorchVersionText(TorchVersion v);

// What a release does by default.
struct TorchDefaults {
  // Optimizer.zero_grad()'s set_to_none: True since 2.0 (pytorch/pytorch#92731):
  // --zero-grad none; False before: zeros.
  std::string zero_grad = "none";
  // Adam/AdamW on CUDA with foreach and fused unset: foreach since 2.0
  // (pytorch/pytorch#92306, #95862: _default_to_fused_or_foreach); the
  // for-loop before (1.13's adam.py: foreach = False).
  std::string optimizer_impl = "foreach";
  // cuBLAS takes its workspace from the caching allocator (2.0 on:
  // pytorch/pytorch#86167 and #91564, seen by users in #95668); 1.13: cuBLAS
  // allocates it outside the allocator (--cublas-workspace off).
  bool cublas_workspace_in_allocator = true;
  // One cuBLASLt workspace per (handle, stream), kept (pytorch/pytorch#156495,
  // merged June 2025: 2.8 on). Before, each cuBLASLt call took a temporary
  // workspace, which memscope does not model (none is allocated).
  bool cublaslt_persistent_workspace = true;
  // DDP: a given bucket_cap_mb also caps the first bucket (2.x); 1.13 uses
  // 1 MiB first whatever the cap (its distributed.py). The 2.x release that
  // changed it is not verified: every 2.x release gets the newest behaviour.
  bool first_bucket_from_cap = true;
  // The autograd engine and ops (tensor/autograd.h): 1.13's values were
  // measured by the oracle (tests/oracle/); the 2.x release that changed
  // each is not verified: every 2.x release gets the newest values.
  TorchBehaviour behaviour;
};
TorchDefaults TorchDefaultsOf(TorchVersion v);

// PyTorch refuses an allocator setting it does not know; so does a run
// pinned to a release before the one that added it. Checks the keys of
// `config` (and roundup_power2_divisions' list form). Errors name the
// setting and the release: "expandable_segments needs PyTorch 2.1 or later
// (pytorch/pytorch#100184); this run is --torch-version 1.13".
absl::Status CheckAllocatorSettings(const AllocatorConfig& config, TorchVersion v);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_TORCH_VERSION_H_
