// memscope report RUN|SNAPSHOT [RUN_B] [-o report.html]: the self-contained
// HTML report (viewer/html_report.h); two inputs give the comparison page.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "cli/explain_training.h"
#include "explain/explain.h"
#include "run/device_memory.h"
#include "run/gpu_table.h"
#include "load/output_file.h"
#include "load/recording.h"
#include "run/run.h"
#include "viewer/html_report.h"

namespace memscope::cli {
namespace {

struct ReportArgs {
  std::vector<std::string> inputs;
  std::string output = "report.html";
  std::size_t max_samples = HtmlReportOptions{}.max_timeline_samples;
  bool no_explain = false;  // --no-explain: no explain section (it replays the requests again)
};

int Report(const ReportArgs& a) {
  if (a.inputs.empty() || a.inputs.size() > 2) return Fail("report", "give one run (or two to compare)");
  if (a.output.empty()) return Fail("report", "-o FILE must not be empty");
  std::vector<std::vector<Timeline>> loaded;
  for (const std::string& path : a.inputs) {
    absl::StatusOr<std::vector<Timeline>> run = LoadTimelines(path);
    if (!run.ok()) return Fail("report", run.status().message());
    PrintNotes(*run);
    loaded.push_back(std::move(*run));
  }
  std::vector<HtmlReportRun> runs;
  for (std::size_t i = 0; i < loaded.size(); ++i) {
    HtmlReportRun run;
    run.label = a.inputs[i];
    // The run's GPU table, as its own report.html has it.
    std::vector<GpuRow> gpus = ReadRunGpuTable(a.inputs[i]);
    if (std::error_code ec; gpus.empty() && std::filesystem::is_directory(a.inputs[i], ec)) {
      std::vector<const Timeline*> ranks;  // a capture's measured table (run/device_memory.h)
      for (const Timeline& t : loaded[i]) ranks.push_back(&t);
      std::vector<std::string> notes;
      gpus = MeasuredGpuTable(a.inputs[i], ranks, notes);
      PrintNotes(notes);
    }
    if (!gpus.empty()) {
      run.gpus = GpuTableJson(gpus).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    if (loaded.size() == 1 && !a.no_explain) {
      // The explain section at the top (docs/explain.md), when the input's
      // requests can be replayed (not a report.json or a capture's state).
      absl::StatusOr<MemoryExplanation> e = Explain(a.inputs[i]);
      if (e.ok()) AddTrainingChanges(a.inputs[i], *e);
      if (e.ok()) run.explain = ExplanationJson(*e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    for (const Timeline& t : loaded[i]) run.timelines.push_back(&t);
    runs.push_back(std::move(run));
  }
  HtmlReportOptions options;
  options.max_timeline_samples = a.max_samples;
  absl::StatusOr<std::string> html = HtmlReport(runs, options);
  if (!html.ok()) return Fail("report", html.status().message());
  if (absl::Status s = WriteOutputFile(a.output, *html); !s.ok()) return Fail("report", s.message());
  std::size_t ranks = 0;
  for (const auto& run : loaded) ranks += run.size();
  std::cout << absl::StrFormat("wrote %s (%s, %d rank%s, %.1f KB; opens offline in a browser)\n", a.output,
                               loaded.size() == 1 ? "1 run" : "2 runs compared", ranks, ranks == 1 ? "" : "s",
                               static_cast<double>(html->size()) / 1000.0);
  return kExitOk;
}

}  // namespace

void RegisterReport(CLI::App& app, int& exit_status) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* report = app.add_subcommand(
      "report", "Write a self-contained HTML report (timeline, phase table, segment map); two runs: side by side.");
  report
      ->add_option("runs", args->inputs,
                   "run directory, rank-R.timeline file, or PyTorch memory snapshot (.pickle); "
                   "a second one to compare")
      ->required()
      ->expected(1, 2);
  report->add_option("-o,--output", args->output, "output file (default report.html)");
  report->add_flag("--no-explain", args->no_explain,
                   "one run: leave out the explain section at the top (memscope explain; it replays the requests)");
  report->add_option("--max-samples", args->max_samples, "timeline samples drawn per rank (peaks always kept)")
      ->check(InRange(std::size_t{10}, std::size_t{10000000}));
  report->callback([args, &exit_status] { exit_status = Report(*args); });
}

}  // namespace memscope::cli
