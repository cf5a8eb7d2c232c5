#include "run/gpu_kinds.h"

#include <array>

#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// One context figure for every kind: about 400 MB per process with CUDA >=
// 11.7's lazy module loading, PyTorch's default (ptrblck,
// https://github.com/pytorch/pytorch/issues/109888). No per-kind measurement
// was found; run/gpu_kinds.md gives the range seen (256 MiB to >1 GiB).
constexpr std::uint64_t kContextMiB = 400;

// Sources of each figure: run/gpu_kinds.md.
constexpr std::array<GpuKind, 9> kKinds = {{
    {"v100-16gb", "Tesla V100-SXM2-16GB", 16160 * kMiB, "OOM message", kContextMiB, false, 70},
    {"v100-32gb", "Tesla V100-SXM2-32GB", 32512 * kMiB, "OOM message", kContextMiB, false, 70},
    {"t4", "Tesla T4", 15843721216, "total_memory", kContextMiB, false, 75},
    {"a10", "NVIDIA A10", 23028 * kMiB, "nvidia-smi", kContextMiB, false, 86},
    {"l4", "NVIDIA L4", 23034 * kMiB, "nvidia-smi", kContextMiB, false, 89},
    {"a100-40gb", "NVIDIA A100-SXM4-40GB", 42298834944, "total_memory", kContextMiB, false, 80},
    {"a100-80gb", "NVIDIA A100-SXM4-80GB", 81152 * kMiB, "OOM message", kContextMiB, false, 80},
    {"h100-80gb", "NVIDIA H100 80GB HBM3", 85520809984, "total_memory", kContextMiB, true, 90},
    {"h200", "NVIDIA H200", std::uint64_t{141} << 30, "nominal", kContextMiB, true, 90},
}};

}  // namespace

std::span<const GpuKind> GpuKinds() { return kKinds; }

std::string GpuKindNames() {
  std::string names;
  for (const GpuKind& k : kKinds) {
    if (!names.empty()) names += ", ";
    names += k.name;
  }
  return names;
}

absl::StatusOr<GpuKind> FindGpuKind(std::string_view name) {
  for (const GpuKind& k : kKinds) {
    if (k.name == name) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("--gpu '", absl::string_view(name.data(), name.size()),
                                                 "': unknown GPU kind; use ", GpuKindNames(),
                                                 " (memscope gpus lists them)"));
}

}  // namespace memscope
