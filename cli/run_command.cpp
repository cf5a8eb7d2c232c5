// memscope run: the reference training loop on simulated GPUs, recorded
// into a run directory, on one rank or N (a launcher process supervising N
// rank processes that talk over Gloo); memscope models: the zoo.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <regex>
#include <thread>

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/config.h"
#include "allocator/sizes.h"
#include "cli/commands.h"
#include "compare/compare.h"
#include "exporters/report.h"
#include "run/run.h"
#include "recording/timeline.h"
#include "reducer/communicator.h"
#include "run/launcher.h"
#include "train/trainer.h"

namespace memscope::cli {
namespace {

// An OOM during the run: recorded and reported, with its own status.
inline constexpr int kExitOutOfMemory = 3;
// A rank failed: killed, a collective timed out or mismatched, or it crashed.
inline constexpr int kExitRankFailed = 4;

struct RunArgs {
  std::string model = "gpt2";
  std::int64_t world_size = 1;
  bool world_size_given = false;
  std::int64_t steps = 3;
  std::int64_t batch_size = 0;
  std::int64_t seq_len = 0;
  std::int64_t width = 0;
  std::int64_t depth = 0;
  std::string optimizer = "adam";
  std::string optimizer_impl = "foreach";
  double lr = 0;
  double momentum = 0.9;
  std::string ddp = "auto";
  double bucket_cap_mb = 0;
  bool bucket_cap_given = false;
  bool find_unused = false;
  bool static_graph = false;
  std::string comm_hook = "none";
  bool no_broadcast_buffers = false;
  double timeout = 60;
  std::string zero_grad = "none";
  std::string alloc_conf;
  bool alloc_conf_given = false;
  std::string device_memory = "80GiB";
  std::string exec = "meta";
  std::string amp = "none";
  bool checkpoint = false;
  std::int64_t grad_accum = 1;
  std::string attention = "math";
  std::string out = "memscope-run";
  bool json = false;
  std::string fault_kill;          // "RANK:STEP": that rank SIGKILLs itself as backward of STEP begins
  std::string fault_skip_barrier;  // "RANK:STEP": every other rank calls a barrier after STEP
};

int Fail(absl::string_view message) { return cli::Fail("run", message); }

// Everything a rank needs, checked before anything is written.
struct Plan {
  TrainOptions train;
  AllocatorConfig config;
  std::uint64_t device_memory = 0;
  bool cpu = false;
  std::string ddp;  // "off", "copy" or "view"
  std::chrono::milliseconds timeout{60000};
  std::pair<int, std::int64_t> fault_kill{-1, -1}, fault_skip_barrier{-1, -1};
};

absl::StatusOr<std::pair<int, std::int64_t>> ParseFault(const std::string& flag, const std::string& text) {
  std::pair<int, std::int64_t> f{-1, -1};
  if (text.empty()) return f;
  const std::size_t colon = text.find(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(text.substr(0, colon), &f.first) ||
      !absl::SimpleAtoi(text.substr(colon + 1), &f.second) || f.first < 0 || f.second < 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", text, "': use RANK:STEP"));
  }
  return f;
}

absl::StatusOr<Plan> MakePlan(const RunArgs& a, const std::string& ddp_mode, std::int64_t world_size) {
  Plan p;
  TrainOptions& t = p.train;
  t.model = a.model;
  t.steps = a.steps;
  t.grad_accum = a.grad_accum;
  t.model_options.batch_size = a.batch_size;
  t.model_options.seq_len = a.seq_len;
  t.model_options.width = a.width;
  t.model_options.depth = a.depth;
  t.model_options.checkpoint_activations = a.checkpoint;
  if (a.attention == "flash") {
    t.model_options.attention = AttentionKind::kFlash;
  } else if (a.attention != "math") {
    return absl::InvalidArgumentError(absl::StrCat("--attention '", a.attention, "': use math or flash"));
  }
  absl::StatusOr<OptimizerKind> kind = ParseOptimizerKind(a.optimizer);
  if (!kind.ok()) return absl::InvalidArgumentError(absl::StrCat("--optimizer: ", kind.status().message()));
  absl::StatusOr<OptimizerImpl> impl = ParseOptimizerImpl(a.optimizer_impl);
  if (!impl.ok()) return absl::InvalidArgumentError(absl::StrCat("--optimizer-impl: ", impl.status().message()));
  t.optimizer.kind = *kind;
  t.optimizer.impl = *impl;
  // torch.optim defaults: Adam/AdamW lr 1e-3 (AdamW weight_decay 1e-2); SGD needs an lr (0.01 here).
  t.optimizer.lr = static_cast<float>(a.lr > 0 ? a.lr : (*kind == OptimizerKind::kSgd ? 0.01 : 1e-3));
  if (*kind == OptimizerKind::kSgd) t.optimizer.momentum = static_cast<float>(a.momentum);
  if (*kind == OptimizerKind::kAdamW) t.optimizer.weight_decay = 1e-2f;
  if (a.zero_grad == "zeros") {
    t.zero_grad_set_to_none = false;
  } else if (a.zero_grad != "none") {
    return absl::InvalidArgumentError(absl::StrCat("--zero-grad '", a.zero_grad, "': use none (set_to_none=True) or zeros"));
  }
  if (a.amp == "fp16") {
    t.amp = DType::kFloat16;
  } else if (a.amp == "bf16") {
    t.amp = DType::kBFloat16;
  } else if (a.amp != "none") {
    return absl::InvalidArgumentError(absl::StrCat("--amp '", a.amp, "': use none, fp16 or bf16"));
  }
  if (a.exec != "meta" && a.exec != "cpu") {
    return absl::InvalidArgumentError(a.exec == "cuda" ? "--exec cuda: this build has no GPU execution path; use meta or cpu"
                                                       : absl::StrCat("--exec '", a.exec, "': use meta or cpu"));
  }
  p.cpu = a.exec == "cpu";
  if (world_size < 1) return absl::InvalidArgumentError("--world-size must be at least 1");
  if (world_size > 64) return absl::InvalidArgumentError("--world-size: at most 64 ranks run on one machine");
  p.ddp = ddp_mode == "auto" ? (world_size > 1 ? "copy" : "off") : ddp_mode;
  if (p.ddp != "off" && p.ddp != "copy" && p.ddp != "view") {
    return absl::InvalidArgumentError(absl::StrCat("--ddp '", ddp_mode, "': use copy, view, off, or copy,view to compare"));
  }
  if (p.ddp != "off") {
    reducer::DdpOptions d;
    d.gradient_as_bucket_view = p.ddp == "view";
    if (a.bucket_cap_given) {
      if (!(a.bucket_cap_mb > 0)) return absl::InvalidArgumentError("--bucket-cap-mb must be greater than 0");
      d.bucket_cap_mb = a.bucket_cap_mb;
    }
    d.find_unused_parameters = a.find_unused;
    d.static_graph = a.static_graph;
    d.broadcast_buffers = !a.no_broadcast_buffers;
    if (a.comm_hook == "fp16") {
      d.comm_hook = reducer::CommHook::kFp16;
    } else if (a.comm_hook == "bf16") {
      d.comm_hook = reducer::CommHook::kBf16;
    } else if (a.comm_hook != "none") {
      return absl::InvalidArgumentError(absl::StrCat("--comm-hook '", a.comm_hook, "': use none, fp16 or bf16"));
    }
    if (d.comm_hook != reducer::CommHook::kNone && p.cpu) {
      return absl::InvalidArgumentError("--comm-hook fp16|bf16 needs --exec meta (the CPU kernels compute float32)");
    }
    t.ddp = d;
  } else if (a.bucket_cap_given || a.find_unused || a.static_graph || a.comm_hook != "none" || a.no_broadcast_buffers) {
    return absl::InvalidArgumentError("DDP options (--bucket-cap-mb, --find-unused-parameters, --static-graph, "
                                      "--comm-hook, --no-broadcast-buffers) need --ddp copy or view");
  }
  if (!(a.timeout > 0)) return absl::InvalidArgumentError("--timeout must be greater than 0 seconds");
  p.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(a.timeout * 1000));
  absl::StatusOr<std::pair<int, std::int64_t>> kill = ParseFault("--fault-kill", a.fault_kill);
  if (!kill.ok()) return kill.status();
  absl::StatusOr<std::pair<int, std::int64_t>> skip = ParseFault("--fault-skip-barrier", a.fault_skip_barrier);
  if (!skip.ok()) return skip.status();
  p.fault_kill = *kill;
  p.fault_skip_barrier = *skip;
  absl::StatusOr<std::uint64_t> device_memory = ParseSize(a.device_memory);
  if (!device_memory.ok()) return absl::InvalidArgumentError(absl::StrCat("--device-memory: ", device_memory.status().message()));
  if (*device_memory == 0) return absl::InvalidArgumentError("--device-memory: must be greater than 0");
  p.device_memory = *device_memory;
  absl::StatusOr<AllocatorConfig> config =
      a.alloc_conf_given ? AllocatorConfig::Parse(a.alloc_conf) : AllocatorConfig::FromEnvironment();
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--alloc-conf \"", a.alloc_conf, "\": ", config.status().message()));
  }
  p.config = *config;
  if (absl::StatusOr<std::unique_ptr<Model>> probe = CreateModel(t.model, t.model_options); !probe.ok()) {
    return probe.status();
  }
  if (p.cpu && t.amp) return absl::InvalidArgumentError("--amp needs --exec meta (the CPU kernels compute float32)");
  if (p.cpu) {
    bool cpu_model = false;
    for (const ModelInfo& m : ListModels()) cpu_model = cpu_model || (m.name == t.model && m.cpu);
    if (!cpu_model) return absl::InvalidArgumentError(absl::StrCat("--exec cpu runs mlp and cifar-net; ", t.model, " needs --exec meta"));
  }
  return p;
}

// The rendezvous directory our launcher uses inside the run directory.
constexpr char kStoreDir[] = ".memscope-store";

// The address a rank's Gloo TCP transport binds to: MEMSCOPE_BIND_ADDR when
// set; this host's name when MASTER_ADDR names another machine (multi-node
// under torchrun or Slurm); else the loopback (one machine).
std::string BindAddress() {
  if (const char* bind = std::getenv("MEMSCOPE_BIND_ADDR"); bind != nullptr && *bind != '\0') return bind;
  const char* master = std::getenv("MASTER_ADDR");
  const std::string m = master != nullptr ? master : "";
  if (m.empty() || m == "localhost" || m.rfind("127.", 0) == 0 || m == "::1") return "127.0.0.1";
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') return host;
  return "127.0.0.1";
}

// The files a run writes per rank: rank-R.json, rank-R.log, rank-R.timeline,
// snapshot-rank-R.pickle (R a number). Only these are cleaned before a run.
bool IsRankFile(const std::string& name) {
  static const std::regex pattern(R"(^(rank-[0-9]+\.(json|log|timeline|json\.tmp)|snapshot-rank-[0-9]+\.pickle)$)");
  return std::regex_match(name, pattern);
}

nlohmann::json BucketsJson(const std::vector<reducer::BucketInfo>& buckets) {
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    out.push_back({{"index", i}, {"bytes", buckets[i].bytes}, {"dtype", std::string(DTypeName(buckets[i].dtype))},
                   {"params", buckets[i].params}});
  }
  return out;
}

// The communicator's errors name their rank first ("rank 1: ..."); where the
// rank is already named, that prefix goes.
std::string WithoutRankPrefix(std::string error, int rank) {
  if (const std::string self = absl::StrCat("rank ", rank, ": "); error.rfind(self, 0) == 0) error.erase(0, self.size());
  return error;
}

// One rank: trains with its timeline recorded, writes rank-R.json. Returns
// the rank's exit status.
int RankMain(Plan plan, int rank, int world_size, const std::string& out) {
  Timeline header;
  header.rank = rank;
  header.world_size = world_size;
  header.device_index = rank;
  header.device_capacity = plan.device_memory;
  header.alloc_conf = plan.config.text;
  header.wall_start_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  absl::StatusOr<std::unique_ptr<TimelineWriter>> writer = TimelineWriter::Create(TimelinePath(out, rank), header);
  if (!writer.ok()) return Fail(writer.status().message());

  nlohmann::json status = {{"rank", rank}};
  std::unique_ptr<reducer::Communicator> comm;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<TrainResult> result;
  try {
    if (world_size > 1) {
      reducer::GlooOptions g;
      g.rank = rank;
      g.world_size = world_size;
      const char* store = std::getenv("MEMSCOPE_STORE");
      g.store_dir = store != nullptr ? store : (std::filesystem::path(out) / kStoreDir).string();
      g.hostname = BindAddress();
      g.timeout = plan.timeout;
      comm = reducer::CreateGlooCommunicator(g);
    } else if (plan.train.ddp) {
      comm = reducer::CreateLocalCommunicator();
    }
    reducer::Communicator* c = comm.get();
    const auto kill = plan.fault_kill;
    const auto skip = plan.fault_skip_barrier;
    plan.train.phase_hook = [c, rank, kill, skip](Phase phase, std::int64_t step, bool end) {
      if (!end && phase == Phase::kBackward && rank == kill.first && step == kill.second) ::raise(SIGKILL);
      if (end && c != nullptr && step == skip.second && rank != skip.first) c->Barrier();
    };
    SimDevice gpu({.capacity = plan.device_memory, .index = rank, .host_backed = plan.cpu});
    CachingAllocator allocator(gpu, plan.config);
    Recorder recorder(**writer);
    allocator.SetObserver(&recorder);
    DeviceContext ctx(allocator, plan.cpu ? ExecMode::kCpu : ExecMode::kMeta, plan.cpu ? &gpu : nullptr);
    result = Train(plan.train, ctx, &recorder, c);
    allocator.SetObserver(nullptr);
  } catch (const reducer::CommError& e) {  // rendezvous
    result = TrainResult{};
    result->comm_error = true;
    result->error = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!result.ok()) return Fail(result.status().message());
  if (absl::Status s = (*writer)->Flush(); !s.ok()) return Fail(s.message());
  writer->reset();
  const int exit_code = result->oom ? kExitOutOfMemory : result->comm_error || !result->error.empty() ? kExitRankFailed : kExitOk;
  status["status"] = result->oom ? "oom" : result->comm_error ? "comm_error" : result->error.empty() ? "ok" : "error";
  status["exit_code"] = exit_code;
  status["error"] = result->error;
  status["parameters"] = result->parameters;
  status["steps_done"] = result->steps_done;
  status["seconds"] = seconds;
  status["losses"] = result->losses;
  if (plan.train.ddp) {
    status["ddp"] = {{"mode", plan.ddp},
                     {"buckets", BucketsJson(result->initial_buckets)},
                     {"rebuilt_buckets", BucketsJson(result->rebuilt_buckets)}};
  }
  const std::filesystem::path path = std::filesystem::path(out) / absl::StrCat("rank-", rank, ".json");
  std::ofstream(path.string() + ".tmp") << status.dump(1) << "\n";
  std::filesystem::rename(path.string() + ".tmp", path);
  if (exit_code != kExitOk && world_size > 1) {
    std::cerr << "memscope run: rank " << rank << ": " << WithoutRankPrefix(result->error, rank) << "\n";
  }
  return exit_code;
}

// Reads rank-R.json of a finished (or failed) rank.
std::optional<nlohmann::json> ReadRankStatus(const std::string& out, int rank) {
  std::ifstream in(std::filesystem::path(out) / absl::StrCat("rank-", rank, ".json"));
  if (!in) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// Analyses every rank's timeline, writes run.json and the outputs, prints
// the tables. `exits` are the launcher's (empty for one in-process rank).
int Finalize(const RunArgs& a, const Plan& plan, int world_size, const std::vector<RankExit>& exits, int first_failure) {
  std::vector<nlohmann::json> statuses;
  nlohmann::json ranks = nlohmann::json::array();
  std::vector<float> losses;
  std::int64_t parameters = 0, steps_done = a.steps;
  double seconds = 0;
  bool oom = false, failed = false;
  std::string failure;
  for (int r = 0; r < world_size; ++r) {
    std::optional<nlohmann::json> st = ReadRankStatus(a.out, r);
    nlohmann::json entry = {{"rank", r}, {"timeline", absl::StrCat("rank-", r, ".timeline")}};
    if (st) {
      entry["status"] = (*st)["status"];
      entry["exit_code"] = (*st)["exit_code"];
      entry["error"] = WithoutRankPrefix((*st)["error"].get<std::string>(), r);
      entry["steps_done"] = (*st)["steps_done"];
      parameters = (*st)["parameters"].get<std::int64_t>();
      steps_done = std::min(steps_done, (*st)["steps_done"].get<std::int64_t>());
      seconds = std::max(seconds, (*st)["seconds"].get<double>());
      if (r == 0) losses = (*st)["losses"].get<std::vector<float>>();
      oom = oom || (*st)["status"] == "oom";
      failed = failed || (*st)["status"] != "ok";
    } else {
      entry["status"] = "failed";
      entry["error"] = "";
      failed = true;
    }
    if (!exits.empty()) {
      const RankExit& e = exits[static_cast<std::size_t>(r)];
      entry["exit_code"] = e.exit_code;
      entry["signal"] = e.signal;
      if (e.signal != 0) entry["status"] = e.stopped_by_launcher ? "stopped" : "killed";
      entry["how"] = e.Describe();
      failed = failed || !e.ok();
    }
    statuses.push_back(st.value_or(nlohmann::json::object()));
    ranks.push_back(entry);
  }
  if (first_failure >= 0) {
    const nlohmann::json& f = ranks[static_cast<std::size_t>(first_failure)];
    failure = absl::StrCat("rank ", first_failure, " ", f["how"].get<std::string>());
    if (!f["error"].get<std::string>().empty()) absl::StrAppend(&failure, ": ", f["error"].get<std::string>());
  }
  nlohmann::json run = {{"schema", "memscope.run/1"},
                        {"generator", kMemscopeVersion},
                        {"command", "run"},
                        {"model", a.model},
                        {"parameters", parameters},
                        {"steps", a.steps},
                        {"steps_done", steps_done},
                        {"batch_size", a.batch_size},
                        {"optimizer", a.optimizer},
                        {"optimizer_impl", a.optimizer_impl},
                        {"zero_grad", a.zero_grad},
                        {"amp", a.amp},
                        {"checkpoint_activations", a.checkpoint},
                        {"grad_accum", a.grad_accum},
                        {"attention", a.attention},
                        {"exec", a.exec},
                        {"ddp", plan.ddp},
                        {"world_size", world_size},
                        {"alloc_conf", plan.config.text},
                        {"device_memory", plan.device_memory},
                        {"seconds", seconds},
                        {"losses", losses},
                        {"ranks", ranks}};
  if (plan.train.ddp) {
    run["bucket_cap_mb"] = a.bucket_cap_given ? nlohmann::json(a.bucket_cap_mb) : nlohmann::json(nullptr);
    run["find_unused_parameters"] = a.find_unused;
    run["static_graph"] = a.static_graph;
    run["comm_hook"] = a.comm_hook;
    run["broadcast_buffers"] = !a.no_broadcast_buffers;
  }
  if (!failure.empty()) run["failure"] = {{"rank", first_failure}, {"message", failure}};
  std::ofstream(std::filesystem::path(a.out) / "run.json") << run.dump(1) << "\n";

  absl::StatusOr<std::vector<Timeline>> recorded = LoadRun(a.out);
  if (!recorded.ok()) return Fail(recorded.status().message());
  // Only this run's ranks (an external launcher's directory may hold more).
  std::erase_if(*recorded, [world_size](const Timeline& t) { return t.rank < 0 || t.rank >= world_size; });
  // report.json also gets each rank's status and DDP buckets, and the run's failure.
  auto amend = [&](std::vector<RankReport>& reports) {
    for (RankReport& r : reports) {
      if (r.rank < 0 || r.rank >= world_size) continue;
      const nlohmann::json& st = statuses[static_cast<std::size_t>(r.rank)];
      if (st.contains("ddp")) {
        // The rank wrote it with DdpJson's layout; one that does not read is left out.
        if (absl::StatusOr<DdpBuckets> ddp = DdpFromJson(st["ddp"]); ddp.ok()) r.ddp = std::move(*ddp);
      }
      const nlohmann::json& status = ranks[static_cast<std::size_t>(r.rank)]["status"];
      r.status = status.is_string() ? status.get<std::string>() : "failed";
      if (r.rank == first_failure) r.failure = failure;
    }
  };
  absl::StatusOr<std::vector<RankReport>> reports = WriteRunOutputs(a.out, *recorded, amend);
  if (!reports.ok()) return Fail(reports.status().message());

  if (a.json) {
    std::ifstream in(std::filesystem::path(a.out) / "report.json");
    std::cout << in.rdbuf();
  } else {
    std::cout << "memscope run: " << a.model << " (" << parameters << " parameters), " << steps_done << " of " << a.steps
              << " steps, --exec " << a.exec << ", " << (world_size > 1 ? absl::StrCat(world_size, " ranks, ") : "")
              << "--ddp " << plan.ddp << ", simulated GPU of " << FormatSize(plan.device_memory) << ", "
              << absl::StrFormat("%.2f", seconds) << " s\n";
    for (const RankReport& r : *reports) {
      std::cout << "\n";
      if (world_size > 1) std::cout << "rank " << r.rank << " (" << r.events << " events)\n";
      std::cout << PhaseTableText(r);
      const nlohmann::json& st = statuses[static_cast<std::size_t>(r.rank)];
      if (st.contains("ddp")) {
        for (const char* key : {"buckets", "rebuilt_buckets"}) {
          const nlohmann::json& b = st["ddp"][key];
          if (b.empty()) continue;
          std::uint64_t total = 0;
          for (const nlohmann::json& x : b) total += x["bytes"].get<std::uint64_t>();
          std::cout << (std::string(key) == "buckets" ? "DDP buckets: " : "rebuilt in gradient-ready order: ") << b.size()
                    << (b.size() == 1 ? " bucket of " : " buckets, ") << FormatSize(total)
                    << (b.size() == 1 ? "" : absl::StrCat(" (first ", FormatSize(b[0]["bytes"].get<std::uint64_t>()), ")"))
                    << "\n";
        }
      }
      std::cout << "peak allocated " << FormatSize(r.peak_allocated.bytes) << " in " << r.peak_allocated.phase << ": "
                << CategoryBreakdown(r.peak_allocated.by_category, r.peak_allocated.bytes, 4) << "\n";
      if (world_size > 1 && r.rank == 0 && !a.json) {
        bool same = true;
        for (const RankReport& o : *reports) same = same && o.peak_allocated.bytes == r.peak_allocated.bytes;
        if (same && reports->size() > 1) {
          std::cout << (world_size == 2 ? std::string("(rank 1 has") : absl::StrCat("(ranks 1-", world_size - 1, " have"))
                    << " the same peak; every rank's table is in summary.txt)\n";
          break;
        }
      }
    }
    if (!losses.empty()) {
      std::cout << "loss:";
      for (float l : losses) std::cout << absl::StrFormat(" %.4f", l);
      std::cout << "\n";
    }
    std::cout << "recorded in " << a.out << "/ (" << RunOutputListing(world_size) << ")\n";
  }
  if (!failure.empty()) {
    std::cerr << "memscope run: " << failure << "\n";
    for (const nlohmann::json& r : ranks) {
      if (r["rank"] != first_failure && r["status"] != "ok") {
        std::cerr << "memscope run: rank " << r["rank"].get<int>() << " " << r.value("how", std::string("failed"))
                  << (r["error"].get<std::string>().empty() ? "" : ": " + r["error"].get<std::string>()) << "\n";
      }
    }
  }
  if (oom) {
    for (std::size_t r = 0; r < statuses.size(); ++r) {
      if (statuses[r].value("status", "") == "oom") {
        std::cerr << "memscope run: rank " << r << " out of memory in step " << statuses[r]["steps_done"].get<std::int64_t>()
                  << ":\n" << statuses[r]["error"].get<std::string>() << "\n";
        for (const RankReport& rep : *reports) {
          if (rep.rank == static_cast<int>(r) && rep.oom) std::cerr << rep.oom->verdict << "\n";
        }
        break;
      }
    }
    return kExitOutOfMemory;
  }
  if (failed) {
    if (failure.empty()) {
      for (const nlohmann::json& r : ranks) {
        if (r["status"] == "ok") continue;
        const std::string error = r["error"].get<std::string>();
        std::cerr << "memscope run: rank " << r["rank"].get<int>() << " failed: "
                  << (error.empty() ? "it wrote no status (killed, or it never started)" : error) << "\n";
      }
    }
    return kExitRankFailed;
  }
  return kExitOk;
}

// A double as text that parses back to the same value.
std::string Exact(double v) { return absl::StrFormat("%.17g", v); }

// The command line of a rank: the same run, as options.
std::vector<std::string> ToArgs(const RunArgs& a, const std::string& ddp_mode) {
  std::vector<std::string> v = {"run", "--model", a.model, "--steps", absl::StrCat(a.steps), "--optimizer", a.optimizer,
                                "--optimizer-impl", a.optimizer_impl, "--momentum", Exact(a.momentum),
                                "--ddp", ddp_mode, "--comm-hook", a.comm_hook, "--timeout", Exact(a.timeout),
                                "--zero-grad", a.zero_grad, "--device-memory", a.device_memory, "--exec", a.exec,
                                "--amp", a.amp, "--grad-accum", absl::StrCat(a.grad_accum), "--attention", a.attention,
                                "--out", a.out};
  auto add = [&v](const char* flag, std::int64_t value) {
    if (value != 0) {
      v.push_back(flag);
      v.push_back(absl::StrCat(value));
    }
  };
  add("--batch-size", a.batch_size);
  add("--seq-len", a.seq_len);
  add("--width", a.width);
  add("--depth", a.depth);
  if (a.lr > 0) v.insert(v.end(), {"--lr", Exact(a.lr)});
  if (a.bucket_cap_given) v.insert(v.end(), {"--bucket-cap-mb", Exact(a.bucket_cap_mb)});
  if (a.find_unused) v.push_back("--find-unused-parameters");
  if (a.static_graph) v.push_back("--static-graph");
  if (a.no_broadcast_buffers) v.push_back("--no-broadcast-buffers");
  if (a.checkpoint) v.push_back("--checkpoint-activations");
  if (a.alloc_conf_given) v.insert(v.end(), {"--alloc-conf", a.alloc_conf});
  if (!a.fault_kill.empty()) v.insert(v.end(), {"--fault-kill", a.fault_kill});
  if (!a.fault_skip_barrier.empty()) v.insert(v.end(), {"--fault-skip-barrier", a.fault_skip_barrier});
  return v;
}

// `memscope run --ddp copy,view`: the two runs compared.
int PrintComparison(const std::string& copy_dir, const std::string& view_dir, int worst) {
  absl::StatusOr<CompareInput> a = LoadCompareInput(copy_dir);
  if (!a.ok()) return Fail(a.status().message());
  absl::StatusOr<CompareInput> b = LoadCompareInput(view_dir);
  if (!b.ok()) return Fail(b.status().message());
  absl::StatusOr<Comparison> c = Compare(*a, *b);
  if (!c.ok()) return Fail(c.status().message());
  std::cout << "== --ddp copy (A) vs --ddp view (B)\n" << FormatComparison(*c);
  return worst;
}

std::string SelfExecutable() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

int RunOne(const RunArgs& a, const std::string& ddp_mode) {
  // A rank started by a launcher (ours, torchrun, Slurm, mpirun).
  const char* env_rank = std::getenv("RANK");
  const char* env_world = std::getenv("WORLD_SIZE");
  const bool worker = env_rank != nullptr && env_world != nullptr;
  std::int64_t world_size = a.world_size;
  int rank = 0;
  if (worker) {
    std::int64_t ws = 0;
    if (!absl::SimpleAtoi(env_world, &ws) || ws < 1) return Fail(absl::StrCat("WORLD_SIZE='", env_world, "' is not a positive integer"));
    if (!absl::SimpleAtoi(env_rank, &rank) || rank < 0 || rank >= ws) {
      return Fail(absl::StrCat("RANK='", env_rank, "' is not a rank of WORLD_SIZE=", ws));
    }
    if (a.world_size_given && a.world_size != ws) {
      return Fail(absl::StrCat("--world-size ", a.world_size, " disagrees with WORLD_SIZE=", ws));
    }
    world_size = ws;
  }
  absl::StatusOr<Plan> plan = MakePlan(a, ddp_mode, world_size);
  if (!plan.ok()) return Fail(plan.status().message());
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (ec) return Fail(absl::StrCat("--out: cannot create '", a.out, "': ", ec.message()));

  if (worker) {
    // A status left by an earlier run must not pass for this one's.
    std::filesystem::remove(std::filesystem::path(a.out) / absl::StrCat("rank-", rank, ".json"), ec);
    const int code = RankMain(*plan, rank, static_cast<int>(world_size), a.out);
    if (std::getenv("MEMSCOPE_SUPERVISED") != nullptr || rank != 0) return code;
    // Started by an external launcher: rank 0 writes the run's outputs once
    // every rank's status is there (or the timeout has passed).
    const auto deadline = std::chrono::steady_clock::now() + plan->timeout;
    for (int r = 0; r < world_size; ++r) {
      while (!ReadRankStatus(a.out, r) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    const int final_code = Finalize(a, *plan, static_cast<int>(world_size), {}, -1);
    return code != kExitOk ? code : final_code;
  }
  // Remove what an earlier run in this directory left.
  for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator(a.out, ec)) {
    const std::string name = e.path().filename().string();
    if (IsRankFile(name) || name == kStoreDir) {
      std::filesystem::remove_all(e.path(), ec);
    }
  }
  if (world_size == 1) {
    const int code = RankMain(*plan, 0, 1, a.out);
    if (code == kExitBadInput) return code;
    return Finalize(a, *plan, 1, {}, -1);
  }
  LaunchOptions launch;
  launch.executable = SelfExecutable();
  if (launch.executable.empty()) return Fail("cannot find the memscope executable (/proc/self/exe)");
  launch.args = ToArgs(a, ddp_mode);
  launch.world_size = static_cast<int>(world_size);
  launch.log_dir = a.out;
  launch.grace = plan->timeout + std::chrono::seconds(5);
  launch.env = {{"WORLD_SIZE", absl::StrCat(world_size)},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", "29500"},
                {"MEMSCOPE_SUPERVISED", "1"},
                {"MEMSCOPE_STORE", (std::filesystem::path(a.out) / kStoreDir).string()}};
  absl::StatusOr<LaunchResult> launched = LaunchRanks(launch);
  if (!launched.ok()) return Fail(launched.status().message());
  std::filesystem::remove_all(std::filesystem::path(a.out) / kStoreDir, ec);
  // A rank that rejected its options fails alike everywhere: say why once.
  for (const RankExit& e : launched->ranks) {
    if (e.exit_code == kExitBadInput) {
      std::ifstream log(std::filesystem::path(a.out) / absl::StrCat("rank-", e.rank, ".log"));
      std::string line;
      std::getline(log, line);
      std::cerr << line << "\n";
      return kExitBadInput;
    }
  }
  return Finalize(a, *plan, static_cast<int>(world_size), launched->ranks, launched->first_failure);
}

int Run(const RunArgs& a) {
  if (a.ddp != "copy,view" && a.ddp != "view,copy") return RunOne(a, a.ddp);
  // Both modes, each in its own directory, then the comparison.
  int worst = kExitOk;
  const char* store = std::getenv("MEMSCOPE_STORE");
  const std::string base_store = store != nullptr ? store : "";
  for (const char* mode : {"copy", "view"}) {
    RunArgs m = a;
    m.ddp = mode;
    m.out = (std::filesystem::path(a.out) / mode).string();
    std::cout << "== --ddp " << mode << "\n";
    // Ranks of an external launcher rendezvous once per pass.
    if (!base_store.empty()) ::setenv("MEMSCOPE_STORE", absl::StrCat(base_store, "-", mode).c_str(), 1);
    const int code = RunOne(m, mode);
    if (code == kExitBadInput) return code;
    worst = std::max(worst, code);
    std::cout << "\n";
  }
  return PrintComparison((std::filesystem::path(a.out) / "copy").string(), (std::filesystem::path(a.out) / "view").string(),
                         worst);
}

int Models() {
  std::cout << absl::StrFormat("%-14s %15s %8s  %s\n", "model", "parameters", "tensors", "description");
  for (const ModelInfo& m : ListModels()) {
    absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(m.name, {});
    if (!model.ok()) return Fail(model.status().message());
    std::string count = absl::StrCat((*model)->NumParameters());
    for (int i = static_cast<int>(count.size()) - 3; i > 0; i -= 3) count.insert(static_cast<std::size_t>(i), ",");
    std::cout << absl::StrFormat("%-14s %15s %8d  %s%s\n", m.name, count, (*model)->NumParameterTensors(), m.description,
                                 m.cpu ? " [--exec cpu]" : "");
  }
  return kExitOk;
}

}  // namespace

void RegisterRun(CLI::App& app, int& exit_status) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Run the reference training loop (a zoo model, optimizer, phases) on a simulated GPU and record every "
      "allocation into a run directory; prints the phase table. Exit 3 when the run hits OOM.");
  cmd->add_option("--model", a->model, "zoo model (memscope models lists them; default gpt2)");
  cmd->add_option("--world-size", a->world_size, "ranks, one process each (default 1; or WORLD_SIZE from a launcher)")
      ->each([a](const std::string&) { a->world_size_given = true; });
  cmd->add_option("--steps", a->steps, "training steps (default 3)");
  cmd->add_option("--batch-size", a->batch_size, "batch size (default: the model's)");
  cmd->add_option("--seq-len", a->seq_len, "sequence length of text models (default: the model's)");
  cmd->add_option("--width", a->width, "mlp hidden width (default 512)");
  cmd->add_option("--depth", a->depth, "mlp hidden layers (default 3)");
  cmd->add_option("--optimizer", a->optimizer, "adam (default), adamw or sgd");
  cmd->add_option("--optimizer-impl", a->optimizer_impl, "foreach (default, as on GPUs), for-loop or fused");
  cmd->add_option("--lr", a->lr, "learning rate (default 1e-3 for Adam/AdamW, 0.01 for SGD)");
  cmd->add_option("--momentum", a->momentum, "SGD momentum (default 0.9; 0 for none)");
  cmd->add_option("--ddp", a->ddp,
                  "copy (gradient_as_bucket_view=False, PyTorch's default), view (=True), off, or copy,view (both, "
                  "compared); default copy with --world-size > 1, else off");
  cmd->add_option("--bucket-cap-mb", a->bucket_cap_mb, "DDP bucket_cap_mb (default None: 25, with a 1 MiB first bucket)")
      ->each([a](const std::string&) { a->bucket_cap_given = true; });
  cmd->add_flag("--find-unused-parameters", a->find_unused, "DDP find_unused_parameters=True");
  cmd->add_flag("--static-graph", a->static_graph, "DDP static_graph=True");
  cmd->add_option("--comm-hook", a->comm_hook, "none (default), fp16 or bf16 (the compression hooks)");
  cmd->add_flag("--no-broadcast-buffers", a->no_broadcast_buffers, "DDP broadcast_buffers=False");
  cmd->add_option("--timeout", a->timeout, "collective timeout in seconds (default 60)");
  cmd->add_option("--fault-kill", a->fault_kill, "testing: RANK:STEP, that rank kills itself (SIGKILL) as backward begins")
      ->group("");
  cmd->add_option("--fault-skip-barrier", a->fault_skip_barrier,
                  "testing: RANK:STEP, every other rank calls a barrier after that step")
      ->group("");
  cmd->add_option("--zero-grad", a->zero_grad, "none (set_to_none=True, the default) or zeros");
  cmd->add_option("--alloc-conf", a->alloc_conf, "allocator settings (default: $PYTORCH_CUDA_ALLOC_CONF)")
      ->each([a](const std::string&) { a->alloc_conf_given = true; });
  cmd->add_option("--device-memory", a->device_memory, "simulated GPU memory (default 80GiB)");
  cmd->add_option("--exec", a->exec, "meta (default: shapes and memory only) or cpu (real float math; mlp, cifar-net)");
  cmd->add_option("--amp", a->amp, "none (default), fp16 (autocast + GradScaler) or bf16 (autocast)");
  cmd->add_flag("--checkpoint-activations", a->checkpoint, "torch.utils.checkpoint around each block (recompute in backward)");
  cmd->add_option("--grad-accum", a->grad_accum, "micro-batches per optimizer step (default 1)");
  cmd->add_option("--attention", a->attention, "gpt2*: math (eager, default) or flash (scaled_dot_product_attention)");
  cmd->add_option("--out", a->out, "run directory (default memscope-run)");
  cmd->add_flag("--json", a->json, "print report.json instead of the tables");
  cmd->callback([a, &exit_status] { exit_status = Run(*a); });

  CLI::App* models = app.add_subcommand("models", "List the model zoo with parameter counts.");
  models->callback([&exit_status] { exit_status = Models(); });
}

}  // namespace memscope::cli
