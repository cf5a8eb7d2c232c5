// An array of trivially copyable values whose new elements are all-zero
// bytes, grown in place by the kernel: anonymous memory from mmap, enlarged
// with mremap (the pages move, nothing is copied), so that growing it touches
// no memory at all and only the elements written or read cost a page. The
// pickle reader's memo table (one slot per memo id: 1.3M on a 1M-entry
// snapshot) used a std::vector resized by doubling, which wrote every new
// slot and copied the old ones at each step: about 64 MB of fresh pages
// touched for 21 MB of slots. Linux only (mremap).
#ifndef MEMSCOPE_IMPORTERS_ZERO_ARRAY_H_
#define MEMSCOPE_IMPORTERS_ZERO_ARRAY_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <new>
#include <type_traits>

namespace memscope {

template <typename T>
class ZeroArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  ZeroArray() = default;
  ZeroArray(const ZeroArray&) = delete;
  ZeroArray& operator=(const ZeroArray&) = delete;
  ~ZeroArray() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return bytes_ / sizeof(T); }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

  // Makes the array n elements long (nothing happens for n <= size()); the
  // new elements' bytes are all zero. Throws std::bad_alloc when the kernel
  // gives no memory.
  void Grow(std::size_t n) {
    if (n <= size_) return;
    if (n > capacity()) {
      const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
      if (n > (~std::size_t{0} - page) / sizeof(T)) throw std::bad_alloc();
      const std::size_t bytes = (n * sizeof(T) + page - 1) / page * page;
      void* p = data_ == nullptr ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                                 : mremap(data_, bytes_, bytes, MREMAP_MAYMOVE);
      if (p == MAP_FAILED) throw std::bad_alloc();
      data_ = static_cast<T*>(p);
      bytes_ = bytes;
    }
    size_ = n;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace memscope

#endif  // MEMSCOPE_IMPORTERS_ZERO_ARRAY_H_
