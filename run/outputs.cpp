#include "run/run.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "analysis/analysis.h"
#include "analysis/timeline_walk.h"
#include "exporters/chrome_trace.h"
#include "exporters/report.h"
#include "exporters/snapshot_export.h"
#include "run/run_directory.h"
#include "viewer/html_report.h"

namespace memscope {
namespace fs = std::filesystem;

namespace {

absl::Status WriteFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write '", path.string(), "'"));
  return absl::OkStatus();
}

// One rank's second walk: owners at the peaks, the rank's part of the trace,
// the snapshot at the peak and the viewer's data, then the summary at the end.
absl::Status SecondWalk(const fs::path& dir, const Timeline& t, RankAnalysis& analysis, ChromeTraceWriter& trace,
                        std::string& summary, std::vector<nlohmann::json>& viewer_data) {
  const RankReport& r = analysis.report();
  const fs::path path = RunDirectory(dir.string()).Snapshot(t.rank);
  std::ofstream snapshot_out(path, std::ios::binary | std::ios::trunc);
  SnapshotAt snapshot(t.events.empty() ? 0 : r.peak_allocated.event_index + 1, SnapshotFormat::kPickle, snapshot_out);
  ViewerRankListener viewer(t, r);
  TimelineWalk walk(t);
  if (absl::Status s = walk.Run({&analysis.second_walk(), &trace.Write(t), &snapshot, &viewer}); !s.ok()) return s;
  if (!snapshot.status().ok()) return snapshot.status();
  snapshot_out.close();
  if (!snapshot_out) return absl::InternalError(absl::StrCat("cannot write '", path.string(), "'"));
  absl::StrAppend(&summary, summary.empty() ? "" : "\n", SummaryText(t, r, walk.model(), "end"));
  viewer_data.push_back(viewer.TakeData());
  return absl::OkStatus();
}

}  // namespace

// Two walks per rank for everything: the first finds the moments (and checks
// every rank before a file is written), the second writes the trace and the
// snapshot and takes the viewer's segment maps as it passes the moments.
absl::StatusOr<std::vector<RankReport>> WriteRunOutputs(
    const std::string& dir, const std::vector<Timeline>& timelines,
    const std::function<void(std::vector<RankReport>& reports)>& amend) {
  std::ofstream trace_out;  // opened once every rank has been checked
  ChromeTraceWriter trace(ChromeTraceOptions{}, trace_out);
  std::vector<std::unique_ptr<RankAnalysis>> analyses;
  for (const Timeline& t : timelines) {
    analyses.push_back(std::make_unique<RankAnalysis>(t));
    TimelineWalk walk(t);
    if (absl::Status s = walk.Run({&analyses.back()->first_walk(), &trace.Plan(t)}); !s.ok()) return s;
  }

  const RunDirectory run_dir(dir);
  trace_out.open(run_dir.Trace(), std::ios::binary | std::ios::trunc);
  std::string summary;
  std::vector<nlohmann::json> viewer_data;
  for (std::size_t i = 0; i < timelines.size(); ++i) {
    if (absl::Status s = SecondWalk(dir, timelines[i], *analyses[i], trace, summary, viewer_data); !s.ok()) return s;
  }
  if (absl::Status s = trace.Finish(); !s.ok() || !trace_out) {
    return absl::InternalError(absl::StrCat("cannot write '", run_dir.Trace(), "'"));
  }

  std::vector<const Timeline*> ptrs;
  std::vector<RankReport> reports;
  for (std::size_t i = 0; i < timelines.size(); ++i) {
    ptrs.push_back(&timelines[i]);
    reports.push_back(std::move(analyses[i]->report()));
  }
  if (amend) amend(reports);
  const nlohmann::json report = ReportJson(ptrs, reports);
  if (absl::Status s = WriteFile(run_dir.Report(), report.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"); !s.ok()) return s;
  if (absl::Status s = WriteFile(run_dir.Summary(), summary); !s.ok()) return s;
  HtmlPageRun page;
  page.label = dir;
  for (const Timeline& t : timelines) page.world_size = std::max(page.world_size, t.world_size);
  page.ranks = std::move(viewer_data);
  std::vector<HtmlPageRun> pages;
  pages.push_back(std::move(page));
  absl::StatusOr<std::string> html = HtmlPage(std::move(pages));
  if (!html.ok()) return html.status();
  if (absl::Status s = WriteFile(run_dir.Html(), *html); !s.ok()) return s;
  return reports;
}

}  // namespace memscope
