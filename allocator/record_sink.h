// A recording written straight from the allocator's hot path: the two
// records of the timeline file that nearly every alloc/free pair makes (the
// compact alloc and the lean free of recording/timeline.h, which owns the
// format and documents it), encoded inline where the allocator has the
// block in hand, without building a TraceEvent or making a virtual call.
//
// A RecordSink is the state of a timeline writer (its buffer cursor, the
// "previous event", the alloc slots) that those two records read and move.
// The writer (recording/timeline.h) owns it and writes every other record
// with the same state; the Recorder (recording/recorder.h) hands it to the
// allocator through AllocatorObserver::record_sink() and grants it a
// `budget`: how many records the allocator may write on its own before the
// Recorder must see an event again (to read its sampled clock, or because
// the buffer is nearly full). A record the fast path cannot write (budget
// spent, a new tag, another stream, an escape of the compact form, a slot
// taken by another alloc) goes the ordinary way: the observer's OnEvent or
// OnFreeAtOnce.
//
// Not thread-safe: called with the allocator lock held, like the observer.
#ifndef MEMSCOPE_ALLOCATOR_RECORD_SINK_H_
#define MEMSCOPE_ALLOCATOR_RECORD_SINK_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "allocator/alloc_tag.h"

namespace memscope {

struct RecordSink {
  static constexpr unsigned kSlotBits = 12;
  static constexpr unsigned kLeanFree = 0x80;      // tag 1tss ssss
  static constexpr unsigned kFoldedFree = 0x40;    // ...with its free_completed folded in
  static constexpr unsigned kCompactAlloc = 0x40;  // tag 01sc cccc
  static constexpr std::size_t kMaxFastBytes = 16;  // a compact alloc (12) and a 4-byte store's slack
  static constexpr std::uint64_t kNoGeneration = ~std::uint64_t{0};

  static std::size_t SlotOf(std::uint64_t addr) {
    return static_cast<std::size_t>((addr * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits));
  }

  char* cur = nullptr;  // where the next record goes (the owner keeps room for `budget` fast records)
  long budget = 0;      // fast records the allocator may still write
  // The tag generation (alloc_tag.h) whose owner is the last alloc's owner:
  // an alloc under it can be compact (kNoGeneration: none).
  std::uint64_t fast_generation = kNoGeneration;
  // The previous event (timeline.h). The fast records keep its time.
  std::uint64_t prev_time = 0, prev_addr = 0, prev_size = 0, prev_stream = 0, prev_name = 0;
  std::uint64_t last_alloc_name = 0;  // the owner of the last alloc
  std::uint64_t seq = 0;              // the record id of the last alloc written (unique in the process)
  // The 4096 alloc slots (timeline.h): the record id of the last alloc
  // written whose address hashes to each (kNoRecord: none yet). A block
  // whose alloc's id is still there is what the reader's slot holds.
  std::uint64_t* slot_seq = nullptr;
  static constexpr std::uint64_t kNoRecord = ~std::uint64_t{0};
  // Called when the budget is spent and a fast record could be written: the
  // owner may grant a new budget (reading its clock and writing a time
  // record first). Returns whether it did.
  bool (*refill)(RecordSink& sink) = nullptr;
  void* owner = nullptr;  // (refill's)

  // The bytes of the two hot records (timeline.h), at `p`; each returns the
  // record's end. Both the fast path below and the TimelineWriter write them
  // through these, so that the format has one encoder.
  //
  // A compact alloc: `d_units` (addr - previous addr) / 512, which must fit
  // an int32; size / 512 below 2^32; `slack` (size - requested) below 2^24;
  // `category` below 16. Writes 13 bytes: the 13th is slack, overwritten by
  // the next record (the caller keeps room for it).
  [[gnu::always_inline]] static char* PutCompactAlloc(char* p, unsigned small, unsigned category,
                                                      std::int64_t d_units, std::uint64_t size, std::uint64_t slack) {
    p[0] = static_cast<char>(kCompactAlloc | small << 4 | category);
    const std::uint64_t word = (static_cast<std::uint64_t>(d_units) & 0xffffffffu) | (size >> 9) << 32;
    std::memcpy(p + 1, &word, 8);
    const auto slack32 = static_cast<std::uint32_t>(slack);
    std::memcpy(p + 9, &slack32, 4);  // 3 bytes; the 4th is the next record's
    return p + 12;
  }
  // A lean free of slot `s` (below 2^12), tag bits `bits` (kLeanFree, and
  // kFoldedFree when its free_completed is folded in): 2 bytes.
  [[gnu::always_inline]] static char* PutLeanFree(char* p, std::size_t s, unsigned bits) {
    // Bytes (bits | s >> 8, s & 255): s's two bytes swapped, tag bits set.
    const auto tag = static_cast<std::uint16_t>(std::rotl(static_cast<std::uint16_t>(s), 8) | bits);
    std::memcpy(p, &tag, 2);
    return p + 2;
  }

  [[gnu::cold]] [[gnu::noinline]] bool Refill() { return refill != nullptr && refill(*this); }

  // An alloc as a compact record, if it can be one; returns whether it was
  // written (its record id is then `seq`).
  [[gnu::always_inline]] bool TryAlloc(std::uint64_t addr, std::uint64_t size, std::uint64_t requested,
                                       std::uint64_t stream, unsigned small) {
    const AllocTag& tag = internal::current_alloc_tag;
    const std::uint64_t d_addr = addr - prev_addr;
    const std::uint64_t slack = size - requested;  // wraps above the limit when requested > size
    const auto d_units = static_cast<std::int64_t>(d_addr) >> 9;
    // (A Category has 10 values: 4 bits; the general record has no more.)
    const auto category = static_cast<unsigned>(tag.category) & 15;
    // The compact form's limits in one test: addr and size multiples of
    // 512, the delta within +-2^40 (2^31 units: d_addr + 2^40 below 2^41),
    // the size below 2^41, a slack below 2^24 (and requested <= size).
    constexpr std::uint64_t kMask = ~((std::uint64_t{1} << 41) - 1) | 511;
    const std::uint64_t escapes = (((d_addr + (std::uint64_t{1} << 40)) | size) & kMask) | (slack >> 24);
    if (tag.generation != fast_generation || stream != prev_stream || escapes != 0 || (budget <= 0 && !Refill())) {
      return false;
    }
    cur = PutCompactAlloc(cur, small, category, d_units, size, slack);
    --budget;
    prev_addr = addr;
    prev_size = size;
    prev_name = last_alloc_name;
    slot_seq[SlotOf(addr)] = ++seq;
    return true;
  }

  // A free that completes at once, as a lean free with its free_completed
  // folded in, if the block's alloc (record id `record_id`) still holds its
  // slot; returns whether it was written.
  [[gnu::always_inline]] bool TryFreeAtOnce(std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                                            std::uint64_t record_id) {
    const std::size_t s = SlotOf(addr);
    if (slot_seq[s] != record_id || (budget <= 0 && !Refill())) return false;
    cur = PutLeanFree(cur, s, kLeanFree | kFoldedFree);
    --budget;
    prev_addr = addr;
    prev_size = size;
    prev_stream = stream;
    prev_name = 0;
    return true;
  }
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_RECORD_SINK_H_
