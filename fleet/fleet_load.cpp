#include "fleet/fleet_load.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "load/manifest.h"
#include "load/recording.h"
#include "load/run_directory.h"
#include "recording/timeline.h"
#include "viewer/html_report.h"

namespace memscope {
namespace fs = std::filesystem;
namespace {

// One file to read, and the rank a run's run.json gives it.
struct FleetUnit {
  std::string path;
  std::optional<int> rank;
  std::vector<GpuRow> gpus;  // its run's GPU table (a run directory's report.json), else empty
};

bool IsRunFileName(const std::string& name) {
  return RunDirectory::TimelineRank(name).has_value() ||
         (RunDirectory::IsRankFile(name) && name.starts_with("snapshot-rank-"));
}

// A run directory's GPU table, from its report.json (none when it has none).
std::vector<GpuRow> RunGpus(const std::string& dir) {
  std::error_code ec;
  const std::string report = RunDirectory(dir).Report();
  if (!fs::is_regular_file(report, ec)) return {};
  absl::StatusOr<LoadedReport> r = LoadReport(report);
  return r.ok() ? std::move(r->report.gpus) : std::vector<GpuRow>{};
}

// The units of a directory (fleet_load.h says which files).
absl::Status ListDirectory(const std::string& dir, std::vector<FleetUnit>& units, std::vector<std::string>& notes) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(".") && e.is_regular_file(ec)) files.push_back(name);
  }
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot list '", dir, "': ", ec.message()));
  std::sort(files.begin(), files.end());
  const bool run = std::any_of(files.begin(), files.end(), IsRunFileName);
  if (run) {
    const std::vector<GpuRow> gpus = RunGpus(dir);
    absl::StatusOr<RunManifest> manifest = RunManifest::Read(RunDirectory(dir).Manifest());
    if (manifest.ok() && !manifest->ranks.empty()) {
      for (const ManifestRank& r : manifest->ranks) {
        const std::string name = fs::path(r.timeline).filename().string();
        if (IsRunFileName(name) && fs::is_regular_file(fs::path(dir) / name, ec)) {
          units.push_back({(fs::path(dir) / name).string(), r.rank, gpus});
        }
      }
    } else {
      // A run's timelines, or else a capture's snapshots (a run has both: its snapshots are at the peak only).
      const bool timelines = std::any_of(files.begin(), files.end(), [](const std::string& name) {
        return RunDirectory::TimelineRank(name).has_value();
      });
      for (const std::string& name : files) {
        if (IsRunFileName(name) && RunDirectory::TimelineRank(name).has_value() == timelines) {
          units.push_back({(fs::path(dir) / name).string(), std::nullopt, gpus});
        }
      }
    }
    return absl::OkStatus();
  }
  int skipped = 0;
  for (const std::string& name : files) {
    const std::string path = (fs::path(dir) / name).string();
    absl::StatusOr<RecordingKind> kind = DetectRecording(path);
    if (!kind.ok()) return kind.status();
    if (*kind == RecordingKind::kSnapshot || *kind == RecordingKind::kTimeline || *kind == RecordingKind::kReport) {
      units.push_back({path, std::nullopt, {}});
    } else {
      ++skipped;
    }
  }
  if (skipped > 0) {
    notes.push_back(absl::StrCat("skipped ", skipped, " file", skipped == 1 ? "" : "s", " in '", dir,
                                 "' that ", skipped == 1 ? "is" : "are",
                                 " not a snapshot, a timeline or a report.json / summary --json"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FleetUnit>> ListUnits(const std::vector<std::string>& paths,
                                                  std::vector<std::string>& notes) {
  if (paths.empty()) return absl::InvalidArgumentError("no inputs: give a directory or files, one per rank");
  std::vector<FleetUnit> units;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
    const std::size_t before = units.size();
    if (fs::is_directory(path, ec)) {
      if (absl::Status s = ListDirectory(path, units, notes); !s.ok()) return s;
      if (units.size() == before) {
        return absl::NotFoundError(absl::StrCat(
            "'", path, "' holds no ranks: no snapshot, timeline or report.json / summary --json file"));
      }
    } else {
      units.push_back({path, std::nullopt, {}});
    }
  }
  return units;
}

// The rows of `gpus` that concern `rank`: the GPUs it uses, its processes on them.
std::vector<GpuRow> GpusOf(const std::vector<GpuRow>& gpus, int rank) {
  std::vector<GpuRow> out;
  for (const GpuRow& row : gpus) {
    GpuRow mine = row;
    mine.processes.clear();
    for (const GpuProcess& p : row.processes) {
      if (p.rank == rank) mine.processes.push_back(p);
    }
    if (!mine.processes.empty()) out.push_back(std::move(mine));
  }
  return out;
}

// The rank of a recording: its one timeline, or of a snapshot with several
// devices, the device with the most events (as a capture reads it).
std::vector<Timeline>::iterator MostEvents(std::vector<Timeline>& timelines) {
  return std::max_element(timelines.begin(), timelines.end(),
                          [](const Timeline& a, const Timeline& b) { return a.events.size() < b.events.size(); });
}

FleetRank MakeRank(const std::string& source, const std::string& kind, RankReport report) {
  FleetRank rank;
  rank.source = source;
  rank.kind = kind;
  rank.report = std::move(report);
  return rank;
}

// The ranks of one recording, analysed and reduced to their summaries.
absl::StatusOr<std::vector<FleetRank>> ReadUnit(const FleetUnit& unit, const FleetLoadOptions& options) {
  OpenOptions open;
  open.device_memory = options.device_memory;
  absl::StatusOr<Recording> rec = OpenRecording(unit.path, open);
  if (!rec.ok()) return rec.status();
  const std::string kind(RecordingKindName(rec->kind));
  std::vector<FleetRank> out;
  std::vector<GpuRow> gpus = unit.gpus;
  if (rec->report) {
    if (rec->report->ranks.empty()) return absl::InvalidArgumentError(absl::StrCat("'", unit.path, "' holds no rank"));
    for (RankReport& r : rec->report->ranks) out.push_back(MakeRank(unit.path, kind, std::move(r)));
    if (gpus.empty()) gpus = std::move(rec->report->gpus);
  } else {
    auto t = MostEvents(rec->timelines);
    if (t == rec->timelines.end()) return absl::NotFoundError(absl::StrCat("'", unit.path, "' holds no rank"));
    absl::StatusOr<RankReport> r = AnalyzeRank(*t);
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("'", unit.path, "': ", r.status().message()));
    r->model_at_end.reset();  // the summary only: the model is the bulk of it
    FleetRank rank = MakeRank(unit.path, kind, std::move(*r));
    rank.notes = t->notes;
    if (rec->timelines.size() > 1) {
      rank.notes.push_back(absl::StrCat("'", unit.path, "' holds ", rec->timelines.size(),
                                        " devices: device ", t->rank, " (the one with the most events) is read"));
    }
    out.push_back(std::move(rank));
  }
  if (out.size() == 1) {
    const std::optional<int> named = unit.rank ? unit.rank : RankInFileName(unit.path);
    if (named) out.front().report.rank = *named;
  }
  for (FleetRank& r : out) {
    r.gpus = GpusOf(gpus, r.report.rank);
    ReduceRank(r);  // in the worker: only the summary is kept
  }
  return out;
}

// Runs ReadUnit over every unit with `jobs` workers. Each result is written
// by one worker into its own slot; after an error, units past it are skipped.
std::vector<std::optional<absl::StatusOr<std::vector<FleetRank>>>> ReadAll(const std::vector<FleetUnit>& units,
                                                                            const FleetLoadOptions& options) {
  std::vector<std::optional<absl::StatusOr<std::vector<FleetRank>>>> results(units.size());
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> first_error{std::numeric_limits<std::size_t>::max()};
  auto work = [&] {
    for (std::size_t i = next++; i < units.size(); i = next++) {
      if (i > first_error.load()) continue;
      results[i] = ReadUnit(units[i], options);
      if (results[i]->ok()) continue;
      std::size_t seen = first_error.load();
      while (i < seen && !first_error.compare_exchange_weak(seen, i)) {
      }
    }
  };
  int jobs = options.jobs > 0 ? options.jobs : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  jobs = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(jobs), units.size()));
  std::vector<std::thread> workers;
  for (int j = 1; j < jobs; ++j) workers.emplace_back(work);
  work();
  for (std::thread& w : workers) w.join();
  return results;
}

}  // namespace

std::optional<int> RankInFileName(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::size_t at = name.rfind("rank");
  if (at == std::string::npos) return std::nullopt;
  std::size_t i = at + 4;
  if (i < name.size() && (name[i] == '-' || name[i] == '_')) ++i;
  std::int64_t rank = 0;
  const std::size_t digits = i;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) != 0; ++i) {
    rank = rank * 10 + (name[i] - '0');
    if (rank >= kMaxTimelineWorldSize) return std::nullopt;
  }
  if (i == digits) return std::nullopt;
  return static_cast<int>(rank);
}

absl::StatusOr<FleetInputs> LoadFleet(const std::vector<std::string>& paths, const FleetLoadOptions& options) {
  FleetInputs in;
  absl::StatusOr<std::vector<FleetUnit>> units = ListUnits(paths, in.notes);
  if (!units.ok()) return units.status();
  auto results = ReadAll(*units, options);
  std::map<int, std::string> seen;  // rank -> source
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (!results[i]) continue;  // skipped after an earlier error
    if (!results[i]->ok()) return results[i]->status();
    for (FleetRank& r : **results[i]) {
      auto [it, fresh] = seen.emplace(r.report.rank, r.source);
      if (!fresh) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", r.report.rank, " is in both '", it->second, "' and '",
                                                       r.source, "' (name the files rank-R)"));
      }
      in.ranks.push_back(std::move(r));
    }
  }
  if (in.ranks.empty()) return absl::InvalidArgumentError("the inputs hold no rank");  // AnalyzeFleet needs one
  return in;
}

absl::StatusOr<std::string> FleetRankHtml(const FleetRank& rank, const FleetLoadOptions& options) {
  OpenOptions open;
  open.device_memory = options.device_memory;
  absl::StatusOr<Recording> rec = OpenRecording(rank.source, open);
  if (!rec.ok()) return rec.status();
  if (rec->timelines.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("'", rank.source, "' is a report, with no recording to show"));
  }
  auto t = MostEvents(rec->timelines);
  t->rank = rank.report.rank;
  return HtmlReport({{rank.source, {&*t}, {}, "", ""}});
}

}  // namespace memscope
