#include "run/interrupt.h"

#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

static_assert(std::atomic<int>::is_always_lock_free, "an atomic set in a signal handler must be lock-free");

std::atomic<int> first_signal{0};
std::atomic<bool> exit_at_second{false};

// Async-signal-safe: an atomic exchange, and for the second signal write() and _exit().
void OnSignal(int signal) {
  int none = 0;
  if (first_signal.compare_exchange_strong(none, signal) || !exit_at_second.load()) return;
  static const char kLine[] = "memscope run: interrupted again: stopped at once\n";
  (void)!::write(STDERR_FILENO, kLine, sizeof(kLine) - 1);
  ::_exit(128 + signal);
}

}  // namespace

InterruptHandlers::InterruptHandlers(bool exit_at_second_signal) {
  exit_at_second.store(exit_at_second_signal);
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: the launcher's wait returns EINTR
  // A signal ignored on entry stays ignored (`nohup`, a background job of a
  // shell without job control), as a shell would leave it.
  ::sigaction(SIGINT, nullptr, &old_int_);
  ::sigaction(SIGTERM, nullptr, &old_term_);
  if (old_int_.sa_handler != SIG_IGN) ::sigaction(SIGINT, &action, nullptr);
  if (old_term_.sa_handler != SIG_IGN) ::sigaction(SIGTERM, &action, nullptr);
}

InterruptHandlers::~InterruptHandlers() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

const std::atomic<int>& InterruptSignal() { return first_signal; }

std::string SignalName(int signal) {
  if (const char* abbrev = sigabbrev_np(signal); abbrev != nullptr) return absl::StrCat("SIG", abbrev);
  return absl::StrCat("signal ", signal);
}

}  // namespace memscope
