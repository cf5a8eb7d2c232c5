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

// Sets the category and owner of allocations made on this thread while it
// lives (nesting restores the outer tag). `owner` must outlive the tag.
class ScopedTag {
 public:
  ScopedTag(Category category, std::string_view owner);
  ~ScopedTag();
  ScopedTag(const ScopedTag&) = delete;
  ScopedTag& operator=(const ScopedTag&) = delete;

  static Category current_category();
  static std::string_view current_owner();

 private:
  Category saved_category_;
  std::string_view saved_owner_;
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_ALLOC_TAG_H_
