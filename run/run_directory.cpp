#include "run/run_directory.h"

#include <filesystem>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace memscope {
namespace fs = std::filesystem;

std::string RunDirectory::TimelineName(int rank) { return absl::StrCat("rank-", rank, ".timeline"); }
std::string RunDirectory::RankStatusName(int rank) { return absl::StrCat("rank-", rank, ".json"); }
std::string RunDirectory::RankLogName(int rank) { return absl::StrCat("rank-", rank, ".log"); }
std::string RunDirectory::SnapshotName(int rank) { return absl::StrCat("snapshot-rank-", rank, ".pickle"); }

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
  static const std::regex pattern(R"(^(rank-[0-9]+\.(json|log|timeline|json\.tmp)|snapshot-rank-[0-9]+\.pickle)$)");
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

absl::Status RunDirectory::Create() const {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create '", root_, "': ", ec.message()));
  return absl::OkStatus();
}

void RunDirectory::RemoveRankFiles() const {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root_, ec)) {
    const std::string name = e.path().filename().string();
    if (IsRankFile(name) || name == kStore) fs::remove_all(e.path(), ec);
  }
}

}  // namespace memscope
