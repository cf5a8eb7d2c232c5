// The iteration order of PyTorch's stream maps, modelled exactly.
//
// PyTorch's allocator keeps its pending stream events in
// `ska::flat_hash_map<CUDAStream, std::deque<...>> cuda_events` and a block's
// other streams in `ska::flat_hash_set<CUDAStream> stream_uses`
// (c10/util/flat_hash_map.h: Malte Skarupke's sherwood_v3_table, robin-hood
// probing, fibonacci hashing, max load factor 0.5). process_events and
// synchronize_and_free_events walk that map from its first slot to its last,
// so when several streams' events complete together their blocks are freed
// in slot order, not in stream-number order, and which neighbours merge
// (inactive_split) depends on it. SkaMap keeps the same slots: the same
// hash, the same growth (4 slots first, doubling when an insert would pass
// half full or probe max_lookups slots), the same robin-hood displacement
// and backward-shift erase, and a table that never shrinks (clear and erase
// keep its slots, as PyTorch's map lives as long as its allocator).
//
// A CUDA stream hashes as c10::Stream::hash() (c10/core/Stream.h; pack() in
// 1.x, the same bits): device type CUDA (1) << 56 | device index << 48 | the
// StreamId's low 48 bits; std::hash<uint64_t> is the identity in libstdc++.
// A StreamId is 0 for the default stream and, for the pool streams that
// torch.cuda.Stream() hands out (c10/cuda/CUDAStream.cpp, makeStreamId),
// slot << 5 | (priority index + 1) << 1 | 1: 3, 35, 67, ... at the default
// priority; an external stream's id is its cudaStream_t.
//
//   SkaMap<std::deque<Event>> events(CudaStreamHash(device_index));
//   events[35].push_back(e);                  // operator[]: find or insert
//   for (std::size_t i = events.Begin(); i != events.End();)
//     i = done ? events.Erase(i) : events.Next(i);
#ifndef MEMSCOPE_ALLOCATOR_SKA_MAP_H_
#define MEMSCOPE_ALLOCATOR_SKA_MAP_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "allocator/device.h"

namespace memscope {

// std::hash<c10::cuda::CUDAStream> of stream `id` on CUDA device `device_index`.
struct CudaStreamHash {
  std::uint64_t device_index = 0;
  std::uint64_t operator()(StreamId id) const {
    return (std::uint64_t{1} << 56) | ((device_index & 0xFF) << 48) | (id & ((std::uint64_t{1} << 48) - 1));
  }
};

// PyTorch's StreamId of the `slot`-th stream (0..31) of the pool at priority
// index `priority` (0: the default priority, torch.cuda.Stream()'s).
constexpr StreamId PoolStreamId(unsigned slot, unsigned priority = 0) {
  return (StreamId{slot} << 5) | (StreamId{priority + 1} << 1) | 1;
}

// A map from StreamId to V with ska::flat_hash_map's slots and iteration
// order (fibonacci_hash_policy, max load factor 0.5). Positions are slot
// indices: Begin() .. End(), Next(i), Erase(i).
template <typename V>
class SkaMap {
 public:
  explicit SkaMap(CudaStreamHash hash = {}) : hash_(hash) {
    entries_.resize(kMinLookups);
    ResetEnd();
  }

  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }
  std::size_t bucket_count() const { return slots_minus_one_ == 0 ? 0 : slots_minus_one_ + 1; }

  // The first occupied slot (End() when empty), the next occupied slot after
  // `i`, and the slot past the last: sherwood_v3_table's begin, ++ and end.
  std::size_t Begin() const {
    std::size_t i = 0;
    while (entries_[i].distance < 0) ++i;
    return i;
  }
  std::size_t Next(std::size_t i) const {
    do {
      ++i;
    } while (entries_[i].distance < 0);
    return i;
  }
  std::size_t End() const { return slots_minus_one_ + static_cast<std::size_t>(max_lookups_); }
  StreamId Key(std::size_t i) const { return entries_[i].key; }
  V& Value(std::size_t i) { return entries_[i].value; }

  // flat_hash_map::operator[]: the value of `key`, inserted empty if absent.
  V& operator[](StreamId key) { return entries_[Emplace(key, V{})].value; }

  // erase(iterator) with its backward shift; returns where iteration goes on
  // (the slot itself when a later entry moved into it).
  std::size_t Erase(std::size_t i) {
    entries_[i] = Entry{};
    --size_;
    for (std::size_t cur = i, next = i + 1; entries_[next].distance > 0; ++cur, ++next) {
      entries_[cur] = Entry{static_cast<std::int8_t>(entries_[next].distance - 1), entries_[next].key,
                            std::move(entries_[next].value)};
      entries_[next] = Entry{};
    }
    return entries_[i].distance >= 0 ? i : Next(i);
  }

  // clear(): every entry goes, the slots stay.
  void clear() {
    for (std::size_t i = 0; i < End(); ++i) entries_[i] = Entry{};
    size_ = 0;
  }

 private:
  static constexpr std::int8_t kMinLookups = 4;
  static constexpr std::uint64_t kFibonacci = 11400714819323198485ull;
  struct Entry {
    std::int8_t distance = -1;  // from the desired slot; -1 empty (the end item has 0)
    StreamId key = 0;
    V value{};
  };

  std::size_t IndexFor(StreamId key) const { return static_cast<std::size_t>((kFibonacci * hash_(key)) >> shift_); }
  void ResetEnd() { entries_.back().distance = 0; }  // special_end_value: iteration stops there

  // emplace: the slot of `key`, inserting it with `value` if absent.
  std::size_t Emplace(StreamId key, V value) {
    std::size_t cur = IndexFor(key);
    std::int8_t distance = 0;
    for (; entries_[cur].distance >= distance; ++cur, ++distance) {
      if (entries_[cur].key == key) return cur;
    }
    return EmplaceNew(distance, cur, key, std::move(value));
  }

  std::size_t EmplaceNew(std::int8_t distance, std::size_t cur, StreamId key, V value) {
    if (slots_minus_one_ == 0 || distance == max_lookups_ ||
        static_cast<double>(size_ + 1) > static_cast<double>(slots_minus_one_ + 1) * 0.5) {
      Grow();
      return Emplace(key, std::move(value));
    }
    if (entries_[cur].distance < 0) {
      entries_[cur] = Entry{distance, key, std::move(value)};
      ++size_;
      return cur;
    }
    // Robin hood: the new entry takes this slot; the one it displaced moves on.
    Entry carry{distance, key, std::move(value)};
    std::swap(carry, entries_[cur]);
    const std::size_t result = cur;
    for (++carry.distance, ++cur;; ++cur) {
      if (entries_[cur].distance < 0) {
        entries_[cur] = std::move(carry);
        ++size_;
        return result;
      }
      if (entries_[cur].distance < carry.distance) {
        std::swap(carry, entries_[cur]);
        ++carry.distance;
      } else if (++carry.distance == max_lookups_) {
        // As sherwood_v3_table does: the new key comes back out, the entry
        // it displaced takes its slot, the table grows and the key goes in again.
        std::swap(carry.key, entries_[result].key);
        std::swap(carry.value, entries_[result].value);
        Grow();
        return Emplace(carry.key, std::move(carry.value));
      }
    }
  }

  void Grow() { Rehash(std::max<std::uint64_t>(4, 2 * bucket_count())); }

  void Rehash(std::uint64_t buckets) {
    buckets = std::max(buckets, static_cast<std::uint64_t>(std::ceil(static_cast<double>(size_) / 0.5)));
    buckets = std::max<std::uint64_t>(2, std::bit_ceil(buckets));  // fibonacci_hash_policy::next_size_over
    if (buckets == bucket_count()) return;
    const auto log2 = static_cast<std::int8_t>(std::bit_width(buckets) - 1);
    std::vector<Entry> old(buckets + static_cast<std::size_t>(std::max(kMinLookups, log2)));
    std::swap(old, entries_);
    const std::size_t old_end = End();
    slots_minus_one_ = buckets - 1;
    shift_ = static_cast<std::int8_t>(64 - log2);
    max_lookups_ = std::max(kMinLookups, log2);
    ResetEnd();
    size_ = 0;
    for (std::size_t i = 0; i < old_end; ++i) {
      if (old[i].distance >= 0) Emplace(old[i].key, std::move(old[i].value));
    }
  }

  CudaStreamHash hash_;
  std::vector<Entry> entries_;  // slots_minus_one_ + max_lookups_ + 1; the last is the end item
  std::uint64_t slots_minus_one_ = 0;
  std::int8_t shift_ = 63;
  std::int8_t max_lookups_ = kMinLookups - 1;
  std::size_t size_ = 0;
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_SKA_MAP_H_
