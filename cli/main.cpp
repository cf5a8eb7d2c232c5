// memscope: GPU memory profiler and fragmentation analyzer for PyTorch-style
// (DDP) training. See README.md.
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "cli/commands.h"

namespace memscope::cli {

int Fail(absl::string_view command, absl::string_view message) {
  std::fprintf(stderr, "memscope %.*s: %.*s\n", static_cast<int>(command.size()), command.data(),
               static_cast<int>(message.size()), message.data());
  return kExitBadInput;
}

void PrintNotes(const std::vector<std::string>& notes) {
  for (const std::string& note : notes) std::fprintf(stderr, "memscope: note: %s\n", note.c_str());
}

void PrintNotes(const std::vector<Timeline>& timelines) {
  for (const Timeline& t : timelines) PrintNotes(t.notes);
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
  // Name an unknown command instead of CLI11's generic "subcommand required".
  auto is_command = [&](const char* name) {
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->check_name(name)) return true;
    }
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !is_command(argv[1])) {
    std::fprintf(stderr, "memscope: error: unknown command '%s' (see memscope --help)\n", argv[1]);
    return memscope::cli::kExitBadInput;
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
    std::fprintf(stderr, "memscope: error: %s (see memscope --help)\n", e.what());
    return memscope::cli::kExitBadInput;
  }
  return exit_status;
}
