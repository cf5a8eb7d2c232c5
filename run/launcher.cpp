#include "run/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "run/run_directory.h"

extern char** environ;

namespace memscope {

std::string RankExit::Describe() const {
  if (signal != 0) {
    const char* name = sigabbrev_np(signal);
    return absl::StrCat(stopped_by_launcher ? "was stopped by signal " : "was killed by signal ", signal,
                        name ? absl::StrCat(" (SIG", name, ")") : "");
  }
  return exit_code == 0 ? "exited normally" : absl::StrCat("exited with status ", exit_code);
}

namespace {

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
absl::StatusOr<pid_t> SpawnRank(const LaunchOptions& options, int r, std::vector<char*>& argv, pid_t launcher) {
  // Everything exec needs is prepared before fork (the child only calls
  // async-signal-safe functions).
  std::vector<std::string> env_store;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    if (options.env.count(key) == 0 && key != "RANK" && key != "LOCAL_RANK") env_store.push_back(entry);
  }
  for (const auto& [k, v] : options.env) env_store.push_back(absl::StrCat(k, "=", v));
  env_store.push_back(absl::StrCat("RANK=", r));
  env_store.push_back(absl::StrCat("LOCAL_RANK=", r));
  std::vector<char*> envp;
  for (std::string& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string log = RunDirectory(options.log_dir).RankLog(r);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create '", log, "': ", std::strerror(errno)));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("fork failed: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // ranks do not outlive the launcher
    if (::getppid() != launcher) ::_exit(127);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    static const char kMessage[] = "memscope launcher: execve of the rank failed\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    ::_exit(127);
  }
  ::close(fd);
  return pid;
}

// Waits for every rank (pids[r]) to end, recording how in `result` (times
// since `start`, the launch). After
// the first failure the others get `grace`, then SIGTERM, 5 s later SIGKILL.
absl::Status Supervise(const LaunchOptions& options, std::chrono::steady_clock::time_point start,
                       std::vector<pid_t>& pids, LaunchResult& result) {
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  int running = options.world_size;
  std::chrono::steady_clock::time_point deadline{};
  bool stopping = false, terminated = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) {
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, SIGKILL);
      }
      return absl::InternalError(absl::StrCat("waiting for the ranks failed: ", std::strerror(errno)));
    }
    if (pid == 0) {  // stopping: others still running
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        for (std::size_t r = 0; r < pids.size(); ++r) {
          if (pids[r] <= 0) continue;
          ::kill(pids[r], terminated ? SIGKILL : SIGTERM);
          result.ranks[r].stopped_by_launcher = true;
        }
        deadline = now + std::chrono::seconds(5);
        terminated = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] != pid) continue;
      pids[r] = -1;
      --running;
      RankExit& e = result.ranks[r];
      e.seconds = since();
      if (WIFSIGNALED(status)) {
        e.signal = WTERMSIG(status);
      } else {
        e.exit_code = WEXITSTATUS(status);
        e.stopped_by_launcher = false;
      }
      if (!e.ok() && result.first_failure < 0 && !e.stopped_by_launcher) {
        result.first_failure = static_cast<int>(r);
        stopping = true;
        deadline = std::chrono::steady_clock::now() + options.grace;
      }
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

  std::vector<std::string> argv_store{options.executable};
  argv_store.insert(argv_store.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_store) argv.push_back(a.data());
  argv.push_back(nullptr);

  for (int r = 0; r < options.world_size; ++r) {
    absl::StatusOr<pid_t> pid = SpawnRank(options, r, argv, launcher);
    if (!pid.ok()) {
      KillAll(pids);
      return pid.status();
    }
    pids[static_cast<std::size_t>(r)] = *pid;
    result.ranks[static_cast<std::size_t>(r)].rank = r;
  }
  if (absl::Status s = Supervise(options, start, pids, result); !s.ok()) return s;
  return result;
}

}  // namespace memscope
