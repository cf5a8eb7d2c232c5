#include "allocator/stats.h"

#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

constexpr const char* kStatTypeNames[kNumStatTypes] = {"all", "small_pool", "large_pool"};

// Calls f(key, value) for every key of torch.cuda.memory_stats(), `value`
// the field of `s` it names: the one list of names FlattenStats and
// SetFlatStat share. `S` is DeviceStats or const DeviceStats.
template <typename S, typename F>
void VisitStats(S& s, F&& f) {
  auto stat = [&](const std::string& prefix, auto& x) {
    f(prefix + ".current", x.current);
    f(prefix + ".peak", x.peak);
    f(prefix + ".allocated", x.allocated);
    f(prefix + ".freed", x.freed);
  };
  auto array = [&](const char* name, auto& a) {
    for (std::size_t t = 0; t < kNumStatTypes; ++t) stat(absl::StrCat(name, ".", kStatTypeNames[t]), a[t]);
  };
  f("num_alloc_retries", s.num_alloc_retries);
  f("num_ooms", s.num_ooms);
  f("max_split_size", s.max_split_size);
  f("num_sync_all_streams", s.num_sync_all_streams);
  f("num_device_alloc", s.num_device_alloc);
  f("num_device_free", s.num_device_free);
  array("allocation", s.allocation);
  array("segment", s.segment);
  array("active", s.active);
  array("inactive_split", s.inactive_split);
  array("allocated_bytes", s.allocated_bytes);
  array("reserved_bytes", s.reserved_bytes);
  array("active_bytes", s.active_bytes);
  array("inactive_split_bytes", s.inactive_split_bytes);
  array("requested_bytes", s.requested_bytes);
  stat("oversize_allocations", s.oversize_allocations);
  stat("oversize_segments", s.oversize_segments);
}

}  // namespace

std::map<std::string, std::int64_t> FlattenStats(const DeviceStats& s) {
  std::map<std::string, std::int64_t> out;
  VisitStats(s, [&](const std::string& key, const std::int64_t& value) { out[key] = value; });
  return out;
}

bool SetFlatStat(DeviceStats& s, std::string_view key, std::int64_t value) {
  bool found = false;
  VisitStats(s, [&](const std::string& k, std::int64_t& field) {
    if (k == key) {
      field = value;
      found = true;
    }
  });
  return found;
}

}  // namespace memscope
