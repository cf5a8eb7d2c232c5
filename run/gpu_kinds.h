// GPU kinds for `memscope run --gpu KIND`: each kind's device memory (what
// torch.cuda.get_device_properties().total_memory reports where a published
// figure was found, else as noted), the CUDA context a PyTorch process
// creates on it, and its cuBLAS workspace. The sources and the uncertainty
// of every figure are in run/gpu_kinds.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace memscope {

struct GpuKind {
  std::string_view name;         // --gpu NAME, e.g. "a100-80gb"
  std::string_view product;      // as torch.cuda.get_device_name() says it
  std::uint64_t total_memory;    // bytes: the --device-memory it sets
  std::string_view memory_from;  // what the figure is: "total_memory", "OOM message", "nvidia-smi", "nominal"
  std::uint64_t context_mib;     // the --cuda-context-mb it sets
  bool hopper;                   // sm90: PyTorch's larger cuBLAS workspace (--cublas-workspace hopper)
  int compute_capability;        // x 10 (sm80: 80): SDPA's backend choice
};

// Every kind, in the order `memscope gpus` lists them.
std::span<const GpuKind> GpuKinds();

// The kind named `name`; an unknown name is an error listing the kinds.
absl::StatusOr<GpuKind> FindGpuKind(std::string_view name);

// "v100-16gb, v100-32gb, ...": the names, for messages.
std::string GpuKindNames();

}  // namespace memscope
