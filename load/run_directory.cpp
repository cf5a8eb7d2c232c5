#include "load/run_directory.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "recording/timeline.h"

namespace memscope {
namespace fs = std::filesystem;

std::string RunDirectory::TimelineName(int rank) { return absl::StrCat("rank-", rank, ".timeline"); }
std::string RunDirectory::RankStatusName(int rank) { return absl::StrCat("rank-", rank, ".json"); }
std::string RunDirectory::RankLogName(int rank) { return absl::StrCat("rank-", rank, ".log"); }
std::string RunDirectory::SnapshotName(int rank) { return absl::StrCat("snapshot-rank-", rank, ".pickle"); }

std::string RunDirectory::DeviceTimelineName(int rank, int device) {
  return absl::StrCat("device-rank-", rank, ".gpu-", device, ".timeline");
}

std::optional<std::pair<int, int>> RunDirectory::DeviceTimelineOf(const std::string& name) {
  static const std::regex pattern(R"(^device-rank-([0-9]{1,9})\.gpu-([0-9]{1,6})\.timeline$)");
  std::smatch m;
  if (!std::regex_match(name, m, pattern)) return std::nullopt;
  return std::make_pair(std::stoi(m[1].str()), std::stoi(m[2].str()));
}

std::string RunDirectory::Path(const std::string& name) const { return (fs::path(root_) / name).string(); }

std::optional<int> RunDirectory::TimelineRank(const std::string& name) {
  constexpr std::string_view kPrefix = "rank-", kSuffix = ".timeline";
  int rank = 0;
  if (name.size() > kPrefix.size() + kSuffix.size() && name.rfind(kPrefix, 0) == 0 &&
      name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0 &&
      absl::SimpleAtoi(name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size()), &rank)) {
    return rank;
  }
  return std::nullopt;
}

bool RunDirectory::IsRankFile(const std::string& name) {
  static const std::regex pattern(R"(^(rank-[0-9]+\.(json|log|timeline|json\.tmp)|snapshot-rank-[0-9]+(\.pid-[0-9]+)?\.pickle|device-rank-[0-9]+\.gpu-[0-9]+\.timeline)$)");
  return std::regex_match(name, pattern);
}

std::string RunDirectory::Listing(int world_size) {
  auto per_rank = [&](const char* prefix, const char* suffix) {
    if (world_size == 1) return absl::StrCat(prefix, "0", suffix);
    return absl::StrCat(prefix, "{0..", world_size - 1, "}", suffix);
  };
  return absl::StrCat(kManifest, ", ", per_rank("rank-", ".timeline"), ", ", kReport, ", ", kHtml, ", ", kSummary, ", ",
                      kTrace, ", ", per_rank("snapshot-rank-", ".pickle"));
}

std::string RunDirectory::ExistingListing(int world_size) const {
  const RunDirectory& dir = *this;
  auto exists = [](const std::string& path) {
    std::error_code ec;
    return std::filesystem::exists(path, ec);
  };
  std::vector<std::string> names;
  auto per_rank = [&](const char* prefix, const char* suffix, std::string (RunDirectory::*path)(int) const) {
    std::vector<int> ranks;
    for (int r = 0; r < world_size; ++r) {
      if (exists((dir.*path)(r))) ranks.push_back(r);
    }
    if (world_size > 1 && static_cast<int>(ranks.size()) == world_size) {
      names.push_back(absl::StrCat(prefix, "{0..", world_size - 1, "}", suffix));
    } else {
      for (const int r : ranks) names.push_back(absl::StrCat(prefix, r, suffix));
    }
  };
  if (exists(dir.Manifest())) names.push_back(kManifest);
  per_rank("rank-", ".timeline", &RunDirectory::Timeline);
  for (const std::string& file : {dir.Report(), dir.Html(), dir.Summary(), dir.Trace()}) {
    if (exists(file)) names.push_back(std::filesystem::path(file).filename().string());
  }
  per_rank("snapshot-rank-", ".pickle", &RunDirectory::Snapshot);
  return absl::StrJoin(names, ", ");
}

absl::Status RunDirectory::Create() const {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create '", root_, "': ", ec.message()));
  return absl::OkStatus();
}

namespace {

// The names memscope writes in a run directory: those of the user's files
// that a run would overwrite.
bool IsOutputName(const std::string& name) {
  for (const char* ours : {RunDirectory::kManifest, RunDirectory::kReport, RunDirectory::kSummary, RunDirectory::kTrace,
                           RunDirectory::kHtml, RunDirectory::kStore, RunDirectory::kCapture, "copy", "view"}) {
    if (name == ours) return true;
  }
  return RunDirectory::IsRankFile(name);
}

// The directory's real path ("" when it does not exist or cannot be resolved).
std::string RealPath(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::canonical(path, ec);
  return ec ? "" : p.string();
}

// The user's home directory: $HOME, else the password database's.
std::string HomeDirectory() {
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') return RealPath(home);
  if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr && pw->pw_dir != nullptr) return RealPath(pw->pw_dir);
  return "";
}

}  // namespace

namespace {

// Whether a directory holding `names` is memscope's: one of its marks is
// there, or its copy/ or view/ (--ddp copy,view) is memscope's. Decided on
// one listing: the ranks of an external launcher claim the same directory
// at once, and the mark is written before anything else.
bool WrittenByMemscope(const RunDirectory& dir, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (name == RunDirectory::kLock || name == RunDirectory::kFileList) return true;
  }
  for (const std::string& name : names) {
    if ((name == "copy" || name == "view") && RunDirectory(dir.Path(name)).WrittenByMemscope()) return true;
  }
  return false;
}

std::vector<std::string> Names(const std::string& root, std::error_code& ec) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

bool RunDirectory::WrittenByMemscope() const {
  std::error_code ec;
  return memscope::WrittenByMemscope(*this, Names(root_, ec));
}

absl::Status RunDirectory::Check(bool force) const {
  std::error_code ec;
  const fs::file_status st = fs::status(root_, ec);
  if (!fs::exists(st)) return absl::OkStatus();  // a new directory
  if (!fs::is_directory(st)) {
    return absl::FailedPreconditionError(absl::StrCat("--out '", root_, "' is not a directory"));
  }
  const std::string real = RealPath(root_);
  if (real == "/") {
    return absl::FailedPreconditionError(
        absl::StrCat("--out '", root_, "' is the root directory: choose a new directory for the run"));
  }
  if (!real.empty() && real == HomeDirectory()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--out '", root_, "' is your home directory: choose a new directory for the run"));
  }
  if (force) return absl::OkStatus();
  const std::vector<std::string> names = Names(root_, ec);
  if (ec) return absl::InternalError(absl::StrCat("--out: cannot read '", root_, "': ", ec.message()));
  if (names.empty() || memscope::WrittenByMemscope(*this, names)) return absl::OkStatus();
  // The file a run would overwrite, when there is one.
  const auto conflict = std::find_if(names.begin(), names.end(), IsOutputName);
  const std::string& shown = conflict != names.end() ? *conflict : names.front();
  return absl::FailedPreconditionError(absl::StrCat(
      "--out '", root_, "' is not empty and was not written by memscope (it holds ", shown,
      names.size() > 1 ? absl::StrCat(" and ", names.size() - 1, names.size() == 2 ? " other" : " others") : "",
      "): choose a new or empty directory, or --force to write into it"));
}

absl::Status RunDirectory::Claim(bool force) const {
  if (absl::Status s = Check(force); !s.ok()) return s;
  if (absl::Status s = Create(); !s.ok()) return absl::Status(s.code(), absl::StrCat("--out: ", s.message()));
  if (WrittenByMemscope()) return absl::OkStatus();
  // The marker, before any output: from now on the directory is memscope's.
  const int fd = ::open(Path(kFileList).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("--out: cannot write '", Path(kFileList), "': ", std::strerror(errno)));
  }
  ::close(fd);
  return absl::OkStatus();
}

void RunDirectory::RecordFile(const std::string& name) const {
  // O_APPEND: ranks record at once, each line one write().
  const int fd = ::open(Path(kFileList).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return;  // then a later cleanup leaves the file: never more than it should
  const std::string line = name + "\n";
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
}

namespace {

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool StartsWithTimelineMagic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[sizeof(kTimelineMagic)] = {};
  return in.read(magic, sizeof(magic)) && std::memcmp(magic, kTimelineMagic, sizeof(magic)) == 0;
}

}  // namespace

void RunDirectory::RemoveRankFiles() const {
  std::error_code ec;
  std::ifstream list(Path(kFileList));
  if (list) {
    std::string name;
    while (std::getline(list, name)) {
      if (IsRankFile(name) && IsRegularFile(Path(name))) ::unlink(Path(name).c_str());
    }
    list.close();
    ::unlink(Path(kFileList).c_str());
  } else {
    for (const fs::directory_entry& e : fs::directory_iterator(root_, ec)) {
      const std::string name = e.path().filename().string();
      if (TimelineRank(name) && IsRegularFile(e.path().string()) && StartsWithTimelineMagic(e.path().string())) {
        ::unlink(e.path().c_str());
      }
    }
  }
  // The rendezvous directory: ours by name, removed; a symlink there is
  // removed, never followed (the ranks would write through it).
  const fs::file_status store = fs::symlink_status(Store(), ec);
  if (!ec && fs::is_directory(store)) fs::remove_all(Store(), ec);
  if (!ec && fs::is_symlink(store)) ::unlink(Store().c_str());
}

RunDirectory::Lock::~Lock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

std::string RunDirectory::ThisProcess() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!cmdline.empty() && cmdline.back() == '\0') cmdline.pop_back();
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  if (const std::size_t slash = cmdline.rfind('/', cmdline.find(' ')); slash != std::string::npos) {
    cmdline.erase(0, slash + 1);  // the program's name, without its directory
  }
  return absl::StrCat("pid ", ::getpid(), ": ", cmdline);
}

absl::StatusOr<RunDirectory::Lock> RunDirectory::TakeLock(const std::string& holder) const {
  const std::string path = Path(kLock);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create '", path, "': ", std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string who(512, '\0');
    const ssize_t n = ::pread(fd, who.data(), who.size(), 0);
    ::close(fd);
    if (err != EWOULDBLOCK) return absl::InternalError(absl::StrCat("cannot lock '", path, "': ", std::strerror(err)));
    who.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    return absl::FailedPreconditionError(absl::StrCat("'", root_, "' is in use by another memscope run (",
                                                      who.empty() ? "it is starting" : who,
                                                      "); wait for it or choose another --out"));
  }
  // Who holds it, for the next run's error: one line.
  std::string line = holder.substr(0, 400);
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  line += "\n";
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, line.data(), line.size(), 0);
  return Lock(fd);
}

}  // namespace memscope
