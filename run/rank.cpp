#include "run/rank.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "allocator/device_ledger.h"
#include "allocator/sizes.h"
#include "recording/recorder.h"
#include "reducer/communicator.h"
#include "run/aggregate.h"
#include "run/rank_session.h"
#include "tensor/tensor.h"

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
// The rendezvous store of a multi-rank run: $MEMSCOPE_STORE or the run directory's.
std::string StoreDir(const RunDirectory& dir) {
  const char* store = std::getenv("MEMSCOPE_STORE");
  return store != nullptr ? store : dir.Store();
}

std::unique_ptr<reducer::Communicator> Connect(const RankPlan& plan, int rank, int world_size,
                                               const RunDirectory& dir) {
  if (world_size > 1) {
    reducer::GlooOptions g;
    g.rank = rank;
    g.world_size = world_size;
    g.store_dir = StoreDir(dir);
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

// The ranks of a multi-rank run share their GPUs through a ledger in the
// store (fresh for each job, which the rendezvous has checked).
absl::Status ShareDevice(SimDevice& device, const DeviceAssignment& assigned, int rank, const RunDirectory& dir) {
  absl::StatusOr<std::shared_ptr<DeviceLedger>> ledger =
      DeviceLedger::Open((std::filesystem::path(StoreDir(dir)) / "device-ledger").string());
  if (!ledger.ok()) return ledger.status();
  return device.UseLedger(*std::move(ledger), assigned.physical, rank);
}

// The diagnosis of an OOM on a GPU other ranks hold memory on: who held what.
std::string SharedOomDiagnosis(const SimDevice& device, const DeviceAssignment& assigned, int rank) {
  const std::vector<std::pair<int, std::uint64_t>> holders = device.shared_oom_holders();
  std::vector<std::string> parts;
  bool others = false;
  for (const auto& [process, bytes] : holders) {
    others = others || process != rank;
    parts.push_back(absl::StrCat("rank ", process, process == rank ? " (this rank) " : " ", FormatSize(bytes)));
  }
  if (!others) return "";
  return absl::StrCat("\nmemscope: GPU ", assigned.ordinal, " (physical GPU ", assigned.physical, ", chosen by ",
                      assigned.how, ") is shared: ", absl::StrJoin(parts, ", "), " of ", FormatSize(device.capacity()),
                      "; ranks on one GPU share its memory. Give each rank its own GPU: "
                      "torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"])) before any CUDA call.");
}

}  // namespace

absl::StatusOr<RankStatus> RunRank(RankPlan plan, int rank, int world_size, const RunDirectory& dir) {
  absl::StatusOr<DeviceAssignment> assigned = AssignDevice(plan.devices, rank, DeviceEnvironment::FromProcess());
  if (!assigned.ok()) return assigned.status();
  RankSessionOptions options;
  options.rank = rank;
  options.device_index = assigned->ordinal;
  options.timeline_device_index = assigned->ordinal;
  options.world_size = world_size;
  options.device_memory = plan.device_memory;
  options.config = plan.config;
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
    if (world_size > 1) {
      if (absl::Status s = ShareDevice(session.device(), *assigned, rank, dir); !s.ok()) return s;
    }
    if (absl::Status s = session.Start(); !s.ok()) return s;
    // The recorder exists from Start on.
    if (comm) comm = std::make_unique<RecordingCommunicator>(std::move(comm), session.recorder());
    reducer::Communicator* c = comm.get();
    const auto kill = plan.fault_kill;
    const auto skip = plan.fault_skip_barrier;
    plan.train.phase_hook = [c, rank, kill, skip](Phase phase, std::int64_t step, bool end) {
      if (!end && phase == Phase::kBackward && rank == kill.first && step == kill.second) ::raise(SIGKILL);
      if (end && c != nullptr && step == skip.second && rank != skip.first) c->Barrier();
    };
    result = Train(plan.train, session.context(), &session.recorder(), c);
  } catch (const reducer::CommError& e) {  // rendezvous
    result = TrainResult{};
    result->comm_error = true;
    result->error = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!result.ok()) return result.status();
  if (result->oom) result->error += SharedOomDiagnosis(session.device(), *assigned, rank);
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
  status.device = RankDevice{assigned->ordinal, assigned->physical, assigned->how};
  if (plan.train.ddp) {
    status.ddp = DdpBuckets{plan.ddp, BucketRecords(result->initial_buckets), BucketRecords(result->rebuilt_buckets)};
  }
  if (absl::Status s = status.Write(dir.RankStatus(rank)); !s.ok()) {
    if (status.error.empty()) return s;
    return absl::Status(s.code(), absl::StrCat(s.message(), " (after: ", status.error, ")"));
  }
  return status;
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
