#include "allocator/expandable_segment.h"

#include "absl/strings/str_cat.h"

namespace memscope {

absl::StatusOr<std::unique_ptr<ExpandableSegment>> ExpandableSegment::Create(Device& device, StreamId /*stream*/,
                                                                             std::size_t page_size) {
  const std::size_t total = device.MemoryInfo().total_bytes;
  const std::size_t address_space = total + total / 8;
  const std::size_t max_pages = (address_space + page_size - 1) / page_size;
  if (max_pages == 0) return absl::ResourceExhaustedError("device has no memory");
  absl::StatusOr<DevicePtr> base = device.ReserveAddress(page_size * max_pages);
  if (!base.ok()) return base.status();
  return std::unique_ptr<ExpandableSegment>(new ExpandableSegment(device, *base, page_size, max_pages));
}

ExpandableSegment::~ExpandableSegment() {
  for (std::size_t i = 0; i < mapped_.size(); ++i) {
    if (mapped_[i]) (void)device_.UnmapPage(base_ + i * page_size_, page_size_);
  }
  (void)device_.ReleaseAddress(base_, size());
}

SegmentRange ExpandableSegment::Map(SegmentRange range) {
  const std::size_t begin = PageLeft(range.ptr);
  const std::size_t end = PageRight(range.ptr + range.size);
  if (begin == end || end > max_pages_) return {base_ + begin * page_size_, 0};
  if (mapped_.size() < end) mapped_.resize(end, false);
  for (std::size_t i = begin; i < end; ++i) {
    if (!device_.MapPage(base_ + i * page_size_, page_size_).ok()) {
      // Out of memory part way: give back what this call mapped.
      UnmapPages(begin, i);
      return {base_ + begin * page_size_, 0};
    }
    mapped_[i] = true;
  }
  return {base_ + begin * page_size_, (end - begin) * page_size_};
}

SegmentRange ExpandableSegment::Unmap(SegmentRange range) {
  const std::size_t begin = PageRight(range.ptr);
  const std::size_t end = PageLeft(range.ptr + range.size);
  if (begin >= end) return {range.ptr, 0};
  UnmapPages(begin, end);
  return {base_ + begin * page_size_, (end - begin) * page_size_};
}

void ExpandableSegment::UnmapPages(std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) {
    if (i < mapped_.size() && mapped_[i]) {
      (void)device_.UnmapPage(base_ + i * page_size_, page_size_);
      mapped_[i] = false;
    }
  }
  while (!mapped_.empty() && !mapped_.back()) mapped_.pop_back();
}

std::size_t ExpandableSegment::mapped_bytes() const {
  std::size_t n = 0;
  for (bool m : mapped_) n += m ? 1 : 0;
  return n * page_size_;
}

}  // namespace memscope
