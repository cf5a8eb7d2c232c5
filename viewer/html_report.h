// `memscope report` and RUN/report.html: one self-contained HTML page (the
// page files of viewer/, embedded in the binary, with the data inlined) that
// opens offline in a browser. It never fetches anything: a
// Content-Security-Policy of default-src 'none' forbids it.
//
//   absl::StatusOr<std::string> html = HtmlReport({{"run", {&rank0, &rank1}, {&report0, &report1}}});
//
// The data (a <script type="application/json" id="memscope-data"> element,
// schema memscope.viewer/1) holds, per run, "label", "world_size", "gpus"
// (report.json's GPU table, only in a run that has one; drawn as a table
// under the run's heading), "explain" (`memscope explain --json`, only when
// the caller gave one: the diagnosis and the what-if table, drawn first)
// and per rank:
//   "report": that rank's object of report.json (memscope.report/1): the
//             phase table (its rows without "by_category"), peaks,
//             fragmentation, OOM, memory_stats: the same numbers
//             `memscope summary --json` prints;
//   "t0", "t1": the first and last event times (ns since the start of the
//             recording); "peak_allocated_t", "peak_reserved_t", "oom_t";
//   "samples": {"t": [...], "allocated": [...], "reserved": [...],
//             "by_category": {CATEGORY: [...]}} (only categories ever
//             non-zero), the state after memory-changing events, thinned
//             without losing peaks (below); "samples_total", "thinned";
//   "bands": one per phase end, in order (so bands[i] is report.phases[i]):
//             {"name", "begin", "end", "depth", "moment" (index into
//             "moments" or -1)}; "steps": [{"step", "t"}] (first begin of
//             each step); "marks": [{"t", "text"}] (at most 200);
//   "moments": segment maps: the peak of allocated, the OOM, every kept phase
//             end, the end. Each {"key" ("peak", "oom", "end" or the phase's
//             name), "t", "event", "fragmentation" (FRAG of report.json),
//             "segments_total", "segments": [{"addr", "size", "pool",
//             "stream", "expandable", "merged", "blocks": [[offset, size,
//             kind, owner]]}]}; kind 0-9 = allocated, of that category;
//             10 = free in a segment that holds allocations (inactive split,
//             not releasable); 11 = free in an unused segment (cached,
//             releasable); 12 = freed, waiting on a stream event. owner
//             indexes "owners" (0 = none).
//
// Bounded size for long runs:
//   - Timeline thinning (analysis/counter_thinning.h,
//     ThinningPolicy::Viewer): with more than max_timeline_samples samples, the
//     rank's time span is cut into max_timeline_samples / 5 buckets; each
//     keeps its first sample, the samples where allocated is highest and
//     lowest, where reserved is highest, and its last. The global peaks of
//     allocated and reserved are bucket maxima, so they are always drawn.
//   - At most max_phase_moments phase ends get a segment map: every phase of
//     a kept step, steps chosen evenly (always the first and the last, and
//     those of the peak and the OOM), phases without a step always.
//   - A segment with more than max_blocks_per_segment blocks (fewer when a
//     moment has many segments: at most max_blocks_per_moment in all) has
//     neighbouring blocks of the same kind merged, then equal slices drawn
//     by their largest kind ("merged": true). At most
//     max_segments_per_moment segments, the largest.
#ifndef MEMSCOPE_VIEWER_HTML_REPORT_H_
#define MEMSCOPE_VIEWER_HTML_REPORT_H_

#include <cstddef>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/analysis.h"
#include "analysis/timeline_walk.h"
#include "nlohmann/json.hpp"
#include "recording/event.h"

namespace memscope {

struct HtmlReportOptions {
  std::size_t max_timeline_samples = 8000;  // per rank
  std::size_t max_phase_moments = 48;       // phase ends with a segment map, per rank
  std::size_t max_segments_per_moment = 1500;
  std::size_t max_blocks_per_segment = 256;
  std::size_t max_blocks_per_moment = 30000;
};

// One run of the page: its ranks and their analyses (reports[i] analyses
// timelines[i]; empty reports: analysed here).
struct HtmlReportRun {
  std::string label;  // e.g. the path given on the command line
  std::vector<const Timeline*> timelines;
  std::vector<const RankReport*> reports;
  // The run's GPU table as JSON text (report.json's "gpus"); empty: none.
  std::string gpus;
  // `memscope explain --json` of the run (explain/explain.h) as JSON text,
  // drawn at the top of the run's column; empty: none.
  std::string explain;
};

// The viewer's data for one rank (see above), as JSON text (written as it
// is computed, keys in sorted order, '<' as \u003c): one walk of its
// timeline. Errors: an inconsistent timeline, naming the rank and event.
absl::StatusOr<std::string> ViewerRankData(const Timeline& timeline, const RankReport& report,
                                           const HtmlReportOptions& options = {});

// ViewerRankData as a walk listener, for a walk that writes other outputs
// too. `report` must hold the first walk's results (the phase table, the
// peaks' and the OOM's events) when the walk starts, and be complete when
// TakeData is called; it and `timeline` must outlive the listener.
//
//   ViewerRankListener viewer(timeline, analysis.report());
//   second_walk.Run({&analysis.second_walk(), &viewer});  // from event 0 to the end
//   std::string data = viewer.TakeData();                 // once: JSON text
class ViewerRankListener final : public WalkListener {
 public:
  ViewerRankListener(const Timeline& timeline, const RankReport& report, const HtmlReportOptions& options = {});
  ~ViewerRankListener() override;
  void OnEvent(const TimelineWalk& walk, const Event& event) override;
  void OnFinish(const TimelineWalk& walk) override;
  std::string TakeData();
  // The same text in pieces (their concatenation), the segment maps as
  // written: no copy of megabytes into one string.
  std::vector<std::string> TakeDataPieces();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The whole page for one run, or two runs side by side with their
// differences.
absl::StatusOr<std::string> HtmlReport(const std::vector<HtmlReportRun>& runs, const HtmlReportOptions& options = {});

// One run of the page when its ranks' viewer data is already assembled
// (ViewerRankData or ViewerRankListener, one per rank in rank order).
struct HtmlPageRun {
  std::string label;
  int world_size = 1;  // the largest of its timelines' world_size, at least 1
  // JSON text, as ViewerRankData returns it; or in pieces (their
  // concatenation: ViewerRankListener::TakeDataPieces), which take precedence
  // when not empty.
  std::vector<std::string> ranks;
  std::vector<std::vector<std::string>> rank_pieces;
  // The run's GPU table, report.json's "gpus" (run/gpu_table.h) as JSON text;
  // empty: the run has none (and the page's run has no "gpus" key).
  std::string gpus;
  // The run's explanation (HtmlReportRun::explain); empty: none (no "explain" key).
  std::string explain;
};

// HtmlReport from assembled data: what HtmlReport does after walking. The
// page is streamed to `out` (the rank data copied, never parsed); Internal
// if the embedded page lacks a marker (nothing written), DataLoss if the
// stream failed.
absl::Status WriteHtmlPage(const std::vector<HtmlPageRun>& runs, std::ostream& out);
absl::StatusOr<std::string> HtmlPage(const std::vector<HtmlPageRun>& runs);

}  // namespace memscope

#endif  // MEMSCOPE_VIEWER_HTML_REPORT_H_
