// Analyses of one rank's recording, as listeners of a TimelineWalk
// (timeline_walk.h): the phase table, peak attribution, fragmentation at the
// end, the peak and an OOM, and the lower bound. The first walk finds the
// moments (the peaks, the OOM, the phase ends, the end); who held the memory
// at the peaks comes from copies of the model that walk keeps (AnalyzeRank),
// or from a second walk as far as the later peak (RankAnalysis's default).
#ifndef MEMSCOPE_ANALYSIS_ANALYSIS_H_
#define MEMSCOPE_ANALYSIS_ANALYSIS_H_

#include <array>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "analysis/timeline_walk.h"
#include "analysis/trace_model.h"
#include "recording/event.h"

namespace memscope {

// One row per phase end: the numbers users print after each phase
// (memory_allocated, max_memory_allocated, memory_reserved,
// max_memory_reserved), plus the peak inside the phase.
struct PhaseRow {
  std::int64_t step = kNoStep;
  std::int64_t micro_batch = kNoMicroBatch;  // --grad-accum: forward, loss, backward per micro-batch
  Phase phase = Phase::kUser;
  std::string label;  // user phases
  std::uint64_t allocated = 0;
  std::uint64_t max_allocated = 0;  // since the start, like torch.cuda.max_memory_allocated
  std::uint64_t reserved = 0;
  std::uint64_t max_reserved = 0;
  std::uint64_t peak_allocated_in_phase = 0;
  std::array<std::int64_t, kNumCategories> by_category{};  // allocated bytes at the phase end
  std::int64_t time_ns = 0;
};

// "forward:0", "backward:0.1" (micro-batch 1), "model", or a user phase's label with its step.
std::string PhaseRowName(const PhaseRow& row);

// The bytes of one allocation site at a moment, like memray's table: for an
// allocation with a stack (an imported PyTorch snapshot) the site is its
// stack, the user's frames innermost first (AllocStack::site); otherwise its
// category and owner ("GRADIENT fc", "OTHER (untagged)").
struct SiteBytes {
  std::string site;
  std::int64_t bytes = 0;         // allocated bytes (block sizes)
  std::uint64_t allocations = 0;  // blocks
  bool operator==(const SiteBytes&) const = default;
};
inline constexpr std::size_t kTopSites = 10;

// The site of a block of `model` recorded in `timeline`.
std::string SiteOf(const TraceModel::Block& block, const Timeline& timeline);
// The sites holding the most allocated bytes (largest first, then by name),
// at most `n`.
std::vector<SiteBytes> TopSites(const TraceModel& model, const Timeline& timeline, std::size_t n = kTopSites);

// Where a peak happened and what made it up.
struct PeakInfo {
  std::uint64_t bytes = 0;
  std::size_t event_index = 0;  // the peak holds after applying events [0, event_index]
  std::int64_t time_ns = 0;
  std::string phase;                                       // the innermost phase open at the peak ("backward:1"), or ""
  std::array<std::int64_t, kNumCategories> by_category{};  // allocated bytes by category
  std::vector<std::pair<std::string, std::int64_t>> top_owners;  // largest first, at most 5
  std::vector<SiteBytes> top_sites;                              // largest first, at most kTopSites
};

struct OomReport {
  std::size_t event_index = 0;
  std::int64_t time_ns = 0;
  std::string phase;
  std::uint64_t requested = 0;
  std::uint64_t rounded = 0;
  std::uint64_t device_free = 0;
  FragmentationInfo fragmentation;
  bool caused_by_fragmentation = false;
  // "N bytes free in segments but the largest free block is M" (fragmentation)
  // or "the device had N bytes free; the request needed M" (capacity).
  std::string verdict;
  std::vector<SiteBytes> top_sites;  // who held the memory when it ran out
};

// One DDP gradient bucket as the Reducer assigned it: its position, its size,
// the dtype of its gradients and its parameters in the bucket's order (its
// layout, and the order their gradients are expected).
struct DdpBucket {
  std::size_t index = 0;
  std::uint64_t bytes = 0;
  std::string dtype;                // "float32"
  std::vector<std::string> params;  // parameter names
  bool operator==(const DdpBucket&) const = default;
};

// ZeroRedundancyOptimizer's partition (train/zero.h): each rank's
// parameters by name, in its param group's order; the flat buckets' bytes
// per rank under parameters_as_bucket_view (else empty).
struct ZeroShards {
  bool parameters_as_bucket_view = false;
  std::vector<std::vector<std::string>> partition;
  std::vector<std::uint64_t> bucket_bytes;
  bool operator==(const ZeroShards&) const = default;
};

// A DDP rank's buckets: the assignment at construction and, once the first
// backward has shown the gradient-ready order, the rebuilt one (empty when
// DDP did not rebuild).
struct DdpBuckets {
  std::string mode;  // --ddp: "copy" or "view"
  std::vector<DdpBucket> buckets;
  std::vector<DdpBucket> rebuilt_buckets;
  std::optional<ZeroShards> zero;  // --zero on|bucket-view
  bool operator==(const DdpBuckets&) const = default;
};

// Bytes by memory pool at one moment: the default pool and each private pool
// (CUDA graph, torch.cuda.MemPool) of a replayed snapshot, in the order of
// Timeline::pools. Empty for a timeline without private pools.
struct PoolBytes {
  PoolId pool;
  std::uint64_t reserved = 0;   // bytes of its segments (mapped ranges)
  std::uint64_t allocated = 0;  // bytes of its allocated blocks
  std::uint64_t segments = 0;   // its segments (an expandable segment's mapped ranges each)
};

// The pinned host memory of a replayed PyTorch snapshot (Timeline::host,
// record_pinned_host_memory): its segments' bytes at the snapshot, by the
// state of their blocks, and its trace's entries by action.
struct PinnedHostBytes {
  std::uint64_t segments = 0;
  std::uint64_t reserved = 0;          // the segments' total_size
  std::uint64_t allocated = 0;         // active_allocated blocks' size
  std::uint64_t allocated_blocks = 0;
  std::uint64_t requested = 0;         // their requested_size
  std::uint64_t pending_free = 0;      // blocks freed, waiting on stream events (active_pending_free / awaiting)
  std::uint64_t pending_free_blocks = 0;
  std::uint64_t trace_entries = 0;
  std::vector<std::pair<std::string, std::uint64_t>> trace_actions;  // entries by action, in order of first use
};

// Everything report.json says about one rank (exporters/report.h has the
// schema): the recording's header and its analyses, which AnalyzeRank fills,
// and what only `memscope run` knows (ddp, status, losses), which it adds.
struct RankReport {
  int rank = 0;
  int device_index = 0;
  std::uint64_t device_capacity = 0;
  std::string alloc_conf;          // PYTORCH_CUDA_ALLOC_CONF of the recording, "" for the defaults
  std::uint64_t torn_bytes = 0;    // an incomplete last record the reader ignored
  std::int64_t wall_start_us = 0;  // Unix time of the recording's start: report.json's times are wall-clock
  std::size_t events = 0;
  std::vector<PhaseRow> phases;
  PeakInfo peak_allocated;
  PeakInfo peak_reserved;
  FragmentationInfo fragmentation_at_end;   // at `end`, after the last step (EndOfLastStep)
  FragmentationInfo fragmentation_at_exit;  // at `exit`, after the last event (teardown included)
  FragmentationInfo fragmentation_at_peak;  // at the peak of allocated
  std::optional<OomReport> oom;             // the first OOM
  DeviceStats stats;                        // at exit (after the last event)
  // False only for a report.json without "memory_stats" (hand-written):
  // `stats` is then all zeros and says nothing.
  bool stats_known = true;
  std::uint64_t lower_bound = 0;  // peak of live requested bytes
  // The model at `end` (EndOfLastStep), kept by the first walk of
  // AnalyzeRank / RankAnalysis: ModelAt(end) with this report takes it instead
  // of walking (or scanning) the timeline again. Null when not analysed here.
  std::shared_ptr<const TraceModel> model_at_end;
  // Bytes by pool at `end`, for a replayed snapshot with private pools (CUDA
  // graphs, torch.cuda.MemPool); empty otherwise (BytesByPool).
  std::vector<PoolBytes> pools_at_end;
  std::size_t model_at_end_events = 0;  // the events up to `end` (EndOfLastStep), with model_at_end
  // What `memscope run` adds:
  std::optional<DdpBuckets> ddp;  // the rank trained under DDP
  std::string status;             // "ok", "oom", "error", "comm_error", "failed", "stopped", "killed"; "" outside a run
  // This rank's losses on its own shard of the batch, one per micro-batch
  // (--exec cpu; a meta run computes no values). NaN when it diverged.
  std::vector<float> losses;
  // How much the actual peak reserved exceeds the lower bound.
  std::uint64_t overhead_bytes() const {
    return peak_reserved.bytes > lower_bound ? peak_reserved.bytes - lower_bound : 0;
  }
};

// Analyses one rank: one walk over the timeline (RankAnalysis with
// peaks_in_first_walk), then the states at the peaks from checkpoints.
// Errors: an inconsistent timeline, naming the event.
absl::StatusOr<RankReport> AnalyzeRank(const Timeline& timeline);

// AnalyzeRank in steps, for a caller whose own listeners ride along the same
// two walks (run/ WriteRunOutputs writes every output in them):
//
//   RankAnalysis analysis(timeline);
//   TimelineWalk first(timeline);
//   first.Run({&analysis.first_walk(), &mine});    // the phase table, peaks, OOM, end
//   TimelineWalk second(timeline);                 // may go on to the end
//   second.Run({&analysis.second_walk(), &exporter}, analysis.second_walk_end());
//   const RankReport& r = analysis.report();       // complete
//
// After the first walk, report() holds everything but the peaks' top_owners
// and fragmentation_at_peak, which the second walk adds.
//
// With `peaks_in_first_walk`, the first walk also keeps copies of the model
// (checkpoints) at new peaks, at most one per few thousand events, and at its
// end rebuilds the model at each peak from its checkpoint: report() is then
// complete after the first walk, second_walk_end() is 0 and the second walk's
// listener does nothing (AnalyzeRank: one walk).
class RankAnalysis {
 public:
  explicit RankAnalysis(const Timeline& timeline, bool peaks_in_first_walk = false);
  ~RankAnalysis();
  RankAnalysis(const RankAnalysis&) = delete;
  RankAnalysis& operator=(const RankAnalysis&) = delete;

  WalkListener& first_walk() { return *first_; }
  WalkListener& second_walk() { return *second_; }
  // The events the second walk must apply (past the later peak).
  std::size_t second_walk_end() const;
  RankReport& report() { return report_; }

 private:
  bool peaks_in_first_walk_;
  RankReport report_;
  std::unique_ptr<WalkListener> first_;
  std::unique_ptr<WalkListener> second_;
};

// The output driver: the two walks of a run's ranks, as every output takes
// them (run/ WriteRunOutputs, the HTML report, ModelAt). First walks every
// rank's events once with its RankAnalysis (the moments; every rank is
// checked before anything is written) and the caller's planning listeners;
// then each rank's second walk, to the end, with the analysis' second-walk
// listener and the caller's writers.
//
//   RunWalks walks(timelines);
//   if (absl::Status s = walks.First([&](std::size_t i) { return Listeners{&trace.Plan(*timelines[i])}; }); ...
//   for (std::size_t i = 0; i < timelines.size(); ++i) {
//     TimelineWalk walk(*timelines[i]);
//     if (absl::Status s = walks.Second(i, walk, {&trace.Write(*timelines[i])}); ...
//   }
//   RankReport& r = walks.analysis(0).report();   // complete
class RunWalks {
 public:
  using Listeners = std::vector<WalkListener*>;
  explicit RunWalks(std::vector<const Timeline*> timelines);

  // Every rank's first walk, in order, with `plan(i)`'s listeners after the
  // analysis'. Errors: the walk's ("rank R: event N: ...").
  absl::Status First(const std::function<Listeners(std::size_t)>& plan = {});
  // Rank i's second walk on `walk` (at event 0 of rank i's timeline), to the
  // end, with `write`'s listeners after the analysis'.
  absl::Status Second(std::size_t i, TimelineWalk& walk, const Listeners& write = {});

  RankAnalysis& analysis(std::size_t i) { return *analyses_[i]; }
  std::size_t size() const { return timelines_.size(); }

 private:
  std::vector<const Timeline*> timelines_;
  std::vector<std::unique_ptr<RankAnalysis>> analyses_;
};

// The moments every command names the same way (summary/frag/snapshot --at,
// report.json, compare, the HTML report):
//   end    after the last step: after the last phase end that has a step
//          (the step phase of a training run); a recording without steps
//          ends after its last event, so there end = exit;
//   exit   after the last event: teardown included, what is left at exit;
//   peak   the peak of allocated; oom the first OOM;
//   PHASE:STEP the end of that phase (the last one of the step when it ran
//          once per micro-batch); PHASE:STEP.MICRO the end of it in micro-batch
//          MICRO (--grad-accum); model and ddp have no step.
struct Moment {
  enum class Kind { kEnd, kExit, kPeak, kOom, kPhaseEnd };
  Kind kind = Kind::kEnd;
  Phase phase = Phase::kUser;
  std::int64_t step = kNoStep;
  std::int64_t micro_batch = kNoMicroBatch;  // PHASE:STEP.MICRO
  std::string text;
};
// The number of events up to the moment `end` (all of them without steps).
std::size_t EndOfLastStep(const Timeline& timeline);

// A listener that keeps a copy of the model as it was after `events` events
// (a moment a walk passes, e.g. EndOfLastStep), for a caller whose walk goes on.
class ModelCapture final : public WalkListener {
 public:
  explicit ModelCapture(std::size_t events) : events_(events) {}
  void OnStart(const TimelineWalk& walk) override {
    if (events_ == 0) model_ = walk.model();
  }
  void OnEvent(const TimelineWalk& walk, const Event& /*event*/) override {
    if (walk.applied() == events_) model_ = walk.model();
  }
  // The model at the moment; empty when the walk did not reach it.
  const std::optional<TraceModel>& model() const { return model_; }

 private:
  std::size_t events_;
  std::optional<TraceModel> model_;
};
absl::StatusOr<Moment> ParseMoment(std::string_view text);

// The model after the events up to `moment`, and how many events that is: a
// TimelineWalk stopped there. NotFound when the recording has no such moment
// (no OOM, no such phase). `report` (the timeline's AnalyzeRank, if the
// caller has it) saves a walk: to find the peak, and for `end` the walk itself.
absl::StatusOr<std::pair<TraceModel, std::size_t>> ModelAt(const Timeline& timeline, const Moment& moment,
                                                           const RankReport* report = nullptr);

// The phase table as text, in the layout users print ("281M"), in the
// table's unit (TableUnitFor its largest value).
std::string PhaseTableText(const RankReport& report);

// The allocated bytes of each category at every phase end, one column per
// category that holds any, in the table's unit (`summary --by-category`).
std::string PhaseCategoryTableText(const RankReport& report);

// The unit of a table of sizes, chosen once per table from its largest value:
// the largest of GiB, MiB and KiB in which that value is at least 100 (else
// bytes), so that a table of small sizes shows their differences ("1536K",
// not "1M") and a large one stays short ("281M").
struct TableUnit {
  std::uint64_t bytes = 1;
  const char* suffix = "B";
};
TableUnit TableUnitFor(std::uint64_t largest);
// A size in a table's unit, rounded down: "281M", "1536K".
std::string FormatInUnit(std::uint64_t bytes, TableUnit unit);
// A difference of two sizes in the table's unit, signed, truncated towards
// zero: "+2M", "-281M"; "0M" only when equal, so "+0M" is a growth under one unit.
std::string FormatDeltaInUnit(std::int64_t bytes, TableUnit unit);

// The fragmentation report as text.
std::string FragmentationText(const FragmentationInfo& f);

std::vector<PoolBytes> BytesByPool(const TraceModel& model, const Timeline& t);
// "(0, 1)"
std::string PoolIdText(PoolId pool);
// "by pool:" and a line per pool ("" for none).
std::string PoolsText(const std::vector<PoolBytes>& pools);

// The timeline's pinned host memory (nullopt when its snapshot had none).
std::optional<PinnedHostBytes> PinnedHostOf(const Timeline& t);
// "pinned host memory: ..." and its trace's line ("" for none).
std::string PinnedHostText(const std::optional<PinnedHostBytes>& host);

}  // namespace memscope

#endif  // MEMSCOPE_ANALYSIS_ANALYSIS_H_
