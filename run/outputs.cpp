#include "run/run.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "analysis/analysis.h"
#include "analysis/timeline_walk.h"
#include "exporters/chrome_trace.h"
#include "exporters/report.h"
#include "exporters/snapshot_export.h"
#include "load/output_file.h"
#include "load/run_directory.h"
#include "viewer/html_report.h"

namespace memscope {
namespace fs = std::filesystem;

namespace {

// One rank's second walk: owners at the peaks, the rank's part of the trace,
// the snapshot at the peak and the viewer's data, then the summary at the end.
// A snapshot that cannot be written goes to `errors`; the walk goes on.
absl::Status SecondWalk(const fs::path& dir, const Timeline& t, RunWalks& walks, std::size_t i, ChromeTraceWriter& trace,
                        std::string& summary, std::vector<std::vector<std::string>>& viewer_data,
                        std::vector<absl::Status>& errors) {
  const RankReport& r = walks.analysis(i).report();
  const RunDirectory run_dir(dir.string());
  run_dir.RecordFile(RunDirectory::SnapshotName(t.rank));
  OutputFile snapshot_out(run_dir.Snapshot(t.rank));
  SnapshotAt snapshot(t.events.empty() ? 0 : r.peak_allocated.event_index + 1, SnapshotFormat::kPickle,
                      snapshot_out.stream());
  ViewerRankListener viewer(t, r);
  ModelCapture at_end(EndOfLastStep(t));  // summary.txt is at the moment `end`
  TimelineWalk walk(t);
  if (absl::Status s = walks.Second(i, walk, {&trace.Write(t), &snapshot, &viewer, &at_end}); !s.ok()) {
    return s;
  }
  if (!snapshot.status().ok() && snapshot_out.stream()) return snapshot.status();  // not a write error
  if (absl::Status s = snapshot_out.Commit(); !s.ok()) errors.push_back(s);
  absl::StrAppend(&summary, summary.empty() ? "" : "\n",
                  SummaryText(t, r, at_end.model().value_or(walk.model()), "end"));
  viewer_data.push_back(viewer.TakeDataPieces());
  return absl::OkStatus();
}

}  // namespace

// Two walks per rank for everything: the first finds the moments (and checks
// every rank before a file is written), the second writes the trace and the
// snapshot and takes the viewer's segment maps as it passes the moments.
// Every output is an OutputFile (written whole or not at all); one that
// cannot be written does not stop the others.
absl::StatusOr<std::vector<RankReport>> WriteRunOutputs(
    const std::string& dir, const std::vector<Timeline>& timelines, const std::function<void(Report& report)>& amend,
    std::vector<absl::Status>* write_errors) {
  const RunDirectory run_dir(dir);
  OutputFile trace_out(run_dir.Trace());  // renamed into place only when complete
  ChromeTraceWriter trace(ChromeTraceOptions{}, trace_out.stream());
  std::vector<const Timeline*> ranks;
  for (const Timeline& t : timelines) ranks.push_back(&t);
  RunWalks walks(ranks);
  if (absl::Status s = walks.First([&](std::size_t i) { return RunWalks::Listeners{&trace.Plan(timelines[i])}; });
      !s.ok()) {
    return s;
  }

  std::vector<absl::Status> errors;
  std::string summary;
  std::vector<std::vector<std::string>> viewer_data;
  for (std::size_t i = 0; i < timelines.size(); ++i) {
    if (absl::Status s = SecondWalk(dir, timelines[i], walks, i, trace, summary, viewer_data, errors); !s.ok()) {
      return s;
    }
  }
  std::vector<RankReport> reports;
  for (std::size_t i = 0; i < timelines.size(); ++i) reports.push_back(std::move(walks.analysis(i).report()));
  Report report = MakeReport(timelines.empty() ? 0 : timelines.front().world_size, std::move(reports));
  if (amend) amend(report);
  const nlohmann::json report_json = ReportToJson(report);
  // The whole-GPU table (what `amend` found) goes to the summary, the trace and the page too.
  const auto gpus = report_json.find("gpus");  // Report::gpus, as report.json writes it
  const bool has_gpus = gpus != report_json.end();
  if (has_gpus) {
    absl::StrAppend(&summary, "\n", GpuTableText(report.gpus));
    trace.WriteGpuTable(*gpus);
  }
  if (absl::Status s = trace.Finish(); !s.ok() && trace_out.stream()) return s;
  if (absl::Status s = trace_out.Commit(); !s.ok()) errors.push_back(s);
  if (absl::Status s = WriteOutputFile(
          run_dir.Report(), report_json.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
      !s.ok()) {
    errors.push_back(s);
  }
  if (absl::Status s = WriteOutputFile(run_dir.Summary(), summary); !s.ok()) errors.push_back(s);
  HtmlPageRun page;
  page.label = dir;
  for (const Timeline& t : timelines) page.world_size = std::max(page.world_size, t.world_size);
  page.rank_pieces = std::move(viewer_data);
  if (has_gpus) page.gpus = gpus->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::vector<HtmlPageRun> pages;
  pages.push_back(std::move(page));
  OutputFile html_out(run_dir.Html());
  if (absl::Status s = WriteHtmlPage(pages, html_out.stream()); !s.ok() && html_out.stream()) return s;
  if (absl::Status s = html_out.Commit(); !s.ok()) errors.push_back(s);
  if (write_errors != nullptr) {
    write_errors->insert(write_errors->end(), errors.begin(), errors.end());
  } else if (!errors.empty()) {
    std::string message(errors.front().message());
    if (errors.size() > 1) absl::StrAppend(&message, " (and ", errors.size() - 1, " more outputs)");
    return absl::InternalError(message);
  }
  return std::move(report.ranks);
}

}  // namespace memscope
