// The memscope subcommands. Each Register* adds its subcommand to the app;
// the subcommand's callback sets the process exit status.
#ifndef MEMSCOPE_CLI_COMMANDS_H_
#define MEMSCOPE_CLI_COMMANDS_H_

#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/string_view.h"
#include "allocator/config.h"
#include "base/terminal_text.h"  // EscapeForTerminal: every message that echoes input
#include "recording/event.h"

namespace memscope::cli {

// Exit statuses shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;    // a check failed (memscope check, replay --verify)
inline constexpr int kExitBadInput = 2;  // unusable input: flags, files, settings

// base/terminal_text.h's EscapeForTerminal, for Abseil's string_view.
inline std::string EscapeForTerminal(absl::string_view text) {
  return memscope::EscapeForTerminal(std::string_view(text.data(), text.size()));
}

// Prints "memscope COMMAND: MESSAGE" (one line, escaped) on stderr and returns
// kExitBadInput: the way every command reports unusable input.
int Fail(absl::string_view command, absl::string_view message);

// What the readers of these recordings want the user to know
// (Timeline::notes: a snapshot replayed, a truncated trace, ...), printed on
// stderr once the command has succeeded, after its output: a command that
// fails (Fail, exit 2) says its error alone.
void PrintNotes(const std::vector<Timeline>& timelines);
void PrintNotes(const std::vector<std::string>& notes);
// Prints the notes so far now, for a command that has succeeded and ends
// with a line of its own (capture: where it recorded).
void FlushNotes();

// The note for settings that PyTorch accepts and then ignores:
// garbage_collection_threshold without a per-process memory fraction (from
// the settings' per_process_memory_fraction or `fraction`, < 1 for a cap).
// Returns the note ("" when none) after printing it.
std::string NoteGcWithoutFraction(const AllocatorConfig& config, double fraction = 1.0);

// Adds to every option of `app` and its commands, registered by then, the
// checks CLI11 leaves out: an empty value is refused (CLI11 reads '' as 0 for
// a number and as "not given" for text), but by --alloc-conf, where '' is
// the allocator's defaults; an integer that does not fit 64 bits, or a
// negative one for an unsigned option, is refused (CLI11 would saturate it
// to INT64_MAX, or wrap -1 to 2^64 - 1). Each is one line, exit 2.
void CheckOptionValues(CLI::App& app);

// CLI::Range(min, max) ("--rank: Value 9 not in range 0 to 3"), but an
// empty value is left to CheckOptionValues to name.
template <typename T>
CLI::Validator InRange(T min, T max) {
  const CLI::Range range(min, max);
  return CLI::Validator(
      [range](std::string& value) -> std::string { return value.empty() ? std::string() : range(value); },
      range.get_description());
}

void RegisterReplay(CLI::App& app, int& exit_status);
// summary, trace, snapshot, frag, dump: commands that read a recording.
void RegisterProfileCommands(CLI::App& app, int& exit_status);
// check: the CI gate on peak memory.
void RegisterCheck(CLI::App& app, int& exit_status);
// run and models: the reference training loop and its zoo.
void RegisterRun(CLI::App& app, int& exit_status);
// report: the self-contained HTML report (one run, or two compared).
void RegisterReport(CLI::App& app, int& exit_status);
// compare: two runs side by side, rank by rank, with what explains the difference.
void RegisterCompare(CLI::App& app, int& exit_status);
// fleet: many ranks at once: the spread, the outliers and what makes them differ.
void RegisterFleet(CLI::App& app, int& exit_status);
// explain: why it ran out of memory, and what would have saved it.
void RegisterExplain(CLI::App& app, int& exit_status);
// plan: the largest batch that fits a GPU, per strategy combination.
void RegisterPlan(CLI::App& app, int& exit_status);

// capture: a real PyTorch job run under memscope's start-up module. `job`:
// the words after the first `--` of the command line (main removes them
// from what CLI11 parses), or nullopt without one.
void RegisterCapture(CLI::App& app, int& exit_status, const std::optional<std::vector<std::string>>& job);

}  // namespace memscope::cli

#endif  // MEMSCOPE_CLI_COMMANDS_H_
