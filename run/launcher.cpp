#include "run/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "load/output_file.h"
#include "load/run_directory.h"
#include "run/interrupt.h"

extern char** environ;

namespace memscope {

std::string RankExit::Describe() const {
  if (stalled_by != 0) {
    const char* name = sigabbrev_np(stalled_by);
    return absl::StrCat("was stopped by signal ", stalled_by, name ? absl::StrCat(" (SIG", name, ")") : "",
                        absl::StrFormat(" and made no progress for %.0f s; killed", stalled_seconds));
  }
  if (signal != 0 || stopped_by_launcher) {
    const int s = signal != 0 ? signal : exit_code - 128;  // one that stopped as asked exits with 128 + it
    const char* name = sigabbrev_np(s);
    return absl::StrCat(stopped_by_launcher ? "was stopped by signal " : "was killed by signal ", s,
                        name ? absl::StrCat(" (SIG", name, ")") : "");
  }
  return exit_code == 0 ? "exited normally" : absl::StrCat("exited with status ", exit_code);
}

namespace {

constexpr int kStatusFd = 3;  // the rank's end of its status pipe
constexpr const char* kStatusFdVariable = "MEMSCOPE_STATUS_FD";

// Kills the ranks started so far (pid > 0) and reaps them.
void KillAll(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    if (p > 0) ::kill(p, SIGKILL);
  }
  for (pid_t p : pids) {
    if (p > 0) ::waitpid(p, nullptr, 0);
  }
}

// Starts rank `r`: `argv` with the launcher's environment plus RANK,
// LOCAL_RANK and `options.env`, stdout and stderr in its rank-R.log.
absl::StatusOr<pid_t> SpawnRank(const LaunchOptions& options, int r, std::vector<char*>& argv, pid_t launcher,
                                int& status_read_fd) {
  // Everything exec needs is prepared before vfork (the child only calls
  // async-signal-safe functions).
  std::vector<std::string> env_store;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    if (options.env.count(key) == 0 && key != "RANK" && key != "LOCAL_RANK" && key != kStatusFdVariable) {
      env_store.push_back(entry);
    }
  }
  env_store.push_back(absl::StrCat(kStatusFdVariable, "=", kStatusFd));
  for (const auto& [k, v] : options.env) env_store.push_back(absl::StrCat(k, "=", v));
  env_store.push_back(absl::StrCat("RANK=", r));
  env_store.push_back(absl::StrCat("LOCAL_RANK=", r));
  std::vector<char*> envp;
  for (std::string& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string log = RunDirectory(options.log_dir).RankLog(r);
  RunDirectory(options.log_dir).RecordFile(RunDirectory::RankLogName(r));
  const int fd = OpenForWritingNoFollow(log);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create '", log, "': ", std::strerror(errno)));
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot create a status pipe: ", std::strerror(err)));
  }
  // vfork: no copy of the launcher's page tables, and none of its pages
  // made copy-on-write (each would fault at its next write). The child runs
  // on our memory until execve, so it only calls async-signal-safe functions
  // and writes nothing but its own stack; no handler of ours may run in it:
  // SIGINT and SIGTERM (run/interrupt.h's) are blocked across vfork, and the
  // child sets them back to the default (or ignored) before it unblocks them
  // (SIGCHLD is the default).
  sigset_t stop_signals, before;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  // The child's SIGINT and SIGTERM: the default, or ignored when ours are
  // (nohup); prepared here, as the child writes no memory of ours.
  struct sigaction child_int {}, child_term {};
  ::sigaction(SIGINT, nullptr, &child_int);
  ::sigaction(SIGTERM, nullptr, &child_term);
  for (struct sigaction* a : {&child_int, &child_term}) {
    if (a->sa_handler != SIG_IGN) *a = {};  // SIG_DFL
  }
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, &before);
  const pid_t pid = ::vfork();
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (pid < 0) {
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    ::close(fd);
    return absl::InternalError(absl::StrCat("vfork failed: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // ranks do not outlive the launcher
    if (::getppid() != launcher) ::_exit(127);
    ::sigaction(SIGINT, &child_int, nullptr);
    ::sigaction(SIGTERM, &child_term, nullptr);
    ::sigprocmask(SIG_SETMASK, &before, nullptr);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    // The status pipe at fd 3, open across exec (dup2 to itself would keep O_CLOEXEC).
    if (pipe_fds[1] == kStatusFd) {
      ::fcntl(kStatusFd, F_SETFD, 0);
    } else {
      ::dup2(pipe_fds[1], kStatusFd);
    }
    ::execve(argv[0], argv.data(), envp.data());
    static const char kMessage[] = "memscope launcher: execve of the rank failed\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    ::_exit(127);
  }
  ::close(fd);
  ::close(pipe_fds[1]);
  status_read_fd = pipe_fds[0];
  return pid;
}

// What a rank wrote to its status pipe (after it exited: the pipe holds
// it): its last line, each sent as "E LINE", "S LINE" or "C LINE"
// (RankFailure kError, kStopRun, kCannotRun); what any line asked is set in `e`.
std::string ReadStatusPipe(int fd, RankExit& e) {
  std::string text;
  char buf[4096];
  ::fcntl(fd, F_SETFL, O_NONBLOCK);
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0 && text.size() < 65536) {
      text.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  auto sent = [&text](const char* tag) {
    return text.rfind(tag, 0) == 0 || text.find(absl::StrCat("\n", tag)) != std::string::npos;
  };
  e.cannot_run = sent("C ");
  e.stop_run = e.cannot_run || sent("S ");
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (const std::size_t nl = text.rfind('\n'); nl != std::string::npos) text.erase(0, nl + 1);  // the last line
  if (text.size() >= 2 && text[1] == ' ' && (text[0] == 'E' || text[0] == 'S' || text[0] == 'C')) text.erase(0, 2);
  return text;
}

// Waits for every rank (pids[r]) to end, recording how in `result` (times
// since `start`, the launch). After
// the first failure the others get `grace`, then SIGTERM, 5 s later SIGKILL.
// The first SIGINT or SIGTERM of this process goes on to the ranks, which
// get 10 s to stop, then SIGKILL. It polls (every 10 ms): a signal that
// comes just before a blocking wait would not end it.
absl::Status Supervise(const LaunchOptions& options, std::chrono::steady_clock::time_point start,
                       std::vector<pid_t>& pids, std::vector<int>& status_fds, LaunchResult& result) {
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  int running = options.world_size;
  std::chrono::steady_clock::time_point deadline{};
  bool stopping = false, terminated = false;
  // When each stopped rank stopped (and by which signal); a rank that
  // continues is removed. A stopped rank cannot make progress: after
  // `options.stall` it is the run's failure.
  std::map<std::size_t, std::pair<std::chrono::steady_clock::time_point, int>> stopped;
  auto fail_first = [&](std::size_t r) {
    if (result.first_failure >= 0 || result.interrupted != 0) return;
    result.first_failure = static_cast<int>(r);
    stopping = true;
    deadline = std::chrono::steady_clock::now() + options.grace;
  };
  while (running > 0) {
    if (const int signal = InterruptSignal().load(); signal != 0 && result.interrupted == 0) {
      result.interrupted = signal;  // the user's: the ranks stop as it asks, they did not fail
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, signal);
      }
      stopping = terminated = true;  // the deadline's signal is SIGKILL
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) {
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, SIGKILL);
      }
      return absl::InternalError(absl::StrCat("waiting for the ranks failed: ", std::strerror(errno)));
    }
    if (pid > 0 && (WIFSTOPPED(status) || WIFCONTINUED(status))) {
      for (std::size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] != pid) continue;
        if (WIFSTOPPED(status)) {
          stopped.emplace(r, std::make_pair(std::chrono::steady_clock::now(), WSTOPSIG(status)));
        } else {
          stopped.erase(r);
        }
      }
      continue;
    }
    if (pid == 0) {  // stopping, or a rank is stopped: others still running
      const auto now = std::chrono::steady_clock::now();
      for (auto it = stopped.begin(); it != stopped.end();) {
        if (now - it->second.first < options.stall || pids[it->first] <= 0) {
          ++it;
          continue;
        }
        RankExit& e = result.ranks[it->first];
        e.stalled_by = it->second.second;
        e.stalled_seconds = std::chrono::duration<double>(now - it->second.first).count();
        fail_first(it->first);
        ::kill(pids[it->first], SIGKILL);  // its peers see it gone and fail at once
        it = stopped.erase(it);
      }
      if (stopping && now >= deadline) {
        for (std::size_t r = 0; r < pids.size(); ++r) {
          if (pids[r] <= 0) continue;
          ::kill(pids[r], terminated ? SIGKILL : SIGTERM);
          result.ranks[r].stopped_by_launcher = true;
        }
        deadline = now + std::chrono::seconds(5);
        terminated = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] != pid) continue;
      pids[r] = -1;
      --running;
      stopped.erase(r);
      RankExit& e = result.ranks[r];
      e.seconds = since();
      e.message = ReadStatusPipe(status_fds[r], e);
      ::close(status_fds[r]);
      status_fds[r] = -1;
      if (WIFSIGNALED(status)) {
        e.signal = WTERMSIG(status);
      } else {
        e.exit_code = WEXITSTATUS(status);
        e.stopped_by_launcher = e.stopped_by_launcher && e.exit_code == 128 + SIGTERM;  // it stopped as asked
      }
      if (!e.ok() && result.first_failure < 0 && !e.stopped_by_launcher) fail_first(r);
      // A rank that could not run, or that a signal killed, is the cause of
      // what a peer that failed just before it saw ("rank 1 closed its
      // connection (exited or was killed)"): it comes first. waitpid may
      // return the peer first when both exited between two polls.
      auto is_cause = [](const RankExit& x) { return x.cannot_run || (x.signal != 0 && !x.stopped_by_launcher); };
      if (const int f = result.first_failure; f >= 0 && static_cast<std::size_t>(f) != r && !e.ok() && is_cause(e) &&
                                              !is_cause(result.ranks[static_cast<std::size_t>(f)]) &&
                                              e.seconds - result.ranks[static_cast<std::size_t>(f)].seconds < 1.0) {
        result.first_failure = static_cast<int>(r);
      }
      // Its peers cannot notice this failure: no grace, they are stopped now.
      if (!e.ok() && e.stop_run && stopping) deadline = std::min(deadline, std::chrono::steady_clock::now());
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LaunchResult> LaunchRanks(const LaunchOptions& options) {
  // An inherited SIGCHLD=SIG_IGN would reap the ranks for us and lose their
  // exit statuses.
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  struct sigaction old_chld = {};
  ::sigaction(SIGCHLD, &dfl, &old_chld);
  struct Restore {
    struct sigaction* old;
    ~Restore() { ::sigaction(SIGCHLD, old, nullptr); }
  } restore{&old_chld};
  const pid_t launcher = ::getpid();
  const auto start = std::chrono::steady_clock::now();
  LaunchResult result;
  result.ranks.resize(static_cast<std::size_t>(options.world_size));
  std::vector<pid_t> pids(static_cast<std::size_t>(options.world_size), -1);
  std::vector<int> status_fds(static_cast<std::size_t>(options.world_size), -1);
  struct CloseAll {
    std::vector<int>* fds;
    ~CloseAll() {
      for (int fd : *fds) {
        if (fd >= 0) ::close(fd);
      }
    }
  } close_all{&status_fds};

  std::vector<std::string> argv_store{options.executable};
  argv_store.insert(argv_store.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_store) argv.push_back(a.data());
  argv.push_back(nullptr);

  for (int r = 0; r < options.world_size; ++r) {
    absl::StatusOr<pid_t> pid = SpawnRank(options, r, argv, launcher, status_fds[static_cast<std::size_t>(r)]);
    if (!pid.ok()) {
      KillAll(pids);
      return pid.status();
    }
    pids[static_cast<std::size_t>(r)] = *pid;
    result.ranks[static_cast<std::size_t>(r)].rank = r;
  }
  if (absl::Status s = Supervise(options, start, pids, status_fds, result); !s.ok()) return s;
  return result;
}

void ReportToLauncher(const std::string& line, RankFailure kind) {
  const char* fd_text = std::getenv(kStatusFdVariable);
  int fd = -1;
  if (fd_text == nullptr || !absl::SimpleAtoi(fd_text, &fd) || fd < 0) return;
  const char* tag = kind == RankFailure::kCannotRun ? "C " : kind == RankFailure::kStopRun ? "S " : "E ";
  const std::string text = absl::StrCat(tag, line, "\n");
  (void)!::write(fd, text.data(), std::min<std::size_t>(text.size(), 4096));
}

}  // namespace memscope
