// report.json both ways: ReportToJson writes what ReportFromJson reads and
// validates, field by field in the same order, so the schema (report.h) has
// one writer and one reader.
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/stats.h"
#include "base/json_writer.h"
#include "base/status.h"
#include "exporters/json_double.h"
#include "base/status.h"
#include "exporters/report.h"

namespace memscope {
namespace {

using nlohmann::json;

// ---- Writing ----

// report.json's times are wall-clock: the recording's start plus the time
// since it.
double TimeUs(std::int64_t wall_start_us, std::int64_t time_ns) {
  return static_cast<double>(wall_start_us) + static_cast<double>(time_ns) / 1000.0;
}

json SitesJson(const std::vector<SiteBytes>& sites) {
  json out = json::array();
  for (const SiteBytes& s : sites) {
    out.push_back({{"site", s.site}, {"bytes", s.bytes}, {"allocations", s.allocations}});
  }
  return out;
}

json PeakJson(const RankReport& r, const PeakInfo& p) {
  json owners = json::array();
  for (const auto& [owner, bytes] : p.top_owners) owners.push_back({{"owner", owner}, {"bytes", bytes}});
  return {{"bytes", p.bytes},     {"time_us", TimeUs(r.wall_start_us, p.time_ns)},
          {"phase", p.phase},     {"by_category", ByCategoryJson(p.by_category)},
          {"top_owners", owners}, {"top_sites", SitesJson(p.top_sites)}};
}

json PhasesJson(const std::vector<PhaseRow>& rows) {
  json phases = json::array();
  for (const PhaseRow& row : rows) {
    phases.push_back({{"step", row.step == kNoStep ? json(nullptr) : json(row.step)},
                      {"phase", ReportPhaseName(row)},
                      {"allocated_bytes", row.allocated},
                      {"max_allocated_bytes", row.max_allocated},
                      {"reserved_bytes", row.reserved},
                      {"max_reserved_bytes", row.max_reserved},
                      {"peak_allocated_bytes_in_phase", row.peak_allocated_in_phase},
                      {"by_category", ByCategoryJson(row.by_category)}});
    if (row.micro_batch != kNoMicroBatch) phases.back()["micro_batch"] = row.micro_batch;
  }
  return phases;
}

json OomJson(const RankReport& r) {
  if (!r.oom) return nullptr;
  return {{"time_us", TimeUs(r.wall_start_us, r.oom->time_ns)},
          {"phase", r.oom->phase},
          {"requested_bytes", r.oom->requested},
          {"rounded_bytes", r.oom->rounded},
          {"device_free_bytes", r.oom->device_free},
          {"caused_by_fragmentation", r.oom->caused_by_fragmentation},
          {"verdict", r.oom->verdict},
          {"top_sites", SitesJson(r.oom->top_sites)}};
}

json BucketsJson(const std::vector<DdpBucket>& buckets) {
  json out = json::array();
  for (const DdpBucket& b : buckets) {
    out.push_back({{"index", b.index}, {"bytes", b.bytes}, {"dtype", b.dtype}, {"params", b.params}});
  }
  return out;
}

// ---- Reading ----

// Reads the fields of one JSON object. Errors say "WHERE has no WHAT", WHERE
// naming the object ("rank 0 phases[1]"); a field of the wrong type is
// reported as missing with the type it needs.
class Fields {
 public:
  Fields(const json& object, std::string where) : object_(object), where_(std::move(where)) {}

  const std::string& where() const { return where_; }
  absl::Status Bad(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, " has no ", what));
  }
  // The field, or null when absent (or when this is not an object).
  const json* Find(const char* key) const {
    if (!object_.is_object()) return nullptr;
    auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }
  // Non-negative integers; a non-negative float is floored (a hand edit).
  // Absent: `out` keeps its value, or an error when `required`.
  template <typename T>
  absl::Status Bytes(const char* key, T& out, bool required = false) const {
    const json* v = Find(key);
    if (v == nullptr) return required ? Bad(absl::StrCat("\"", key, "\" (bytes)")) : absl::OkStatus();
    std::optional<std::uint64_t> bytes;
    if (v->is_number_unsigned()) {
      bytes = v->get<std::uint64_t>();
    } else if (v->is_number_integer() && v->get<std::int64_t>() >= 0) {
      bytes = static_cast<std::uint64_t>(v->get<std::int64_t>());
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() >= 0 &&
               v->get<double>() < 18446744073709551615.0) {
      bytes = static_cast<std::uint64_t>(std::floor(v->get<double>()));
    }
    if (!bytes) return Bad(absl::StrCat("\"", key, "\" (bytes)"));
    out = static_cast<T>(*bytes);
    return absl::OkStatus();
  }
  absl::Status Int(const char* key, int& out) const {
    const json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number_integer() || v->get<std::int64_t>() < 0 || v->get<std::int64_t>() > (1 << 20)) {
      return Bad(absl::StrCat("\"", key, "\" (a number from 0)"));
    }
    out = v->get<int>();
    return absl::OkStatus();
  }
  // A string; null reads as "".
  absl::Status String(const char* key, std::string& out, bool required = false) const {
    const json* v = Find(key);
    if (v == nullptr && !required) return absl::OkStatus();
    if (v != nullptr && v->is_null() && !required) {
      out.clear();
      return absl::OkStatus();
    }
    if (v == nullptr || !v->is_string()) return Bad(absl::StrCat("string \"", key, "\""));
    out = v->get<std::string>();
    return absl::OkStatus();
  }
  absl::Status Bool(const char* key, bool& out) const {
    const json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return Bad(absl::StrCat("true or false \"", key, "\""));
    out = v->get<bool>();
    return absl::OkStatus();
  }
  absl::Status Double(const char* key, double& out) const {
    const json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number() || !std::isfinite(v->get<double>())) return Bad(absl::StrCat("number \"", key, "\""));
    out = v->get<double>();
    return absl::OkStatus();
  }
  // A wall-clock "time_us" as nanoseconds since `wall_start_us`.
  absl::Status TimeNs(std::int64_t wall_start_us, std::int64_t& out) const {
    double us = static_cast<double>(wall_start_us);
    MEMSCOPE_RETURN_IF_ERROR(Double("time_us", us));
    if (us < 0 || us > 9e15) return Bad("\"time_us\" (Unix time in microseconds)");
    out = std::llround((us - static_cast<double>(wall_start_us)) * 1000.0);
    return absl::OkStatus();
  }
  // {CATEGORY: bytes}; absent: all 0 (or an error when `required`).
  absl::Status Categories(std::array<std::int64_t, kNumCategories>& out, bool required) const {
    const json* v = Find("by_category");
    if (v == nullptr && !required) return absl::OkStatus();
    if (v == nullptr || !v->is_object()) return Bad("\"by_category\" object");
    out.fill(0);
    for (auto it = v->begin(); it != v->end(); ++it) {
      const std::optional<Category> c = ParseCategory(it.key());
      if (!c) {
        return absl::InvalidArgumentError(
            absl::StrCat(where_, " has an unknown category \"", it.key(), "\" in \"by_category\""));
      }
      if (!it->is_number_integer()) return Bad(absl::StrCat("integer \"by_category\".\"", it.key(), "\""));
      out[static_cast<std::size_t>(*c)] = it->get<std::int64_t>();
    }
    return absl::OkStatus();
  }
  // An object field as Fields named "WHERE key" (or "WHERE key_name"); null
  // when absent or null, an error when it is something else.
  absl::StatusOr<std::optional<Fields>> Object(const char* key, absl::string_view key_name = {}) const {
    const json* v = Find(key);
    if (v == nullptr || v->is_null()) return std::optional<Fields>();
    if (!v->is_object()) return Bad(absl::StrCat("\"", key, "\" object"));
    const absl::string_view name = key_name.empty() ? absl::string_view(key) : key_name;
    return std::optional<Fields>(Fields(*v, absl::StrCat(where_, " ", name)));
  }
  // An array field (absent: empty); an error when it is something else.
  absl::StatusOr<const json*> Array(const char* key) const {
    static const json kEmpty = json::array();
    const json* v = Find(key);
    if (v == nullptr) return &kEmpty;
    if (!v->is_array()) return Bad(absl::StrCat("\"", key, "\" array"));
    return v;
  }

 private:
  const json& object_;
  std::string where_;
};

absl::Status ReadFragmentation(const Fields& f, FragmentationInfo& out) {
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("reserved_bytes", out.reserved));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("allocated_bytes", out.allocated));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("reserved_minus_allocated_bytes", out.reserved_minus_allocated));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("inactive_split_bytes", out.inactive_split_bytes));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("free_in_segments_bytes", out.free_in_segments));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("largest_free_block_bytes", out.largest_free_block));
  MEMSCOPE_RETURN_IF_ERROR(f.Double("fragmentation", out.fragmentation));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("segments", out.segments));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("releasable_bytes", out.releasable_bytes));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("releasable_segments", out.releasable_segments));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("fragmented_bytes", out.fragmented_bytes));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("fragmented_segments", out.fragmented_segments));
  return f.Bytes("free_blocks", out.free_blocks);
}

absl::Status ReadBuckets(const Fields& ddp, const char* key, std::vector<DdpBucket>& out) {
  absl::StatusOr<const json*> buckets = ddp.Array(key);
  if (!buckets.ok()) return buckets.status();
  for (std::size_t i = 0; i < (*buckets)->size(); ++i) {
    const Fields f((**buckets)[i], absl::StrCat(ddp.where(), ".", key, "[", i, "]"));
    DdpBucket b;
    b.index = i;
    MEMSCOPE_RETURN_IF_ERROR(f.Bytes("index", b.index));
    MEMSCOPE_RETURN_IF_ERROR(f.Bytes("bytes", b.bytes, /*required=*/true));
    MEMSCOPE_RETURN_IF_ERROR(f.String("dtype", b.dtype));
    absl::StatusOr<const json*> params = f.Array("params");
    if (!params.ok()) return params.status();
    for (const json& p : **params) {
      if (!p.is_string()) return f.Bad("\"params\" array of names");
      b.params.push_back(p.get<std::string>());
    }
    out.push_back(std::move(b));
  }
  return absl::OkStatus();
}

absl::StatusOr<ZeroShards> ReadZero(const Fields& f) {
  ZeroShards z;
  MEMSCOPE_RETURN_IF_ERROR(f.Bool("parameters_as_bucket_view", z.parameters_as_bucket_view));
  absl::StatusOr<const json*> partition = f.Array("partition");
  if (!partition.ok()) return partition.status();
  for (const json& rank : **partition) {
    if (!rank.is_array()) return f.Bad("\"partition\" array of name arrays, one per rank");
    std::vector<std::string>& names = z.partition.emplace_back();
    for (const json& name : rank) {
      if (!name.is_string()) return f.Bad("\"partition\" array of name arrays, one per rank");
      names.push_back(name.get<std::string>());
    }
  }
  if (const json* bytes = f.Find("bucket_bytes"); bytes != nullptr) {
    if (!bytes->is_array()) return f.Bad("\"bucket_bytes\" array");
    for (const json& b : *bytes) {
      if (!b.is_number_unsigned()) return f.Bad("\"bucket_bytes\" array of byte counts");
      z.bucket_bytes.push_back(b.get<std::uint64_t>());
    }
  }
  return z;
}

absl::StatusOr<DdpBuckets> ReadDdp(const Fields& f) {
  DdpBuckets ddp;
  MEMSCOPE_RETURN_IF_ERROR(f.String("mode", ddp.mode));
  MEMSCOPE_RETURN_IF_ERROR(ReadBuckets(f, "buckets", ddp.buckets));
  MEMSCOPE_RETURN_IF_ERROR(ReadBuckets(f, "rebuilt_buckets", ddp.rebuilt_buckets));
  if (const json* zero = f.Find("zero"); zero != nullptr) {
    absl::StatusOr<ZeroShards> z = ReadZero(Fields(*zero, f.where() + ".zero"));
    if (!z.ok()) return z.status();
    ddp.zero = std::move(*z);
  }
  return ddp;
}

absl::Status ReadPhases(const Fields& rank, std::vector<PhaseRow>& out) {
  absl::StatusOr<const json*> phases = rank.Array("phases");
  if (!phases.ok()) return phases.status();
  for (std::size_t i = 0; i < (*phases)->size(); ++i) {
    const Fields f((**phases)[i], absl::StrCat(rank.where(), " phases[", i, "]"));
    PhaseRow row;
    if (const json* step = f.Find("step"); step != nullptr && !step->is_null()) {
      if (!step->is_number_integer() || step->get<std::int64_t>() < 0) return f.Bad("\"step\" (null or a step number)");
      row.step = step->get<std::int64_t>();
    }
    if (const json* micro = f.Find("micro_batch"); micro != nullptr && !micro->is_null()) {
      if (!micro->is_number_integer() || micro->get<std::int64_t>() < 0) {
        return f.Bad("\"micro_batch\" (null or a micro-batch index)");
      }
      row.micro_batch = micro->get<std::int64_t>();
    }
    std::string phase;
    MEMSCOPE_RETURN_IF_ERROR(f.String("phase", phase, /*required=*/true));
    const std::optional<Phase> known = ParsePhase(phase);
    row.phase = known.value_or(Phase::kUser);
    if (row.phase == Phase::kUser) row.label = phase;
    MEMSCOPE_RETURN_IF_ERROR(f.Bytes("allocated_bytes", row.allocated, /*required=*/true));
    MEMSCOPE_RETURN_IF_ERROR(f.Bytes("max_allocated_bytes", row.max_allocated, /*required=*/true));
    MEMSCOPE_RETURN_IF_ERROR(f.Bytes("reserved_bytes", row.reserved, /*required=*/true));
    MEMSCOPE_RETURN_IF_ERROR(f.Bytes("max_reserved_bytes", row.max_reserved));
    MEMSCOPE_RETURN_IF_ERROR(f.Bytes("peak_allocated_bytes_in_phase", row.peak_allocated_in_phase));
    MEMSCOPE_RETURN_IF_ERROR(f.Categories(row.by_category, /*required=*/true));
    out.push_back(std::move(row));
  }
  return absl::OkStatus();
}

// "top_sites" (optional: older reports have none).
absl::Status ReadSites(const Fields& f, std::vector<SiteBytes>& out) {
  absl::StatusOr<const json*> sites = f.Array("top_sites");
  if (!sites.ok()) return sites.status();
  for (std::size_t i = 0; i < (*sites)->size(); ++i) {
    const Fields o((**sites)[i], absl::StrCat(f.where(), ".top_sites[", i, "]"));
    SiteBytes site;
    MEMSCOPE_RETURN_IF_ERROR(o.String("site", site.site, /*required=*/true));
    MEMSCOPE_RETURN_IF_ERROR(o.Bytes("bytes", site.bytes, /*required=*/true));
    MEMSCOPE_RETURN_IF_ERROR(o.Bytes("allocations", site.allocations));
    out.push_back(std::move(site));
  }
  return absl::OkStatus();
}

absl::Status ReadPeak(const Fields& f, std::int64_t wall_start_us, bool allocated, PeakInfo& out) {
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("bytes", out.bytes, /*required=*/true));
  MEMSCOPE_RETURN_IF_ERROR(f.TimeNs(wall_start_us, out.time_ns));
  MEMSCOPE_RETURN_IF_ERROR(f.String("phase", out.phase));
  MEMSCOPE_RETURN_IF_ERROR(f.Categories(out.by_category, /*required=*/allocated));
  absl::StatusOr<const json*> owners = f.Array("top_owners");
  if (!owners.ok()) return owners.status();
  for (std::size_t i = 0; i < (*owners)->size(); ++i) {
    const Fields o((**owners)[i], absl::StrCat(f.where(), ".top_owners[", i, "]"));
    std::pair<std::string, std::int64_t> owner;
    MEMSCOPE_RETURN_IF_ERROR(o.String("owner", owner.first, /*required=*/true));
    MEMSCOPE_RETURN_IF_ERROR(o.Bytes("bytes", owner.second, /*required=*/true));
    out.top_owners.push_back(std::move(owner));
  }
  return ReadSites(f, out.top_sites);
}

// "peak": both objects, and the wall clock the rank's times count from.
absl::Status ReadPeaks(const Fields& rank, RankReport& r) {
  absl::StatusOr<std::optional<Fields>> peak = rank.Object("peak");
  if (!peak.ok()) return peak.status();
  const json* allocated = *peak ? (*peak)->Find("allocated") : nullptr;
  const json* reserved = *peak ? (*peak)->Find("reserved") : nullptr;
  if (allocated == nullptr || !allocated->is_object()) return rank.Bad("\"peak\".\"allocated\" object");
  if (reserved == nullptr || !reserved->is_object()) return rank.Bad("\"peak\".\"reserved\" object");
  // time_ns counts from a whole microsecond at or before the peak, so that a
  // wall-clock time_us (a multiple of 1/4 us near 2^50) reads back exactly;
  // small times (no wall clock) count from 0.
  if (const json* t = Fields(*allocated, "").Find("time_us"); t != nullptr && t->is_number() &&
                                                              std::isfinite(t->get<double>()) &&
                                                              t->get<double>() >= 0x1p33 && t->get<double>() <= 9e15) {
    r.wall_start_us = static_cast<std::int64_t>(std::floor(t->get<double>()));
  }
  MEMSCOPE_RETURN_IF_ERROR(
      ReadPeak(Fields(*allocated, rank.where() + " peak.allocated"), r.wall_start_us, true, r.peak_allocated));
  MEMSCOPE_RETURN_IF_ERROR(
      ReadPeak(Fields(*reserved, rank.where() + " peak.reserved"), r.wall_start_us, false, r.peak_reserved));
  std::uint64_t peak_reserved = r.peak_reserved.bytes;
  MEMSCOPE_RETURN_IF_ERROR(rank.Bytes("peak_reserved_bytes", peak_reserved));
  if (peak_reserved != r.peak_reserved.bytes) {
    return absl::InvalidArgumentError(absl::StrCat(rank.where(), " has \"peak_reserved_bytes\" ", peak_reserved,
                                                   " but \"peak\".\"reserved\".\"bytes\" ", r.peak_reserved.bytes));
  }
  return absl::OkStatus();
}

// "fragmentation" and "oom" (whose fragmentation is fragmentation.oom).
absl::Status ReadFragmentationAndOom(const Fields& rank, RankReport& r) {
  absl::StatusOr<std::optional<Fields>> frag = rank.Object("fragmentation");
  if (!frag.ok()) return frag.status();
  FragmentationInfo at_oom;
  if (*frag) {
    for (auto [key, out] : {std::pair{"end", &r.fragmentation_at_end}, std::pair{"exit", &r.fragmentation_at_exit},
                            std::pair{"peak", &r.fragmentation_at_peak}, std::pair{"oom", &at_oom}}) {
      absl::StatusOr<std::optional<Fields>> f = (*frag)->Object(key, absl::StrCat("fragmentation.", key));
      if (!f.ok()) return f.status();
      if (*f) MEMSCOPE_RETURN_IF_ERROR(ReadFragmentation(**f, *out));
    }
  }
  absl::StatusOr<std::optional<Fields>> oom = rank.Object("oom");
  if (!oom.ok()) return oom.status();
  if (!*oom) return absl::OkStatus();
  const Fields& f = **oom;
  OomReport o;
  o.fragmentation = at_oom;
  MEMSCOPE_RETURN_IF_ERROR(f.TimeNs(r.wall_start_us, o.time_ns));
  MEMSCOPE_RETURN_IF_ERROR(f.String("phase", o.phase));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("requested_bytes", o.requested, /*required=*/true));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("rounded_bytes", o.rounded));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("device_free_bytes", o.device_free));
  MEMSCOPE_RETURN_IF_ERROR(f.Bool("caused_by_fragmentation", o.caused_by_fragmentation));
  MEMSCOPE_RETURN_IF_ERROR(f.String("verdict", o.verdict));
  MEMSCOPE_RETURN_IF_ERROR(ReadSites(f, o.top_sites));
  r.oom = std::move(o);
  return absl::OkStatus();
}

absl::Status ReadMemoryStats(const Fields& rank, RankReport& r) {
  const json* stats = rank.Find("memory_stats");
  r.stats_known = stats != nullptr;
  if (stats == nullptr) return absl::OkStatus();
  if (!stats->is_object()) return rank.Bad("\"memory_stats\" object");
  for (auto it = stats->begin(); it != stats->end(); ++it) {
    if (!it->is_number_integer()) return rank.Bad(absl::StrCat("integer \"memory_stats\".\"", it.key(), "\""));
    if (!SetFlatStat(r.stats, it.key(), it->get<std::int64_t>())) {
      return absl::InvalidArgumentError(absl::StrCat(rank.where(), " has a key \"", it.key(),
                                                     "\" in \"memory_stats\" that torch.cuda.memory_stats() has not"));
    }
  }
  return absl::OkStatus();
}

// One entry of "ranks"; `where` is "ranks[i]" until its rank is known.
absl::StatusOr<RankReport> ReadRank(const json& entry, const std::string& where) {
  RankReport r;
  r.rank = -1;
  MEMSCOPE_RETURN_IF_ERROR(Fields(entry, where).Int("rank", r.rank));
  if (r.rank < 0) return Fields(entry, where).Bad("\"rank\" (a rank number)");
  const Fields f(entry, absl::StrCat("rank ", r.rank));
  MEMSCOPE_RETURN_IF_ERROR(f.Int("device_index", r.device_index));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("device_capacity", r.device_capacity));
  MEMSCOPE_RETURN_IF_ERROR(f.String("alloc_conf", r.alloc_conf));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("events", r.events));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("torn_bytes", r.torn_bytes));
  MEMSCOPE_RETURN_IF_ERROR(ReadPhases(f, r.phases));
  MEMSCOPE_RETURN_IF_ERROR(ReadPeaks(f, r));
  MEMSCOPE_RETURN_IF_ERROR(ReadFragmentationAndOom(f, r));
  MEMSCOPE_RETURN_IF_ERROR(ReadMemoryStats(f, r));
  MEMSCOPE_RETURN_IF_ERROR(f.Bytes("lower_bound_bytes", r.lower_bound));
  MEMSCOPE_RETURN_IF_ERROR(f.String("status", r.status));
  absl::StatusOr<std::optional<Fields>> ddp = f.Object("ddp");
  if (!ddp.ok()) return ddp.status();
  if (*ddp) {
    absl::StatusOr<DdpBuckets> d = ReadDdp(**ddp);
    if (!d.ok()) return d.status();
    r.ddp = std::move(*d);
  }
  if (const json* losses = f.Find("losses"); losses != nullptr) {
    if (!losses->is_array()) return f.Bad("\"losses\" (an array of numbers or null)");
    for (const json& l : *losses) {
      if (!l.is_null() && !l.is_number()) return f.Bad("\"losses\" (an array of numbers or null)");
      r.losses.push_back(l.is_null() ? std::numeric_limits<float>::quiet_NaN() : l.get<float>());
    }
  }
  return r;
}

// The document's header: a memscope.report/1 object with a ranks array.
absl::Status CheckHeader(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("is not a JSON object (expected memscope.report/1)");
  const json* schema = Fields(j, "").Find("schema");
  if (schema == nullptr || !schema->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("has no \"schema\" (expected ", kReportSchema, ")"));
  }
  if (schema->get<std::string>() != kReportSchema) {
    return absl::InvalidArgumentError(
        absl::StrCat("has schema '", schema->get<std::string>(), "', not ", kReportSchema));
  }
  if (!j.contains("ranks") || !j["ranks"].is_array()) return absl::InvalidArgumentError("has no \"ranks\" array");
  return absl::OkStatus();
}

// A measured GPU process's own fields ("source": "measured"); none for a modelled one.
absl::Status ReadMeasured(const Fields& p, GpuProcess& process) {
  std::string source;
  MEMSCOPE_RETURN_IF_ERROR(p.String("source", source));
  if (source.empty()) return absl::OkStatus();
  if (source != "measured") return p.Bad("\"source\" of \"measured\" or none");
  process.measured = true;
  MEMSCOPE_RETURN_IF_ERROR(p.Bool("context_measured", process.context_measured));
  MEMSCOPE_RETURN_IF_ERROR(p.Bytes("cublas_bytes", process.cublas_bytes));
  MEMSCOPE_RETURN_IF_ERROR(p.Bytes("cudnn_bytes", process.cudnn_bytes));
  MEMSCOPE_RETURN_IF_ERROR(p.Bytes("other_bytes", process.other_bytes));
  MEMSCOPE_RETURN_IF_ERROR(p.Int("pytorch_segments", process.segments));
  return p.Int("pytorch_segments_matched", process.segments_matched);
}

// Everything below the header; errors name the field.
// "gpus": what GpuTableJson writes (the totals and "shared_by_ranks" follow
// from the processes, so they are not read).
absl::StatusOr<std::vector<GpuRow>> ReadGpus(const json& j) {
  if (!j.is_array()) return absl::InvalidArgumentError("\"gpus\" is not an array");
  std::vector<GpuRow> rows;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string where = absl::StrCat("gpus[", i, "]");
    if (!j[i].is_object()) return absl::InvalidArgumentError(absl::StrCat(where, " is not an object"));
    const Fields g(j[i], where);
    GpuRow& row = rows.emplace_back();
    MEMSCOPE_RETURN_IF_ERROR(g.Int("physical", row.physical));
    MEMSCOPE_RETURN_IF_ERROR(g.Bytes("capacity_bytes", row.capacity, /*required=*/true));
    const json* processes = g.Find("processes");
    if (processes == nullptr || !processes->is_array()) return g.Bad("\"processes\" array");
    for (std::size_t k = 0; k < processes->size(); ++k) {
      const json& pj = (*processes)[k];
      const std::string at = absl::StrCat(where, ".processes[", k, "]");
      if (!pj.is_object()) return absl::InvalidArgumentError(absl::StrCat(at, " is not an object"));
      const Fields p(pj, at);
      GpuProcess& process = row.processes.emplace_back();
      MEMSCOPE_RETURN_IF_ERROR(p.Int("rank", process.rank));
      if (const json* cuda = p.Find("cuda"); cuda != nullptr && !cuda->is_null()) {
        MEMSCOPE_RETURN_IF_ERROR(p.Int("cuda", process.ordinal));
      }
      MEMSCOPE_RETURN_IF_ERROR(p.Bytes("context_bytes", process.context_bytes));
      MEMSCOPE_RETURN_IF_ERROR(p.Bytes("reserved_bytes", process.reserved_bytes));
      MEMSCOPE_RETURN_IF_ERROR(p.Bytes("nccl_bytes", process.nccl_bytes));
      MEMSCOPE_RETURN_IF_ERROR(ReadMeasured(p, process));
    }
  }
  return rows;
}

absl::StatusOr<Report> ReadBody(const json& j) {
  Report report;
  const Fields doc(j, "the report");
  report.generator.clear();
  MEMSCOPE_RETURN_IF_ERROR(doc.String("generator", report.generator));
  std::map<int, std::size_t> index;  // rank -> position in report.ranks
  for (std::size_t i = 0; i < j["ranks"].size(); ++i) {
    absl::StatusOr<RankReport> r = ReadRank(j["ranks"][i], absl::StrCat("ranks[", i, "]"));
    if (!r.ok()) return r.status();
    if (!index.emplace(r->rank, i).second) {
      return absl::InvalidArgumentError(absl::StrCat("ranks[", i, "] repeats rank ", r->rank));
    }
    report.ranks.push_back(std::move(*r));
  }
  report.world_size = static_cast<int>(report.ranks.size());
  MEMSCOPE_RETURN_IF_ERROR(doc.Int("world_size", report.world_size));
  MEMSCOPE_RETURN_IF_ERROR(doc.String("torch_version", report.torch_version));
  if (const json* failure = doc.Find("failure"); failure != nullptr && !failure->is_null()) {
    const Fields f(*failure, "failure");
    if (!failure->is_object()) return doc.Bad("\"failure\" object");
    int rank = -1;
    std::string message;
    MEMSCOPE_RETURN_IF_ERROR(f.Int("rank", rank));
    MEMSCOPE_RETURN_IF_ERROR(f.String("message", message, /*required=*/true));
    if (rank >= report.world_size && !index.contains(rank)) {
      return absl::InvalidArgumentError(
          absl::StrCat("failure names rank ", rank, ", not a rank of world_size ", report.world_size));
    }
    report.failure = ReportFailure{rank, std::move(message)};
  }
  if (const json* gpus = doc.Find("gpus"); gpus != nullptr && !gpus->is_null()) {
    absl::StatusOr<std::vector<GpuRow>> rows = ReadGpus(*gpus);
    if (!rows.ok()) return rows.status();
    report.gpus = *std::move(rows);
  }
  return report;
}

}  // namespace

std::string ReportPhaseName(const PhaseRow& row) {
  return row.phase == Phase::kUser && !row.label.empty() ? row.label : std::string(PhaseName(row.phase));
}

json ByCategoryJson(const std::array<std::int64_t, kNumCategories>& by_category) {
  json j = json::object();
  for (int c = 0; c < kNumCategories; ++c) j[std::string(CategoryName(static_cast<Category>(c)))] = by_category[c];
  return j;
}

json PoolsJson(const std::vector<PoolBytes>& pools) {
  json out = json::array();
  for (const PoolBytes& p : pools) {
    out.push_back({{"pool_id", {p.pool.first, p.pool.second}},
                   {"reserved", p.reserved},
                   {"allocated", p.allocated},
                   {"segments", p.segments}});
  }
  return out;
}

// PinnedHostBytes, for `summary --json`.
json PinnedHostJson(const PinnedHostBytes& h) {
  json actions = json::object();
  for (const auto& [action, n] : h.trace_actions) actions[action] = n;
  return {{"segments", h.segments},
          {"reserved_bytes", h.reserved},
          {"allocated_bytes", h.allocated},
          {"allocated_blocks", h.allocated_blocks},
          {"requested_bytes", h.requested},
          {"pending_free_bytes", h.pending_free},
          {"pending_free_blocks", h.pending_free_blocks},
          {"trace_entries", h.trace_entries},
          {"trace_actions", actions}};
}

json FragmentationJson(const FragmentationInfo& f) {
  return {{"reserved_bytes", f.reserved},
          {"allocated_bytes", f.allocated},
          {"reserved_minus_allocated_bytes", f.reserved_minus_allocated},
          {"inactive_split_bytes", f.inactive_split_bytes},
          {"free_in_segments_bytes", f.free_in_segments},
          {"largest_free_block_bytes", f.largest_free_block},
          {"fragmentation", f.fragmentation},
          {"segments", f.segments},
          {"free_blocks", f.free_blocks},
          {"releasable_bytes", f.releasable_bytes},
          {"releasable_ratio", f.releasable_ratio()},
          {"releasable_segments", f.releasable_segments},
          {"fragmented_bytes", f.fragmented_bytes},
          {"fragmented_ratio", f.fragmented_ratio()},
          {"fragmented_segments", f.fragmented_segments}};
}

void WriteFragmentationJson(JsonWriter& w, const FragmentationInfo& f) {
  w.BeginObject();
  w.Key("allocated_bytes");
  w.UInt(f.allocated);
  w.Key("fragmentation");
  WriteJsonDouble(w, f.fragmentation);
  w.Key("fragmented_bytes");
  w.UInt(f.fragmented_bytes);
  w.Key("fragmented_ratio");
  WriteJsonDouble(w, f.fragmented_ratio());
  w.Key("fragmented_segments");
  w.UInt(f.fragmented_segments);
  w.Key("free_blocks");
  w.UInt(f.free_blocks);
  w.Key("free_in_segments_bytes");
  w.UInt(f.free_in_segments);
  w.Key("inactive_split_bytes");
  w.UInt(f.inactive_split_bytes);
  w.Key("largest_free_block_bytes");
  w.UInt(f.largest_free_block);
  w.Key("releasable_bytes");
  w.UInt(f.releasable_bytes);
  w.Key("releasable_ratio");
  WriteJsonDouble(w, f.releasable_ratio());
  w.Key("releasable_segments");
  w.UInt(f.releasable_segments);
  w.Key("reserved_bytes");
  w.UInt(f.reserved);
  w.Key("reserved_minus_allocated_bytes");
  w.UInt(f.reserved_minus_allocated);
  w.Key("segments");
  w.UInt(f.segments);
  w.EndObject();
}

json DdpJson(const DdpBuckets& ddp) {
  json j = {
      {"mode", ddp.mode}, {"buckets", BucketsJson(ddp.buckets)}, {"rebuilt_buckets", BucketsJson(ddp.rebuilt_buckets)}};
  if (ddp.zero) {
    j["zero"] = {{"parameters_as_bucket_view", ddp.zero->parameters_as_bucket_view},
                 {"partition", ddp.zero->partition},
                 {"bucket_bytes", ddp.zero->bucket_bytes}};
  }
  return j;
}

absl::StatusOr<DdpBuckets> DdpFromJson(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("ddp is not an object");
  return ReadDdp(Fields(j, "ddp"));
}

json RankReportJson(const RankReport& r) {
  json stats = json::object();
  for (const auto& [key, value] : FlattenStats(r.stats)) stats[key] = value;
  json j = {{"rank", r.rank},
            {"device_index", r.device_index},
            {"device_capacity", r.device_capacity},
            {"alloc_conf", r.alloc_conf},
            {"events", r.events},
            {"torn_bytes", r.torn_bytes},
            {"phases", PhasesJson(r.phases)},
            {"peak", {{"allocated", PeakJson(r, r.peak_allocated)}, {"reserved", PeakJson(r, r.peak_reserved)}}},
            {"fragmentation",
             {{"end", FragmentationJson(r.fragmentation_at_end)},
              {"exit", FragmentationJson(r.fragmentation_at_exit)},
              {"peak", FragmentationJson(r.fragmentation_at_peak)},
              {"oom", r.oom ? FragmentationJson(r.oom->fragmentation) : json(nullptr)}}},
            {"oom", OomJson(r)},
            {"lower_bound_bytes", r.lower_bound},
            {"peak_reserved_bytes", r.peak_reserved.bytes},
            {"overhead_bytes", r.overhead_bytes()}};
  if (r.stats_known) j["memory_stats"] = std::move(stats);
  if (!r.pools_at_end.empty()) j["pools_at_end"] = PoolsJson(r.pools_at_end);
  if (!r.status.empty()) j["status"] = r.status;
  if (r.ddp) j["ddp"] = DdpJson(*r.ddp);
  if (!r.losses.empty()) {
    json losses = json::array();
    for (float l : r.losses) losses.push_back(std::isfinite(l) ? json(l) : json(nullptr));
    j["losses"] = std::move(losses);
  }
  return j;
}

Report MakeReport(int world_size, std::vector<RankReport> ranks) {
  Report report;
  report.world_size = world_size;
  report.ranks = std::move(ranks);
  return report;
}

json ReportToJson(const Report& report) {
  json ranks = json::array();
  for (const RankReport& r : report.ranks) ranks.push_back(RankReportJson(r));
  json j = {{"schema", report.schema},
            {"generator", report.generator},
            {"world_size", report.world_size},
            {"ranks", std::move(ranks)}};
  if (!report.torch_version.empty()) j["torch_version"] = report.torch_version;
  if (report.failure) j["failure"] = {{"rank", report.failure->rank}, {"message", report.failure->message}};
  if (!report.gpus.empty()) j["gpus"] = GpuTableJson(report.gpus);
  return j;
}

json GpuTableJson(const std::vector<GpuRow>& gpus) {
  json out = json::array();
  for (const GpuRow& g : gpus) {
    json processes = json::array();
    json shared_by = json::array();
    for (const GpuProcess& p : g.processes) {
      processes.push_back({{"rank", p.rank},
                           {"cuda", p.ordinal >= 0 ? json(p.ordinal) : json(nullptr)},
                           {"context_bytes", p.context_bytes},
                           {"reserved_bytes", p.reserved_bytes},
                           {"nccl_bytes", p.nccl_bytes},
                           {"used_bytes", p.used_bytes()}});
      if (p.measured) {
        json& m = processes.back();
        m["source"] = "measured";
        m["context_measured"] = p.context_measured;
        m["cublas_bytes"] = p.cublas_bytes;
        m["cudnn_bytes"] = p.cudnn_bytes;
        m["other_bytes"] = p.other_bytes;
        m["pytorch_segments"] = p.segments;
        m["pytorch_segments_matched"] = p.segments_matched;
      }
      if (p.ordinal >= 0) shared_by.push_back(p.rank);
    }
    out.push_back({{"physical", g.physical},
                   {"capacity_bytes", g.capacity},
                   {"used_bytes", g.used_bytes()},
                   {"shared_by_ranks", g.ranks_on_it() > 1 ? shared_by : json::array()},
                   {"processes", processes}});
  }
  return out;
}

json SummaryJson(const Report& report, const std::vector<MomentState>& at) {
  json j = ReportToJson(report);
  json moments = json::array();
  for (const MomentState& m : at) {
    json stats = json::object();
    for (const auto& [key, value] : FlattenStats(m.stats)) stats[key] = value;
    moments.push_back({{"rank", m.rank},
                       {"moment", m.moment},
                       {"events", m.events},
                       {"memory_stats", stats},
                       {"fragmentation", FragmentationJson(m.fragmentation)}});
    if (!m.pools.empty()) moments.back()["pools"] = PoolsJson(m.pools);
    if (m.pinned_host) moments.back()["pinned_host_memory"] = PinnedHostJson(*m.pinned_host);
  }
  j["at"] = std::move(moments);
  return j;
}

json ReportJson(const std::vector<const Timeline*>& timelines, const std::vector<RankReport>& reports) {
  return ReportToJson(MakeReport(timelines.empty() ? 0 : timelines.front()->world_size, reports));
}

absl::StatusOr<Report> ReportFromJson(const json& j) {
  MEMSCOPE_RETURN_IF_ERROR(CheckHeader(j));
  absl::StatusOr<Report> report = ReadBody(j);
  if (!report.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("is not a usable ", kReportSchema, ": ", report.status().message()));
  }
  return report;
}

#undef MEMSCOPE_RETURN_IF_ERROR

}  // namespace memscope
