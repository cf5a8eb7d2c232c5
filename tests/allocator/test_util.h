// Helpers shared by the allocator tests.
#ifndef MEMSCOPE_TESTS_ALLOCATOR_TEST_UTIL_H_
#define MEMSCOPE_TESTS_ALLOCATOR_TEST_UTIL_H_

#include <catch2/catch.hpp>
#include <string>

#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/sim_device.h"

namespace memscope::testing {

inline constexpr std::size_t MiB = 1024 * 1024;

inline AllocatorConfig Conf(const std::string& text) {
  auto c = AllocatorConfig::Parse(text);
  INFO(text);
  REQUIRE(c.ok());
  return *c;
}

inline DevicePtr MustMalloc(CachingAllocator& a, std::size_t size, StreamId stream = 0) {
  auto p = a.Malloc(size, stream);
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  return *p;
}

inline void MustFree(CachingAllocator& a, DevicePtr p) { REQUIRE(a.Free(p).ok()); }

inline void RequireInvariants(const CachingAllocator& a) {
  const absl::Status s = a.CheckInvariants();
  INFO(s.ToString());
  REQUIRE(s.ok());
}

inline constexpr int kAll = 0, kSmall = 1, kLarge = 2;

}  // namespace memscope::testing

#endif  // MEMSCOPE_TESTS_ALLOCATOR_TEST_UTIL_H_
