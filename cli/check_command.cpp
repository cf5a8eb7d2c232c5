// memscope check RUN|REPORT [--max METRIC=SIZE]... [--baseline REPORT --tolerance PCT] [--junit FILE] [--json]:
// memory budgets and baseline regressions for CI. Exit 0 when every check
// holds, 1 when one fails, 2 for unusable input.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "check/check.h"
#include "cli/commands.h"
#include "nlohmann/json.hpp"
#include "load/recording.h"
#include "run/run.h"

namespace memscope::cli {
namespace {

int Fail(absl::string_view message) { return cli::Fail("check", message); }

struct CheckArgs {
  std::string path;
  std::vector<std::string> max;
  std::string baseline;
  std::string tolerance;
  std::string junit;
  bool json = false;
};

// The report to check, with the readers' notes on stderr.
absl::StatusOr<Report> LoadCheckedReport(const std::string& path) {
  absl::StatusOr<LoadedReport> loaded = LoadReport(path);
  if (!loaded.ok()) return loaded.status();
  PrintNotes(loaded->timelines);
  return std::move(loaded->report);
}

int Check(const CheckArgs& a) {
  std::vector<Budget> budgets;
  for (const std::string& text : a.max) {
    absl::StatusOr<Budget> b = ParseBudget(text);
    if (!b.ok()) return Fail(b.status().message());
    budgets.push_back(*b);
  }
  double tolerance = 0;
  if (!a.tolerance.empty()) {
    if (a.baseline.empty()) return Fail("--tolerance needs --baseline REPORT");
    absl::string_view t = absl::StripAsciiWhitespace(a.tolerance);
    if (absl::EndsWith(t, "%")) t.remove_suffix(1);
    if (!absl::SimpleAtod(t, &tolerance) || !std::isfinite(tolerance) || tolerance < 0) {
      return Fail(absl::StrCat("invalid --tolerance '", a.tolerance, "': expected a percentage >= 0, e.g. 10"));
    }
  }
  if (budgets.empty() && a.baseline.empty())
    return Fail("nothing to check: give --max METRIC=SIZE or --baseline REPORT");

  absl::StatusOr<Report> report = LoadCheckedReport(a.path);
  if (!report.ok()) return Fail(report.status().message());
  std::optional<Report> baseline;
  if (!a.baseline.empty()) {
    absl::StatusOr<Report> b = LoadCheckedReport(a.baseline);
    if (!b.ok()) return Fail(absl::StrCat("baseline: ", b.status().message()));
    baseline = std::move(*b);
  }
  absl::StatusOr<CheckResult> result = RunChecks(*report, budgets, baseline ? &*baseline : nullptr, tolerance);
  if (!result.ok()) return Fail(result.status().message());

  if (a.json) {
    std::cout << CheckJson(*result).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << CheckText(*result);
  }
  std::cout.flush();
  if (!a.junit.empty()) {
    std::ofstream out(a.junit, std::ios::binary | std::ios::trunc);
    if (out) out << JUnitXml(*result);
    out.close();
    if (!out) return Fail(absl::StrCat("cannot write '", a.junit, "'"));
  }
  return result->failed > 0 ? kExitFailed : kExitOk;
}

}  // namespace

void RegisterCheck(CLI::App& app, int& exit_status) {
  auto args = std::make_shared<CheckArgs>();
  CLI::App* cmd = app.add_subcommand(
      "check",
      "Check memory budgets and regressions against a baseline (for CI): exit 0 when every check holds, 1 when "
      "one fails, 2 for unusable input.");
  cmd->add_option("run", args->path, "run directory, rank-R.timeline file or report.json")->required();
  cmd->add_option("--max", args->max,
                  "budget METRIC=SIZE (every rank) or rankR.METRIC=SIZE; METRIC: peak_allocated, peak_reserved, "
                  "peak_active; SIZE e.g. 2GiB, 512MB; repeatable")
      ->allow_extra_args(false);
  cmd->add_option("--baseline", args->baseline,
                  "report.json (or run directory) to compare with: fail when a rank's peak grew by more than "
                  "--tolerance");
  cmd->add_option("--tolerance", args->tolerance, "allowed growth over the baseline in percent (default 0)");
  cmd->add_option("--junit", args->junit, "also write the checks as JUnit XML to this file");
  cmd->add_flag("--json", args->json, "print the checks as JSON");
  cmd->callback([args, &exit_status] { exit_status = Check(*args); });
}

}  // namespace memscope::cli
