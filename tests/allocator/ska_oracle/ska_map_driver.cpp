// memscope's side of ska_oracle_test.py: allocator/ska_map.h driven by the
// commands ska_oracle.cpp reads (see there), printing the same lines.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "allocator/ska_map.h"

int main(int argc, char** argv) {
  const auto device = static_cast<std::uint64_t>(argc > 1 ? std::atoi(argv[1]) : 0);
  memscope::SkaMap<int> map(memscope::CudaStreamHash{device});
  std::string op;
  while (std::cin >> op) {
    if (op == "i") {
      std::int64_t id = 0;
      std::cin >> id;
      map[static_cast<memscope::StreamId>(id)] += 1;
    } else if (op == "w") {
      std::int64_t m = 1;
      std::cin >> m;
      for (std::size_t i = map.Begin(); i != map.End();) {
        const auto id = static_cast<std::int64_t>(map.Key(i));
        std::cout << id << ' ';
        i = id % m == 0 ? map.Erase(i) : map.Next(i);
      }
      std::cout << '\n';
    } else if (op == "c") {
      map.clear();
    } else if (op == "o") {
      for (std::size_t i = map.Begin(); i != map.End(); i = map.Next(i)) {
        std::cout << static_cast<std::int64_t>(map.Key(i)) << ' ';
      }
      std::cout << '\n';
    }
  }
}
