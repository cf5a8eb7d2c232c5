#include "explain/explain.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/config.h"
#include "allocator/sizes.h"
#include "allocator/snapshot.h"
#include "analysis/trace_model.h"
#include "base/terminal_text.h"
#include "exporters/report.h"
#include "importers/snapshot_import.h"
#include "load/record_replay.h"
#include "load/recording.h"

namespace memscope {

std::string_view OomCauseName(OomCause cause) {
  switch (cause) {
    case OomCause::kMemoryFraction: return "memory_fraction";
    case OomCause::kOtherProcess: return "other_process";
    case OomCause::kPrivatePool: return "private_pool";
    case OomCause::kFragmentation: return "fragmentation";
    case OomCause::kCapacity: return "capacity";
  }
  return "capacity";
}

namespace {

// What is replayed: the requests, the settings the job ran with, and the
// memory it had.
struct Input {
  ReplaySource source{};
  AllocatorConfig config{};
  std::uint64_t gpu_memory = 0;
  std::uint64_t device_memory = 0;
};

std::string Settings(const std::string& text) { return text.empty() ? "(defaults)" : text; }

// The settings: --alloc-conf, else the recording's own, else the environment's;
// then --memory-fraction.
absl::StatusOr<AllocatorConfig> BaselineConfig(const ReplaySource& source, const ExplainOptions& options) {
  absl::StatusOr<AllocatorConfig> config = AllocatorConfig::FromEnvironment();
  if (options.alloc_conf) {
    config = AllocatorConfig::Parse(*options.alloc_conf);
    if (!config.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--alloc-conf \"", *options.alloc_conf, "\": ", config.status().message()));
    }
  } else if (source.settings) {
    config = *source.settings;
  }
  if (!config.ok()) return config.status();
  if (options.memory_fraction) {
    const double f = *options.memory_fraction;
    if (!(f >= 0.0 && f <= 1.0))
      return absl::InvalidArgumentError(absl::StrCat("--memory-fraction ", f, ": use 0 to 1"));
    config->per_process_memory_fraction = f;
  }
  return config;
}

absl::StatusOr<Input> LoadInput(const std::string& path, const ExplainOptions& options) {
  if (options.rank < 0) return absl::InvalidArgumentError("--rank must be 0 or more");
  if (options.gpu_memory && *options.gpu_memory == 0) {
    return absl::InvalidArgumentError("--device-memory: must be greater than 0");
  }
  absl::StatusOr<ReplaySource> source = OpenReplaySource(path, options.rank);
  if (!source.ok()) return source.status();
  Input in{.source = *std::move(source)};
  absl::StatusOr<AllocatorConfig> config = BaselineConfig(in.source, options);
  if (!config.ok()) return config.status();
  in.config = *std::move(config);
  const std::uint64_t own = in.source.device_memory;  // a recording's GPU, or what a snapshot's OOM implies
  const bool oom_snapshot = in.source.snapshot && in.source.snapshot->device_capacity != 0;
  if (oom_snapshot && options.gpu_memory && *options.gpu_memory >= own) {
    // The snapshot's process had reserved + free at its OOM; the rest of the GPU was someone else's.
    in.device_memory = own;
    in.gpu_memory = *options.gpu_memory;
  } else {
    in.device_memory = options.gpu_memory ? *options.gpu_memory : own != 0 ? own : kDefaultReplayDeviceMemory;
    in.gpu_memory = in.device_memory;
  }
  if (in.source.snapshot) {
    const std::string frees =
        ResolveMallocFrees(in.source.trace, in.source.snapshot->malloc_frees, in.device_memory,
                           options.gpu_memory.has_value() || in.source.snapshot->device_capacity != 0);
    if (!frees.empty()) in.source.notes.push_back(frees);
  }
  return in;
}

// One change to replay.
struct Variant {
  std::string change{};
  AllocatorConfig config{};
  bool empty_cache_at_phase_ends = false;
  std::uint64_t device_memory = 0;
};

// The settings text with `setting` added (a later key wins).
absl::StatusOr<AllocatorConfig> With(const AllocatorConfig& base, const std::string& setting) {
  absl::StatusOr<AllocatorConfig> c =
      AllocatorConfig::Parse(base.text.empty() ? setting : absl::StrCat(base.text, ",", setting));
  if (c.ok()) c->per_process_memory_fraction = base.per_process_memory_fraction;
  return c;
}

// max_split_size_mb at the values that matter: the sizes, in whole MiB, of
// the large requests (above 20 MiB, PyTorch's least value), at most three
// (the smallest, the middle one and the largest).
std::vector<std::uint64_t> SplitSizes(const RequestTrace& trace) {
  std::set<std::uint64_t> sizes;
  for (const Request& r : trace.requests) {
    if (r.op == RequestOp::kAlloc && r.size > kLargeBuffer) sizes.insert((r.size + kMiB - 1) / kMiB);
  }
  std::vector<std::uint64_t> all(sizes.begin(), sizes.end());
  if (all.size() <= 3) return all;
  return {all.front(), all[all.size() / 2], all.back()};
}

bool HasPhaseEnds(const RequestTrace& trace) {
  return std::any_of(trace.requests.begin(), trace.requests.end(),
                     [](const Request& r) { return r.op == RequestOp::kPhaseEnd; });
}

std::vector<Variant> Variants(const Input& in) {
  const AllocatorConfig& base = in.config;
  std::vector<Variant> out;
  auto add = [&](std::string change, absl::StatusOr<AllocatorConfig> config) {
    if (config.ok()) out.push_back({std::move(change), *std::move(config), false, in.device_memory});
  };
  if (!base.expandable_segments) add("expandable_segments:True", With(base, "expandable_segments:True"));
  for (std::uint64_t mb : SplitSizes(in.source.trace)) {
    const std::string s = absl::StrCat("max_split_size_mb:", mb);
    if (base.max_split_size != mb * kMiB) add(s, With(base, s));
  }
  const bool fraction = base.per_process_memory_fraction < 1.0;
  if (fraction && base.garbage_collection_threshold <= 0.0) {
    add("garbage_collection_threshold:0.8", With(base, "garbage_collection_threshold:0.8"));
  }
  if (HasPhaseEnds(in.source.trace)) out.push_back({"empty_cache() after every phase", base, true, in.device_memory});
  if (fraction) {
    AllocatorConfig whole = base;
    whole.per_process_memory_fraction = 1.0;
    out.push_back({"no memory fraction", whole, false, in.device_memory});
  }
  if (in.gpu_memory > in.device_memory) {
    out.push_back({absl::StrCat("the whole GPU (", FormatSize(in.gpu_memory), ")"), base, false, in.gpu_memory});
  }
  return out;
}

// The trace with an empty_cache() after every phase end.
RequestTrace EmptyCacheAtPhaseEnds(const RequestTrace& trace) {
  RequestTrace out = trace;
  out.requests.clear();
  for (const Request& r : trace.requests) {
    out.requests.push_back(r);
    if (r.op == RequestOp::kPhaseEnd) {
      out.requests.push_back({.op = RequestOp::kEmptyCache, .line = r.line, .time_us = r.time_us});
    }
  }
  return out;
}

std::uint64_t PeakReserved(const ReplayResult& r) {
  return static_cast<std::uint64_t>(All(r.stats.reserved_bytes).peak);
}

absl::StatusOr<WhatIf> RunVariant(const RequestTrace& trace, const Variant& v,
                                  std::optional<std::uint64_t> baseline_min) {
  std::optional<RequestTrace> changed;
  if (v.empty_cache_at_phase_ends) changed = EmptyCacheAtPhaseEnds(trace);
  const RequestTrace& replayed = changed ? *changed : trace;
  absl::StatusOr<ReplayResult> r = Replay(replayed, v.config, v.device_memory);
  if (!r.ok()) return r.status();
  absl::StatusOr<std::optional<std::uint64_t>> min = MinDeviceMemory(replayed, v.config);
  if (!min.ok()) return min.status();
  WhatIf w{.change = v.change,
           .alloc_conf = v.config.text,
           .memory_fraction = v.config.per_process_memory_fraction,
           .empty_cache_at_phase_ends = v.empty_cache_at_phase_ends,
           .device_memory = v.device_memory,
           .oom = r->oom,
           .peak_reserved = PeakReserved(*r),
           .min_device_memory = *min};
  if (baseline_min && *min) {
    w.saved_bytes = static_cast<std::int64_t>(*baseline_min) - static_cast<std::int64_t>(**min);
  }
  return w;
}

// Those that run on this memory first (when the baseline did not), then by
// bytes saved, largest first; ties keep their order.
void RankWhatIfs(std::vector<WhatIf>& what_ifs) {
  std::stable_sort(what_ifs.begin(), what_ifs.end(), [](const WhatIf& a, const WhatIf& b) {
    if (a.oom.has_value() != b.oom.has_value()) return !a.oom.has_value();
    constexpr std::int64_t kUnknown = std::numeric_limits<std::int64_t>::min();
    return a.saved_bytes.value_or(kUnknown) > b.saved_bytes.value_or(kUnknown);
  });
}

// Free cached bytes in the pools other than `pool`, and the largest such block.
std::pair<std::uint64_t, std::uint64_t> CachedOutside(const std::vector<PoolCache>& pools, const PoolId& pool) {
  std::uint64_t bytes = 0, largest = 0;
  for (const PoolCache& c : pools) {
    if (c.pool == pool) continue;
    bytes += c.free_bytes;
    largest = std::max(largest, c.largest_free);
  }
  return {bytes, largest};
}

OomCause CauseOf(const MemoryExplanation& e) {
  const OutOfMemoryInfo& info = e.oom->info;
  const double fraction = e.memory_fraction;
  if (fraction < 1.0 && info.device_free >= info.alloc_size) return OomCause::kMemoryFraction;
  if (e.outside_bytes > 0 && info.device_free + e.outside_bytes >= info.alloc_size) return OomCause::kOtherProcess;
  // A request in a private pool is served by its pool's blocks and new
  // segments only, and its OOM releases only its pool's cache: the other
  // pools' free blocks could have held it.
  if (e.oom_pool && CachedOutside(e.moment.cached_by_pool, *e.oom_pool).first >= info.rounded) {
    return OomCause::kPrivatePool;
  }
  const auto allowed = fraction < 1.0 ? static_cast<std::uint64_t>(fraction * static_cast<double>(info.device_total))
                                      : static_cast<std::uint64_t>(info.device_total);
  if (info.allocated + info.rounded <= allowed) return OomCause::kFragmentation;
  return OomCause::kCapacity;
}

std::vector<PoolCache> CachedByPool(const TraceModel& model, const std::vector<PoolId>& pools) {
  std::vector<PoolCache> out;
  for (const SegmentInfo& seg : model.Snapshot(0, pools)) {
    auto it = std::find_if(out.begin(), out.end(), [&](const PoolCache& c) { return c.pool == seg.pool_id; });
    if (it == out.end()) it = out.insert(out.end(), PoolCache{.pool = seg.pool_id});
    for (const BlockInfo& b : seg.blocks) {
      if (b.state != BlockState::kInactive) continue;
      it->free_bytes += b.size;
      it->largest_free = std::max<std::uint64_t>(it->largest_free, b.size);
    }
  }
  return out;
}

// What filled the device at the OOM (or at the peak of allocated), from the
// baseline's recording.
absl::StatusOr<MomentMemory> MemoryAt(const Timeline& t, const RankReport& report) {
  MomentMemory m;
  if (report.oom) {
    absl::StatusOr<std::pair<TraceModel, std::size_t>> at =
        ModelAt(t, Moment{.kind = Moment::Kind::kOom, .text = "oom"}, &report);
    if (!at.ok()) return at.status();
    m.name = "oom";
    m.phase = report.oom->phase;
    m.allocated = report.oom->fragmentation.allocated;
    m.reserved = report.oom->fragmentation.reserved;
    m.by_category = at->first.allocated_by_category();
    m.top_sites = report.oom->top_sites;
    m.cached_by_pool = CachedByPool(at->first, t.pools);
    return m;
  }
  m.name = "peak";
  m.phase = report.peak_allocated.phase;
  m.allocated = report.peak_allocated.bytes;
  m.by_category = report.peak_allocated.by_category;
  m.top_sites = report.peak_allocated.top_sites;
  m.reserved = report.fragmentation_at_peak.reserved;
  return m;
}

std::string Signed(std::int64_t bytes) {
  if (bytes == 0) return "0 bytes";
  return bytes >= 0 ? absl::StrCat(FormatSize(static_cast<std::uint64_t>(bytes)), " less")
                    : absl::StrCat(FormatSize(static_cast<std::uint64_t>(-bytes)), " more");
}

std::string MinText(std::optional<std::uint64_t> min) { return min ? FormatSize(*min) : std::string("over 1 TiB"); }

std::string CauseLine(const MemoryExplanation& e) {
  const OutOfMemoryInfo& i = e.oom->info;
  switch (*e.cause) {
    case OomCause::kMemoryFraction:
      return absl::StrCat(
          "Cause: the memory fraction. set_per_process_memory_fraction(", e.memory_fraction, ") allows this process ",
          FormatSize(static_cast<std::uint64_t>(e.memory_fraction * static_cast<double>(e.device_memory))),
          " of the GPU's ", FormatSize(e.device_memory), "; with ", FormatSize(i.reserved),
          " reserved, a new segment of ", FormatSize(i.alloc_size), " would pass it, though the device had ",
          FormatSize(i.device_free), " free.");
    case OomCause::kOtherProcess:
      return absl::StrCat("Cause: another process (or rank) on the GPU. Of its ", FormatSize(e.gpu_memory),
                          ", this process had reserved ", FormatSize(i.reserved), " and ", FormatSize(i.device_free),
                          " was free: ", FormatSize(e.outside_bytes), " was held outside it, without which the ",
                          FormatSize(i.alloc_size), " segment would have fit.");
    case OomCause::kPrivatePool: {
      const PoolId& p = *e.oom_pool;
      const auto [outside, largest] = CachedOutside(e.moment.cached_by_pool, p);
      std::uint64_t own = 0;
      for (const PoolCache& c : e.moment.cached_by_pool) own += c.pool == p ? c.free_bytes : 0;
      return absl::StrCat("Cause: a private pool. The request was in private pool (", p.first, ", ", p.second,
                          ") (a CUDA graph or torch.cuda.MemPool), which only its own cached blocks (", FormatSize(own),
                          " free) and new segments serve, and whose OOM releases only its own cache: ",
                          FormatSize(outside), " was free in the other pools' cached blocks (the largest ",
                          FormatSize(largest), "), which it cannot use, and the device had ", FormatSize(i.device_free),
                          " free, too little for a new segment of ", FormatSize(i.alloc_size), ".");
    }
    case OomCause::kFragmentation:
      return absl::StrCat("Cause: fragmentation. ", FormatSize(i.allocated), " allocated plus the ",
                          FormatSize(i.rounded), " asked fit in this process's ", FormatSize(i.device_total), ", and ",
                          FormatSize(i.cached_free), " was free in the cache (the largest block ",
                          FormatSize(i.largest_free_block), ") with ", FormatSize(i.device_free),
                          " free on the device, but no free block and no new segment of ", FormatSize(i.alloc_size),
                          " fit.");
    case OomCause::kCapacity: break;
  }
  return absl::StrCat("Cause: capacity. ", FormatSize(i.allocated), " allocated plus the ", FormatSize(i.rounded),
                      " asked is more than this process's ", FormatSize(i.device_total),
                      ": no allocator setting fits them; the smallest GPU that runs the requests is ",
                      MinText(e.min_device_memory), ".");
}

// "Would have avoided it: ..." / the best setting of a run without an OOM.
std::string RemedyLine(const MemoryExplanation& e) {
  std::vector<std::string> parts;
  for (const WhatIf& w : e.what_ifs) {
    if (e.oom && w.oom) continue;
    if (!e.oom && w.saved_bytes.value_or(0) <= 0) continue;
    std::string part = absl::StrCat(w.change, " (needs ", MinText(w.min_device_memory));
    if (w.saved_bytes.value_or(0) != 0) absl::StrAppend(&part, ", ", Signed(*w.saved_bytes));
    parts.push_back(absl::StrCat(part, ")"));
  }
  if (e.oom) {
    if (parts.empty()) return "None of the changes tried runs on this memory (the what-if table below).";
    return absl::StrCat("Would have avoided it (each a replay of the same requests): ", absl::StrJoin(parts, "; "),
                        ".");
  }
  if (parts.empty()) return "None of the changes tried needs less memory (the what-if table below).";
  return absl::StrCat("Would need less memory (each a replay of the same requests): ", absl::StrJoin(parts, "; "), ".");
}

std::vector<std::string> Diagnose(const MemoryExplanation& e) {
  std::vector<std::string> lines;
  if (e.oom) {
    const ReplayOom& o = *e.oom;
    lines.push_back(absl::StrCat("OOM at request ", o.request_index + 1, " of ", e.requests, " (line ", o.line,
                                 ", alloc \"", o.id, "\"", e.moment.phase.empty() ? "" : " in ", e.moment.phase,
                                 "): asked for ", FormatSize(o.info.requested), " (a ", FormatSize(o.info.alloc_size),
                                 " segment); the GPU had ", FormatSize(o.info.device_free), " free of ",
                                 FormatSize(e.gpu_memory), "."));
    lines.push_back(CauseLine(e));
  } else {
    lines.push_back(absl::StrCat(
        "No OOM. Peak reserved ", FormatSize(e.peak_reserved), " (peak allocated ", FormatSize(e.moment.allocated),
        e.moment.phase.empty() ? "" : " in ", e.moment.phase, "); headroom ",
        FormatSize(e.device_memory > e.peak_reserved ? e.device_memory - e.peak_reserved : 0), " of the ",
        FormatSize(e.device_memory), " GPU; the smallest GPU that runs it is ", MinText(e.min_device_memory), "."));
    const std::string made = CategoryBreakdown(e.moment.by_category, e.moment.allocated, 3);
    if (!made.empty()) lines.push_back(absl::StrCat("The peak was made of ", made, "."));
  }
  lines.push_back(RemedyLine(e));
  return lines;
}

}  // namespace

absl::StatusOr<MemoryExplanation> Explain(const std::string& path, const ExplainOptions& options) {
  absl::StatusOr<Input> in = LoadInput(path, options);
  if (!in.ok()) return in.status();
  const RequestTrace& trace = in->source.trace;
  MemoryExplanation e{.source = trace.source,
                      .rank = options.rank,
                      .requests = trace.requests.size(),
                      .alloc_conf = in->config.text,
                      .memory_fraction = in->config.per_process_memory_fraction,
                      .gpu_memory = in->gpu_memory,
                      .device_memory = in->device_memory,
                      .outside_bytes = in->gpu_memory - in->device_memory,
                      .lower_bound = PeakLiveBytes(trace)};
  e.notes = in->source.notes;
  ReplayResult baseline;
  absl::StatusOr<Timeline> t = RecordReplay(trace, in->config, in->device_memory, options.rank, &baseline);
  if (!t.ok()) return t.status();
  absl::StatusOr<RankReport> report = AnalyzeRank(*t);
  if (!report.ok()) return report.status();
  absl::StatusOr<MomentMemory> moment = MemoryAt(*t, *report);
  if (!moment.ok()) return moment.status();
  e.moment = *std::move(moment);
  e.oom = baseline.oom;
  e.peak_reserved = PeakReserved(baseline);
  absl::StatusOr<std::optional<std::uint64_t>> min = MinDeviceMemory(trace, in->config);
  if (!min.ok()) return min.status();
  e.min_device_memory = *min;
  if (e.oom) {
    const Request& r = trace.requests[e.oom->request_index];
    if (r.pool != 0 && r.pool < trace.pools.size()) e.oom_pool = trace.pools[r.pool];
    e.cause = CauseOf(e);
  }
  for (const Variant& v : Variants(*in)) {
    absl::StatusOr<WhatIf> w = RunVariant(trace, v, e.min_device_memory);
    if (!w.ok()) return w.status();
    e.what_ifs.push_back(*std::move(w));
  }
  RankWhatIfs(e.what_ifs);
  e.diagnosis = Diagnose(e);
  return e;
}

namespace {

std::string Outcome(const std::optional<ReplayOom>& oom) {
  return oom ? absl::StrCat("OOM at request ", oom->request_index + 1) : std::string("ok");
}

std::string WhatIfTable(const MemoryExplanation& e) {
  const char* kRow = "%-40s %-18s %13s %12s  %s\n";
  std::string out = absl::StrFormat(kRow, "change", "result", "peak reserved", "min memory", "saved");
  out += absl::StrFormat(kRow, absl::StrCat(EscapeForTerminal(Settings(e.alloc_conf)), " as recorded"), Outcome(e.oom),
                         FormatSize(e.peak_reserved), MinText(e.min_device_memory), "-");
  for (const WhatIf& w : e.what_ifs) {
    out += absl::StrFormat(kRow, EscapeForTerminal(w.change), Outcome(w.oom), FormatSize(w.peak_reserved),
                           MinText(w.min_device_memory), w.saved_bytes ? Signed(*w.saved_bytes) : std::string("-"));
  }
  return out;
}

std::string TrainingText(const MemoryExplanation& e) {
  if (!e.training) {
    return e.training_note.empty()
               ? std::string()
               : absl::StrCat("\ntraining-side changes: ", EscapeForTerminal(e.training_note), "\n");
  }
  const TrainingChanges& t = *e.training;
  std::string out =
      absl::StrCat("\ntraining-side changes: the memscope plan strategies at the run's batch of ", t.batch_size,
                   " per rank on its ", FormatSize(t.device_memory), " (", EscapeForTerminal(t.command), "):\n");
  const char* kRow = "%-24s %-12s %13s  %s\n";
  absl::StrAppend(&out, absl::StrFormat(kRow, "strategy", "batch", "peak reserved", "saved"));
  for (const TrainingChange& c : t.rows) {
    const std::string name = absl::StrCat(c.strategy, c.own ? " (the run's)" : "");
    if (!c.error.empty()) {
      absl::StrAppend(&out, absl::StrFormat(kRow, name, "error", "-", EscapeForTerminal(c.error)));
      continue;
    }
    const std::string batch = c.fits            ? absl::StrCat(c.max_batch, " fits")
                              : c.max_batch > 0 ? absl::StrCat("only ", c.max_batch)
                                                : std::string("OOM");
    absl::StrAppend(&out, absl::StrFormat(kRow, name, batch, c.max_batch > 0 ? FormatSize(c.peak_reserved) : "-",
                                          c.saved_bytes ? Signed(*c.saved_bytes) : std::string("-")));
  }
  return out;
}

}  // namespace

void RankTrainingChanges(std::vector<TrainingChange>& rows) {
  const auto own = std::find_if(rows.begin(), rows.end(), [](const TrainingChange& c) { return c.own; });
  const std::optional<std::uint64_t> base = own != rows.end() && own->fits && own->error.empty()
                                                ? std::optional<std::uint64_t>(own->peak_reserved)
                                                : std::nullopt;
  for (TrainingChange& c : rows) {
    if (base && c.fits && c.error.empty()) {
      c.saved_bytes = static_cast<std::int64_t>(*base) - static_cast<std::int64_t>(c.peak_reserved);
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const TrainingChange& a, const TrainingChange& b) {
    const bool fa = a.fits && a.error.empty(), fb = b.fits && b.error.empty();
    if (fa != fb) return fa;
    if (fa) return a.peak_reserved < b.peak_reserved;
    return a.max_batch > b.max_batch;
  });
}

std::string ExplanationText(const MemoryExplanation& e) {
  std::string out = absl::StrCat("memscope explain: ", EscapeForTerminal(e.source), ", rank ", e.rank, ": ", e.requests,
                                 " requests, alloc_conf ", EscapeForTerminal(Settings(e.alloc_conf)));
  if (e.memory_fraction < 1.0) absl::StrAppend(&out, ", memory fraction ", e.memory_fraction);
  absl::StrAppend(&out, ", simulated GPU of ", FormatSize(e.device_memory));
  if (e.outside_bytes > 0) {
    absl::StrAppend(&out, " (of ", FormatSize(e.gpu_memory), "; ", FormatSize(e.outside_bytes), " held outside)");
  }
  absl::StrAppend(&out, "\n");
  for (const std::string& line : e.diagnosis) absl::StrAppend(&out, EscapeForTerminal(line), "\n");
  const MomentMemory& m = e.moment;
  absl::StrAppend(&out, "\nat the ", m.name == "oom" ? "OOM" : "peak", m.phase.empty() ? "" : " in ",
                  EscapeForTerminal(m.phase), ": allocated ", FormatSize(m.allocated), ", reserved ",
                  FormatSize(m.reserved));
  const std::string categories = CategoryBreakdown(m.by_category, m.allocated);
  if (!categories.empty()) absl::StrAppend(&out, ": ", categories);
  absl::StrAppend(&out, "\n");
  absl::StrAppend(
      &out,
      SitesText(m.name == "oom" ? "top allocation sites at the OOM" : "top allocation sites at the peak", m.top_sites));
  absl::StrAppend(&out, "lower bound (peak live requested bytes) ", FormatSize(e.lower_bound), "\n");
  absl::StrAppend(&out, "\nwhat-if: the same ", e.requests, " requests replayed with one change on the same ",
                  FormatSize(e.device_memory), " (min memory: the smallest GPU that runs them all):\n", WhatIfTable(e));
  absl::StrAppend(&out, TrainingText(e));
  return out;
}

namespace {

nlohmann::json Optional(std::optional<std::uint64_t> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

nlohmann::json SitesJson(const std::vector<SiteBytes>& sites) {
  nlohmann::json out = nlohmann::json::array();
  for (const SiteBytes& s : sites)
    out.push_back({{"site", s.site}, {"bytes", s.bytes}, {"allocations", s.allocations}});
  return out;
}

nlohmann::json OomJson(const MemoryExplanation& e) {
  const ReplayOom& o = *e.oom;
  const OomCause cause = *e.cause;
  nlohmann::json pools = nlohmann::json::array();
  for (const PoolCache& c : e.moment.cached_by_pool) {
    pools.push_back({{"pool", {c.pool.first, c.pool.second}},
                     {"cached_free_bytes", c.free_bytes},
                     {"largest_free_block", c.largest_free}});
  }
  return {{"request_index", o.request_index},
          {"pool", e.oom_pool ? nlohmann::json({e.oom_pool->first, e.oom_pool->second}) : nlohmann::json()},
          {"cached_by_pool", pools},
          {"line", o.line},
          {"id", o.id},
          {"requested_bytes", o.info.requested},
          {"rounded_bytes", o.info.rounded},
          {"alloc_size", o.info.alloc_size},
          {"device_free", o.info.device_free},
          {"device_total", o.info.device_total},
          {"allocated_bytes", o.info.allocated},
          {"reserved_bytes", o.info.reserved},
          {"cached_free_bytes", o.info.cached_free},
          {"largest_free_block", o.info.largest_free_block},
          {"cause", std::string(OomCauseName(cause))}};
}

nlohmann::json WhatIfJson(const WhatIf& w) {
  return {{"change", w.change},
          {"alloc_conf", w.alloc_conf},
          {"memory_fraction", w.memory_fraction},
          {"empty_cache_at_phase_ends", w.empty_cache_at_phase_ends},
          {"device_memory", w.device_memory},
          {"oom_request_index", w.oom ? nlohmann::json(w.oom->request_index) : nlohmann::json(nullptr)},
          {"peak_reserved_bytes", w.peak_reserved},
          {"min_device_memory", Optional(w.min_device_memory)},
          {"saved_bytes", w.saved_bytes ? nlohmann::json(*w.saved_bytes) : nlohmann::json(nullptr)}};
}

nlohmann::json TrainingJson(const MemoryExplanation& e) {
  if (!e.training) return nullptr;
  const TrainingChanges& t = *e.training;
  nlohmann::json rows = nlohmann::json::array();
  for (const TrainingChange& c : t.rows) {
    rows.push_back({{"strategy", c.strategy},
                    {"own", c.own},
                    {"max_batch", c.max_batch},
                    {"fits", c.fits},
                    {"peak_reserved_bytes", c.max_batch > 0 ? nlohmann::json(c.peak_reserved) : nlohmann::json()},
                    {"saved_bytes", c.saved_bytes ? nlohmann::json(*c.saved_bytes) : nlohmann::json()},
                    {"error", c.error.empty() ? nlohmann::json() : nlohmann::json(c.error)}});
  }
  return {{"command", t.command}, {"batch_size", t.batch_size}, {"device_memory", t.device_memory}, {"rows", rows}};
}

}  // namespace

nlohmann::json ExplanationJson(const MemoryExplanation& e) {
  nlohmann::json what_ifs = nlohmann::json::array();
  for (const WhatIf& w : e.what_ifs) what_ifs.push_back(WhatIfJson(w));
  const MomentMemory& m = e.moment;
  return {{"source", e.source},
          {"rank", e.rank},
          {"requests", e.requests},
          {"alloc_conf", e.alloc_conf},
          {"memory_fraction", e.memory_fraction},
          {"gpu_memory", e.gpu_memory},
          {"device_memory", e.device_memory},
          {"outside_bytes", e.outside_bytes},
          {"lower_bound_bytes", e.lower_bound},
          {"min_device_memory", Optional(e.min_device_memory)},
          {"peak_reserved_bytes", e.peak_reserved},
          {"oom", e.oom ? OomJson(e) : nlohmann::json(nullptr)},
          {"moment",
           {{"name", m.name},
            {"phase", m.phase},
            {"allocated_bytes", m.allocated},
            {"reserved_bytes", m.reserved},
            {"by_category", ByCategoryJson(m.by_category)},
            {"top_sites", SitesJson(m.top_sites)}}},
          {"diagnosis", e.diagnosis},
          {"what_ifs", what_ifs},
          {"training", TrainingJson(e)},
          {"training_note", e.training_note.empty() ? nlohmann::json() : nlohmann::json(e.training_note)}};
}

}  // namespace memscope
