#include "run/run.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "analysis/analysis.h"
#include "exporters/chrome_trace.h"
#include "exporters/report.h"
#include "exporters/snapshot_export.h"
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

}  // namespace

absl::StatusOr<std::vector<RankReport>> WriteRunOutputs(const std::string& dir, const std::vector<Timeline>& timelines,
                                                        const std::function<void(std::vector<RankReport>& reports)>& amend) {
  std::vector<const Timeline*> ptrs;
  std::vector<RankReport> reports;
  std::string summary;
  for (const Timeline& t : timelines) {
    ptrs.push_back(&t);
    absl::StatusOr<RankReport> r = AnalyzeRank(t);
    if (!r.ok()) return r.status();
    absl::StatusOr<std::pair<TraceModel, std::size_t>> end = ModelAt(t, Moment{});
    if (!end.ok()) return end.status();
    absl::StrAppend(&summary, summary.empty() ? "" : "\n", SummaryText(t, *r, end->first, "end"));
    reports.push_back(std::move(*r));
  }
  if (amend) amend(reports);
  const nlohmann::json report = ReportJson(ptrs, reports);
  if (absl::Status s = WriteFile(fs::path(dir) / "report.json", report.dump(1) + "\n"); !s.ok()) return s;
  if (absl::Status s = WriteFile(fs::path(dir) / "summary.txt", summary); !s.ok()) return s;
  {
    std::ofstream out(fs::path(dir) / "trace.json", std::ios::binary | std::ios::trunc);
    if (absl::Status s = WriteChromeTrace(ptrs, ChromeTraceOptions{}, out); !s.ok()) return s;
    if (!out) return absl::InternalError(absl::StrCat("cannot write '", dir, "/trace.json'"));
  }
  for (std::size_t i = 0; i < timelines.size(); ++i) {
    const Timeline& t = timelines[i];
    Moment peak;
    peak.kind = Moment::Kind::kPeak;
    absl::StatusOr<std::pair<TraceModel, std::size_t>> at = ModelAt(t, peak, &reports[i]);
    if (!at.ok()) return at.status();
    const fs::path path = fs::path(dir) / absl::StrCat("snapshot-rank-", t.rank, ".pickle");
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (absl::Status s = WriteSnapshot(t, at->first, at->second, SnapshotFormat::kPickle, out); !s.ok()) return s;
    if (!out) return absl::InternalError(absl::StrCat("cannot write '", path.string(), "'"));
  }
  HtmlReportRun html_run;
  html_run.label = dir;
  html_run.timelines = ptrs;
  for (const RankReport& r : reports) html_run.reports.push_back(&r);
  absl::StatusOr<std::string> html = HtmlReport({html_run});
  if (!html.ok()) return html.status();
  if (absl::Status s = WriteFile(fs::path(dir) / "report.html", *html); !s.ok()) return s;
  return reports;
}

}  // namespace memscope
