// Address -> pointer map for the allocator's allocated blocks: open
// addressing with linear probing over a power-of-two table at most a quarter
// full, Fibonacci hashing of the address, and deletion by backward shift (no
// tombstones). A lookup is a multiply, a shift and usually one probe; the
// values are non-null pointers and nullptr marks an empty slot.
#ifndef MEMSCOPE_ALLOCATOR_ADDRESS_MAP_H_
#define MEMSCOPE_ALLOCATOR_ADDRESS_MAP_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace memscope {

template <typename T>
class AddressMap {
 public:
  AddressMap() { Rehash(kMinCapacity); }

  std::size_t size() const { return size_; }

  // The value at `key`, or nullptr.
  T* Find(std::uint64_t key) const {
    for (std::size_t i = Index(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value == nullptr) return nullptr;
      if (s.key == key) return s.value;
    }
  }

  // Inserts `key` (not present) -> `value` (not null).
  void Insert(std::uint64_t key, T* value) {
    if (4 * (size_ + 1) > slots_.size()) Rehash(2 * slots_.size());
    Place(key, value);
    ++size_;
  }

  // Removes `key` and returns its value, or nullptr if absent.
  T* Erase(std::uint64_t key) {
    std::size_t i = Index(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].value == nullptr) return nullptr;
      if (slots_[i].key == key) break;
    }
    T* const value = slots_[i].value;
    // Backward shift: move up every later entry of the run that may sit at i.
    for (std::size_t j = (i + 1) & mask_; slots_[j].value != nullptr; j = (j + 1) & mask_) {
      const std::size_t home = Index(slots_[j].key);
      // Entry j may move to i if its home is not in (i, j] (cyclically).
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
    return value;
  }

  // Calls f(key, value) for every entry, in no particular order.
  template <typename F>
  void ForEach(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.value != nullptr) f(s.key, s.value);
    }
  }

 private:
  struct Slot {
    std::uint64_t key = 0;
    T* value = nullptr;
  };
  static constexpr std::size_t kMinCapacity = 64;

  std::size_t Index(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
  }

  void Place(std::uint64_t key, T* value) {
    std::size_t i = Index(key);
    while (slots_[i].value != nullptr) i = (i + 1) & mask_;
    slots_[i] = Slot{key, value};
  }

  void Rehash(std::size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    shift_ = 64;
    for (std::size_t c = capacity; c > 1; c >>= 1) --shift_;
    for (const Slot& s : old) {
      if (s.value != nullptr) Place(s.key, s.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  int shift_ = 64;
  std::size_t size_ = 0;
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_ADDRESS_MAP_H_
