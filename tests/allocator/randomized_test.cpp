// 100k+ random operations per setting on several streams, with the
// allocator's invariants checked after every one: blocks tile their
// segments, pools hold exactly the free blocks, and every stat equals a
// brute-force recount. The device is small, so OOMs and retries happen.
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <unordered_map>
#include <vector>

#include "allocator/address_map.h"
#include "allocator/free_block_set.h"
#include "test_util.h"

using namespace memscope;
using namespace memscope::testing;

namespace {

struct Live {
  DevicePtr ptr;
  std::size_t size;
};

void RunRandomized(const std::string& conf, std::uint64_t seed, int operations, std::size_t capacity, double fraction) {
  INFO("alloc_conf " << conf << ", seed " << seed);
  SimDevice gpu({.capacity = capacity});
  CachingAllocator a(gpu, Conf(conf));
  if (fraction > 0) REQUIRE(a.SetMemoryFraction(fraction).ok());
  std::mt19937_64 rng(seed);
  std::vector<Live> live;
  std::size_t live_requested = 0;
  std::size_t peak_live = 0;
  int ooms = 0;
  auto pick_size = [&]() -> std::size_t {
    switch (rng() % 4) {
      case 0: return 1 + rng() % 4096;                // tiny
      case 1: return 4096 + rng() % (1024 * 1024);    // small pool
      case 2: return MiB + rng() % (9 * MiB);         // large, below 10 MiB
      default: return 10 * MiB + rng() % (40 * MiB);  // large
    }
  };
  for (int i = 0; i < operations; ++i) {
    const unsigned op = rng() % 100;
    if (op < 48 || live.empty()) {
      const std::size_t size = pick_size();
      const StreamId stream = rng() % 3;
      auto p = a.Malloc(size, stream);
      if (p.ok()) {
        live.push_back({*p, size});
        live_requested += size;
        peak_live = std::max(peak_live, live_requested);
        if (rng() % 10 == 0) REQUIRE(a.RecordStream(*p, 3 + rng() % 2).ok());
      } else {
        REQUIRE(absl::IsResourceExhausted(p.status()));
        ++ooms;
      }
    } else if (op < 96) {
      const std::size_t k = rng() % live.size();
      MustFree(a, live[k].ptr);
      live_requested -= live[k].size;
      live[k] = live.back();
      live.pop_back();
    } else if (op < 98) {
      gpu.CompleteStream(3 + rng() % 2);
    } else if (op < 99) {
      gpu.CompleteAll();
    } else {
      a.EmptyCache();
    }
    const absl::Status s = a.CheckInvariants();
    if (!s.ok()) {
      INFO("after operation " << i << ": " << s.ToString());
      REQUIRE(s.ok());
    }
    // What the allocator holds is exactly what the device has handed out.
    REQUIRE(a.memory_reserved() == gpu.used_bytes());
    REQUIRE(static_cast<std::size_t>(a.GetStats().requested_bytes[kAll].current) >= live_requested);
  }
  for (const Live& l : live) MustFree(a, l.ptr);
  gpu.CompleteAll();
  a.EmptyCache();
  RequireInvariants(a);
  CHECK(a.memory_allocated() == 0);
  CHECK(a.memory_reserved() == 0);
  CHECK(gpu.used_bytes() == 0);
  CHECK(a.GetStats().num_ooms == ooms);
  CHECK(a.max_memory_allocated() >= peak_live);
}

}  // namespace

TEST_CASE("randomized: default settings", "[randomized]") { RunRandomized("", 1, 100000, 512 * MiB, 0); }

TEST_CASE("randomized: max_split_size_mb", "[randomized]") {
  RunRandomized("max_split_size_mb:24", 2, 100000, 512 * MiB, 0);
}

TEST_CASE("randomized: expandable segments", "[randomized]") {
  RunRandomized("expandable_segments:True", 3, 100000, 512 * MiB, 0);
}

TEST_CASE("randomized: roundup_power2_divisions and max_non_split_rounding", "[randomized]") {
  RunRandomized("roundup_power2_divisions:[1:2,8:4,>:8],max_split_size_mb:32,max_non_split_rounding_mb:40", 4, 100000,
                512 * MiB, 0);
}

TEST_CASE("randomized: garbage collection under a memory fraction", "[randomized]") {
  RunRandomized("garbage_collection_threshold:0.6", 5, 100000, 1024 * MiB, 0.5);
}

// The pools' container against std::map (PyTorch's pools are a std::set in
// the same order): the same entries, the same order, the same lower_bound,
// through inserts, erases and replacements, chunk splits and merges, at sizes from one chunk to hundreds.
TEST_CASE("randomized: FreeBlockSet orders like std::map", "[randomized]") {
  struct Less {
    bool operator()(const FreeKey& a, const FreeKey& b) const { return a < b; }
  };
  for (const std::uint64_t addresses : {8, 100, 1000, 20000}) {
    INFO("addresses " << addresses);
    std::mt19937_64 rng(addresses);
    FreeBlockSet<std::uint64_t> set;
    std::map<FreeKey, std::uint64_t, Less> oracle;
    for (int op = 0; op < 100000; ++op) {
      const FreeKey key{512 * (rng() % 64), 4096 * (rng() % addresses)};
      const unsigned kind = rng() % 10;
      if (kind < 5) {
        if (oracle.emplace(key, key.ptr + 1).second) set.Insert(key, key.ptr + 1);
      } else if (kind < 7) {
        REQUIRE(set.Erase(key) == (oracle.erase(key) == 1));
      } else if (kind < 8) {
        // Replace the entry at or after `key` by one with another key.
        const FreeKey other{512 * (rng() % 64), 4096 * (rng() % addresses)};
        auto at = oracle.lower_bound(key);
        if (at != oracle.end() && oracle.count(other) == 0) {
          set.Replace(set.LowerBound(key), other, other.ptr + 2);
          oracle.erase(at);
          oracle.emplace(other, other.ptr + 2);
          REQUIRE(set.Find(other)->value == other.ptr + 2);
        }
      } else {
        auto expected = oracle.lower_bound(key);
        auto actual = set.LowerBound(key);
        REQUIRE(set.LowerBoundSize(key.size) == set.LowerBound(FreeKey{key.size, 0}));
        REQUIRE((actual == set.end()) == (expected == oracle.end()));
        if (expected != oracle.end()) {
          REQUIRE(actual->key == expected->first);
          REQUIRE(actual->value == expected->second);
          if (expected != oracle.begin()) REQUIRE((--actual)->key == (--expected)->first);
        }
      }
      REQUIRE(set.size() == oracle.size());
      if (op % 997 == 0) {
        auto expected = oracle.begin();
        for (const auto& entry : set) {
          REQUIRE(expected != oracle.end());
          REQUIRE(entry.key == expected->first);
          ++expected;
        }
        REQUIRE(expected == oracle.end());
      }
    }
  }
}

// The allocated-block map against std::unordered_map: inserts, lookups and
// erases (backward shift) of 512-aligned addresses, through rehashes.
TEST_CASE("randomized: AddressMap finds what std::unordered_map finds", "[randomized]") {
  for (const std::uint64_t addresses : {16, 1000, 100000}) {
    INFO("addresses " << addresses);
    std::mt19937_64 rng(addresses);
    std::vector<int> values(addresses);
    AddressMap<int> map;
    std::unordered_map<std::uint64_t, int*> oracle;
    for (int op = 0; op < 200000; ++op) {
      const std::uint64_t index = rng() % addresses;
      const std::uint64_t key = 0x7f0000000000ULL + 512 * index;
      switch (rng() % 3) {
        case 0:
          if (oracle.emplace(key, &values[index]).second) map.Insert(key, &values[index]);
          break;
        case 1: {
          auto it = oracle.find(key);
          REQUIRE(map.Erase(key) == (it == oracle.end() ? nullptr : it->second));
          if (it != oracle.end()) oracle.erase(it);
          break;
        }
        default: {
          auto it = oracle.find(key);
          REQUIRE(map.Find(key) == (it == oracle.end() ? nullptr : it->second));
        }
      }
      REQUIRE(map.size() == oracle.size());
    }
    std::size_t seen = 0;
    map.ForEach([&](std::uint64_t key, int* value) {
      REQUIRE(oracle.at(key) == value);
      ++seen;
    });
    REQUIRE(seen == oracle.size());
  }
}
