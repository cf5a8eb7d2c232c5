// memscope compare RUN_A RUN_B [--rank R] [--json]: two runs side by side,
// rank by rank (compare/compare.h): the phase tables with B - A, the peaks,
// and the categories that explain the difference.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "compare/compare.h"
#include "recording/timeline.h"
#include "run/run.h"

namespace memscope::cli {
namespace {

struct CompareArgs {
  std::vector<std::string> runs;
  int rank = -1;
  bool rank_given = false;
  bool json = false;
};

int Fail(absl::string_view message) { return cli::Fail("compare", message); }

int CompareCommand(const CompareArgs& a) {
  if (a.runs.size() != 2) return Fail("give two runs: memscope compare RUN_A RUN_B");
  if (a.rank_given && a.rank < 0) return Fail(absl::StrCat("--rank ", a.rank, ": must be 0 or more"));
  std::vector<CompareInput> inputs;
  for (const std::string& path : a.runs) {
    std::vector<std::string> notes;
    absl::StatusOr<CompareInput> input = LoadCompareInput(path, &notes);
    if (!input.ok()) return Fail(input.status().message());
    PrintNotes(notes);
    inputs.push_back(std::move(*input));
  }
  absl::StatusOr<Comparison> comparison = Compare(inputs[0], inputs[1], a.rank_given ? a.rank : -1);
  if (!comparison.ok()) return Fail(comparison.status().message());
  if (a.json) {
    std::cout << ComparisonJson(*comparison).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << FormatComparison(*comparison);
  }
  return kExitOk;
}

}  // namespace

void RegisterCompare(CLI::App& app, int& exit_status) {
  auto args = std::make_shared<CompareArgs>();
  CLI::App* cmd = app.add_subcommand(
      "compare",
      "Compare two runs rank by rank: phase tables side by side with B-A, the peaks, and the memory categories "
      "that explain the difference (at the peak and at the end of the run).");
  cmd->add_option("runs", args->runs,
                  "RUN_A RUN_B: run directories, rank-R.timeline files, report.json files or PyTorch memory "
                  "snapshots (.pickle)")
      ->required()
      ->expected(2);
  cmd->add_option("--rank", args->rank, "only this rank (default: every rank both runs have)")
      ->check(InRange(0, kMaxTimelineWorldSize - 1))
      ->each([args](const std::string&) { args->rank_given = true; });
  cmd->add_flag("--json", args->json, "print the comparison as JSON (schema memscope.compare/1)");
  cmd->callback([args, &exit_status] { exit_status = CompareCommand(*args); });
}

}  // namespace memscope::cli
