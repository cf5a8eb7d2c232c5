// `memscope trace -o trace.json`: recorded timelines as one Chrome trace
// (JSON object format), which Perfetto (ui.perfetto.dev) and
// chrome://tracing open.
//
//   std::ofstream out("trace.json");
//   absl::Status s = WriteChromeTrace({&rank0, &rank1}, {}, out);
//
// What the trace holds, per rank R (one Chrome process, pid = R, named
// "rank R", sorted by R; thread 0 "phases", thread 1 "allocator", thread 2
// "communication" in a rank that ran a collective):
//
// - Counter tracks (ph "C"), the state of a TraceModel fed the rank's events
//   in order, sampled after every event that changes allocator memory (alloc,
//   free_requested, free_completed, segment_alloc/free/map/unmap):
//     "allocated", "reserved", "active": {"bytes"}, three tracks (in one
//                           event, trace viewers would draw them stacked)
//     "memory by category": {"PARAMETER", ..., "OTHER"}: allocated bytes
//                           (block sizes) of each of the 10 categories
// - Phase slices on thread 0 (complete events, ph "X"): named after the phase
//   ("model", "ddp"), with ":<step>" for steps >= 0 ("forward:0"); a user
//   phase is named after its label ("user" if it has none). args {"step"}.
//   A phase end closes the latest open begin with the same phase, step and
//   label (ends with no such begin are ignored); a phase still open at the
//   end of the timeline ends at its last event, with args "unfinished": true.
// - Marks: instant events (ph "i", scope thread) on thread 0, named by the
//   mark's text.
// - Collectives (allreduce, broadcast, allgather, barrier of a DDP rank's
//   communicator) as slices (ph "X", cat "communication") on thread 2,
//   "communication" (named only in a rank that ran one), args {"bytes"}; one
//   still open at the end ends at the last event, args "unfinished": true.
// - Instant events (ph "i", scope process) on thread 1:
//     "OOM":         {"requested_size", "rounded_size", "device_free",
//                     "allocated", "reserved", "stream", "pool"}
//                    (allocated and reserved as the model holds them then)
//     "empty_cache": {"reserved"}  (before the segments it frees)
//     "alloc retry": {"size"}      (the segment size asked again)
//
// Times: the run's common clock. ts = (wall_start_us - the earliest rank's
// wall_start_us) + event.time_ns / 1000: microseconds since the earliest
// rank's start, written exactly to the nanosecond, so ranks started 1 s
// apart are drawn 1 s apart.
//
// Layout: {"displayTimeUnit":"ms","otherData":{"generator":"memscope",
// "ranks", and per rank "rank R events", "rank R counter samples" (before
// thinning), "rank R counter samples written", world_size, device,
// device_capacity, wall_start_us, alloc_conf},"traceEvents":[...]}, one event
// per line, each beginning with its "ts". The order is for Perfetto's
// streaming JSON reader, which honours displayTimeUnit only near the start
// of the file and scans each event for "ts" with a reader that gives up on
// \u escapes in any string before it. Text (phase labels, marks) is escaped,
// invalid UTF-8 becomes U+FFFD.
//
// Thinning (keeps long runs loadable; analysis/counter_thinning.h,
// ThinningPolicy::ChromeTrace). When a rank has more counter samples
// than options.max_counter_samples_per_rank (M; values below 3 count as 3),
// only at most M are written per track, chosen so that no maximum is lost:
//   1. The time span between the rank's first and last sample is cut into
//      B = (M - 1) / 2 equal buckets.
//   2. Every bucket holding samples keeps the sample where "allocated" is
//      highest and the one where "reserved" is highest (the earliest on
//      ties). The global maxima of allocated and reserved are the maxima of
//      their buckets, so they always survive.
//   3. The rank's very last sample is kept (the final state).
//   4. With the room left under M, buckets also keep their last sample (the
//      level after a drop), the buckets with the largest drop from their
//      maximum first.
// Kept samples are written in event order, each once. The "memory by
// category" track is sampled at the same events as "allocated". Peaks of
// "active" and of single categories can fall between kept samples.
//
// Cost: two walks over each rank's events (timeline_walk.h; the first, after
// a scan of the event times, chooses the samples, the second writes), memory
// proportional to the live allocator state plus O(M) per rank; the JSON is
// streamed to `out`, never built as one tree. Every rank is checked before
// anything is written, so on error `out` is untouched.
#ifndef MEMSCOPE_EXPORTERS_CHROME_TRACE_H_
#define MEMSCOPE_EXPORTERS_CHROME_TRACE_H_

#include <cstddef>
#include <memory>
#include <ostream>
#include <vector>

#include "absl/status/status.h"
#include "analysis/timeline_walk.h"
#include "nlohmann/json.hpp"
#include "recording/event.h"

namespace memscope {

struct ChromeTraceOptions {
  // Counter samples written per rank and per counter track, at most.
  std::size_t max_counter_samples_per_rank = 20000;
  // A run's GPU table (report.json's "gpus"), written by WriteChromeTrace
  // as ChromeTraceWriter::WriteGpuTable does; null or not an array: none.
  const nlohmann::json* gpus = nullptr;
};

// Writes one Chrome trace for all ranks; each Timeline is one rank
// (timeline.rank). Errors: a null timeline or a rank given twice
// (InvalidArgument); an inconsistent timeline (TraceModel::Apply failed):
// that error, its message prefixed with "rank R: event N: " (N = index in
// timeline.events); a stream that failed while writing (DataLoss).
absl::Status WriteChromeTrace(const std::vector<const Timeline*>& ranks, const ChromeTraceOptions& options,
                              std::ostream& out);

// The same trace in steps, as walk listeners, for a caller that walks each
// rank for other outputs too (run/ WriteRunOutputs). The caller checks the
// ranks (WriteChromeTrace's errors) and stops at the first walk error.
//
//   ChromeTraceWriter trace(options, out);
//   for (const Timeline* t : ranks) first_walk_of(*t).Run({&trace.Plan(*t), ...});
//   for (const Timeline* t : ranks) second_walk_of(*t).Run({&trace.Write(*t), ...});
//   absl::Status s = trace.Finish();
//
// Nothing is written to `out` before the first Write.
class ChromeTraceWriter {
 public:
  ChromeTraceWriter(const ChromeTraceOptions& options, std::ostream& out);
  ~ChromeTraceWriter();
  ChromeTraceWriter(const ChromeTraceWriter&) = delete;
  ChromeTraceWriter& operator=(const ChromeTraceWriter&) = delete;

  // A rank's first-walk listener (walk it to the end): chooses its counter
  // samples. Ranks are written in the order they are planned. The listener
  // lives as long as this writer.
  WalkListener& Plan(const Timeline& timeline);
  // A planned rank's second-walk listener (walk it to the end, from event 0,
  // one rank after the other); the first call writes the header, so every
  // rank must be planned by then. Valid until the next Write.
  WalkListener& Write(const Timeline& timeline);
  // The run's GPU table (report.json's "gpus", run/gpu_table.h), after the
  // last Write and before Finish: one process "GPUs" (pid kGpusPid, sorted
  // after the ranks) with, per physical GPU N, a counter track "GPU N"
  // {"context", "reserved", "nccl"} (bytes summed over its processes; the
  // stacked total is what nvidia-smi would list as used) at the run's first
  // and last time, and an instant event "GPU N processes" at the last time,
  // args = the table's row (capacity_bytes, used_bytes, shared_by_ranks,
  // processes). Rows missing a field count it as 0.
  static constexpr int kGpusPid = 1000000;
  void WriteGpuTable(const nlohmann::json& gpus);
  // Ends the trace. DataLoss if the stream failed.
  absl::Status Finish();

 private:
  class Events;
  class RankPlan;
  class RankWriter;
  void WriteHeader();

  std::size_t max_samples_;
  std::ostream& out_;
  std::unique_ptr<Events> events_;
  std::vector<std::unique_ptr<RankPlan>> plans_;
  std::unique_ptr<RankWriter> writer_;
  bool header_written_ = false;
};

}  // namespace memscope

#endif  // MEMSCOPE_EXPORTERS_CHROME_TRACE_H_
