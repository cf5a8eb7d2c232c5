// memscope replay: run a request trace through the caching allocator under
// one or more allocator settings.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <filesystem>
#include <fstream>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/config.h"
#include "allocator/sizes.h"
#include "cli/commands.h"
#include "nlohmann/json.hpp"

#include "analysis/analysis.h"
#include "analysis/trace_model.h"
#include "base/hex_address.h"
#include "exporters/report.h"
#include "importers/replayer.h"
#include "importers/request_trace.h"
#include "importers/snapshot_import.h"
#include "load/record_replay.h"
#include "load/recording.h"
#include "load/run_directory.h"
#include "recording/timeline.h"
#include "run/run.h"

namespace memscope::cli {
namespace {

struct ReplayArgs {
  std::string file;
  std::vector<std::string> alloc_confs;
  std::string device_memory;
  std::string out;
  bool force = false;  // --force: --out may hold files memscope did not write
  bool json = false;
  bool verify = false;
  bool no_search = false;
  int rank = 0;                  // of a run directory
  double memory_fraction = 1.0;  // torch.cuda.set_per_process_memory_fraction
  bool memory_fraction_given = false;
};

int Fail(absl::string_view message) { return cli::Fail("replay", message); }

std::string Quoted(const std::string& s) {
  return s.empty() ? "(defaults)" : absl::StrCat("\"", EscapeForTerminal(s), "\"");
}

nlohmann::json OomJson(const ReplayOom& oom) {
  return {{"request_index", oom.request_index},
          {"line", oom.line},
          {"id", oom.id},
          {"requested_bytes", oom.info.requested},
          {"rounded_bytes", oom.info.rounded},
          {"alloc_size", oom.info.alloc_size},
          {"stream", oom.info.stream},
          {"pool", oom.info.small_pool ? "small" : "large"},
          {"device_free", oom.info.device_free},
          {"device_total", oom.info.device_total},
          {"allocated_bytes", oom.info.allocated},
          {"reserved_bytes", oom.info.reserved},
          {"inactive_split_bytes", oom.info.inactive_split},
          {"cached_free_bytes", oom.info.cached_free},
          {"largest_free_block", oom.info.largest_free_block},
          {"message", oom.info.message},
          {"diagnosis", oom.info.diagnosis}};
}

// What one setting did with the trace.
struct SettingResult {
  ReplayResult replay;
  double fragmentation_at_peak = 0;
  // The smallest simulated GPU that runs the trace without OOM (0: none up
  // to 1 TiB, or not searched), MinDeviceMemory's.
  std::uint64_t min_device_memory = 0;
};

absl::StatusOr<SettingResult> RunSetting(const RequestTrace& trace, const AllocatorConfig& config,
                                         std::uint64_t device_memory, bool search_min_memory) {
  SettingResult out;
  absl::StatusOr<Timeline> t = RecordReplay(trace, config, device_memory, /*rank=*/0, &out.replay);
  if (!t.ok()) return t.status();
  absl::StatusOr<RankReport> report = AnalyzeRank(*t);
  if (!report.ok()) return report.status();
  out.fragmentation_at_peak = report->fragmentation_at_peak.fragmentation;
  if (search_min_memory && !out.replay.oom) {
    absl::StatusOr<std::optional<std::uint64_t>> min = MinDeviceMemory(trace, config);
    if (!min.ok()) return min.status();
    out.min_device_memory = min->value_or(0);
  }
  return out;
}

// The simulated GPU's size: --device-memory, else the source's own (a
// recording's, or the capacity a snapshot's OOM implies), else 80 GiB (1 GiB
// for the embedded demo, so that its fragmentation shows).
absl::StatusOr<std::uint64_t> DeviceMemory(const ReplayArgs& args, const ReplaySource* source) {
  if (args.device_memory.empty() && source != nullptr && source->device_memory > 0) return source->device_memory;
  if (args.device_memory.empty()) return args.file.empty() ? 1ULL << 30 : kDefaultReplayDeviceMemory;
  absl::StatusOr<std::uint64_t> parsed = ParseSize(args.device_memory);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--device-memory: ", parsed.status().message()));
  if (*parsed == 0) return absl::InvalidArgumentError("--device-memory: must be greater than 0");
  return *parsed;
}

// The input: the embedded demo, or what load/ reads of FILE (OpenReplaySource).
absl::StatusOr<ReplaySource> ReadInput(const ReplayArgs& args) {
  if (args.file.empty()) {
    ReplaySource demo;
    demo.trace = DemoTrace();
    return demo;
  }
  return OpenReplaySource(args.file, args.rank);
}

// The settings to replay under: each --alloc-conf; without one, a
// snapshot's own settings, or the environment's (and, for the demo, also
// expandable segments). --out records only the first.
absl::StatusOr<std::vector<AllocatorConfig>> Settings(const ReplayArgs& args, const ReplaySource& source) {
  std::vector<AllocatorConfig> configs;
  const std::vector<std::string>& texts = args.alloc_confs;
  if (texts.empty()) {
    if (source.settings) {
      // A PyTorch snapshot or a recording is replayed under its own settings
      // (parsed when it was read) unless told otherwise.
      configs.push_back(*source.settings);
    } else {
      absl::StatusOr<AllocatorConfig> env = AllocatorConfig::FromEnvironment();
      if (!env.ok()) return env.status();
      configs.push_back(*env);
      if (args.file.empty() && env->text.empty()) {
        // The demo's point: the same requests, with and without expandable segments.
        configs.push_back(*AllocatorConfig::Parse("expandable_segments:True"));
      }
    }
  }
  for (const std::string& text : texts) {
    absl::StatusOr<AllocatorConfig> config = AllocatorConfig::Parse(text);
    if (!config.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--alloc-conf \"", text, "\": ", config.status().message()));
    }
    configs.push_back(*config);
  }
  if (!args.out.empty() && configs.size() > 1) {
    if (texts.size() > 1) return absl::InvalidArgumentError("--out records one setting: give at most one --alloc-conf");
    configs.resize(1);
  }
  return configs;
}

// The first difference between the replay's end state and the file's
// segments (address, size, and each block's address, size and whether it
// is free), "" when they are the same.
std::string EndStateDifference(const std::vector<SegmentInfo>& theirs, std::vector<SegmentInfo> mine) {
  std::sort(mine.begin(), mine.end(), [](const SegmentInfo& x, const SegmentInfo& y) { return x.address < y.address; });
  auto segment = [](const SegmentInfo& s) { return absl::StrCat(s.total_size, " B at ", HexAddress(s.address)); };
  for (std::size_t i = 0; i < std::max(theirs.size(), mine.size()); ++i) {
    if (i >= theirs.size() || i >= mine.size() || theirs[i].address != mine[i].address ||
        theirs[i].total_size != mine[i].total_size) {
      return absl::StrCat("segment #", i + 1, ": PyTorch ", i < theirs.size() ? segment(theirs[i]) : "none",
                          ", memscope ", i < mine.size() ? segment(mine[i]) : "none", " (", theirs.size(),
                          " in the file, ", mine.size(), " in the replay)");
    }
    const std::vector<BlockInfo>& a = theirs[i].blocks;
    const std::vector<BlockInfo>& b = mine[i].blocks;
    for (std::size_t k = 0; k < std::max(a.size(), b.size()); ++k) {
      auto block = [](const BlockInfo& x) {
        return absl::StrCat(std::string(BlockStateName(x.state)), " ", x.size, " B at ", HexAddress(x.address));
      };
      if (k >= a.size() || k >= b.size() || a[k].address != b[k].address || a[k].size != b[k].size ||
          (a[k].state == BlockState::kInactive) != (b[k].state == BlockState::kInactive)) {
        return absl::StrCat("segment at ", HexAddress(theirs[i].address), ", block #", k + 1, ": PyTorch ",
                            k < a.size() ? block(a[k]) : "none", ", memscope ", k < b.size() ? block(b[k]) : "none");
      }
    }
  }
  return "";
}

// --verify of a trace that starts from a rebuilt state: the replay must end
// with exactly the file's segments. Prints the line; false when they differ.
bool VerifyEndState(const Timeline& t, const ImportedTrace& snapshot) {
  TraceModel model(snapshot.settings);
  for (const Event& e : t.events) {
    if (absl::Status s = model.Apply(e); !s.ok()) {
      std::cout << "verify: the replay's recording does not read back: " << s.message() << "\n";
      return false;
    }
  }
  const std::string diff = EndStateDifference(snapshot.final_segments, model.Snapshot(snapshot.device, {}));
  if (!diff.empty()) {
    std::cout << "verify: the end state differs: " << diff << "\n";
    return false;
  }
  std::cout << "verify: the replay ends with the snapshot's " << snapshot.final_segments.size()
            << " segments exactly (addresses, sizes, blocks)\n";
  return true;
}

// --verify. Faithfulness: under the trace's own settings, memscope's
// allocator must do to the device what PyTorch did: the same segment_alloc,
// segment_free, segment_map and segment_unmap, with the same sizes, in order.
int Verify(const RequestTrace& trace, const std::optional<ImportedTrace>& snapshot, std::uint64_t device_memory) {
  if (!snapshot) return Fail("--verify needs a PyTorch snapshot (it compares against the trace's segment actions)");
  absl::StatusOr<Timeline> t = RecordReplay(trace, snapshot->settings, device_memory, snapshot->device);
  if (!t.ok()) return Fail(std::string(t.status().message()));
  // A rebuilt start state's segments are the replay's first segment_allocs:
  // they are not the trace's, so only what follows them is compared.
  const std::size_t adopted = trace.start_segments.size();
  if (adopted > 0) {
    std::cout << "verify: the trace starts after the program did; the state at its start (" << adopted
              << (adopted == 1 ? " segment" : " segments") << ") was rebuilt from the snapshot's "
              << snapshot->final_segments.size() << " segments, and only what the trace covers is checked\n";
  }
  std::vector<ImportedTrace::SegmentAction> mine;
  std::size_t skipped = 0;
  for (const Event& e : t->events) {
    if (e.type == EventType::kSegmentAlloc && skipped < adopted) {
      ++skipped;
    } else if (e.type == EventType::kSegmentAlloc || e.type == EventType::kSegmentFree ||
               e.type == EventType::kSegmentMap || e.type == EventType::kSegmentUnmap) {
      mine.push_back({e.type, e.size});
    }
  }
  const std::vector<ImportedTrace::SegmentAction>& theirs = snapshot->segment_actions;
  auto text = [](const std::vector<ImportedTrace::SegmentAction>& v, std::size_t i) {
    return i < v.size() ? absl::StrCat(std::string(EventTypeName(v[i].type)), " of ", v[i].size, " B")
                        : std::string("none");
  };
  std::map<EventType, std::size_t> counts;
  for (std::size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
    if (i >= mine.size() || i >= theirs.size() || mine[i].type != theirs[i].type || mine[i].size != theirs[i].size) {
      std::cout << "verify: segment action #" << i + 1 << " differs: PyTorch " << text(theirs, i) << ", memscope "
                << text(mine, i) << " (of " << theirs.size() << " in the trace, " << mine.size() << " in the replay)\n";
      return kExitFailed;
    }
    ++counts[theirs[i].type];
  }
  if (theirs.empty()) {
    std::cout << "verify: the trace has no segment actions to check (0 checked)\n";
  } else {
    std::vector<std::string> parts;
    for (const auto& [type, n] : counts) parts.push_back(absl::StrCat(n, " ", std::string(EventTypeName(type))));
    std::cout << "verify: all " << theirs.size() << " segment actions match, in order (" << absl::StrJoin(parts, ", ")
              << ")\n";
  }
  if (adopted > 0 && !VerifyEndState(*t, *snapshot)) return kExitFailed;
  return kExitOk;
}

// --json: the results as one JSON document.
void PrintJson(const RequestTrace& trace, const std::vector<SettingResult>& results) {
  nlohmann::json runs = nlohmann::json::array();
  for (const SettingResult& sr : results) {
    const ReplayResult& r = sr.replay;
    nlohmann::json stats = nlohmann::json::object();
    for (const auto& [key, value] : FlattenStats(r.stats)) stats[key] = value;
    runs.push_back({{"alloc_conf", r.alloc_conf},
                    {"device_memory", r.device_memory},
                    {"requests", r.requests_total},
                    {"requests_done", r.requests_done},
                    {"peak_live_bytes", r.peak_live_bytes},
                    {"fragmentation_at_peak", sr.fragmentation_at_peak},
                    {"min_device_memory",
                     sr.min_device_memory == 0 ? nlohmann::json(nullptr) : nlohmann::json(sr.min_device_memory)},
                    {"oom", r.oom ? OomJson(*r.oom) : nlohmann::json(nullptr)},
                    {"memory_stats", stats}});
  }
  std::cout << nlohmann::json{{"source", trace.source}, {"lower_bound_bytes", PeakLiveBytes(trace)}, {"runs", runs}}
                   .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
            << "\n";
}

// Each setting's memory_summary (and OOM), then the what-if table under the lower bound.
void PrintTables(const ReplayArgs& args, const RequestTrace& trace, const std::vector<SettingResult>& results) {
  for (const SettingResult& sr : results) {
    const ReplayResult& r = sr.replay;
    std::cout << "== " << EscapeForTerminal(trace.source) << ": " << r.requests_total << " requests, alloc_conf "
              << Quoted(r.alloc_conf) << ", simulated GPU of " << FormatSize(r.device_memory) << "\n";
    if (r.oom) {
      std::cout << "OOM at request " << r.oom->request_index + 1 << " (line " << r.oom->line << ", alloc \""
                << EscapeForTerminal(r.oom->id) << "\" of " << r.oom->info.requested << " B); replay stopped:\n"
                << r.oom->info.message << "\n"
                << r.oom->info.diagnosis << "\n";
    }
    std::cout << r.memory_summary << "\n";
  }
  // One row per setting, side by side, under the lower bound.
  const char* kRow = "%-36s %12s %13s %9s %9s %7s %12s  %s\n";
  std::cout << absl::StrFormat(kRow, "alloc_conf", "peak alloc", "peak reserved", "res/alloc", "frag@peak", "retries",
                               "min memory", "result");
  std::cout << absl::StrFormat(kRow, "lower bound (peak live bytes)", FormatSize(PeakLiveBytes(trace)), "", "", "", "",
                               "", "");
  for (const SettingResult& sr : results) {
    const ReplayResult& r = sr.replay;
    const auto peak_alloc = static_cast<std::uint64_t>(All(r.stats.allocated_bytes).peak);
    const auto peak_reserved = static_cast<std::uint64_t>(All(r.stats.reserved_bytes).peak);
    const std::string outcome =
        r.oom ? absl::StrCat("OOM at request ", r.oom->request_index + 1, " of ", r.requests_total) : std::string("ok");
    std::cout << absl::StrFormat(
        kRow, Quoted(r.alloc_conf), FormatSize(peak_alloc), FormatSize(peak_reserved),
        peak_alloc == 0 ? std::string("-") : absl::StrFormat("%.3f", static_cast<double>(peak_reserved) / peak_alloc),
        absl::StrFormat("%.3f", sr.fragmentation_at_peak), absl::StrCat(r.stats.num_alloc_retries),
        sr.min_device_memory == 0 ? std::string("-") : FormatSize(sr.min_device_memory), outcome);
  }
  if (!args.out.empty()) {
    std::cout << "\nrecorded in " << args.out << "/ (" << RunDirectory::Listing(1) << ")\n";
  }
}

int Run(const ReplayArgs& args) {
  if (args.rank < 0) return Fail("--rank must be 0 or more");
  absl::StatusOr<ReplaySource> read = ReadInput(args);
  if (read.ok()) PrintNotes(read->notes);  // (escaped: a note can quote the file's own field names)
  absl::StatusOr<std::uint64_t> memory = DeviceMemory(args, read.ok() ? &*read : nullptr);
  if (!memory.ok()) return Fail(memory.status().message());
  const std::uint64_t device_memory = *memory;
  if (!read.ok()) return Fail(read.status().message());
  if (read->snapshot) {
    const std::string frees = ResolveMallocFrees(read->trace, read->snapshot->malloc_frees, device_memory,
                                                 !args.device_memory.empty() || read->snapshot->device_capacity != 0);
    if (!frees.empty()) PrintNotes({frees});
  }
  const RequestTrace& trace = read->trace;
  const std::optional<ImportedTrace>& snapshot = read->snapshot;
  absl::StatusOr<std::vector<AllocatorConfig>> settings = Settings(args, *read);
  if (!settings.ok()) return Fail(settings.status().message());
  if (args.memory_fraction_given) {
    if (!(args.memory_fraction >= 0.0 && args.memory_fraction <= 1.0)) {
      return Fail(absl::StrCat("--memory-fraction ", args.memory_fraction, ": use 0 to 1"));
    }
    for (AllocatorConfig& c : *settings) c.per_process_memory_fraction = args.memory_fraction;
  }
  for (const AllocatorConfig& c : *settings) {
    if (!NoteGcWithoutFraction(c).empty()) break;
  }
  const std::vector<AllocatorConfig>& configs = *settings;
  if (args.verify) return Verify(trace, snapshot, device_memory);

  std::vector<SettingResult> results;
  if (!args.out.empty()) {
    // Record the replay into a run directory, then analyse it.
    absl::StatusOr<RecordedReplay> recorded = RecordReplayRun(args.out, trace, configs[0], device_memory, args.force);
    if (!recorded.ok()) return Fail(std::string(recorded.status().message()));
    SettingResult one;
    one.replay = std::move(recorded->replay);
    one.fragmentation_at_peak = recorded->reports.front().fragmentation_at_peak.fragmentation;
    results.push_back(std::move(one));
  } else {
    for (const AllocatorConfig& config : configs) {
      absl::StatusOr<SettingResult> r = RunSetting(trace, config, device_memory, !args.no_search);
      if (!r.ok()) return Fail(std::string(r.status().message()));
      results.push_back(std::move(*r));
    }
  }

  if (args.json) {
    PrintJson(trace, results);
  } else {
    PrintTables(args, trace, results);
  }
  return kExitOk;
}

}  // namespace

void RegisterReplay(CLI::App& app, int& exit_status) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand(
      "replay",
      "Replay a request trace (JSON lines, a PyTorch memory snapshot pickle, or RMM's CSV log) through the "
      "PyTorch-faithful caching allocator under one or more settings: memory_summary() and a what-if table. "
      "Without FILE, replays an embedded demo trace.");
  cmd->add_option(
      "file", args->file,
      "request trace: JSON lines (docs/replay.md, Request trace format), a torch.cuda.memory._snapshot() pickle, "
      "an RMM logging_resource_adaptor CSV, or a memscope recording (run directory or rank-R.timeline: "
      "its whole request stream, under its own settings and device size unless told otherwise)");
  cmd->add_option("--alloc-conf", args->alloc_confs,
                  "allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax; repeat to compare settings "
                  "(default: $PYTORCH_CUDA_ALLOC_CONF or $PYTORCH_ALLOC_CONF)")
      ->allow_extra_args(false);
  cmd->add_option("--device-memory", args->device_memory,
                  "simulated GPU memory, e.g. 80GiB, 16GB, 512MiB (default 80GiB; 1GiB for the demo)");
  cmd->add_option("--memory-fraction", args->memory_fraction,
                  "torch.cuda.set_per_process_memory_fraction(F) before the first request, 0 to 1 (default 1: no cap)")
      ->each([args](const std::string&) { args->memory_fraction_given = true; });
  cmd->add_option("--out", args->out,
                  "record the replay into this run directory (timeline, report.json, summary.txt, trace.json, "
                  "snapshot at the peak); one setting only");
  cmd->add_flag("--force", args->force,
                "with --out: write into a directory that is not empty and was not written by memscope");
  cmd->add_option("--rank", args->rank, "of a run directory: the rank whose requests to replay (default 0)");
  cmd->add_flag("--json", args->json, "print the results as JSON");
  cmd->add_flag("--verify", args->verify,
                "PyTorch snapshot input: replay under its own settings and check that the segment sizes asked of "
                "the device match the trace's segment_alloc entries, in order (exit 1 at the first difference)");
  cmd->add_flag("--no-search", args->no_search, "skip the search for the smallest device memory that works");
  cmd->callback([args, &exit_status] { exit_status = Run(*args); });
}

}  // namespace memscope::cli
