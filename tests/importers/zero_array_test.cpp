// ZeroArray (the pickle reader's memo slots): new elements read as zero, the
// old ones keep their values across growth by mremap, and growing to a size
// not above the current one changes nothing.
#include "importers/zero_array.h"

#include <catch2/catch.hpp>
#include <cstdint>

using namespace memscope;

namespace {
struct Slot {
  std::uint64_t a;
  std::uint32_t b;
  std::uint32_t c;
};
}  // namespace

TEST_CASE("zero array: new elements are zero, old ones survive growth") {
  ZeroArray<Slot> z;
  CHECK(z.size() == 0);
  CHECK(z.data() == nullptr);
  z.Grow(3);
  REQUIRE(z.size() == 3);
  CHECK(z.capacity() == 4096 / sizeof(Slot));  // one page
  for (std::size_t i = 0; i < 3; ++i) CHECK((z[i].a == 0 && z[i].b == 0 && z[i].c == 0));
  z[0] = Slot{1, 2, 3};
  z[2] = Slot{~std::uint64_t{0}, 7, 9};
  z.Grow(2);  // not above the size: nothing changes
  CHECK(z.size() == 3);
  // Far past the first page and then past 64 MiB: the mapping moves (or grows) without a copy by us.
  z.Grow(1'000'000);
  CHECK(z.size() == 1'000'000);
  z[999'999] = Slot{5, 6, 7};
  z.Grow(5'000'000);
  CHECK(z.size() == 5'000'000);
  CHECK(z.capacity() == 5'000'192);  // 80,000,000 bytes rounded up to 19,532 pages of 4 KiB
  CHECK((z[0].a == 1 && z[0].b == 2 && z[0].c == 3));
  CHECK(z[1].a == 0);
  CHECK((z[2].a == ~std::uint64_t{0} && z[2].b == 7 && z[2].c == 9));
  CHECK((z[999'999].a == 5 && z[999'999].c == 7));
  CHECK((z[4'999'999].a == 0 && z[4'999'999].b == 0));
  CHECK(z[3'000'000].c == 0);
}
