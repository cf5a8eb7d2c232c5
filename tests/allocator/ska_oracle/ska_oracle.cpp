// The oracle of allocator/ska_map.h: PyTorch's own ska::flat_hash_map keyed
// by c10::Stream (Debian's libtorch-dev headers, libc10), driven by the same
// commands as ska_map_driver (ska_oracle_test.py compiles it at test time).
// Commands on stdin, one per line:
//   i ID     map[stream ID] (insert if absent)
//   w M      walk from begin: erase each stream whose ID % M == 0 (as
//            process_events erases drained queues), print every ID visited
//   c        clear()
//   o        print the IDs in iteration order
#include <c10/core/Stream.h>
#include <c10/util/flat_hash_map.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  const auto device = static_cast<c10::DeviceIndex>(argc > 1 ? std::atoi(argv[1]) : 0);
  ska::flat_hash_map<c10::Stream, int> map;
  const auto stream = [&](std::int64_t id) {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, device), id);
  };
  std::string op;
  while (std::cin >> op) {
    if (op == "i") {
      std::int64_t id = 0;
      std::cin >> id;
      map[stream(id)] += 1;
    } else if (op == "w") {
      std::int64_t m = 1;
      std::cin >> m;
      for (auto it = map.begin(); it != map.end();) {
        std::cout << it->first.id() << ' ';
        it = it->first.id() % m == 0 ? map.erase(it) : std::next(it);
      }
      std::cout << '\n';
    } else if (op == "c") {
      map.clear();
    } else if (op == "o") {
      for (const auto& [s, n] : map) std::cout << s.id() << ' ';
      std::cout << '\n';
    }
  }
}
