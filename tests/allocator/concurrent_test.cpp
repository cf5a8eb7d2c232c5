// Several threads allocate and free at once through one allocator: the lock
// keeps its state consistent (this test also runs under ThreadSanitizer).
#include <catch2/catch.hpp>
#include <random>
#include <thread>
#include <vector>

#include "test_util.h"

using namespace memscope;
using namespace memscope::testing;

TEST_CASE("concurrent allocations from four threads keep every invariant") {
  for (const char* conf : {"", "expandable_segments:True"}) {
    INFO(conf);
    SimDevice gpu({.capacity = 8192 * MiB});  // 4 threads x 32 live x <17 MiB never fill it
    CachingAllocator a(gpu, Conf(conf));
    constexpr int kThreads = 4;
    constexpr int kOperations = 20000;
    std::vector<std::thread> threads;
    std::vector<int> failures(kThreads, 0);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
        std::vector<DevicePtr> live;
        for (int i = 0; i < kOperations; ++i) {
          if (live.empty() || (live.size() < 32 && rng() % 2 == 0)) {
            const std::size_t size = rng() % 2 ? 1 + rng() % (512 * 1024) : MiB + rng() % (16 * MiB);
            auto p = a.Malloc(size, static_cast<StreamId>(t % 2));
            if (p.ok()) {
              live.push_back(*p);
            } else {
              ++failures[static_cast<std::size_t>(t)];
            }
          } else {
            const std::size_t k = rng() % live.size();
            if (!a.Free(live[k]).ok()) ++failures[static_cast<std::size_t>(t)];
            live[k] = live.back();
            live.pop_back();
          }
          if (i % 5000 == 0) {
            (void)a.GetStats();
            (void)a.Snapshot();
          }
        }
        for (DevicePtr p : live) {
          if (!a.Free(p).ok()) ++failures[static_cast<std::size_t>(t)];
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int f : failures) CHECK(f == 0);
    RequireInvariants(a);
    CHECK(a.memory_allocated() == 0);
    a.EmptyCache();
    CHECK(gpu.used_bytes() == 0);
  }
}
