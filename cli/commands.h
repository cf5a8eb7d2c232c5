// The memscope subcommands. Each Register* adds its subcommand to the app;
// the subcommand's callback sets the process exit status.
#ifndef MEMSCOPE_CLI_COMMANDS_H_
#define MEMSCOPE_CLI_COMMANDS_H_

#include "CLI/CLI.hpp"

namespace memscope::cli {

// Exit statuses shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;     // a check failed (memscope check, replay --verify)
inline constexpr int kExitBadInput = 2;   // unusable input: flags, files, settings

void RegisterReplay(CLI::App& app, int& exit_status);
// summary, trace, snapshot, frag, dump: commands that read a recording.
void RegisterProfileCommands(CLI::App& app, int& exit_status);
// check: the CI gate on peak memory.
void RegisterCheck(CLI::App& app, int& exit_status);

}  // namespace memscope::cli

#endif  // MEMSCOPE_CLI_COMMANDS_H_
