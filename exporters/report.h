// What memscope writes about a recording: report.json (versioned schema,
// memscope.report/1) and the text tables a person reads first.
//
// report.json is a `Report`: ReportToJson writes it, ReportFromJson reads and
// validates it (exporters/report_json.cpp holds both, so they cannot drift).
//
//   {"schema": "memscope.report/1", "generator": "memscope 0.1.0", "world_size": N,
//    "torch_version": "X.Y"   (memscope run: its --torch-version; absent in other reports and in
//                              reports written before memscope had it)
//    "failure": {"rank", "message"}   (memscope run, only when a rank failed: the run's first failure;
//                                      its rank may have no entry in "ranks": a rank that recorded nothing)
//    "ranks": [{
//      "rank", "device_index", "device_capacity", "alloc_conf", "events", "torn_bytes",
//      "phases": [{"step" (null before the first step), "phase" (its name, or a user phase's label),
//                  "allocated_bytes", "max_allocated_bytes", "reserved_bytes", "max_reserved_bytes",
//                  "peak_allocated_bytes_in_phase", "by_category": {CATEGORY: bytes}}],
//      "peak": {"allocated": PEAK, "reserved": PEAK},
//         PEAK = {"bytes", "time_us", "phase" ("" when none was open), "by_category": {...},
//                 "top_owners": [{"owner", "bytes"}], "top_sites": [SITE]}
//         SITE = {"site", "bytes", "allocations"}: allocated bytes by allocation site, largest
//                first, at most 10 (analysis.h SiteBytes: an imported allocation's stack, the user's
//                frames innermost first joined by " <- "; else "CATEGORY owner")
//      "fragmentation": {"end": FRAG, "peak": FRAG, "oom": FRAG or null},
//         FRAG = {"reserved_bytes", "allocated_bytes", "reserved_minus_allocated_bytes",
//                 "inactive_split_bytes", "free_in_segments_bytes", "largest_free_block_bytes",
//                 "fragmentation", "segments", "free_blocks"}
//      "oom": null or {"time_us", "phase", "requested_bytes", "rounded_bytes", "device_free_bytes",
//                      "caused_by_fragmentation", "verdict", "top_sites": [SITE] (who held the memory)},
//      "memory_stats": {every torch.cuda.memory_stats() key, flattened},
//      "lower_bound_bytes", "peak_reserved_bytes" (= peak.reserved.bytes),
//      "overhead_bytes" (peak_reserved_bytes - lower_bound_bytes, at least 0),
//      "status"   (memscope run: "ok", "oom", "error", "comm_error", "nccl_error", "failed", "stopped", "killed"),
//      "ddp"      (memscope run, DDP ranks: DDP below),
//      "losses"   (memscope run --exec cpu: this rank's loss on its shard of the batch, one per
//                  micro-batch, null where it diverged; absent when no values were computed)}],
//    "gpus": [GPU]  (memscope run, only with memory outside the allocator or a GPU shared by ranks;
//                    written by run/gpu_table.h, not part of Report: readers ignore it)}
//   GPU = {"physical", "capacity_bytes", "used_bytes", "shared_by_ranks": [ranks],
//          "processes": [{"rank", "cuda" (null: a stray context), "context_bytes", "reserved_bytes" (peak),
//                         "nccl_bytes", "used_bytes" (= context + reserved + nccl)}]}
//   DDP = {"mode": "copy" or "view", "buckets": [BUCKET], "rebuilt_buckets": [BUCKET]}
//      BUCKET = {"index", "bytes", "dtype", "params": [parameter names, in the bucket's order]}
//   CATEGORY: every allocator category ("PARAMETER", "ACTIVATION", ...).
//   time_us: wall-clock microseconds (Unix time).
//
// Reading: "schema", "ranks" and, per rank, "rank" (each once) and "peak"
// (allocated: bytes and by_category; reserved: bytes) are required, and a
// phase row needs its phase, allocated, max allocated and reserved bytes and
// by_category; the rest may be missing, as in a report written by an older
// memscope or by hand (numbers read as 0, "oom" as none, "memory_stats" as
// unknown). A field that is there must have its type (bytes non-negative,
// categories and memory_stats keys known); peak_reserved_bytes, when there,
// equals peak.reserved.bytes; "failure" names a rank of the run (below
// world_size).
#ifndef MEMSCOPE_EXPORTERS_REPORT_H_
#define MEMSCOPE_EXPORTERS_REPORT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/analysis.h"
#include "nlohmann/json.hpp"
#include "recording/event.h"

namespace memscope {

class JsonWriter;  // base/json_writer.h

inline constexpr const char* kReportSchema = "memscope.report/1";
inline constexpr const char* kMemscopeVersion = "memscope 0.1.0";

// The first failure of a run (memscope run): the rank that failed first and
// what was said about it ("rank 1 was killed by signal 9 (SIGKILL)").
struct ReportFailure {
  int rank = 0;
  std::string message;
  bool operator==(const ReportFailure&) const = default;
};

// The whole GPU as nvidia-smi lists its processes (run/gpu_table.h makes it
// from the ranks' rank-R.json): per physical GPU, each rank's CUDA context,
// peak reserved bytes and NCCL buffers. Modelled (memscope run: the
// context and NCCL sizes it was given) or, for a `memscope capture
// --all-device-memory`, measured (CUPTI's allocations by calling library,
// NVML's used memory less them as the context): then cuBLAS, cuDNN and
// other libraries have their own columns.
struct GpuProcess {
  int rank = 0;
  int ordinal = -1;  // the rank's cuda:N for this GPU; -1 for a stray context (not its device)
  std::uint64_t context_bytes = 0;   // measured: NVML's used less the allocations at that moment (0: no NVML)
  std::uint64_t reserved_bytes = 0;  // the rank's peak reserved (max_memory_reserved); measured: PyTorch's allocations' peak
  std::uint64_t nccl_bytes = 0;
  bool measured = false;
  std::uint64_t cublas_bytes = 0;  // measured only, as the rest
  std::uint64_t cudnn_bytes = 0;
  std::uint64_t other_bytes = 0;   // every other library's allocations (and those whose caller was not found)
  int segments_matched = 0;        // the snapshot's segments found among the device allocations, by address...
  int segments = 0;                // ...of its segments
  bool context_measured = false;   // NVML answered (else the context is unknown, shown as 0)
  std::uint64_t used_bytes() const {
    return context_bytes + reserved_bytes + nccl_bytes + cublas_bytes + cudnn_bytes + other_bytes;
  }
  bool operator==(const GpuProcess&) const = default;
};
struct GpuRow {
  int physical = 0;
  std::uint64_t capacity = 0;
  std::vector<GpuProcess> processes;  // by rank; a rank's own device before its stray context
  std::uint64_t used_bytes() const;
  int ranks_on_it() const;  // processes whose device it is
  bool operator==(const GpuRow&) const = default;
};

// The table's text (summary.txt, `memscope summary`): one line per process,
// a total per GPU, and a note on each GPU that two ranks share (allowed with
// Gloo; NCCL refuses it).
std::string GpuTableText(const std::vector<GpuRow>& gpus);

// report.json's "gpus": [{"physical", "capacity_bytes", "used_bytes", "shared_by_ranks",
//   "processes": [{"rank", "cuda", "context_bytes", "reserved_bytes", "nccl_bytes", "used_bytes"}]}]
// ("cuda": the rank's ordinal for it, null for a stray context). A measured
// process adds "source": "measured", "context_measured", "cublas_bytes",
// "cudnn_bytes", "other_bytes", "pytorch_segments" and
// "pytorch_segments_matched"; a process without "source" is modelled.
nlohmann::json GpuTableJson(const std::vector<GpuRow>& gpus);

// report.json as a value.
struct Report {
  std::string schema = kReportSchema;
  std::string generator = kMemscopeVersion;  // what wrote it; "" when a read report does not say
  int world_size = 0;
  std::string torch_version;      // memscope run's --torch-version; "" when the report has none
  std::vector<RankReport> ranks;  // memscope writes them by rank; a read report keeps the file's order
  // memscope run: the run's first failure. Run-level, since the rank that
  // failed first may have recorded nothing (no timeline, no entry in `ranks`).
  std::optional<ReportFailure> failure;
  // The whole-GPU table ("gpus"), when there is more to a run's GPUs than
  // the allocator's view (contexts, NCCL buffers, shared GPUs); else empty.
  std::vector<GpuRow> gpus;
};

// One rank at the moment `memscope summary --at` asked for: summary --json's
// "at" entries.
struct MomentState {
  int rank = 0;
  std::string moment;      // as given: end, peak, backward:1, ...
  std::size_t events = 0;  // the events up to the moment
  DeviceStats stats;
  FragmentationInfo fragmentation;
  std::vector<PoolBytes> pools;  // bytes by pool (only with private pools)
  std::optional<PinnedHostBytes> pinned_host;  // a snapshot's pinned host memory (PinnedHostOf)
};

// `memscope summary --json`: the report's document plus "at", one entry per
// rank: {"rank", "moment", "events", "memory_stats", "fragmentation"[, "pools"][, "pinned_host_memory"]}
// (pinned_host_memory: the snapshot's, at the snapshot whatever the moment).
nlohmann::json SummaryJson(const Report& report, const std::vector<MomentState>& at);

// The report of `ranks` (AnalyzeRank's, amended or not) of a run of
// `world_size` ranks, by this memscope.
Report MakeReport(int world_size, std::vector<RankReport> ranks);

// report.json's document.
nlohmann::json ReportToJson(const Report& report);

// One rank's object of report.json.
nlohmann::json RankReportJson(const RankReport& rank);

// `reports[i]` analyses `timelines[i]`: ReportToJson(MakeReport(...)) with
// the world size the timelines recorded.
nlohmann::json ReportJson(const std::vector<const Timeline*>& timelines, const std::vector<RankReport>& reports);

// The largest report.json read (docs/report-json.md): tens of KiB a rank,
// so thousands of ranks.
inline constexpr std::uint64_t kMaxReportJsonBytes = std::uint64_t{1} << 30;

// Reads and validates report.json. ReportToJson(*ReportFromJson(j)) == j for
// what memscope writes. Errors (InvalidArgument) read after the name of what
// was read ("'run/report.json' " + message):
//   "is not a JSON object (expected memscope.report/1)",
//   "has no \"schema\" (expected memscope.report/1)",
//   "has schema 'memscope.run/1', not memscope.report/1",
//   "has no \"ranks\" array",
//   "is not a usable memscope.report/1: rank 1 phases[3] has no \"reserved_bytes\" (bytes)".
absl::StatusOr<Report> ReportFromJson(const nlohmann::json& json);

// DDP above: the "ddp" object of a rank (also what a rank of `memscope run`
// records in its rank-R.json). DdpFromJson's errors name the field
// ("ddp.buckets[1] has no \"bytes\" (bytes)").
nlohmann::json DdpJson(const DdpBuckets& ddp);
absl::StatusOr<DdpBuckets> DdpFromJson(const nlohmann::json& json);

// FRAG above; the Write form streams the same object (keys sorted, as
// nlohmann's dump prints them).
nlohmann::json FragmentationJson(const FragmentationInfo& f);
// [{"pool_id": [a, b], "reserved", "allocated", "segments"}, ...] (BytesByPool).
nlohmann::json PoolsJson(const std::vector<PoolBytes>& pools);
// {"segments", "reserved_bytes", "allocated_bytes", "allocated_blocks", "requested_bytes",
//  "pending_free_bytes", "pending_free_blocks", "trace_entries", "trace_actions": {action: n}}
nlohmann::json PinnedHostJson(const PinnedHostBytes& host);
void WriteFragmentationJson(JsonWriter& w, const FragmentationInfo& f);

// {CATEGORY: bytes} for every category, as report.json's "by_category".
nlohmann::json ByCategoryJson(const std::array<std::int64_t, kNumCategories>& by_category);

// A phase row's "phase" in report.json: the phase's name ("forward"), or a
// user phase's label.
std::string ReportPhaseName(const PhaseRow& row);

// "ACTIVATION 812.00 MiB (86%), PARAMETER 288.00 MiB (30%)": the categories
// holding memory, largest first, at most `max_parts` of them, with their share
// of `total`. "" when nothing is allocated.
std::string CategoryBreakdown(const std::array<std::int64_t, kNumCategories>& by_category, std::uint64_t total,
                              std::size_t max_parts = kNumCategories);

// The top allocation sites as `summary` and `frag` print them: a title line,
// then one line per site (bytes, allocations, site). "" when there are none.
std::string SitesText(std::string_view title, const std::vector<SiteBytes>& sites);

// The text of `memscope summary` for one rank: header, phase table, peaks,
// lower bound, fragmentation and memory_summary() at `moment`. With
// `by_category`, the phase table is followed by the allocated bytes of each
// category at every phase end (PhaseCategoryTableText).
std::string SummaryText(const Timeline& timeline, const RankReport& report, const TraceModel& at_moment,
                        const std::string& moment_text, bool by_category = false);

}  // namespace memscope

#endif  // MEMSCOPE_EXPORTERS_REPORT_H_
