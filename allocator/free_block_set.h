// The free blocks of one stream of one pool, ordered by (size, address): the
// order in which PyTorch's BlockPool (a std::set with BlockComparatorSize)
// finds the best fit. A chunked sorted array: chunks of at most kChunk
// entries, each a sorted array of {size, address, value}, and beside them the
// last key of every chunk. A search reads the chunk keys (one or two cache
// lines for the pools of a training job, which hold tens to a few hundred
// blocks) and then one chunk; an insert or an erase moves at most kChunk
// entries. Pools with many thousands of blocks stay O(n / kChunk + kChunk)
// per change.
#ifndef MEMSCOPE_ALLOCATOR_FREE_BLOCK_SET_H_
#define MEMSCOPE_ALLOCATOR_FREE_BLOCK_SET_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <type_traits>
#include <vector>

namespace memscope {

// Best-fit order: size, then address.
struct FreeKey {
  std::uint64_t size = 0;
  std::uint64_t ptr = 0;
  bool operator==(const FreeKey&) const = default;
};
// One 128-bit comparison (cmp + sbb on x86-64), branch-free: a binary
// search over keys mispredicts less.
__extension__ using FreeKeyBits = unsigned __int128;
inline FreeKeyBits Bits(const FreeKey& k) { return static_cast<FreeKeyBits>(k.size) << 64 | k.ptr; }
inline bool operator<(const FreeKey& a, const FreeKey& b) { return Bits(a) < Bits(b); }

template <typename T>
class FreeBlockSet {
  static_assert(std::is_trivially_copyable_v<T>, "entries are moved with memmove");

 public:
  struct Entry {
    FreeKey key;
    T value;
  };
  static constexpr std::uint32_t kChunk = 32;

  // A position: chunk index and index inside it; end() is {chunks, 0}.
  class Iterator {
   public:
    using iterator_category = std::bidirectional_iterator_tag;
    using value_type = Entry;
    using difference_type = std::ptrdiff_t;
    using pointer = const Entry*;
    using reference = const Entry&;

    Iterator() = default;
    const Entry& operator*() const { return set_->chunks_[c_]->entries[i_]; }
    const Entry* operator->() const { return &**this; }
    Iterator& operator++() {
      if (++i_ == set_->chunks_[c_]->size) {
        ++c_;
        i_ = 0;
      }
      return *this;
    }
    Iterator& operator--() {
      if (i_ == 0) {
        --c_;
        i_ = set_->chunks_[c_]->size;
      }
      --i_;
      return *this;
    }
    Iterator operator++(int) {
      Iterator old = *this;
      ++*this;
      return old;
    }
    bool operator==(const Iterator& o) const { return c_ == o.c_ && i_ == o.i_; }
    // Where the entry is now: a hint for FindNear after later changes.
    std::uint32_t chunk() const { return static_cast<std::uint32_t>(c_); }
    std::uint32_t index() const { return i_; }

   private:
    friend class FreeBlockSet;
    Iterator(const FreeBlockSet* set, std::size_t c, std::uint32_t i) : set_(set), c_(c), i_(i) {}
    const FreeBlockSet* set_ = nullptr;
    std::size_t c_ = 0;
    std::uint32_t i_ = 0;
  };

  FreeBlockSet() = default;
  FreeBlockSet(const FreeBlockSet&) = delete;
  FreeBlockSet& operator=(const FreeBlockSet&) = delete;

  Iterator begin() const { return Iterator(this, 0, 0); }
  Iterator end() const { return Iterator(this, chunks_.size(), 0); }
  bool empty() const { return chunks_.empty(); }
  std::size_t size() const { return size_; }

  // The first entry whose key is not less than `key`.
  Iterator LowerBound(const FreeKey& key) const {
    const std::size_t c = ChunkFor(key);
    if (c == chunks_.size()) return end();
    const Chunk& chunk = *chunks_[c];
    return Iterator(this, c, LowerBoundIn(chunk.entries, chunk.size, key));
  }

  // LowerBound({size, 0}): the best fit for `size`, the smallest entry of
  // at least that size (lowest address first). Compares sizes only.
  Iterator LowerBoundSize(std::uint64_t size) const {
    const std::size_t c = ChunkFor(FreeKey{size, 0});
    if (c == chunks_.size()) return end();
    const Chunk& chunk = *chunks_[c];
    const Entry* first = chunk.entries;
    std::uint32_t count = chunk.size;
    while (count > 1) {
      const std::uint32_t half = count / 2;
      first = first[half - 1].key.size < size ? first + half : first;
      count -= half;
    }
    if (count == 1 && first->key.size < size) ++first;
    return Iterator(this, c, static_cast<std::uint32_t>(first - chunk.entries));
  }

  // The entry with `key`, or end(). Tries first where the last Replace put
  // its entry: a block split off at allocation is often the one merged
  // back at free.
  Iterator Find(const FreeKey& key) const {
    if (hint_c_ < chunks_.size() && hint_i_ < chunks_[hint_c_]->size && chunks_[hint_c_]->entries[hint_i_].key == key) {
      return Iterator(this, hint_c_, hint_i_);
    }
    Iterator it = LowerBound(key);
    return it != end() && it->key == key ? it : end();
  }

  // Find, trying first where the entry was (Iterator::chunk() and index()
  // when it was inserted) and the places next to it (one insert or erase
  // before it in its chunk since).
  Iterator FindNear(const FreeKey& key, std::uint32_t chunk, std::uint32_t index) const {
    if (chunk < chunks_.size()) {
      const Chunk& ch = *chunks_[chunk];
      if (index < ch.size && ch.entries[index].key == key) return Iterator(this, chunk, index);
      if (index + 1 < ch.size && ch.entries[index + 1].key == key) return Iterator(this, chunk, index + 1);
      if (index > 0 && index - 1 < ch.size && ch.entries[index - 1].key == key) return Iterator(this, chunk, index - 1);
    }
    return Find(key);
  }

  // Inserts `key` (not already present) with `value`; returns where.
  Iterator Insert(const FreeKey& key, T value) {
    ++size_;
    if (chunks_.empty()) {
      chunks_.push_back(NewChunk());
      lasts_.push_back(key);
      chunks_[0]->entries[0] = Entry{key, value};
      chunks_[0]->size = 1;
      return begin();
    }
    std::size_t c = ChunkFor(key);
    if (c == chunks_.size()) c = chunks_.size() - 1;  // above every key: append to the last chunk
    if (chunks_[c]->size == kChunk) {
      Split(c);
      if (lasts_[c] < key) ++c;
    }
    Chunk& chunk = *chunks_[c];
    const std::uint32_t i = LowerBoundIn(chunk.entries, chunk.size, key);
    std::memmove(&chunk.entries[i + 1], &chunk.entries[i], (chunk.size - i) * sizeof(Entry));
    chunk.entries[i] = Entry{key, value};
    ++chunk.size;
    if (i + 1 == chunk.size) lasts_[c] = key;
    return Iterator(this, c, i);
  }

  // Erases the entry at `it`; other iterators are invalidated.
  void Erase(Iterator it) {
    --size_;
    const std::size_t c = it.c_;
    Chunk& chunk = *chunks_[c];
    const std::uint32_t i = it.i_;
    std::memmove(&chunk.entries[i], &chunk.entries[i + 1], (chunk.size - i - 1) * sizeof(Entry));
    --chunk.size;
    if (chunk.size == 0) {
      RemoveChunk(c);
      return;
    }
    if (i == chunk.size) lasts_[c] = chunk.entries[i - 1].key;
    // Keep chunks at least a quarter full, so that the chunk keys stay few.
    if (chunk.size < kChunk / 4) {
      if (c + 1 < chunks_.size() && chunk.size + chunks_[c + 1]->size <= kChunk / 2) {
        MergeNext(c);
      } else if (c > 0 && chunk.size + chunks_[c - 1]->size <= kChunk / 2) {
        MergeNext(c - 1);
      }
    }
  }

  // Replaces the entry at `it` by (`key`, `value`), `key` not already
  // present: an erase and an insert in one move of the entries between the
  // old and the new position when both are in the same chunk (as when a
  // block is split or merged: its key changes, its neighbours do not).
  [[gnu::always_inline]] Iterator Replace(Iterator it, const FreeKey& key, T value) {
    const std::size_t c = it.c_;
    Chunk& chunk = *chunks_[c];
    Entry* e = chunk.entries;
    const std::uint32_t i = it.i_;
    // The new place is usually a few entries away: look at the next few
    // before searching the rest of the chunk.
    constexpr std::uint32_t kNear = 4;
    if (key < e[i].key) {
      if (c == 0 || lasts_[c - 1] < key) {
        std::uint32_t j = i;
        while (j > 0 && i - j < kNear && key < e[j - 1].key) --j;
        if (j > 0 && i - j == kNear) j = LowerBoundIn(e, j, key);
        Move(&e[j + 1], &e[j], i - j);
        e[j] = Entry{key, value};
        if (i + 1 == chunk.size) lasts_[c] = e[i].key;
        hint_c_ = c;
        hint_i_ = j;
        return Iterator(this, c, j);
      }
    } else if (c + 1 == chunks_.size() || key < chunks_[c + 1]->entries[0].key) {
      std::uint32_t j = i + 1;  // the first entry not less than key, in (i, size]
      while (j < chunk.size && j - i <= kNear && e[j].key < key) ++j;
      if (j < chunk.size && j - i > kNear) j += LowerBoundIn(e + j, chunk.size - j, key);
      Move(&e[i], &e[i + 1], j - i - 1);
      e[j - 1] = Entry{key, value};
      if (j == chunk.size) lasts_[c] = key;
      hint_c_ = c;
      hint_i_ = j - 1;
      return Iterator(this, c, j - 1);
    }
    return ReplaceFar(it, key, value);
  }
  // Replace when the new place is in another chunk.
  Iterator ReplaceFar(Iterator it, const FreeKey& key, T value) {
    Erase(it);
    return Insert(key, value);
  }

  // Erases `key` if present; returns whether it was.
  bool Erase(const FreeKey& key) {
    Iterator it = Find(key);
    if (it == end()) return false;
    Erase(it);
    return true;
  }

 private:
  struct Chunk {
    std::uint32_t size = 0;
    Entry entries[kChunk];
  };

  // The first chunk whose last key is not less than `key`; chunks_.size() if none.
  std::size_t ChunkFor(const FreeKey& key) const {
    std::size_t n = lasts_.size();
    if (n <= 4) {  // up to ~100 blocks: a scan beats a search
      std::size_t c = 0;
      while (c < n && lasts_[c] < key) ++c;
      return c;
    }
    std::size_t lo = 0;
    while (n > 0) {
      const std::size_t half = n / 2;
      if (lasts_[lo + half] < key) {
        lo += half + 1;
        n -= half + 1;
      } else {
        n = half;
      }
    }
    return lo;
  }

  // memmove of n entries; a few are copied inline (a split or a merge
  // usually moves its entry by a few places).
  static void Move(Entry* dst, const Entry* src, std::uint32_t n) {
    if (n > 4) {
      std::memmove(dst, src, n * sizeof(Entry));
    } else if (dst < src) {
      for (std::uint32_t k = 0; k < n; ++k) dst[k] = src[k];
    } else {
      for (std::uint32_t k = n; k-- > 0;) dst[k] = src[k];
    }
  }

  // The index of the first of entries[0, n) not less than `key`.
  [[gnu::always_inline]] static std::uint32_t LowerBoundIn(const Entry* entries, std::uint32_t n, const FreeKey& key) {
    const Entry* first = entries;
    while (n > 1) {
      const std::uint32_t half = n / 2;
      first = first[half - 1].key < key ? first + half : first;
      n -= half;
    }
    if (n == 1 && first->key < key) ++first;
    return static_cast<std::uint32_t>(first - entries);
  }

  std::unique_ptr<Chunk> NewChunk() {
    if (spare_ != nullptr) return std::move(spare_);
    return std::make_unique<Chunk>();
  }

  void RemoveChunk(std::size_t c) {
    spare_ = std::move(chunks_[c]);
    spare_->size = 0;
    chunks_.erase(chunks_.begin() + static_cast<std::ptrdiff_t>(c));
    lasts_.erase(lasts_.begin() + static_cast<std::ptrdiff_t>(c));
  }

  // Moves the upper half of full chunk c into a new chunk after it.
  void Split(std::size_t c) {
    std::unique_ptr<Chunk> upper = NewChunk();
    Chunk& lower = *chunks_[c];
    const std::uint32_t keep = kChunk / 2;
    upper->size = lower.size - keep;
    std::memcpy(upper->entries, &lower.entries[keep], upper->size * sizeof(Entry));
    lower.size = keep;
    const FreeKey upper_last = lasts_[c];
    lasts_[c] = lower.entries[keep - 1].key;
    chunks_.insert(chunks_.begin() + static_cast<std::ptrdiff_t>(c + 1), std::move(upper));
    lasts_.insert(lasts_.begin() + static_cast<std::ptrdiff_t>(c + 1), upper_last);
  }

  // Appends chunk c + 1 to chunk c and removes it.
  void MergeNext(std::size_t c) {
    Chunk& dst = *chunks_[c];
    const Chunk& src = *chunks_[c + 1];
    std::memcpy(&dst.entries[dst.size], src.entries, src.size * sizeof(Entry));
    dst.size += src.size;
    lasts_[c] = lasts_[c + 1];
    RemoveChunk(c + 1);
  }

  std::vector<std::unique_ptr<Chunk>> chunks_;  // non-empty, in key order
  std::vector<FreeKey> lasts_;                  // the last key of each chunk
  std::unique_ptr<Chunk> spare_;                // one emptied chunk, kept for reuse
  std::size_t size_ = 0;
  // Where Replace last put an entry (may be stale; Find checks it).
  std::size_t hint_c_ = 0;
  std::uint32_t hint_i_ = 0;
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_FREE_BLOCK_SET_H_
