// Ctrl-C and SIGTERM during `memscope run` (docs/run.md, "Interrupted runs").
//
// The first SIGINT or SIGTERM asks the run to stop, nothing more: its
// number goes to InterruptSignal(), which the training loop reads before
// each phase (TrainOptions::interrupt) and the rendezvous while it waits
// (GlooOptions::interrupt). A rank then ends its training, writes its
// timeline and its status ("interrupted"); our launcher passes the signal
// on to its ranks and, once they have ended, writes run.json (saying
// "interrupted") and the reports of what was recorded, says so in one line
// and exits with 128 + the signal, as a shell expects (130, 143).
//
// A second signal ends a process that started the run (`exit_at_second`:
// the launcher, or one rank run in this process) at once, with 128 + that
// signal; its ranks die with it (PR_SET_PDEATHSIG). A rank started by a
// launcher only counts the first: Ctrl-C reaches it from the terminal and
// from our launcher, and the launcher is the one that stops at once.
//
//   InterruptHandlers handlers(/*exit_at_second=*/true);
//   options.interrupt = &InterruptSignal();
//   ... train ...
//   if (const int signal = InterruptSignal().load(); signal != 0) ...
#ifndef MEMSCOPE_RUN_INTERRUPT_H_
#define MEMSCOPE_RUN_INTERRUPT_H_

#include <signal.h>

#include <atomic>
#include <string>

namespace memscope {

// Handlers for SIGINT and SIGTERM while alive (without SA_RESTART: a
// waiting system call returns EINTR); the previous ones back on destruction.
// A signal ignored when they are installed (nohup) stays ignored.
class InterruptHandlers {
 public:
  explicit InterruptHandlers(bool exit_at_second);
  ~InterruptHandlers();
  InterruptHandlers(const InterruptHandlers&) = delete;
  InterruptHandlers& operator=(const InterruptHandlers&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// The first SIGINT or SIGTERM received under InterruptHandlers (its
// number), 0 when none.
const std::atomic<int>& InterruptSignal();

// "SIGINT", "SIGTERM", "signal N".
std::string SignalName(int signal);

}  // namespace memscope

#endif  // MEMSCOPE_RUN_INTERRUPT_H_
