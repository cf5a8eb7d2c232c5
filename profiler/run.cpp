#include "profiler/run.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "profiler/analysis.h"
#include "profiler/check.h"
#include "profiler/chrome_trace.h"
#include "profiler/html_report.h"
#include "allocator/sizes.h"
#include "profiler/recorder.h"
#include "profiler/replayer.h"
#include "profiler/report.h"
#include "profiler/snapshot_import.h"
#include "profiler/snapshot_export.h"
#include "profiler/timeline.h"

namespace memscope {
namespace fs = std::filesystem;

std::string TimelinePath(const std::string& dir, int rank) {
  return (fs::path(dir) / absl::StrCat("rank-", rank, ".timeline")).string();
}

std::string RunOutputListing(int world_size) {
  auto per_rank = [&](const char* prefix, const char* suffix) {
    if (world_size == 1) return absl::StrCat(prefix, "0", suffix);
    return absl::StrCat(prefix, "{0..", world_size - 1, "}", suffix);
  };
  return absl::StrCat("run.json, ", per_rank("rank-", ".timeline"), ", report.json, report.html, summary.txt, trace.json, ",
                      per_rank("snapshot-rank-", ".pickle"));
}

absl::StatusOr<Timeline> RecordReplay(const RequestTrace& trace, const AllocatorConfig& config,
                                      std::uint64_t device_memory, int rank, ReplayResult* result) {
  Timeline t;
  t.rank = rank;
  t.device_index = rank;
  t.device_capacity = device_memory;
  t.alloc_conf = config.text;
  MemorySink sink(t);
  Recorder recorder(sink);
  absl::StatusOr<ReplayResult> r = Replay(trace, config, device_memory, &recorder);
  if (!r.ok()) return r.status();
  if (result != nullptr) *result = std::move(*r);
  return t;
}

absl::StatusOr<std::vector<Timeline>> LoadRun(const std::string& path, std::uint64_t device_memory) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
  std::vector<Timeline> timelines;
  if (!fs::is_directory(status)) {
    absl::StatusOr<InputKind> kind = DetectInput(path);
    if (!kind.ok()) return kind.status();
    if (*kind == InputKind::kPickle) {
      absl::StatusOr<std::vector<ImportedTrace>> imported = ReadPytorchSnapshot(path);
      if (absl::IsFailedPrecondition(imported.status())) {
        // No trace (1.13, or history not recorded): the state at the snapshot.
        absl::StatusOr<std::vector<Timeline>> state = ReadPytorchSnapshotState(path);
        if (state.ok()) {
          for (Timeline& t : *state) t.device_capacity = device_memory;
        }
        return state;
      }
      if (!imported.ok()) return imported.status();
      for (const ImportedTrace& trace : *imported) {
        absl::StatusOr<AllocatorConfig> config = AllocatorConfig::Parse(trace.alloc_conf);
        if (!config.ok()) return config.status();
        absl::StatusOr<Timeline> t = RecordReplay(trace.requests, *config, device_memory, trace.device);
        if (!t.ok()) return t.status();
        t->notes = trace.notes;
        t->notes.insert(t->notes.begin(),
                        absl::StrCat("device ", trace.device, " of ", path, ": its trace was replayed under its own "
                                     "allocator settings (", trace.alloc_conf.empty() ? "defaults" : trace.alloc_conf,
                                     ") on a simulated GPU of ", FormatSize(device_memory)));
        timelines.push_back(std::move(*t));
      }
      return timelines;
    }
    if (*kind == InputKind::kJsonl || *kind == InputKind::kRmmCsv) {
      return absl::InvalidArgumentError(absl::StrCat("'", path, "' is a request trace, not a recording: record it with "
                                                     "memscope replay ", path, " --out RUN"));
    }
    absl::StatusOr<Timeline> t = ReadTimelineFile(path);
    if (!t.ok()) return t.status();
    timelines.push_back(std::move(*t));
    return timelines;
  }
  std::vector<std::pair<int, std::string>> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(path, ec)) {
    const std::string name = entry.path().filename().string();
    int rank = 0;
    if (name.rfind("rank-", 0) == 0 && name.size() > 14 && name.substr(name.size() - 9) == ".timeline" &&
        absl::SimpleAtoi(name.substr(5, name.size() - 14), &rank)) {
      files.emplace_back(rank, entry.path().string());
    }
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list '", path, "': ", ec.message()));
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat("'", path, "' has no rank-R.timeline files: not a memscope run directory"));
  }
  std::sort(files.begin(), files.end());
  for (const auto& [rank, file] : files) {
    absl::StatusOr<Timeline> t = ReadTimelineFile(file);
    if (!t.ok()) return t.status();
    timelines.push_back(std::move(*t));
  }
  return timelines;
}

absl::StatusOr<LoadedReport> LoadReport(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
  LoadedReport loaded;
  if (fs::is_regular_file(status)) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
    char first = 0;
    while (in.get(first) && absl::ascii_isspace(static_cast<unsigned char>(first))) {
    }
    if (in && first == '{') {
      in.seekg(0);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      loaded.report = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (loaded.report.is_discarded()) {
        return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not valid JSON"));
      }
      if (absl::Status s = ValidateReport(loaded.report); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("'", path, "' ", s.message()));
      }
      return loaded;
    }
  }
  absl::StatusOr<std::vector<Timeline>> run = LoadRun(path);
  if (!run.ok()) return run.status();
  loaded.timelines = std::move(*run);
  std::vector<const Timeline*> ptrs;
  std::vector<RankReport> reports;
  for (const Timeline& t : loaded.timelines) {
    absl::StatusOr<RankReport> r = AnalyzeRank(t);
    if (!r.ok()) return r.status();
    ptrs.push_back(&t);
    reports.push_back(std::move(*r));
  }
  loaded.report = ReportJson(ptrs, reports);
  return loaded;
}

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
                                                        const std::function<void(nlohmann::json& report)>& amend_report) {
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
  nlohmann::json report = ReportJson(ptrs, reports);
  if (amend_report) amend_report(report);
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
