#include "run/rank.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "recording/recorder.h"
#include "reducer/communicator.h"
#include "run/aggregate.h"
#include "run/rank_session.h"
#include "tensor/tensor.h"
#include "train/data_parallel.h"

namespace memscope {
namespace {

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

// The communicator of a rank: Gloo between processes, a local one for DDP on
// one rank, none otherwise. Throws CommError when the rendezvous fails.
std::unique_ptr<reducer::Communicator> Connect(const RankPlan& plan, int rank, int world_size,
                                               const RunDirectory& dir) {
  if (world_size > 1) {
    reducer::GlooOptions g;
    g.rank = rank;
    g.world_size = world_size;
    const char* store = std::getenv("MEMSCOPE_STORE");
    g.store_dir = store != nullptr ? store : dir.Store();
    g.hostname = BindAddress();
    g.timeout = plan.timeout;
    return reducer::CreateGlooCommunicator(g);
  }
  if (plan.train.ddp) return reducer::CreateLocalCommunicator();
  return nullptr;
}

// A communicator that records each collective as it runs (begin and end,
// its kind and payload bytes) into the rank's timeline, for the Chrome
// trace's communication track; the collective itself is the wrapped one's.
class RecordingCommunicator final : public reducer::Communicator {
 public:
  RecordingCommunicator(std::unique_ptr<reducer::Communicator> inner, Recorder& recorder)
      : inner_(std::move(inner)), recorder_(recorder) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }
  void AllreduceSum(void* data, std::size_t count, DType dtype) override {
    Scope s(recorder_, "allreduce", count * ElementSize(dtype));
    inner_->AllreduceSum(data, count, dtype);
  }
  void Broadcast(void* data, std::size_t count, DType dtype, int root) override {
    Scope s(recorder_, "broadcast", count * ElementSize(dtype));
    inner_->Broadcast(data, count, dtype, root);
  }
  void Allgather(const void* in, void* out, std::size_t count, DType dtype) override {
    Scope s(recorder_, "allgather", count * ElementSize(dtype));
    inner_->Allgather(in, out, count, dtype);
  }
  void Barrier() override {
    Scope s(recorder_, "barrier", 0);
    inner_->Barrier();
  }
  void CheckNow() override { inner_->CheckNow(); }

 private:
  // The end is recorded even when the collective throws (a peer gone).
  struct Scope {
    Scope(Recorder& r, const char* kind, std::uint64_t bytes) : r_(r), kind_(kind), bytes_(bytes) {
      r_.CollectiveBegin(kind_, bytes_);
    }
    ~Scope() { r_.CollectiveEnd(kind_, bytes_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Recorder& r_;
    const char* kind_;
    std::uint64_t bytes_;
  };
  std::unique_ptr<reducer::Communicator> inner_;
  Recorder& recorder_;
};

// The scenario's mistake, made by this rank: a phase hook, or one more step.
void ApplyScenario(const Scenario& sc, int rank, reducer::Communicator* c, TrainOptions& train) {
  using Kind = Scenario::Kind;
  switch (sc.kind) {
    case Kind::kNone: return;
    case Kind::kExtraStep:
      if (rank == sc.rank) ++train.steps;
      return;
    case Kind::kKill:
      if (rank != sc.rank) return;
      train.phase_hook = [sc](Phase phase, std::int64_t step, bool end) {
        if (!end && phase == Phase::kBackward && step == sc.step) ::raise(SIGKILL);
      };
      return;
    case Kind::kSkipBarrier:
    case Kind::kOnlyBarrier:
      // Does this rank call the barrier? Every rank but sc.rank, or sc.rank alone.
      if (c == nullptr || (rank == sc.rank) == (sc.kind == Kind::kSkipBarrier)) return;
      train.phase_hook = [sc, c](Phase phase, std::int64_t step, bool end) {
        if (end && phase == Phase::kStep && step == sc.step) c->Barrier();
      };
      return;
  }
}

}  // namespace

absl::StatusOr<RankStatus> RunRank(RankPlan plan, int rank, int world_size, const RunDirectory& dir) {
  RankSessionOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.device_memory = plan.device_memory;
  options.config = plan.config;
  options.blas_workspaces = plan.blas_workspaces;
  options.exec = plan.cpu ? ExecMode::kCpu : ExecMode::kMeta;
  options.timeline_path = dir.Timeline(rank);
  RankSession session(options);
  dir.RecordFile(RunDirectory::TimelineName(rank));
  dir.RecordFile(RunDirectory::RankStatusName(rank));
  // The timeline exists even when the rendezvous fails.
  if (absl::Status s = session.Open(); !s.ok()) return s;

  std::unique_ptr<reducer::Communicator> comm;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<TrainResult> result;
  try {
    comm = Connect(plan, rank, world_size, dir);
    if (absl::Status s = session.Start(); !s.ok()) return s;
    // The recorder exists from Start on.
    if (comm) comm = std::make_unique<RecordingCommunicator>(std::move(comm), session.recorder());
    reducer::Communicator* c = comm.get();
    ApplyScenario(plan.scenario, rank, c, plan.train);
    result = Train(plan.train, session.context(), &session.recorder(), c);
  } catch (const reducer::CommError& e) {  // rendezvous
    result = TrainResult{};
    result->comm_error = true;
    result->error = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!result.ok()) return result.status();
  // A timeline that could not be written whole (a full disk) fails the rank;
  // what it holds is still read (its torn tail ignored) and reported.
  if (absl::Status s = session.Finish(); !s.ok() && result->error.empty()) result->error = std::string(s.message());
  RankStatus status;
  status.rank = rank;
  status.exit_code = result->oom                                    ? kExitOutOfMemory
                     : result->comm_error || !result->error.empty() ? kExitRankFailed
                                                                    : 0;
  status.status = result->oom ? "oom" : result->comm_error ? "comm_error" : result->error.empty() ? "ok" : "error";
  status.error = result->error;
  status.parameters = result->parameters;
  status.steps_done = result->steps_done;
  status.seconds = seconds;
  status.losses = result->losses;
  if (plan.train.ddp) {
    status.ddp = DdpBuckets{plan.ddp, BucketRecords(result->initial_buckets), BucketRecords(result->rebuilt_buckets)};
  }
  if (absl::Status s = status.Write(dir.RankStatus(rank)); !s.ok()) {
    if (status.error.empty()) return s;
    return absl::Status(s.code(), absl::StrCat(s.message(), " (after: ", status.error, ")"));
  }
  return status;
}

absl::StatusOr<DataParallelRun> RunDataParallel(const RankPlan& plan, int devices, const RunDirectory& dir) {
  std::vector<std::unique_ptr<RankSession>> sessions;
  for (int d = 0; d < devices; ++d) {
    RankSessionOptions options;
    options.rank = d;
    options.world_size = devices;
    options.device_index = d;
    options.device_memory = plan.device_memory;
    options.config = plan.config;
    options.exec = plan.cpu ? ExecMode::kCpu : ExecMode::kMeta;
    options.timeline_path = dir.Timeline(d);
    options.blas_workspaces = plan.blas_workspaces;  // each replica's own handle on its device
    dir.RecordFile(RunDirectory::TimelineName(d));
    dir.RecordFile(RunDirectory::RankStatusName(d));
    sessions.push_back(std::make_unique<RankSession>(options));
  }
  std::vector<DeviceContext*> contexts;
  std::vector<Recorder*> recorders;
  for (std::unique_ptr<RankSession>& s : sessions) {
    if (absl::Status st = s->Start(); !st.ok()) return st;
    contexts.push_back(&s->context());
    recorders.push_back(&s->recorder());
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<DataParallelResult> result = TrainDataParallel(plan.train, contexts, recorders);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!result.ok()) return result.status();
  TrainResult& train = result->train;
  for (std::unique_ptr<RankSession>& s : sessions) {
    if (absl::Status st = s->Finish(); !st.ok() && train.error.empty()) train.error = std::string(st.message());
  }
  DataParallelRun run;
  run.chunk_sizes = result->chunk_sizes;
  // A failure that is not an OOM of one device is the module's, on device 0.
  const int failed = train.oom ? std::max(result->oom_device, 0) : 0;
  for (int d = 0; d < devices; ++d) {
    RankStatus status;
    status.rank = d;
    const bool here = !train.error.empty() && d == failed;
    status.exit_code = !here ? 0 : train.oom ? kExitOutOfMemory : kExitRankFailed;
    status.status = !here ? "ok" : train.oom ? "oom" : "error";
    if (here) status.error = train.error;
    status.parameters = train.parameters;
    status.steps_done = train.steps_done;
    status.seconds = seconds;
    if (d == 0) status.losses = train.losses;
    if (absl::Status s = status.Write(dir.RankStatus(d)); !s.ok()) return s;
    run.statuses.push_back(std::move(status));
  }
  return run;
}

absl::StatusOr<LaunchResult> LaunchRankProcesses(const RunDirectory& dir, std::vector<std::string> args, int world_size,
                                                 std::chrono::milliseconds timeout) {
  LaunchOptions launch;
  std::error_code ec;
  launch.executable = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec || launch.executable.empty()) {
    return absl::NotFoundError("cannot find the memscope executable (/proc/self/exe)");
  }
  launch.args = std::move(args);
  launch.world_size = world_size;
  launch.log_dir = dir.root();
  launch.grace = timeout + std::chrono::seconds(5);
  // A rank stopped for half the timeout is named before its peers' collectives time out.
  launch.stall = timeout / 2;
  launch.env = {{"WORLD_SIZE", absl::StrCat(world_size)},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", "29500"},
                {"MEMSCOPE_SUPERVISED", "1"},
                {"MEMSCOPE_STORE", dir.Store()}};
  absl::StatusOr<LaunchResult> launched = LaunchRanks(launch);
  std::filesystem::remove_all(dir.Store(), ec);
  return launched;
}

void WaitForRankStatuses(const RunDirectory& dir, int world_size, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < world_size; ++r) {
    while (!RankStatus::Read(dir.RankStatus(r)) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

}  // namespace memscope
