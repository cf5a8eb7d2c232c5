// memscope: GPU memory profiler and fragmentation analyzer for PyTorch-style
// (DDP) training. See README.md and docs/
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "base/terminal_text.h"
#include "cli/commands.h"

namespace memscope::cli {

namespace {

// The readers' notes of this command, printed once it has succeeded
// (FinishOutput): a command that fails says one line, its error.
std::vector<std::string>& PendingNotes() {
  static std::vector<std::string> notes;
  return notes;
}
bool command_failed = false;  // Fail() was called: the notes are dropped

}  // namespace

int Fail(absl::string_view command, absl::string_view message) {
  const std::string text = EscapeForTerminal(message);
  std::fprintf(stderr, "memscope %.*s: %s\n", static_cast<int>(command.size()), command.data(), text.c_str());
  command_failed = true;
  return kExitBadInput;
}

void PrintNotes(const std::vector<std::string>& notes) {
  for (const std::string& note : notes) PendingNotes().push_back(note);
}

void FlushNotes() {
  std::cout.flush();
  for (const std::string& note : PendingNotes()) {
    std::fprintf(stderr, "memscope: note: %s\n", EscapeForTerminal(note).c_str());
  }
  PendingNotes().clear();
}

std::string NoteGcWithoutFraction(const AllocatorConfig& config, double fraction) {
  if (config.garbage_collection_threshold <= 0.0 || config.per_process_memory_fraction < 1.0 || fraction < 1.0)
    return "";
  std::string note =
      "garbage_collection_threshold has no effect without a per-process memory fraction "
      "(--memory-fraction, or per_process_memory_fraction in the allocator settings)";
  PrintNotes(std::vector<std::string>{note});
  return note;
}

void PrintNotes(const std::vector<Timeline>& timelines) {
  for (const Timeline& t : timelines) PrintNotes(t.notes);
}

// The exit status once standard output is flushed: output that could not be
// written (a full disk, a closed pipe, `> /dev/full`) is an error, never a
// silent success. Then the notes, unless the command failed.
int FinishOutput(int exit_status, TerminalStreamBuf& out) {
  std::cout.flush();
  errno = 0;
  const bool finished = out.Finish();
  const bool failed_output = !finished || std::fflush(stdout) != 0 || std::ferror(stdout) != 0 || !std::cout;
  if (!failed_output) {
    if (!command_failed && exit_status != kExitBadInput) FlushNotes();
    return exit_status;
  }
  // The failed write's errno is often overwritten by then: say it only when fflush set it.
  const int error = errno;
  std::fprintf(stderr, "memscope: error: cannot write standard output%s%s\n", error != 0 ? ": " : "",
               error != 0 ? std::strerror(error) : "");
  return exit_status != kExitOk ? exit_status : kExitBadInput;
}

// std::cout and std::cerr through the terminal escaping (base/terminal_text.h)
// while it lives: no byte of any command's output reaches the terminal
// unescaped, whichever path printed it.
class TerminalStreams {
 public:
  TerminalStreams() : out_(std::cout.rdbuf()), err_(std::cerr.rdbuf()) {
    std::cout.rdbuf(&out_);
    std::cerr.rdbuf(&err_);
  }
  ~TerminalStreams() {
    err_.Finish();
    std::cout.rdbuf(out_target_);
    std::cerr.rdbuf(err_target_);
  }
  TerminalStreams(const TerminalStreams&) = delete;
  TerminalStreams& operator=(const TerminalStreams&) = delete;
  TerminalStreamBuf& out() { return out_; }

 private:
  std::streambuf* out_target_ = std::cout.rdbuf();
  std::streambuf* err_target_ = std::cerr.rdbuf();
  TerminalStreamBuf out_;
  TerminalStreamBuf err_;
};

// The command line parsed and its command run: the exit status.
int Main(int argc, char** argv) {
  CLI::App app{"memscope: GPU memory profiler and fragmentation analyzer (PyTorch caching allocator, DDP)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("memscope 0.1.0"));
  int exit_status = kExitOk;
  RegisterReplay(app, exit_status);
  RegisterProfileCommands(app, exit_status);
  RegisterCheck(app, exit_status);
  RegisterRun(app, exit_status);
  RegisterReport(app, exit_status);
  RegisterCompare(app, exit_status);
  RegisterFleet(app, exit_status);
  RegisterPlan(app, exit_status);
  RegisterExplain(app, exit_status);
  // memscope capture ... -- CMD ARGS: the job's words after `--` never reach CLI11.
  std::optional<std::vector<std::string>> job;
  if (argc > 1 && std::string_view(argv[1]) == "capture") {
    for (int i = 2; i < argc; ++i) {
      if (std::string_view(argv[i]) == "--") {
        job.emplace(argv + i + 1, argv + argc);
        argc = i;
        break;
      }
    }
  }
  RegisterCapture(app, exit_status, job);
  CheckOptionValues(app);
  // Name an unknown command instead of CLI11's generic "subcommand required".
  auto is_command = [&](const char* name) {
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->check_name(name)) return true;
    }
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !is_command(argv[1])) {
    std::fprintf(stderr, "memscope: error: unknown command '%s' (see memscope --help)\n",
                 EscapeForTerminal(argv[1]).c_str());
    return kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Point at the help of the command that was given, when there is one.
    std::string help = "memscope";
    for (const CLI::App* sub : app.get_subcommands()) help += " " + sub->get_name();
    std::fprintf(stderr, "memscope: error: %s (see %s --help)\n", EscapeForTerminal(e.what()).c_str(),
                 help.c_str());
    return kExitBadInput;
  }
  return exit_status;
}

}  // namespace memscope::cli

int main(int argc, char** argv) {
  memscope::cli::TerminalStreams streams;
  const int exit_status = memscope::cli::Main(argc, argv);
  return memscope::cli::FinishOutput(exit_status, streams.out());
}
