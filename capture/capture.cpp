#include "capture/capture.h"

#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/input_file.h"
#include "capture/module.h"
#include "exporters/report.h"
#include "load/output_file.h"
#include "load/run_directory.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace memscope {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

// The job's pid while it runs, for the handler that passes SIGTERM / SIGHUP on.
volatile sig_atomic_t g_job = 0;

void PassOn(int sig) {
  if (g_job > 0) ::kill(static_cast<pid_t>(g_job), sig);
}

// memscope's signal dispositions while the job runs, restored when destroyed:
// SIGINT and SIGQUIT ignored (the terminal sends them to the job too, as to a
// shell's foreground command), SIGTERM and SIGHUP passed on to the job.
class JobSignals {
 public:
  JobSignals() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    struct sigaction pass {};
    pass.sa_handler = PassOn;
    sigemptyset(&pass.sa_mask);
    pass.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &ignore, &old_[0]);
    ::sigaction(SIGQUIT, &ignore, &old_[1]);
    ::sigaction(SIGTERM, &pass, &old_[2]);
    ::sigaction(SIGHUP, &pass, &old_[3]);
  }
  ~JobSignals() {
    ::sigaction(SIGINT, &old_[0], nullptr);
    ::sigaction(SIGQUIT, &old_[1], nullptr);
    ::sigaction(SIGTERM, &old_[2], nullptr);
    ::sigaction(SIGHUP, &old_[3], nullptr);
  }
  JobSignals(const JobSignals&) = delete;
  JobSignals& operator=(const JobSignals&) = delete;

 private:
  struct sigaction old_[4]{};
};

// The job's environment: memscope's, with the start-up module's directory
// first on PYTHONPATH and the capture's settings.
// `device_library`: the CUPTI injection library, as CUDA_INJECTION64_PATH
// (and MEMSCOPE_DEVICE_LIBRARY, for the start-up module's phase-end
// samples); "" for none.
std::vector<std::string> JobEnvironment(const std::string& module_dir, const std::string& run_dir,
                                        std::uint64_t max_entries, const std::string& device_library) {
  std::map<std::string, std::string> set = {{"MEMSCOPE_CAPTURE_DIR", run_dir},
                                            {"MEMSCOPE_CAPTURE_MAX_ENTRIES", absl::StrCat(max_entries)}};
  if (!device_library.empty()) {
    set["CUDA_INJECTION64_PATH"] = device_library;
    set["MEMSCOPE_DEVICE_LIBRARY"] = device_library;
  }
  const char* path = std::getenv("PYTHONPATH");
  set["PYTHONPATH"] = path != nullptr && *path != '\0' ? absl::StrCat(module_dir, ":", path) : module_dir;
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string name(entry.substr(0, entry.find('=')));
    if (set.count(name) == 0) env.emplace_back(entry);
  }
  for (const auto& [name, value] : set) env.push_back(absl::StrCat(name, "=", value));
  return env;
}

// The directory of the running memscope binary ("" when unknown).
std::string BinaryDirectory() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "" : exe.parent_path().string();
}

// The injection library for an --all-device-memory capture: its path, or ""
// with a note saying why there is none.
std::string DeviceLibraryFor(const CaptureOptions& options, std::vector<std::string>& notes) {
  if (!options.all_device_memory) return "";
  absl::StatusOr<std::string> library = DeviceMemoryLibrary();
  if (!library.ok()) {
    notes.push_back(absl::StrCat("--all-device-memory: ", library.status().message(),
                                 "; only PyTorch's allocator was recorded"));
    return "";
  }
  if (const char* other = std::getenv("CUDA_INJECTION64_PATH"); other != nullptr && *other != '\0') {
    notes.push_back(absl::StrCat("--all-device-memory: the job's CUDA_INJECTION64_PATH (", other,
                                 ") was replaced by memscope's"));
  }
  return *library;
}

// Starts the job (argv[0] looked up on PATH) with memscope's standard
// streams and the default dispositions of the signals memscope changes.
// Returns its pid, or the errno of a failed start.
std::pair<pid_t, int> StartJob(const std::vector<std::string>& command, const std::vector<std::string>& env) {
  std::vector<char*> argv, envp;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&defaults, sig);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int error = ::posix_spawnp(&pid, argv[0], nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  return {error == 0 ? pid : -1, error};
}

// What one rank's start-up module wrote in RUN/.memscope-capture/rank-R.json
// (or rank-R.pid-P.json: a second process of the job that reported rank R,
// whose files the start-up module kept apart rather than overwrite the
// first's).
struct CapturedRank {
  int rank = 0;
  std::optional<int> pid;  // set for rank-R.pid-P.json
  std::optional<int> process;  // the process that wrote it ("pid" inside)
  int world_size = 1;
  bool cuda = false;
  std::int64_t steps = 0;
  std::optional<std::string> snapshot;  // its file name in the run directory
  std::optional<std::string> error;
};

std::vector<CapturedRank> ReadCapturedRanks(const std::string& capture_dir) {
  std::vector<CapturedRank> ranks;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(capture_dir, ec)) {
    const std::string name = entry.path().filename().string();
    static const std::regex pattern(R"(^rank-([0-9]{1,9})(\.pid-([0-9]{1,9}))?\.json$)");
    std::smatch m;
    if (!std::regex_match(name, m, pattern)) continue;
    const int rank = std::stoi(m[1].str());
    absl::StatusOr<std::string> text = ReadInputFile(entry.path().string(), "rank status", kMaxManifestBytes);
    if (!text.ok()) continue;
    const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    CapturedRank r;
    r.rank = rank;
    if (m[3].matched) r.pid = std::stoi(m[3].str());
    r.world_size = j.value("world_size", 1);
    r.cuda = j.value("cuda", false);
    r.steps = j.value("steps", std::int64_t{0});
    if (j.contains("pid") && j["pid"].is_number_integer()) r.process = j["pid"].get<int>();
    if (j.contains("snapshot") && j["snapshot"].is_string()) r.snapshot = j["snapshot"].get<std::string>();
    if (j.contains("error") && j["error"].is_string()) r.error = j["error"].get<std::string>();
    ranks.push_back(std::move(r));
  }
  std::sort(ranks.begin(), ranks.end(), [](const CapturedRank& a, const CapturedRank& b) { return a.rank < b.rank; });
  return ranks;
}

// Prepares RUN for a capture: what an earlier run left (its per-rank files,
// its ranks' capture status, and, when run.json says memscope wrote here,
// the analysis outputs a capture does not rewrite) is removed, the start-up
// module written.
absl::Status PrepareRunDirectory(const RunDirectory& dir) {
  dir.RemoveRankFiles();
  std::error_code ec;
  if (RunManifest::Read(dir.Manifest()).ok()) {
    for (const char* name :
         {RunDirectory::kReport, RunDirectory::kSummary, RunDirectory::kTrace, RunDirectory::kHtml}) {
      if (fs::is_regular_file(fs::symlink_status(dir.Path(name), ec))) fs::remove(dir.Path(name), ec);
    }
  }
  fs::create_directories(dir.Capture(), ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create '", dir.Capture(), "': ", ec.message()));
  std::vector<fs::path> stale;  // the earlier capture's rank statuses and claims
  for (const fs::directory_entry& e : fs::directory_iterator(dir.Capture(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("claim-rank-") || (name.starts_with("rank-") && name.ends_with(".json")) ||
        (name.starts_with("device-pid-") && name.ends_with(".timeline"))) {
      stale.push_back(e.path());
    }
  }
  for (const fs::path& p : stale) fs::remove(p, ec);
  return WriteOutputFile((fs::path(dir.Capture()) / "sitecustomize.py").string(), CaptureModule());
}

// A second process that reported rank R (two processes of the job without
// torch.distributed's rank or $RANK): its files are kept, not read.
std::string DuplicateRankNote(const RunDirectory& dir, const CapturedRank& r) {
  std::string files = absl::StrCat(RunDirectory::kCapture, "/rank-", r.rank, ".pid-", *r.pid, ".json");
  std::error_code ec;
  if (r.snapshot && RunDirectory::IsRankFile(*r.snapshot) && fs::is_regular_file(dir.Path(*r.snapshot), ec)) {
    absl::StrAppend(&files, " and ", *r.snapshot);
    dir.RecordFile(*r.snapshot);
  }
  return absl::StrCat("rank ", r.rank, " was reported by more than one process: process ", *r.pid,
                      "'s capture is kept as ", files, ", not read (set RANK, or call init_process_group)");
}

// The device timelines of rank `r`'s process
// (.memscope-capture/device-pid-P.gpu-D.timeline, written by the injection
// library), moved to RUN/device-rank-R.gpu-D.timeline.
void CollectDeviceTimelines(const RunDirectory& dir, const CapturedRank& r) {
  if (!r.process) return;
  std::error_code ec;
  const std::string prefix = absl::StrCat("device-pid-", *r.process, ".gpu-");
  std::vector<std::pair<fs::path, int>> found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir.Capture(), ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(prefix) || !name.ends_with(".timeline")) continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 9);
    if (digits.empty() || digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    found.emplace_back(e.path(), std::stoi(digits));
  }
  for (const auto& [path, device] : found) {
    const std::string name = RunDirectory::DeviceTimelineName(r.rank, device);
    fs::rename(path, dir.Path(name), ec);
    if (!ec) dir.RecordFile(name);
  }
}

// run.json of a capture, from what the ranks wrote.
RunManifest CaptureManifestFor(const RunDirectory& dir, const CaptureOptions& options, int exit_status,
                               std::optional<int> signal, std::vector<std::string>& notes) {
  RunManifest m;
  m.generator = kMemscopeVersion;
  m.command = "capture";
  m.capture = CaptureManifest{options.command, exit_status, signal, options.max_entries};
  if (const char* conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF"); conf != nullptr) m.alloc_conf = conf;
  const std::vector<CapturedRank> ranks = ReadCapturedRanks(dir.Capture());
  int world_size = 1;
  std::vector<int> without_gpu;
  for (const CapturedRank& r : ranks) {
    if (r.pid) {
      notes.push_back(DuplicateRankNote(dir, r));
      continue;
    }
    world_size = std::max({world_size, r.world_size, r.rank + 1});
    CollectDeviceTimelines(dir, r);
    ManifestRank& out = m.ranks.emplace_back();
    out.rank = r.rank;
    out.steps_done = r.steps;
    out.error = r.error;
    std::error_code ec;
    if (r.snapshot && RunDirectory::IsRankFile(*r.snapshot) && fs::is_regular_file(dir.Path(*r.snapshot), ec)) {
      out.timeline = *r.snapshot;
      out.status = "ok";
      dir.RecordFile(*r.snapshot);  // a later run's cleanup removes it
    } else {
      out.status = "no_snapshot";
      if (!r.cuda) without_gpu.push_back(r.rank);
    }
  }
  m.world_size = world_size;
  if (ranks.empty()) {
    notes.push_back(
        "the job recorded nothing: it never imported torch, or its Python did not read PYTHONPATH (python -E, -I "
        "or -S)");
  } else if (!without_gpu.empty()) {
    notes.push_back(absl::StrCat("no snapshot from rank(s) ", absl::StrJoin(without_gpu, ", "),
                                 ": no CUDA device (the phases were marked, no memory was recorded)"));
  }
  return m;
}

}  // namespace

absl::StatusOr<std::string> DeviceMemoryLibrary() {
  std::string path;
  const char* set = std::getenv("MEMSCOPE_CUPTI_LIBRARY");
  const bool named = set != nullptr && *set != '\0';
  if (named) {
    path = set;
  } else {
    const std::string here = BinaryDirectory();
    path = here.empty() ? std::string(kDeviceMemoryLibraryName) : (fs::path(here) / kDeviceMemoryLibraryName).string();
  }
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("no CUPTI injection library at '", path, "'",
                     named ? " ($MEMSCOPE_CUPTI_LIBRARY)" : " (memscope was built without CUPTI, or with a sanitizer)"));
  }
  path = fs::absolute(path, ec).lexically_normal().string();  // dlopen: this file, not one on the library path
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load '", path, "': ", why != nullptr ? why : "dlopen failed"));
  }
  const bool has_entry = dlsym(handle, "InitializeInjection") != nullptr;
  dlclose(handle);
  if (!has_entry) return absl::FailedPreconditionError(absl::StrCat("'", path, "' has no InitializeInjection"));
  return path;
}

absl::StatusOr<CaptureResult> RunCapture(const CaptureOptions& options) {
  if (options.command.empty())
    return absl::InvalidArgumentError("no command to run (memscope capture --out RUN -- CMD ARGS...)");
  if (options.max_entries == 0) return absl::InvalidArgumentError("--max-entries must be at least 1");
  const RunDirectory dir(options.run_dir);
  if (absl::Status s = dir.Claim(options.force); !s.ok()) return s;
  absl::StatusOr<RunDirectory::Lock> lock = dir.TakeLock(RunDirectory::ThisProcess());
  if (!lock.ok()) return lock.status();
  if (absl::Status s = PrepareRunDirectory(dir); !s.ok()) return s;
  std::error_code ec;
  const std::string run_dir = fs::absolute(options.run_dir, ec).lexically_normal().string();
  const std::string module_dir = (fs::path(run_dir) / RunDirectory::kCapture).string();

  CaptureResult result;
  const std::string device_library = DeviceLibraryFor(options, result.notes);
  int wait_status = 0;
  {
    JobSignals signals;
    // SIGTERM / SIGHUP wait until the job's pid is known, then reach it.
    sigset_t pass_on, before;
    sigemptyset(&pass_on);
    sigaddset(&pass_on, SIGTERM);
    sigaddset(&pass_on, SIGHUP);
    ::sigprocmask(SIG_BLOCK, &pass_on, &before);
    const auto [pid, error] = StartJob(options.command, JobEnvironment(module_dir, run_dir, options.max_entries, device_library));
    g_job = pid > 0 ? pid : 0;
    ::sigprocmask(SIG_SETMASK, &before, nullptr);
    if (pid < 0) {
      result.exit_status = error == ENOENT ? 127 : 126;
      result.start_error = error == ENOENT
                               ? absl::StrCat("'", options.command[0], "': command not found")
                               : absl::StrCat("cannot run '", options.command[0], "': ", std::strerror(error));
      return result;
    }
    while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    g_job = 0;
  }
  std::optional<int> signal;
  if (WIFSIGNALED(wait_status)) {
    signal = WTERMSIG(wait_status);
    result.exit_status = 128 + *signal;
  } else {
    result.exit_status = WEXITSTATUS(wait_status);
  }
  result.manifest = CaptureManifestFor(dir, options, result.exit_status, signal, result.notes);
  if (absl::Status s = result.manifest.Write(dir.Manifest()); !s.ok()) return s;
  return result;
}

}  // namespace memscope
