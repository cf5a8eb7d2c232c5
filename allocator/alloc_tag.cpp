#include "allocator/alloc_tag.h"

#include <atomic>

namespace memscope {
namespace {
std::atomic<std::uint64_t> tag_generations{0};
std::uint64_t NextGeneration() { return tag_generations.fetch_add(1, std::memory_order_relaxed) + 1; }

constexpr std::string_view kCategoryNames[kNumCategories] = {
    "PARAMETER",       "OPTIMIZER_STATE", "INPUT",      "ACTIVATION", "GRADIENT",
    "AUTOGRAD_DETAIL", "TEMPORARY",       "DDP_BUCKET", "COMM_TEMP",  "OTHER"};
}  // namespace

std::string_view CategoryName(Category c) {
  const auto i = static_cast<std::size_t>(c);
  return i < kNumCategories ? kCategoryNames[i] : "OTHER";
}

std::optional<Category> ParseCategory(std::string_view name) {
  for (int i = 0; i < kNumCategories; ++i) {
    if (kCategoryNames[i] == name) return static_cast<Category>(i);
  }
  return std::nullopt;
}

ScopedTag::ScopedTag(Category category, std::string_view owner)
    : saved_category_(internal::current_alloc_tag.category), saved_owner_(internal::current_alloc_tag.owner) {
  AllocTag& tag = internal::current_alloc_tag;
  tag.category = category;
  tag.owner = owner;
  tag.generation = NextGeneration();
}

void ScopedTag::Retag(Category category, std::string_view owner) {
  AllocTag& tag = internal::current_alloc_tag;
  tag.category = category;
  tag.owner = owner;
  tag.generation = NextGeneration();
}

ScopedTag::~ScopedTag() {
  AllocTag& tag = internal::current_alloc_tag;
  tag.category = saved_category_;
  tag.owner = saved_owner_;
  tag.generation = NextGeneration();
}

}  // namespace memscope
