// Devices and tensors shared by the tensor/ tests.
#ifndef MEMSCOPE_TESTS_TENSOR_TENSOR_TEST_UTIL_H_
#define MEMSCOPE_TESTS_TENSOR_TENSOR_TEST_UTIL_H_

#include <catch2/catch.hpp>

#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"
#include "tensor/tensor.h"

namespace memscope::testing {

inline constexpr std::size_t kMiB = 1024 * 1024;

// A host-backed device whose kernels compute (ExecMode::kCpu).
struct CpuGpu {
  SimDevice gpu{SimDeviceOptions{.capacity = 64 * kMiB, .host_backed = true}};
  CachingAllocator alloc{gpu};
  DeviceContext ctx{alloc, ExecMode::kCpu, &gpu};
};

// A device that only allocates (ExecMode::kMeta).
struct MetaGpu {
  SimDevice gpu{SimDeviceOptions{.capacity = kGiB}};
  CachingAllocator alloc{gpu};
  DeviceContext ctx{alloc, ExecMode::kMeta};
};

// A float32 tensor holding `values` (kCpu).
inline Tensor FromValues(DeviceContext& ctx, const Shape& sizes, const std::vector<float>& values) {
  Tensor t = Tensor::Empty(ctx, sizes);
  REQUIRE(static_cast<std::size_t>(t.numel()) == values.size());
  for (std::size_t i = 0; i < values.size(); ++i) t.data()[i] = values[i];
  return t;
}

}  // namespace memscope::testing

#endif  // MEMSCOPE_TESTS_TENSOR_TENSOR_TEST_UTIL_H_
