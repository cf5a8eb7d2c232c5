#include "allocator/alloc_tag.h"

namespace memscope {
namespace {
constexpr std::string_view kCategoryNames[kNumCategories] = {
    "PARAMETER",       "OPTIMIZER_STATE", "INPUT",      "ACTIVATION", "GRADIENT",
    "AUTOGRAD_DETAIL", "TEMPORARY",       "DDP_BUCKET", "COMM_TEMP",  "OTHER"};
struct Tag {
  Category category = Category::kOther;
  std::string_view owner;
};
thread_local Tag current_tag;
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
    : saved_category_(current_tag.category), saved_owner_(current_tag.owner) {
  current_tag = {category, owner};
}

ScopedTag::~ScopedTag() { current_tag = {saved_category_, saved_owner_}; }

Category ScopedTag::current_category() { return current_tag.category; }
std::string_view ScopedTag::current_owner() { return current_tag.owner; }

}  // namespace memscope
