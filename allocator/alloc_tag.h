// What an allocation is for: its memory category (the PyTorch profiler's
// categories plus DDP's own) and its owner (a module path such as
// "encoder.rnn"). The caller who knows sets a ScopedTag; whoever observes the
// allocator (recording/recorder.h) reads the current tag. The allocator itself
// never looks at it.
#ifndef MEMSCOPE_ALLOCATOR_ALLOC_TAG_H_
#define MEMSCOPE_ALLOCATOR_ALLOC_TAG_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace memscope {

// Memory categories of the PyTorch profiler, plus DDP's own.
enum class Category : std::uint8_t {
  kParameter,
  kOptimizerState,
  kInput,
  kActivation,
  kGradient,
  kAutogradDetail,
  kTemporary,
  kDdpBucket,
  kCommTemp,
  kOther,  // untagged allocations
};
inline constexpr int kNumCategories = 10;
std::string_view CategoryName(Category c);  // "PARAMETER", "DDP_BUCKET", ...
std::optional<Category> ParseCategory(std::string_view name);

// The current tag of a thread. `generation` takes a new value, unique in the
// process, whenever a ScopedTag begins or ends (0: no tag was ever set on the
// thread, the owner is ""): an observer that saw a tag of the same
// generation knows the owner is the same text without comparing it.
struct AllocTag {
  Category category = Category::kOther;
  std::uint64_t generation = 0;
  std::string_view owner;
};

namespace internal {
inline thread_local constinit AllocTag current_alloc_tag;
}  // namespace internal

// Sets the category and owner of allocations made on this thread while it
// lives (nesting restores the outer tag). `owner` must outlive the tag.
class ScopedTag {
 public:
  ScopedTag(Category category, std::string_view owner);
  ~ScopedTag();
  ScopedTag(const ScopedTag&) = delete;
  ScopedTag& operator=(const ScopedTag&) = delete;

  // Tags this scope's allocations from now on with `category` and `owner`:
  // what ending this tag and beginning a new one would do, with one new
  // generation instead of two (a replay retags one scope per request).
  void Retag(Category category, std::string_view owner);

  static Category current_category() { return internal::current_alloc_tag.category; }
  static std::string_view current_owner() { return internal::current_alloc_tag.owner; }
  // This thread's tag.
  static const AllocTag& current() { return internal::current_alloc_tag; }

 private:
  Category saved_category_;
  std::string_view saved_owner_;
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_ALLOC_TAG_H_
