// Commands that read a recording (a run directory or a timeline file):
// summary, trace, snapshot, frag, dump.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/sizes.h"
#include "analysis/analysis.h"
#include "cli/commands.h"
#include "exporters/chrome_trace.h"
#include "exporters/report.h"
#include "exporters/snapshot_export.h"
#include "nlohmann/json.hpp"
#include "recording/timeline.h"
#include "run/device_memory.h"
#include "run/gpu_table.h"
#include "load/manifest.h"
#include "load/output_file.h"
#include "load/recording.h"
#include "run/run.h"
#include "load/run_directory.h"

namespace memscope::cli {
namespace {

// Loads RUN and keeps the ranks asked for (all when rank < 0).
absl::StatusOr<std::vector<Timeline>> LoadRanks(const std::string& path, int rank) {
  absl::StatusOr<std::vector<Timeline>> run = LoadTimelines(path);
  if (run.ok()) PrintNotes(*run);
  if (!run.ok() || rank < 0) return run;
  for (Timeline& t : *run) {
    if (t.rank == rank) {
      std::vector<Timeline> one;
      one.push_back(std::move(t));
      return one;
    }
  }
  return absl::NotFoundError(absl::StrCat("'", path, "' has no rank ", rank));
}

struct ReadArgs {
  std::string path;
  int rank = -1;
  std::string at = "end";
  std::string output;
  std::string format = "pickle";
  std::size_t max_entries = 0;
  bool json = false;
  bool by_category = false;
  std::size_t max_samples = ChromeTraceOptions{}.max_counter_samples_per_rank;
};

void AddRunArgs(CLI::App* cmd, ReadArgs& a, bool with_at) {
  cmd->add_option("run", a.path, "run directory, rank-R.timeline file, or PyTorch memory snapshot (.pickle)")
      ->required();
  cmd->add_option("--rank", a.rank, "only this rank (default: every rank)")
      ->check(InRange(0, kMaxTimelineWorldSize - 1));
  if (with_at) {
    cmd->add_option("--at", a.at,
                    "moment: end (after the last step, the default), exit (after teardown), peak, oom, or "
                    "PHASE:STEP[.MICRO] (the end of that phase, e.g. backward:1; backward:1.0 is micro-batch 0 "
                    "with --grad-accum)");
  }
}

// A capture's measured GPU table (run/device_memory.h), its notes printed.
std::vector<GpuRow> CaptureGpuTable(const std::string& path, const std::vector<Timeline>& run) {
  std::vector<const Timeline*> ranks;
  for (const Timeline& t : run) ranks.push_back(&t);
  std::vector<std::string> notes;
  std::vector<GpuRow> rows = MeasuredGpuTable(path, ranks, notes);
  PrintNotes(notes);
  return rows;
}

int Summary(const ReadArgs& a) {
  absl::StatusOr<Moment> moment = ParseMoment(a.at);
  if (!moment.ok()) return Fail("summary", moment.status().message());
  absl::StatusOr<std::vector<Timeline>> run = LoadRanks(a.path, a.rank);
  if (!run.ok()) return Fail("summary", run.status().message());
  std::vector<RankReport> reports;
  std::string text;
  std::vector<MomentState> at_moment;
  for (const Timeline& t : *run) {
    absl::StatusOr<RankReport> r = AnalyzeRank(t);
    if (!r.ok()) return Fail("summary", r.status().message());
    absl::StatusOr<std::pair<TraceModel, std::size_t>> at = ModelAt(t, *moment, &*r);
    if (!at.ok()) return Fail("summary", at.status().message());
    const std::optional<PinnedHostBytes> host = PinnedHostOf(t);
    absl::StrAppend(&text, text.empty() ? "" : "\n", SummaryText(t, *r, at->first, moment->text, a.by_category),
                    PinnedHostText(host));
    at_moment.push_back({.rank = t.rank,
                         .moment = moment->text,
                         .events = at->second,
                         .stats = at->first.stats(),
                         .fragmentation = at->first.Fragmentation(),
                         .pools = BytesByPool(at->first, t),
                         .pinned_host = host});
    reports.push_back(std::move(*r));
  }
  // A run directory's whole-GPU table (run/gpu_table.h), from its ranks' rank-R.json.
  std::vector<GpuRow> gpus;
  if (std::error_code ec; std::filesystem::is_directory(a.path, ec) && !run->empty()) {
    std::vector<std::optional<RankStatus>> statuses;
    for (const Timeline& t : *run) statuses.push_back(RankStatus::Read(RunDirectory(a.path).RankStatus(t.rank)));
    gpus = GpuTable(statuses, reports, run->front().device_capacity);
    if (gpus.empty()) gpus = CaptureGpuTable(a.path, *run);  // a capture's device timelines, measured
  }
  if (a.json) {
    Report report = MakeReport(run->empty() ? 0 : run->front().world_size, std::move(reports));
    report.gpus = gpus;
    std::cout << SummaryJson(report, at_moment).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << text;
    if (!gpus.empty()) std::cout << "\n" << GpuTableText(gpus);
  }
  return kExitOk;
}

int Trace(const ReadArgs& a) {
  if (a.output.empty()) return Fail("trace", "-o FILE is required");
  absl::StatusOr<std::vector<Timeline>> run = LoadRanks(a.path, a.rank);
  if (!run.ok()) return Fail("trace", run.status().message());
  std::vector<const Timeline*> ptrs;
  for (const Timeline& t : *run) ptrs.push_back(&t);
  OutputFile out(a.output);  // whole or not at all, never through a symlink
  ChromeTraceOptions options;
  options.max_counter_samples_per_rank = a.max_samples;
  std::vector<GpuRow> rows = ReadRunGpuTable(a.path);  // the run's own, as its trace.json has it
  if (std::error_code ec; rows.empty() && std::filesystem::is_directory(a.path, ec)) {
    rows = CaptureGpuTable(a.path, *run);
  }
  const nlohmann::json gpus = rows.empty() ? nlohmann::json(nullptr) : GpuTableJson(rows);
  options.gpus = &gpus;
  if (absl::Status s = WriteChromeTrace(ptrs, options, out.stream()); !s.ok() && out.stream()) {
    return Fail("trace", s.message());
  }
  if (absl::Status s = out.Commit(); !s.ok()) return Fail("trace", s.message());
  std::cout << "wrote " << a.output << " (" << ptrs.size() << " rank" << (ptrs.size() == 1 ? "" : "s")
            << "; open it in https://ui.perfetto.dev or chrome://tracing)\n";
  return kExitOk;
}

int Snapshot(const ReadArgs& a) {
  if (a.output.empty()) return Fail("snapshot", "-o FILE is required");
  if (a.format != "pickle" && a.format != "json") return Fail("snapshot", "--format must be pickle or json");
  absl::StatusOr<Moment> moment = ParseMoment(a.at);
  if (!moment.ok()) return Fail("snapshot", moment.status().message());
  absl::StatusOr<std::vector<Timeline>> run = LoadRanks(a.path, a.rank);
  if (!run.ok()) return Fail("snapshot", run.status().message());
  if (run->size() > 1) return Fail("snapshot", "the run has several ranks: choose one with --rank R");
  const Timeline& t = run->front();
  absl::StatusOr<std::pair<TraceModel, std::size_t>> at = ModelAt(t, *moment);
  if (!at.ok()) return Fail("snapshot", at.status().message());
  OutputFile out(a.output);  // whole or not at all, never through a symlink
  const SnapshotFormat format = a.format == "json" ? SnapshotFormat::kJson : SnapshotFormat::kPickle;
  if (absl::Status s = WriteSnapshot(t, at->first, at->second, format, out.stream(), a.max_entries);
      !s.ok() && out.stream()) {
    return Fail("snapshot", s.message());
  }
  if (absl::Status s = out.Commit(); !s.ok()) return Fail("snapshot", s.message());
  std::cout << "wrote " << a.output << " (rank " << t.rank << " at " << moment->text << ", " << at->second
            << " events; open it in https://pytorch.org/memory_viz)\n";
  return kExitOk;
}

// Segments sorted by free bytes, with the blocks that keep them from being
// released (who pinned what).
nlohmann::json SegmentMapJson(const Timeline& t, const TraceModel& model) {
  nlohmann::json segments = nlohmann::json::array();
  for (const auto& [addr, seg] : model.segments()) {
    nlohmann::json pinned = nlohmann::json::array();
    std::uint64_t used = 0;
    for (auto it = model.blocks().lower_bound(addr); it != model.blocks().end() && it->first < addr + seg.size; ++it) {
      used += it->second.size;
      pinned.push_back({{"address", it->first},
                        {"size", it->second.size},
                        {"category", std::string(CategoryName(it->second.category))},
                        {"owner", t.str(it->second.owner)},
                        {"site", SiteOf(it->second, t)},
                        {"state", it->second.pending_free ? "active_pending_free" : "active_allocated"}});
    }
    segments.push_back({{"address", addr},
                        {"size", seg.size},
                        {"pool", seg.small ? "small" : "large"},
                        {"stream", seg.stream},
                        {"expandable", seg.expandable},
                        {"free_bytes", seg.size - used},
                        {"blocks", pinned}});
    if (t.has_private_pools()) {  // segment_pool_id, only where a snapshot has private pools
      const PoolId pool = seg.pool < t.pools.size() ? t.pools[seg.pool] : PoolId{};
      segments.back()["pool_id"] = {pool.first, pool.second};
    }
  }
  std::stable_sort(segments.begin(), segments.end(), [](const nlohmann::json& x, const nlohmann::json& y) {
    return x["free_bytes"].get<std::uint64_t>() > y["free_bytes"].get<std::uint64_t>();
  });
  return segments;
}

int Frag(const ReadArgs& a) {
  absl::StatusOr<Moment> moment = ParseMoment(a.at);
  if (!moment.ok()) return Fail("frag", moment.status().message());
  absl::StatusOr<std::vector<Timeline>> run = LoadRanks(a.path, a.rank);
  if (!run.ok()) return Fail("frag", run.status().message());
  nlohmann::json ranks = nlohmann::json::array();
  std::string text;
  for (const Timeline& t : *run) {
    absl::StatusOr<std::pair<TraceModel, std::size_t>> at = ModelAt(t, *moment);
    if (!at.ok()) return Fail("frag", at.status().message());
    const FragmentationInfo f = at->first.Fragmentation();
    const nlohmann::json segments = SegmentMapJson(t, at->first);
    ranks.push_back(
        {{"rank", t.rank}, {"moment", moment->text}, {"fragmentation", FragmentationJson(f)}, {"segments", segments}});
    const std::vector<PoolBytes> pools = BytesByPool(at->first, t);
    if (!pools.empty()) ranks.back()["pools"] = PoolsJson(pools);
    absl::StrAppend(&text, text.empty() ? "" : "\n", "rank ", t.rank, " at ", moment->text, ":\n", FragmentationText(f),
                    PoolsText(pools));
    int shown = 0;
    for (const nlohmann::json& s : segments) {
      if (s["free_bytes"].get<std::uint64_t>() == 0 || s["blocks"].empty()) continue;  // only pinned free space
      if (shown++ == 0) absl::StrAppend(&text, "segments holding free memory that cannot be released:\n");
      if (shown > 10) {
        absl::StrAppend(&text, "  ...\n");
        break;
      }
      const std::string private_pool = s.contains("pool_id") && !(s["pool_id"][0] == 0 && s["pool_id"][1] == 0)
                                           ? absl::StrCat(", private pool (", s["pool_id"][0].get<std::uint64_t>(),
                                                          ", ", s["pool_id"][1].get<std::uint64_t>(), ")")
                                           : std::string();
      absl::StrAppendFormat(&text, "  0x%x %s (%s pool%s): %s free, pinned by", s["address"].get<std::uint64_t>(),
                            FormatSize(s["size"].get<std::uint64_t>()), s["pool"].get<std::string>(), private_pool,
                            FormatSize(s["free_bytes"].get<std::uint64_t>()));
      // Group the pinning blocks by category and owner, largest first; a
      // block with a stack (an imported snapshot) by its site, the stack.
      std::map<std::pair<std::string, std::string>, std::pair<std::uint64_t, int>> groups;
      for (const nlohmann::json& b : s["blocks"]) {
        const std::string category = b["category"].get<std::string>();
        const std::string site = b["site"].get<std::string>();
        const bool from_stack = !site.starts_with(category + " ");
        auto& g = groups[{category, from_stack ? site : b["owner"].get<std::string>()}];
        g.first += b["size"].get<std::uint64_t>();
        ++g.second;
      }
      std::vector<std::pair<std::pair<std::string, std::string>, std::pair<std::uint64_t, int>>> sorted(groups.begin(),
                                                                                                        groups.end());
      std::stable_sort(sorted.begin(), sorted.end(),
                       [](const auto& x, const auto& y) { return x.second.first > y.second.first; });
      for (const auto& [key, g] : sorted) {
        absl::StrAppend(&text, " ", key.first, key.second.empty() ? "" : absl::StrCat(" ", EscapeForTerminal(key.second)), " ",
                        FormatSize(g.first), g.second > 1 ? absl::StrCat(" (", g.second, " blocks)") : "", ";");
      }
      text.back() = '\n';
    }
  }
  if (a.json) {
    std::cout << nlohmann::json{{"ranks", ranks}}.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << text;
  }
  return kExitOk;
}

int Dump(const ReadArgs& a) {
  absl::StatusOr<std::vector<Timeline>> run = LoadRanks(a.path, a.rank);
  if (!run.ok()) return Fail("dump", run.status().message());
  for (const Timeline& t : *run) {
    std::cout << nlohmann::json{{"type", "header"},
                                {"rank", t.rank},
                                {"world_size", t.world_size},
                                {"device_index", t.device_index},
                                {"device_capacity", t.device_capacity},
                                {"wall_start_us", t.wall_start_us},
                                {"alloc_conf", t.alloc_conf},
                                {"events", t.events.size()},
                                {"torn_bytes", t.torn_bytes}}
                     .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
    for (const Event& e : t.events) {
      nlohmann::json j = {{"type", std::string(EventTypeName(e.type))}, {"time_ns", e.time_ns}};
      if (IsAllocatorAction(e.type)) {
        j["addr"] = e.addr;
        j["size"] = e.size;
        j["requested_size"] = e.requested_size;
        j["stream"] = e.stream;
        j["pool"] = e.small_pool() ? "small" : "large";
        if (e.type == EventType::kAlloc) {
          j["category"] = std::string(CategoryName(e.category));
          j["owner"] = t.str(e.name);
        }
      } else if (e.type == EventType::kMark) {
        j["text"] = t.str(e.name);
      } else if (e.type == EventType::kCollectiveBegin || e.type == EventType::kCollectiveEnd) {
        j["collective"] = t.str(e.name);
        j["bytes"] = e.size;
      } else {
        j["phase"] = std::string(PhaseName(e.phase));
        j["step"] = e.step() == kNoStep ? nlohmann::json(nullptr) : nlohmann::json(e.step());
        if (e.name != 0) j["label"] = t.str(e.name);
      }
      std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
  }
  return kExitOk;
}

}  // namespace

void RegisterProfileCommands(CLI::App& app, int& exit_status) {
  auto args = std::make_shared<ReadArgs>();

  CLI::App* summary = app.add_subcommand(
      "summary", "Phase table, peaks with category attribution, fragmentation and memory_summary() at a moment.");
  AddRunArgs(summary, *args, true);
  summary->add_flag("--json", args->json, "print report.json (plus the moment's stats) instead of text");
  summary->add_flag("--by-category", args->by_category,
                    "after the phase table, the allocated bytes of each category at every phase end");
  summary->callback([args, &exit_status] { exit_status = Summary(*args); });

  CLI::App* trace = app.add_subcommand("trace", "Write a Chrome trace JSON (Perfetto, chrome://tracing) of a run.");
  AddRunArgs(trace, *args, false);
  trace->add_option("-o,--output", args->output, "output file")->required();
  trace->add_option("--max-samples", args->max_samples, "counter samples kept per rank (peaks always kept)")
      ->check(InRange(std::size_t{4}, std::size_t{100000000}));
  trace->callback([args, &exit_status] { exit_status = Trace(*args); });

  CLI::App* snapshot = app.add_subcommand(
      "snapshot", "Write a PyTorch memory._snapshot() pickle (pytorch.org/memory_viz opens it) at a moment.");
  AddRunArgs(snapshot, *args, true);
  snapshot->add_option("-o,--output", args->output, "output file")->required();
  snapshot->add_option("--format", args->format, "pickle (default) or json");
  snapshot->add_option("--max-entries", args->max_entries,
                       "keep only the last N trace entries, like PyTorch's ring buffer (default: all)");
  snapshot->callback([args, &exit_status] { exit_status = Snapshot(*args); });

  CLI::App* frag = app.add_subcommand(
      "frag", "Fragmentation at a moment: free bytes vs largest free block, and the blocks pinning free memory.");
  AddRunArgs(frag, *args, true);
  frag->add_flag("--json", args->json, "print JSON");
  frag->callback([args, &exit_status] { exit_status = Frag(*args); });

  CLI::App* dump = app.add_subcommand("dump", "Print a timeline file (or a run's timelines) as JSON lines.");
  AddRunArgs(dump, *args, false);
  dump->callback([args, &exit_status] { exit_status = Dump(*args); });
}

}  // namespace memscope::cli
