// Devices and tensors shared by the tensor/ tests.
#ifndef MEMSCOPE_TESTS_TENSOR_TENSOR_TEST_UTIL_H_
#define MEMSCOPE_TESTS_TENSOR_TENSOR_TEST_UTIL_H_

#include <catch2/catch.hpp>

#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"
#include "run/rank_session.h"
#include "tensor/tensor.h"

namespace memscope::testing {

inline constexpr std::size_t kMiB = 1024 * 1024;

inline RankSessionOptions TestGpu(std::size_t capacity, ExecMode exec) {
  RankSessionOptions o;
  o.device_memory = capacity;
  o.exec = exec;
  return o;
}

// A host-backed device whose kernels compute (ExecMode::kCpu). Its session
// records in memory between session.Start() and session.Finish().
struct CpuGpu {
  RankSession session{TestGpu(64 * kMiB, ExecMode::kCpu)};
  SimDevice& gpu = session.device();
  CachingAllocator& alloc = session.allocator();
  DeviceContext& ctx = session.context();
};

// A device that only allocates (ExecMode::kMeta); records as CpuGpu does.
struct MetaGpu {
  RankSession session{TestGpu(kGiB, ExecMode::kMeta)};
  SimDevice& gpu = session.device();
  CachingAllocator& alloc = session.allocator();
  DeviceContext& ctx = session.context();
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
