// memscope replay: run a request trace through the caching allocator under
// one or more allocator settings.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/config.h"
#include "allocator/sizes.h"
#include "cli/commands.h"
#include "nlohmann/json.hpp"
#include <filesystem>
#include <fstream>

#include "profiler/replayer.h"
#include "profiler/report.h"
#include "profiler/run.h"
#include "profiler/timeline.h"
#include "profiler/request_trace.h"

namespace memscope::cli {
namespace {

struct ReplayArgs {
  std::string file;
  std::vector<std::string> alloc_confs;
  std::string device_memory;
  std::string out;
  bool json = false;
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "memscope replay: %s\n", message.c_str());
  return kExitBadInput;
}

std::string Quoted(const std::string& s) { return s.empty() ? "(defaults)" : absl::StrCat("\"", s, "\""); }

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

int Run(const ReplayArgs& args) {
  std::uint64_t device_memory = 0;
  const bool demo = args.file.empty();
  if (!args.device_memory.empty()) {
    absl::StatusOr<std::uint64_t> parsed = ParseSize(args.device_memory);
    if (!parsed.ok()) return Fail(absl::StrCat("--device-memory: ", parsed.status().message()));
    if (*parsed == 0) return Fail("--device-memory: must be greater than 0");
    device_memory = *parsed;
  } else {
    // The embedded demo runs on a small GPU so that its fragmentation shows.
    device_memory = demo ? 1ULL << 30 : 80ULL << 30;
  }

  std::vector<AllocatorConfig> configs;
  std::vector<std::string> texts = args.alloc_confs;
  if (texts.empty()) {
    absl::StatusOr<AllocatorConfig> env = AllocatorConfig::FromEnvironment();
    if (!env.ok()) return Fail(std::string(env.status().message()));
    configs.push_back(*env);
    if (demo && env->text.empty()) {
      // The demo's point: the same requests, with and without expandable segments.
      configs.push_back(*AllocatorConfig::Parse("expandable_segments:True"));
    }
  }
  for (const std::string& text : texts) {
    absl::StatusOr<AllocatorConfig> config = AllocatorConfig::Parse(text);
    if (!config.ok()) return Fail(absl::StrCat("--alloc-conf \"", text, "\": ", config.status().message()));
    configs.push_back(*config);
  }

  if (!args.out.empty() && configs.size() > 1) {
    if (texts.size() > 1) return Fail("--out records one setting: give at most one --alloc-conf");
    configs.resize(1);
  }

  RequestTrace trace;
  if (demo) {
    trace = DemoTrace();
  } else {
    absl::StatusOr<RequestTrace> read = ReadJsonlTraceFile(args.file);
    if (!read.ok()) return Fail(std::string(read.status().message()));
    trace = std::move(*read);
  }

  std::vector<ReplayResult> results;
  if (!args.out.empty()) {
    // Record the replay into a run directory, then analyse it.
    std::error_code ec;
    std::filesystem::create_directories(args.out, ec);
    if (ec) return Fail(absl::StrCat("--out: cannot create '", args.out, "': ", ec.message()));
    Timeline header;
    header.device_capacity = device_memory;
    header.alloc_conf = configs[0].text;
    header.wall_start_us = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    absl::StatusOr<std::unique_ptr<TimelineWriter>> writer = TimelineWriter::Create(TimelinePath(args.out, 0), header);
    if (!writer.ok()) return Fail(std::string(writer.status().message()));
    Recorder recorder(**writer);
    absl::StatusOr<ReplayResult> r = Replay(trace, configs[0], device_memory, &recorder);
    if (!r.ok()) return Fail(std::string(r.status().message()));
    if (absl::Status s = (*writer)->Flush(); !s.ok()) return Fail(std::string(s.message()));
    writer->reset();
    nlohmann::json run = {{"schema", "memscope.run/1"},
                          {"generator", kMemscopeVersion},
                          {"command", "replay"},
                          {"source", trace.source},
                          {"world_size", 1},
                          {"alloc_conf", configs[0].text},
                          {"device_memory", device_memory},
                          {"ranks", {{{"rank", 0},
                                      {"status", r->oom ? "oom" : "ok"},
                                      {"exit_code", 0},
                                      {"timeline", "rank-0.timeline"}}}}};
    std::ofstream(std::filesystem::path(args.out) / "run.json") << run.dump(1) << "\n";
    absl::StatusOr<std::vector<Timeline>> recorded = LoadRun(args.out);
    if (!recorded.ok()) return Fail(std::string(recorded.status().message()));
    if (absl::Status s = WriteRunOutputs(args.out, *recorded); !s.ok()) return Fail(std::string(s.message()));
    results.push_back(std::move(*r));
  } else {
    for (const AllocatorConfig& config : configs) {
      absl::StatusOr<ReplayResult> r = Replay(trace, config, device_memory);
      if (!r.ok()) return Fail(std::string(r.status().message()));
      results.push_back(std::move(*r));
    }
  }

  if (args.json) {
    nlohmann::json runs = nlohmann::json::array();
    for (const ReplayResult& r : results) {
      nlohmann::json stats = nlohmann::json::object();
      for (const auto& [key, value] : FlattenStats(r.stats)) stats[key] = value;
      runs.push_back({{"alloc_conf", r.alloc_conf},
                      {"device_memory", r.device_memory},
                      {"requests", r.requests_total},
                      {"requests_done", r.requests_done},
                      {"peak_live_bytes", r.peak_live_bytes},
                      {"oom", r.oom ? OomJson(*r.oom) : nlohmann::json(nullptr)},
                      {"memory_stats", stats}});
    }
    std::cout << nlohmann::json{{"source", trace.source}, {"runs", runs}}.dump(2) << "\n";
    return kExitOk;
  }

  for (const ReplayResult& r : results) {
    std::cout << "== " << trace.source << ": " << r.requests_total << " requests, alloc_conf " << Quoted(r.alloc_conf)
              << ", simulated GPU of " << FormatSize(r.device_memory) << "\n";
    if (r.oom) {
      std::cout << "OOM at request " << r.oom->request_index + 1 << " (line " << r.oom->line << ", alloc \""
                << r.oom->id << "\" of " << r.oom->info.requested << " B); replay stopped:\n"
                << r.oom->info.message << "\n"
                << r.oom->info.diagnosis << "\n";
    }
    std::cout << r.memory_summary << "\n";
  }
  // One line per setting, side by side.
  std::cout << absl::StrFormat("%-40s %14s %14s %8s %s\n", "alloc_conf", "peak alloc", "peak reserved", "retries",
                               "result");
  for (const ReplayResult& r : results) {
    const std::string outcome =
        r.oom ? absl::StrCat("OOM at request ", r.oom->request_index + 1, " of ", r.requests_total)
              : std::string("ok");
    std::cout << absl::StrFormat("%-40s %14s %14s %8d %s\n", Quoted(r.alloc_conf),
                                 FormatSize(static_cast<std::uint64_t>(r.stats.allocated_bytes[0].peak)),
                                 FormatSize(static_cast<std::uint64_t>(r.stats.reserved_bytes[0].peak)),
                                 r.stats.num_alloc_retries, outcome);
  }
  std::cout << absl::StrFormat("%-40s %14s %14s %8s %s\n", "lower bound (peak live bytes)",
                               FormatSize(results.front().peak_live_bytes), "", "", "");
  if (!args.out.empty()) {
    std::cout << "\nrecorded in " << args.out
              << "/: run.json rank-0.timeline report.json summary.txt trace.json snapshot-rank-0.pickle\n";
  }
  return kExitOk;
}

}  // namespace

void RegisterReplay(CLI::App& app, int& exit_status) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand(
      "replay",
      "Replay a JSON-lines request trace through the PyTorch-faithful caching allocator and print "
      "memory_summary() for each setting. Without FILE, replays an embedded demo trace.");
  cmd->add_option("file", args->file, "JSON-lines request trace (see README: Request trace format)");
  cmd->add_option("--alloc-conf", args->alloc_confs,
                  "allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax; repeat to compare settings "
                  "(default: $PYTORCH_CUDA_ALLOC_CONF or $PYTORCH_ALLOC_CONF)")
      ->allow_extra_args(false);
  cmd->add_option("--device-memory", args->device_memory,
                  "simulated GPU memory, e.g. 80GiB, 16GB, 512MiB (default 80GiB; 1GiB for the demo)");
  cmd->add_option("--out", args->out,
                  "record the replay into this run directory (timeline, report.json, summary.txt, trace.json, "
                  "snapshot at the peak); one setting only");
  cmd->add_flag("--json", args->json, "print the results as JSON");
  cmd->callback([args, &exit_status] { exit_status = Run(*args); });
}

}  // namespace memscope::cli
