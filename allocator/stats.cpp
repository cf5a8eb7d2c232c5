#include "allocator/stats.h"

#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

constexpr const char* kStatTypeNames[kNumStatTypes] = {"all", "small_pool", "large_pool"};

void AddStat(std::map<std::string, std::int64_t>& out, const std::string& prefix, const Stat& s) {
  out[prefix + ".current"] = s.current;
  out[prefix + ".peak"] = s.peak;
  out[prefix + ".allocated"] = s.allocated;
  out[prefix + ".freed"] = s.freed;
}

void AddStatArray(std::map<std::string, std::int64_t>& out, const char* name, const StatArray& a) {
  for (std::size_t t = 0; t < kNumStatTypes; ++t) {
    AddStat(out, absl::StrCat(name, ".", kStatTypeNames[t]), a[t]);
  }
}

}  // namespace

std::map<std::string, std::int64_t> FlattenStats(const DeviceStats& s) {
  std::map<std::string, std::int64_t> out;
  out["num_alloc_retries"] = s.num_alloc_retries;
  out["num_ooms"] = s.num_ooms;
  out["max_split_size"] = s.max_split_size;
  out["num_sync_all_streams"] = s.num_sync_all_streams;
  out["num_device_alloc"] = s.num_device_alloc;
  out["num_device_free"] = s.num_device_free;
  AddStatArray(out, "allocation", s.allocation);
  AddStatArray(out, "segment", s.segment);
  AddStatArray(out, "active", s.active);
  AddStatArray(out, "inactive_split", s.inactive_split);
  AddStatArray(out, "allocated_bytes", s.allocated_bytes);
  AddStatArray(out, "reserved_bytes", s.reserved_bytes);
  AddStatArray(out, "active_bytes", s.active_bytes);
  AddStatArray(out, "inactive_split_bytes", s.inactive_split_bytes);
  AddStatArray(out, "requested_bytes", s.requested_bytes);
  AddStat(out, "oversize_allocations", s.oversize_allocations);
  AddStat(out, "oversize_segments", s.oversize_segments);
  return out;
}

}  // namespace memscope
