#include "run/run.h"

#include <chrono>
#include <filesystem>

#include "base/input_file.h"
#include "exporters/report.h"
#include "load/manifest.h"
#include "load/record_replay.h"
#include "load/run_directory.h"
#include "recording/timeline.h"

namespace memscope {
namespace fs = std::filesystem;

absl::StatusOr<RecordedReplay> RecordReplayRun(const std::string& dir, const RequestTrace& trace,
                                               const AllocatorConfig& config, std::uint64_t device_memory,
                                               bool force) {
  const RunDirectory run_dir(dir);
  if (absl::Status s = run_dir.Claim(force); !s.ok()) return s;
  // One run at a time per directory, as for memscope run.
  absl::StatusOr<RunDirectory::Lock> lock = run_dir.TakeLock(RunDirectory::ThisProcess());
  if (!lock.ok()) return lock.status();
  // Recorded in memory (with the trace's stacks, which a timeline file does
  // not hold), then written as rank 0's timeline; the outputs are made from
  // the recording in memory, as from every rank's.
  RecordedReplay out;
  absl::StatusOr<Timeline> recorded = RecordReplay(trace, config, device_memory, /*rank=*/0, &out.replay);
  if (!recorded.ok()) return recorded.status();
  recorded->wall_start_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  if (absl::Status s = WriteTimelineFile(run_dir.Timeline(0), *recorded); !s.ok()) return s;
  RunManifest manifest;
  manifest.generator = kMemscopeVersion;
  manifest.command = "replay";
  manifest.source = trace.source;
  manifest.world_size = 1;
  manifest.alloc_conf = config.text;
  manifest.device_memory = device_memory;
  ManifestRank& rank = manifest.ranks.emplace_back();
  rank.timeline = RunDirectory::TimelineName(0);
  rank.status = out.replay.oom ? "oom" : "ok";
  rank.exit_code = 0;
  (void)manifest.Write(run_dir.Manifest());  // as before: the outputs below say whether the directory is writable
  std::vector<Timeline> timelines;
  timelines.push_back(*std::move(recorded));
  absl::StatusOr<std::vector<RankReport>> reports = WriteRunOutputs(dir, timelines);
  if (!reports.ok()) return reports.status();
  out.reports = std::move(*reports);
  return out;
}

absl::StatusOr<CompareInput> LoadCompareInput(const std::string& path, std::vector<std::string>* notes) {
  absl::StatusOr<LoadedReport> loaded = LoadReport(path);
  if (!loaded.ok()) return loaded.status();
  for (const Timeline& t : loaded->timelines) {
    if (notes != nullptr) notes->insert(notes->end(), t.notes.begin(), t.notes.end());
  }
  // The run's run.json: in the directory, or next to the file.
  nlohmann::json run_config = nullptr;
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  if (absl::StatusOr<std::string> text = ReadInputFile(RunDirectory(dir.string()).Manifest(), "run.json",
                                                      kMaxManifestBytes);
      text.ok()) {
    nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    // Only a run's own description; anything else is not a config.
    if (config.is_object() && config.value("schema", nlohmann::json()).is_string() && config["schema"] == kRunSchema) {
      run_config = std::move(config);
    }
  }
  return MakeCompareInput(path, std::move(loaded->report), loaded->timelines, std::move(run_config));
}

}  // namespace memscope
