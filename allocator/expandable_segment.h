// Internal to the allocator: one expandable segment, a large virtual address
// reservation into which physical pages are mapped on demand.
#ifndef MEMSCOPE_ALLOCATOR_EXPANDABLE_SEGMENT_H_
#define MEMSCOPE_ALLOCATOR_EXPANDABLE_SEGMENT_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/device.h"

namespace memscope {

struct SegmentRange {
  DevicePtr ptr = 0;
  std::size_t size = 0;
};

class ExpandableSegment {
 public:
  // Reserves enough address space for 1 1/8 of the device's total memory,
  // in pages of `page_size` (2 MiB small pool, 20 MiB large pool), as
  // PyTorch does.
  static absl::StatusOr<std::unique_ptr<ExpandableSegment>> Create(Device& device, StreamId stream,
                                                                   std::size_t page_size);
  // Unmaps every mapped page and releases the reservation.
  ~ExpandableSegment();
  ExpandableSegment(const ExpandableSegment&) = delete;
  ExpandableSegment& operator=(const ExpandableSegment&) = delete;

  // Maps the pages covering [range.ptr, range.ptr + range.size); range.ptr must
  // be page aligned. Returns the range mapped (whole pages, possibly more than
  // asked), or size 0 when the device is out of memory (nothing stays mapped).
  SegmentRange Map(SegmentRange range);

  // Unmaps the pages wholly inside `range`. Returns the range unmapped (size 0
  // when no whole page is inside).
  SegmentRange Unmap(SegmentRange range);

  DevicePtr ptr() const { return base_; }
  std::size_t size() const { return page_size_ * max_pages_; }
  std::size_t page_size() const { return page_size_; }
  std::size_t mapped_bytes() const;

 private:
  ExpandableSegment(Device& device, DevicePtr base, std::size_t page_size, std::size_t max_pages)
      : device_(device), base_(base), page_size_(page_size), max_pages_(max_pages) {}
  std::size_t PageLeft(DevicePtr p) const { return (p - base_) / page_size_; }
  std::size_t PageRight(DevicePtr p) const { return (p - base_ + page_size_ - 1) / page_size_; }
  void UnmapPages(std::size_t begin, std::size_t end);

  Device& device_;
  const DevicePtr base_;
  const std::size_t page_size_;
  const std::size_t max_pages_;
  std::vector<bool> mapped_;  // one entry per page up to the last mapped one
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_EXPANDABLE_SEGMENT_H_
