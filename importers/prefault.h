// Prefaulting the pages an array is about to write: one
// madvise(MADV_POPULATE_WRITE) per chunk instead of one page fault per 4 KiB
// page. A snapshot's import and replay write ~100 MB of fresh memory per
// million trace entries (requests, events); each first touch of a page is a
// fault that cost about 2 us of kernel time here, of which the populate
// saves the trap (about 1.2 us a page: `summary` of a 1M-entry snapshot
// 0.389 -> 0.375 s CPU from the events alone). Linux 5.14 and later; where
// the kernel refuses (older kernels, other systems) nothing happens and the
// pages fault in as before. Never changes what the array holds.
#ifndef MEMSCOPE_IMPORTERS_PREFAULT_H_
#define MEMSCOPE_IMPORTERS_PREFAULT_H_

#include <cstddef>
#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace memscope {

// Populates for writing the pages from the one holding `data` up to the last
// whole page of [data, data + bytes) (all of them mapped: the array's own,
// or the one its first byte shares with what precedes it).
inline void PrefaultForWrite(const void* data, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  constexpr std::uintptr_t kPage = 4096;
  const auto begin = reinterpret_cast<std::uintptr_t>(data) & ~(kPage - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes) & ~(kPage - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
#else
  (void)data;
  (void)bytes;
#endif
}

// Keeps the pages just past an array's written end populated, a chunk at a
// time, as the array grows inside its reserved capacity. Call Advance now
// and then (every few thousand elements) with the array's storage.
class PrefaultAhead {
 public:
  static constexpr std::size_t kChunk = std::size_t{1} << 20;  // 1 MiB ahead at most

  void Advance(const void* data, std::size_t capacity_bytes, std::size_t used_bytes) {
    if (data != base_) {  // new storage (or the first call): nothing of it populated by us
      base_ = data;
      done_ = used_bytes;
    }
    if (used_bytes + kChunk / 2 <= done_) return;  // still half a chunk ahead
    const std::size_t from = done_ > used_bytes ? done_ : used_bytes;
    std::size_t to = used_bytes + kChunk;
    if (to > capacity_bytes) to = capacity_bytes;
    if (to <= from) return;
    PrefaultForWrite(static_cast<const char*>(data) + from, to - from);
    done_ = to;
  }

 private:
  const void* base_ = nullptr;
  std::size_t done_ = 0;  // bytes from base_ populated (or written) so far
};

}  // namespace memscope

#endif  // MEMSCOPE_IMPORTERS_PREFAULT_H_
