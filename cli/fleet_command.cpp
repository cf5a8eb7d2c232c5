// memscope fleet DIR|FILES... [--max METRIC=SIZE]... [--html FILE] [--jobs N] [--device-memory SIZE] [--json]:
// many ranks at once (fleet/fleet.h). Exit 0, or 1 when a budget fails for a
// rank (as `memscope check`), 2 for unusable input.
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "allocator/sizes.h"
#include "check/check.h"
#include "cli/commands.h"
#include "fleet/fleet.h"
#include "fleet/fleet_load.h"
#include "load/output_file.h"
#include "nlohmann/json.hpp"

namespace memscope::cli {
namespace {

int Fail(absl::string_view message) { return cli::Fail("fleet", message); }

struct FleetArgs {
  std::vector<std::string> paths;
  std::vector<std::string> max;
  std::string html;
  std::string device_memory;
  int jobs = 0;
  bool json = false;
};

// The page and, beside it, each outlier's own report ("fleet-rank-3.html"
// beside "fleet.html"), linked from it. An outlier read from a report.json
// or a summary has no recording to show: no link.
absl::StatusOr<int> WriteHtml(const FleetResult& fleet, const std::string& path, const FleetLoadOptions& options) {
  const std::filesystem::path page(path);
  std::vector<FleetHtmlLink> links;
  for (const FleetOutlier& o : fleet.outliers) {
    const FleetRank* rank = nullptr;
    for (const FleetRank& r : fleet.ranks) {
      if (r.report.rank == o.rank) rank = &r;
    }
    absl::StatusOr<std::string> html = FleetRankHtml(*rank, options);
    if (absl::IsFailedPrecondition(html.status())) continue;
    if (!html.ok()) return html.status();
    const std::string name = absl::StrCat(page.stem().string(), "-rank-", o.rank, ".html");
    if (absl::Status s = WriteOutputFile((page.parent_path() / name).string(), *html); !s.ok()) return s;
    links.push_back({o.rank, name});
  }
  if (absl::Status s = WriteOutputFile(path, FleetHtml(fleet, links)); !s.ok()) return s;
  return static_cast<int>(links.size());
}

// The readers' notes, each said once: a note several ranks share but for
// their file's name ("device 0 of FILE: its trace was replayed ...") is
// said once, with how many ranks it concerns.
std::vector<std::string> GroupedNotes(const std::vector<std::string>& input_notes, const FleetResult& fleet) {
  std::vector<std::string> out = input_notes;
  std::vector<std::pair<std::string, std::string>> grouped;  // (note with FILE, the first rank's note)
  std::map<std::string, int> count;
  for (const FleetRank& r : fleet.ranks) {
    for (const std::string& note : r.notes) {
      const std::string general = absl::StrReplaceAll(note, {{r.source, "FILE"}});
      if (count[general]++ == 0) grouped.emplace_back(general, note);
    }
  }
  for (const auto& [general, first] : grouped) {
    const int n = count[general];
    out.push_back(n == 1 ? first : absl::StrCat(n, " ranks: ", general));
  }
  return out;
}

int Fleet(const FleetArgs& a) {
  std::vector<Budget> budgets;
  for (const std::string& text : a.max) {
    absl::StatusOr<Budget> b = ParseBudget(text);
    if (!b.ok()) return Fail(b.status().message());
    budgets.push_back(*b);
  }
  FleetLoadOptions options;
  options.jobs = a.jobs;
  if (!a.device_memory.empty()) {
    absl::StatusOr<std::uint64_t> size = ParseSize(a.device_memory);
    if (!size.ok()) return Fail(absl::StrCat("--device-memory: ", size.status().message()));
    if (*size == 0) return Fail("--device-memory: must be greater than 0");
    options.device_memory = *size;
  }
  absl::StatusOr<FleetInputs> in = LoadFleet(a.paths, options);
  if (!in.ok()) return Fail(in.status().message());
  const FleetResult fleet = AnalyzeFleet(std::move(in->ranks));
  std::optional<CheckResult> checks;
  if (!budgets.empty()) {
    absl::StatusOr<CheckResult> c = RunChecks(FleetReport(fleet), budgets, nullptr, 0);
    if (!c.ok()) return Fail(c.status().message());
    checks = std::move(*c);
  }
  std::optional<int> reports;
  if (!a.html.empty()) {
    absl::StatusOr<int> written = WriteHtml(fleet, a.html, options);
    if (!written.ok()) return Fail(written.status().message());
    reports = *written;
  }
  if (a.json) {
    nlohmann::json j = FleetJson(fleet);
    if (checks) j["checks"] = CheckJson(*checks);
    std::cout << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << FleetText(fleet);
    if (checks) std::cout << "\n" << CheckText(*checks);
    if (reports) {
      std::cout << "wrote " << a.html
                << (*reports > 0 ? absl::StrCat(" (and the own report of ", *reports, " outlier rank",
                                                *reports == 1 ? "" : "s", " beside it)")
                                 : std::string())
                << "\n";
    }
  }
  PrintNotes(GroupedNotes(in->notes, fleet));
  return checks && checks->failed > 0 ? kExitFailed : kExitOk;
}

}  // namespace

void RegisterFleet(CLI::App& app, int& exit_status) {
  auto args = std::make_shared<FleetArgs>();
  CLI::App* cmd = app.add_subcommand(
      "fleet",
      "Many ranks at once: the spread across ranks, the outlier ranks and what makes them differ; budgets that "
      "every rank must hold (exit 1 when one fails, as memscope check).");
  cmd->add_option("inputs", args->paths,
                  "a directory (run, capture, or one file per rank) or files: PyTorch snapshots, rank-R.timeline, "
                  "report.json or summary --json files")
      ->required();
  cmd->add_option("--max", args->max,
                  "budget METRIC=SIZE (every rank) or rankR.METRIC=SIZE, as memscope check; METRIC: peak_allocated, "
                  "peak_reserved, peak_active; repeatable")
      ->allow_extra_args(false);
  cmd->add_option("--html", args->html, "also write the HTML page (heat map, outliers linked to their own reports)");
  cmd->add_option("--jobs", args->jobs, "files read at once (default: one per core)")->check(InRange(1, 1024));
  cmd->add_option("--device-memory", args->device_memory,
                  "simulated GPU a snapshot is replayed on (default: the capacity its OOM implies, else 80GiB)");
  cmd->add_flag("--json", args->json, "print JSON (schema memscope.fleet/1)");
  cmd->callback([args, &exit_status] { exit_status = Fleet(*args); });
}

}  // namespace memscope::cli
