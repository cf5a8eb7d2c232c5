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
#include "base/utf8.h"
#include "cli/commands.h"

namespace memscope::cli {

std::string EscapeForTerminal(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto hex = [&out](unsigned char c) { absl::StrAppendFormat(&out, "\\x%02x", c); };
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      hex(c);
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      // Valid UTF-8 (base/utf8.h) passes, except C1 controls (U+0080..U+009F,
      // which some terminals obey); any other byte is shown as \xNN.
      const std::size_t n = Utf8Sequence(reinterpret_cast<const unsigned char*>(text.data()), text.size(), i);
      const bool c1 = n == 2 && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0;
      if (n == 0 || c1) {
        hex(c);
        ++i;
        continue;
      }
      out.append(text.data() + i, n);
      i += n;
      continue;
    }
    ++i;
  }
  return out;
}

int Fail(absl::string_view command, absl::string_view message) {
  const std::string text = EscapeForTerminal(message);
  std::fprintf(stderr, "memscope %.*s: %s\n", static_cast<int>(command.size()), command.data(), text.c_str());
  return kExitBadInput;
}

void PrintNotes(const std::vector<std::string>& notes) {
  for (const std::string& note : notes) {
    std::fprintf(stderr, "memscope: note: %s\n", EscapeForTerminal(note).c_str());
  }
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
// silent success.
int FinishOutput(int exit_status) {
  std::cout.flush();
  errno = 0;
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) != 0 || !std::cout;
  if (!failed) return exit_status;
  // The failed write's errno is often overwritten by then: say it only when fflush set it.
  const int error = errno;
  std::fprintf(stderr, "memscope: error: cannot write standard output%s%s\n", error != 0 ? ": " : "",
               error != 0 ? std::strerror(error) : "");
  return exit_status != kExitOk ? exit_status : kExitBadInput;
}

}  // namespace memscope::cli

int main(int argc, char** argv) {
  CLI::App app{"memscope: GPU memory profiler and fragmentation analyzer (PyTorch caching allocator, DDP)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("memscope 0.1.0"));
  int exit_status = memscope::cli::kExitOk;
  memscope::cli::RegisterReplay(app, exit_status);
  memscope::cli::RegisterProfileCommands(app, exit_status);
  memscope::cli::RegisterCheck(app, exit_status);
  memscope::cli::RegisterRun(app, exit_status);
  memscope::cli::RegisterReport(app, exit_status);
  memscope::cli::RegisterCompare(app, exit_status);
  memscope::cli::RegisterPlan(app, exit_status);
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
  memscope::cli::RegisterCapture(app, exit_status, job);
  // Name an unknown command instead of CLI11's generic "subcommand required".
  auto is_command = [&](const char* name) {
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->check_name(name)) return true;
    }
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !is_command(argv[1])) {
    std::fprintf(stderr, "memscope: error: unknown command '%s' (see memscope --help)\n",
                 memscope::cli::EscapeForTerminal(argv[1]).c_str());
    return memscope::cli::kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return memscope::cli::FinishOutput(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return memscope::cli::FinishOutput(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return memscope::cli::FinishOutput(app.exit(e));
  } catch (const CLI::ParseError& e) {
    // Point at the help of the command that was given, when there is one.
    std::string help = "memscope";
    for (const CLI::App* sub : app.get_subcommands()) help += " " + sub->get_name();
    std::fprintf(stderr, "memscope: error: %s (see %s --help)\n", memscope::cli::EscapeForTerminal(e.what()).c_str(),
                 help.c_str());
    return memscope::cli::kExitBadInput;
  }
  return memscope::cli::FinishOutput(exit_status);
}
