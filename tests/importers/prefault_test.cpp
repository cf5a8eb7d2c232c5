// PrefaultForWrite / PrefaultAhead (importers/prefault.h): which pages of a
// fresh anonymous mapping they make resident, read back with mincore(2).
// They are hints: on a kernel without MADV_POPULATE_WRITE (before Linux
// 5.14) nothing is populated, and the tests say so instead of checking.
#include "importers/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstring>
#include <vector>

using namespace memscope;

namespace {

constexpr std::size_t kPage = 4096;

// A fresh private anonymous mapping: no page resident until touched.
struct Mapping {
  explicit Mapping(std::size_t n) : bytes(n) {
    data = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~Mapping() {
    if (data != MAP_FAILED) munmap(data, bytes);
  }
  // How many of its pages are resident, and whether page i is.
  std::vector<unsigned char> Residency() const {
    std::vector<unsigned char> v(bytes / kPage);
    REQUIRE(mincore(data, bytes, v.data()) == 0);
    return v;
  }
  std::size_t Resident() const {
    std::size_t n = 0;
    for (unsigned char c : Residency()) n += c & 1;
    return n;
  }
  char* data;
  std::size_t bytes;
};

bool KernelPopulates() {
  if (sysconf(_SC_PAGESIZE) != static_cast<long>(kPage)) return false;
  Mapping m(kPage);
  return madvise(m.data, kPage, MADV_POPULATE_WRITE) == 0;
}

}  // namespace

TEST_CASE("prefault: the whole pages of a range, from the page of its first byte") {
  if (!KernelPopulates()) {
    WARN("this kernel has no MADV_POPULATE_WRITE (or pages are not 4 KiB): PrefaultForWrite does nothing here");
    return;
  }
  Mapping m(16 * kPage);
  REQUIRE(m.data != MAP_FAILED);
  CHECK(m.Resident() == 0);
  // From the middle of page 1 up to the middle of page 5: pages 1 to 4 (page 5 is not whole).
  PrefaultForWrite(m.data + kPage + 100, 4 * kPage);
  const std::vector<unsigned char> r = m.Residency();
  for (std::size_t i = 0; i < r.size(); ++i) {
    INFO("page " << i);
    CHECK((r[i] & 1) == (i >= 1 && i <= 4 ? 1 : 0));
  }
  // Less than a page past its first byte's page: nothing more.
  PrefaultForWrite(m.data + 10 * kPage, kPage - 1);
  CHECK(m.Resident() == 4);
  // The contents are untouched: zeros.
  for (std::size_t i = 0; i < 16 * kPage; ++i) REQUIRE(m.data[i] == 0);
}

TEST_CASE("prefault ahead: a chunk past the written end, again when half of it is used") {
  if (!KernelPopulates()) {
    WARN("this kernel has no MADV_POPULATE_WRITE (or pages are not 4 KiB): PrefaultAhead does nothing here");
    return;
  }
  constexpr std::size_t kChunkPages = PrefaultAhead::kChunk / kPage;  // 256
  Mapping m(4 * PrefaultAhead::kChunk);
  REQUIRE(m.data != MAP_FAILED);
  PrefaultAhead ahead;
  ahead.Advance(m.data, m.bytes, 0);
  CHECK(m.Resident() == kChunkPages);  // [0, 1 MiB)
  // Still half a chunk or more populated past the written end: nothing new.
  ahead.Advance(m.data, m.bytes, PrefaultAhead::kChunk / 2);
  CHECK(m.Resident() == kChunkPages);
  // Less than half a chunk: up to a chunk past the end, [0, 1.5 MiB + 4 KiB).
  ahead.Advance(m.data, m.bytes, PrefaultAhead::kChunk / 2 + kPage);
  CHECK(m.Resident() == kChunkPages + kChunkPages / 2 + 1);
  // Written past what was populated (2 MiB), near the end of a capacity of
  // 2 MiB + 5 pages: the 5 pages after the end, never past the capacity.
  ahead.Advance(m.data, 2 * PrefaultAhead::kChunk + 5 * kPage, 2 * PrefaultAhead::kChunk);
  CHECK(m.Resident() == kChunkPages + kChunkPages / 2 + 1 + 5);
  const std::vector<unsigned char> r = m.Residency();
  CHECK((r[2 * kChunkPages - 1] & 1) == 0);  // written by the array itself, not by us
  CHECK((r[2 * kChunkPages] & 1) == 1);
  CHECK((r[2 * kChunkPages + 4] & 1) == 1);
  CHECK((r[2 * kChunkPages + 5] & 1) == 0);
}

TEST_CASE("prefault ahead: new storage starts over from its written end") {
  if (!KernelPopulates()) {
    WARN("this kernel has no MADV_POPULATE_WRITE (or pages are not 4 KiB): PrefaultAhead does nothing here");
    return;
  }
  constexpr std::size_t kChunkPages = PrefaultAhead::kChunk / kPage;
  Mapping a(2 * PrefaultAhead::kChunk), b(4 * PrefaultAhead::kChunk);
  REQUIRE((a.data != MAP_FAILED && b.data != MAP_FAILED));
  PrefaultAhead ahead;
  ahead.Advance(a.data, a.bytes, 0);
  CHECK(a.Resident() == kChunkPages);
  // The array moved (a vector that grew): the new storage from its used end on.
  ahead.Advance(b.data, b.bytes, 2 * PrefaultAhead::kChunk);
  CHECK(b.Resident() == kChunkPages);
  const std::vector<unsigned char> r = b.Residency();
  CHECK((r[2 * kChunkPages - 1] & 1) == 0);  // what it had written is not ours to touch (it already is)
  CHECK((r[2 * kChunkPages] & 1) == 1);
  CHECK((r[3 * kChunkPages - 1] & 1) == 1);
  CHECK((r[3 * kChunkPages] & 1) == 0);
}
