#include "run/rank.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "allocator/device_ledger.h"
#include "allocator/sizes.h"
#include "recording/recorder.h"
#include "reducer/communicator.h"
#include "reducer/nccl_checks.h"
#include "run/aggregate.h"
#include "run/interrupt.h"
#include "run/rank_session.h"
#include "tensor/tensor.h"
#include "train/data_parallel.h"

namespace memscope {
namespace {

// DDP's buckets as rank-R.json and report.json record them (DdpBuckets,
// analysis/analysis.h).
std::vector<DdpBucket> BucketRecords(const std::vector<reducer::BucketInfo>& buckets) {
  std::vector<DdpBucket> out;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    out.push_back({i, buckets[i].bytes, std::string(DTypeName(buckets[i].dtype)), buckets[i].params});
  }
  return out;
}

// DDP's record of a rank: its buckets at construction and after the
// rebuild, and ZeroRedundancyOptimizer's shards when --zero is on.
DdpBuckets DdpRecord(const RankPlan& plan, const TrainResult& result) {
  std::optional<ZeroShards> zero;
  if (plan.train.zero) {
    zero = ZeroShards{plan.train.zero->parameters_as_bucket_view, result.zero_partition, result.zero_buckets};
  }
  return DdpBuckets{plan.ddp, BucketRecords(result.initial_buckets), BucketRecords(result.rebuilt_buckets),
                    std::move(zero)};
}

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
    // Meta: every payload is small and goes through the mailboxes; gloo's
    // event loop only connects the ranks, at a lower priority.
    g.loop_nice = plan.cpu ? 0 : 10;
    g.interrupt = &InterruptSignal();
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

// Thrown to leave the rank's try block when it ends before training.
struct EndedEarly {};

// The ranks of a multi-rank run share their GPUs through a ledger in the
// store (fresh for each job, which the rendezvous has checked).
absl::StatusOr<std::shared_ptr<DeviceLedger>> ShareDevice(SimDevice& device, const DeviceAssignment& assigned, int rank,
                                                          const RunDirectory& dir) {
  absl::StatusOr<std::shared_ptr<DeviceLedger>> ledger =
      DeviceLedger::Open((std::filesystem::path(StoreDir(dir)) / "device-ledger").string());
  if (!ledger.ok()) return ledger.status();
  if (absl::Status s = device.UseLedger(*ledger, assigned.physical, rank); !s.ok()) return s;
  return ledger;
}

// Contexts this process created on GPUs other than its own (cuda:D touched
// before set_device), returned to the ledger when the rank ends, as a
// process's exit frees them.
struct StrayContexts {
  std::shared_ptr<DeviceLedger> ledger;  // null on one rank
  int rank = 0;
  std::vector<std::pair<int, std::uint64_t>> charged;  // {physical, bytes}
  ~StrayContexts() {
    if (ledger == nullptr) return;
    for (const auto& [physical, bytes] : charged) ledger->Credit(physical, rank, bytes);
  }
};

std::string ContextOom(int rank, int ordinal, int physical, std::uint64_t bytes, std::uint64_t capacity,
                       std::uint64_t in_use) {
  return absl::StrCat("CUDA error: out of memory (creating the CUDA context of rank ", rank, " on cuda:", ordinal,
                      ", physical GPU ", physical, ": ", FormatSize(bytes), " needed, ", FormatSize(in_use), " of its ",
                      FormatSize(capacity), " in use)");
}

// Memory outside the allocator, in the order a script makes it: a context on
// cuda:D when the script touches it before set_device (--touch-device), then
// the context on its own GPU. Returns the out-of-memory error, or "".
std::string ChargeContexts(const RankPlan& plan, SimDevice& device, const DeviceAssignment& assigned, int rank,
                           StrayContexts& stray, RankDevice& record) {
  const std::uint64_t bytes = plan.cuda_context_bytes;
  if (bytes == 0) return "";
  if (plan.touch_device && *plan.touch_device != assigned.ordinal) {
    const int ordinal = *plan.touch_device;
    int physical = ordinal;
    if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES"); cvd != nullptr) {
      const std::vector<int> visible = VisibleDevices(cvd);
      if (ordinal < static_cast<int>(visible.size())) physical = visible[static_cast<std::size_t>(ordinal)];
    }
    if (physical != assigned.physical) {
      if (stray.ledger != nullptr && !stray.ledger->TryCharge(physical, rank, bytes, plan.device_memory)) {
        return ContextOom(rank, ordinal, physical, bytes, plan.device_memory, stray.ledger->Used(physical));
      }
      if (stray.ledger == nullptr && bytes > plan.device_memory) {
        return ContextOom(rank, ordinal, physical, bytes, plan.device_memory, 0);
      }
      stray.charged.emplace_back(physical, bytes);
      record.other_contexts.emplace_back(physical, bytes);
    }
  }
  if (!device.ChargeOutside(bytes).ok()) {
    const DeviceMemoryInfo info = device.MemoryInfo();
    return ContextOom(rank, assigned.ordinal, assigned.physical, bytes, info.total_bytes,
                      info.total_bytes - info.free_bytes);
  }
  record.context_bytes = bytes;
  return "";
}

// --backend nccl: the communicator's creation. NCCL's peer check (two ranks
// of one host on one GPU: ncclInvalidUsage), then its buffers on this GPU.
// Returns {the NCCL error, the OOM error}, either "".
std::pair<std::string, std::string> CreateNcclCommunicator(const RankPlan& plan, reducer::Communicator& comm,
                                                           SimDevice& device, const DeviceAssignment& assigned,
                                                           int rank, RankDevice& record) {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  const reducer::NcclPeerInfo mine{reducer::HostHash(host), reducer::SimulatedBusId(assigned.physical)};
  if (std::optional<std::string> error = reducer::CheckNcclPeers(comm, mine)) {
    return {absl::StrCat(*error, "\nmemscope: with NCCL every rank needs its own GPU; rank ", rank, " is on cuda:",
                         assigned.ordinal, " (physical GPU ", assigned.physical, ", chosen by ", assigned.how,
                         "). Call torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"])) before "
                         "init_process_group, or run these ranks with the Gloo backend."),
            ""};
  }
  if (plan.nccl_buffer_bytes > 0 && !device.ChargeOutside(plan.nccl_buffer_bytes).ok()) {
    const DeviceMemoryInfo info = device.MemoryInfo();
    return {"", absl::StrCat("CUDA error: out of memory (NCCL's communicator buffers of rank ", rank, ": ",
                             FormatSize(plan.nccl_buffer_bytes), " needed on cuda:", assigned.ordinal, ", ",
                             FormatSize(info.free_bytes), " free)")};
  }
  record.nccl_bytes = plan.nccl_buffer_bytes;
  return {"", ""};
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

// A GPU other than the rank's own that the rank touches: `torch.load`
// without map_location puts the tensors on the device they were saved from,
// which makes the process allocate there through a second caching allocator
// (PyTorch keeps one per device), charged to that GPU in the ledger.
struct StrayDevice {
  StrayDevice(std::uint64_t capacity, int ordinal, const AllocatorConfig& config)
      : device({.capacity = capacity, .index = ordinal}),
        allocator(device, config),
        context(allocator, ExecMode::kMeta) {}
  SimDevice device;
  CachingAllocator allocator;
  DeviceContext context;
};

// The physical GPU of `ordinal` in this process (CUDA_VISIBLE_DEVICES renumbers).
absl::StatusOr<int> PhysicalOf(int ordinal, const DeviceEnvironment& env, std::string_view what) {
  if (!env.cuda_visible_devices) return ordinal;
  const std::vector<int> visible = VisibleDevices(*env.cuda_visible_devices);
  if (ordinal < static_cast<int>(visible.size())) return visible[static_cast<std::size_t>(ordinal)];
  return absl::InvalidArgumentError(absl::StrCat(
      "CUDA error: invalid device ordinal: ", std::string(what), " on cuda:", ordinal, ", but CUDA_VISIBLE_DEVICES=",
      *env.cuda_visible_devices, " makes ", visible.size(), visible.size() == 1 ? " device" : " devices", " visible"));
}

// The device rank `r` runs on, as our launcher starts it (LOCAL_RANK = r).
absl::StatusOr<DeviceAssignment> DeviceOfRank(const DeviceMap& map, int r) {
  DeviceEnvironment env = DeviceEnvironment::FromProcess();
  env.local_rank = absl::StrCat(r);
  return AssignDevice(map, r, env);
}

// The ordinal torch.load puts the checkpoint on, or -1 for the host.
absl::StatusOr<int> LoadOrdinal(const RankPlan& plan, const DeviceAssignment& own) {
  switch (plan.checkpoint.load) {
    case CheckpointPlan::Load::kCpu:
    case CheckpointPlan::Load::kNone: return -1;
    case CheckpointPlan::Load::kCuda: return plan.checkpoint.load_ordinal;
    case CheckpointPlan::Load::kMapNone: break;
  }
  // The device the file was saved from: each rank's own with --save-checkpoint all, else rank 0's.
  if (plan.checkpoint.save == CheckpointPlan::Save::kAll) return own.ordinal;
  absl::StatusOr<DeviceAssignment> saver = DeviceOfRank(plan.devices, 0);
  if (!saver.ok()) return saver.status();
  return saver->ordinal;
}

// The diagnosis of an OOM on a GPU that ranks loaded a checkpoint onto
// without map_location (their own GPU is another): each named with the
// checkpoint's bytes; "" when no such rank held memory there.
std::string CheckpointOomDiagnosis(const RankPlan& plan, const SimDevice& device, int rank, std::uint64_t state_bytes) {
  std::vector<std::string> lines, held;
  for (const auto& [process, bytes] : device.shared_oom_holders()) {
    held.push_back(absl::StrCat("rank ", process, process == rank ? " (this rank) " : " ", FormatSize(bytes)));
    absl::StatusOr<DeviceAssignment> own = DeviceOfRank(plan.devices, process);
    if (!own.ok() || own->physical == device.physical()) continue;
    lines.push_back(absl::StrCat("\nmemscope: rank ", process, " loaded ", FormatSize(state_bytes),
                                 " onto cuda:", device.index(), ": use map_location"));
  }
  if (lines.empty()) return "";
  return absl::StrCat(absl::StrJoin(lines, ""), "\nmemscope: GPU ", device.index(), " held ", absl::StrJoin(held, ", "),
                      " of ", FormatSize(device.capacity()),
                      ". torch.load without map_location puts each tensor back on the device it was saved from, "
                      "in every rank; load with torch.load(f, map_location=\"cpu\") (or f\"cuda:{local_rank}\").");
}

// What the GPU torch.load put the tensors on held once every rank had loaded.
struct LoadMeasure {
  int physical = -1;  // -1: not measured (a load to the host, or the run ended before)
  std::uint64_t used = 0;
  std::vector<std::uint64_t> by_rank;
};

// Fills plan.train.checkpoint for this rank: whether it saves, and where
// torch.load puts the tensors (the rank's own device, the host, or another
// GPU: then `stray`, on the run's ledger with other ranks).
absl::Status SetUpCheckpoint(RankPlan& plan, const DeviceAssignment& own, int rank, int world_size,
                             const RunDirectory& dir, RankSession& session, std::unique_ptr<StrayDevice>& stray,
                             LoadMeasure& measured, RankDevice& record) {
  const CheckpointPlan& c = plan.checkpoint;
  if (c.step < 0) return absl::OkStatus();
  CheckpointOptions& t = plan.train.checkpoint;
  t.step = c.step;
  t.save = c.save == CheckpointPlan::Save::kAll || (c.save == CheckpointPlan::Save::kRank0 && rank == 0);
  t.load = c.load != CheckpointPlan::Load::kNone;
  absl::StatusOr<int> ordinal = LoadOrdinal(plan, own);
  if (!ordinal.ok()) return ordinal.status();
  if (*ordinal < 0) return absl::OkStatus();  // the host
  absl::StatusOr<int> physical =
      PhysicalOf(*ordinal, DeviceEnvironment::FromProcess(), absl::StrCat("rank ", rank, "'s torch.load"));
  if (!physical.ok()) return physical.status();
  std::shared_ptr<DeviceLedger> ledger;
  if (world_size > 1) {
    absl::StatusOr<std::shared_ptr<DeviceLedger>> opened =
        DeviceLedger::Open((std::filesystem::path(StoreDir(dir)) / "device-ledger").string());
    if (!opened.ok()) return opened.status();
    ledger = *std::move(opened);
  }
  SimDevice* device = &session.device();
  t.load_ctx = &session.context();
  if (*ordinal != own.ordinal) {
    stray = std::make_unique<StrayDevice>(plan.device_memory, *ordinal, plan.config);
    if (ledger != nullptr) {
      if (absl::Status s = stray->device.UseLedger(ledger, *physical, rank); !s.ok()) return s;
    }
    // torch.load onto another GPU creates this process's CUDA context there
    // first (unless --touch-device already made it), as any first use does.
    const bool touched = plan.touch_device && *plan.touch_device == *ordinal;
    if (plan.cuda_context_bytes > 0 && !touched && !stray->device.ChargeOutside(plan.cuda_context_bytes).ok()) {
      const DeviceMemoryInfo info = stray->device.MemoryInfo();
      return absl::ResourceExhaustedError(ContextOom(rank, *ordinal, *physical, plan.cuda_context_bytes,
                                                     info.total_bytes, info.total_bytes - info.free_bytes));
    }
    if (plan.cuda_context_bytes > 0 && !touched) record.other_contexts.emplace_back(*physical, plan.cuda_context_bytes);
    device = &stray->device;
    t.load_ctx = &stray->context;
  }
  // What the load's GPU holds once every rank has loaded: the ledger's view
  // (every process), or this device alone in a single-rank run.
  t.measure = [&measured, ledger, device, physical = *physical, world_size] {
    measured.physical = physical;
    measured.by_rank.clear();
    if (ledger == nullptr) {
      measured.used = device->used_bytes();
      measured.by_rank.push_back(measured.used);
      return;
    }
    measured.used = ledger->Used(physical);
    for (int r = 0; r < world_size; ++r) measured.by_rank.push_back(ledger->UsedBy(physical, r));
  };
  return absl::OkStatus();
}

// rank-R.json's "checkpoint".
RankCheckpoint CheckpointRecord(const RankPlan& plan, const CheckpointResult& result, const DeviceAssignment& own,
                                const LoadMeasure& measured) {
  RankCheckpoint r;
  r.load_physical = measured.physical;
  r.gpu_used = measured.used;
  r.gpu_used_by_rank = measured.by_rank;
  r.step = plan.checkpoint.step;
  r.saved = result.saved;
  r.state_bytes = result.state_bytes;
  r.loaded = result.loaded;
  switch (plan.checkpoint.load) {
    case CheckpointPlan::Load::kNone: break;
    case CheckpointPlan::Load::kCpu:
      r.map_location = "cpu";
      r.loaded_onto = "cpu";
      break;
    case CheckpointPlan::Load::kCuda:
      r.map_location = absl::StrCat("cuda:", plan.checkpoint.load_ordinal);
      r.loaded_onto = r.map_location;
      break;
    case CheckpointPlan::Load::kMapNone:
      r.map_location = "none";
      absl::StatusOr<int> ordinal = LoadOrdinal(plan, own);
      r.loaded_onto = absl::StrCat("cuda:", ordinal.ok() ? *ordinal : own.ordinal);
      break;
  }
  return r;
}

}  // namespace

absl::Status CheckCheckpointDevice(const CheckpointPlan& plan, const DeviceEnvironment& env) {
  if (plan.load != CheckpointPlan::Load::kCuda) return absl::OkStatus();
  return PhysicalOf(plan.load_ordinal, env, "--load-checkpoint").status();
}

absl::StatusOr<CheckpointPlan> ParseCheckpointPlan(std::string_view save, std::string_view load, std::int64_t step,
                                                   bool step_given) {
  CheckpointPlan c;
  if (save == "rank0") {
    c.save = CheckpointPlan::Save::kRank0;
  } else if (save == "all") {
    c.save = CheckpointPlan::Save::kAll;
  } else if (!save.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--save-checkpoint ", std::string(save), ": expected rank0 or all"));
  }
  int ordinal = -1;
  if (load == "none") {
    c.load = CheckpointPlan::Load::kMapNone;
  } else if (load == "cpu") {
    c.load = CheckpointPlan::Load::kCpu;
  } else if (load.substr(0, 5) == "cuda:" && absl::SimpleAtoi(std::string(load.substr(5)), &ordinal) && ordinal >= 0 &&
             ordinal < 256 && load.substr(5).find_first_not_of("0123456789") == std::string_view::npos) {
    c.load = CheckpointPlan::Load::kCuda;
    c.load_ordinal = ordinal;
  } else if (!load.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--load-checkpoint ", std::string(load), ": expected none (no map_location), cpu or cuda:R (R from 0 to 255)"));
  }
  if (step_given && c.save == CheckpointPlan::Save::kNone && c.load == CheckpointPlan::Load::kNone) {
    return absl::InvalidArgumentError("--checkpoint-step needs --save-checkpoint or --load-checkpoint");
  }
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("--checkpoint-step ", step, ": must be at least 0"));
  if (c.save != CheckpointPlan::Save::kNone || c.load != CheckpointPlan::Load::kNone) c.step = step;
  return c;
}

namespace {

// --torch-version's TorchBehaviour on this thread while a rank trains; the
// thread's previous one afterwards.
class ScopedTorchBehaviour {
 public:
  explicit ScopedTorchBehaviour(const TorchBehaviour& b) : saved_(CurrentTorchBehaviour()) {
    CurrentTorchBehaviour() = b;
  }
  ~ScopedTorchBehaviour() { CurrentTorchBehaviour() = saved_; }
  ScopedTorchBehaviour(const ScopedTorchBehaviour&) = delete;
  ScopedTorchBehaviour& operator=(const ScopedTorchBehaviour&) = delete;

 private:
  TorchBehaviour saved_;
};

}  // namespace

absl::StatusOr<RankStatus> RunRank(RankPlan plan, int rank, int world_size, const RunDirectory& dir,
                                   bool* rendezvous_failed) {
  const ScopedTorchBehaviour behaviour(plan.torch_behaviour);
  plan.train.interrupt = &InterruptSignal();
  absl::StatusOr<DeviceAssignment> assigned = AssignDevice(plan.devices, rank, DeviceEnvironment::FromProcess());
  if (!assigned.ok()) return assigned.status();
  RankSessionOptions options;
  options.rank = rank;
  options.device_index = assigned->ordinal;
  options.timeline_device_index = assigned->ordinal;
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
  std::unique_ptr<StrayDevice> load_device;  // outlives the training's tensors
  LoadMeasure measured;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<TrainResult> result;
  RankDevice record;
  record.ordinal = assigned->ordinal;
  record.physical = assigned->physical;
  record.how = assigned->how;
  StrayContexts stray;
  stray.rank = rank;
  bool nccl_invalid = false;
  try {
    comm = Connect(plan, rank, world_size, dir);
    if (world_size > 1) {
      absl::StatusOr<std::shared_ptr<DeviceLedger>> ledger = ShareDevice(session.device(), *assigned, rank, dir);
      if (!ledger.ok()) return ledger.status();
      stray.ledger = *ledger;
    }
    std::string oom = ChargeContexts(plan, session.device(), *assigned, rank, stray, record);
    std::string nccl_error;
    if (oom.empty() && plan.nccl && comm != nullptr && world_size > 1) {
      std::tie(nccl_error, oom) = CreateNcclCommunicator(plan, *comm, session.device(), *assigned, rank, record);
    }
    if (!oom.empty() || !nccl_error.empty()) {
      // The rank ends here, as the script would at its first CUDA call or at init_process_group.
      result = TrainResult{};
      result->oom = !oom.empty();
      nccl_invalid = !nccl_error.empty();
      result->error = oom.empty() ? nccl_error : oom;
      throw EndedEarly();
    }
    if (absl::Status s =
            SetUpCheckpoint(plan, *assigned, rank, world_size, dir, session, load_device, measured, record);
        !s.ok())
      return s;
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
    if (rendezvous_failed != nullptr) *rendezvous_failed = true;
  } catch (const EndedEarly&) {
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!result.ok()) return result.status();
  if (result->oom) {
    const bool on_stray =
        load_device != nullptr && result->checkpoint.loading && !load_device->device.shared_oom_holders().empty();
    const SimDevice& oom_device = on_stray ? load_device->device : session.device();
    std::string diagnosis = CheckpointOomDiagnosis(plan, oom_device, rank, result->checkpoint.state_bytes);
    if (diagnosis.empty() && !on_stray) diagnosis = SharedOomDiagnosis(session.device(), *assigned, rank);
    result->error += diagnosis;
  }
  // Stopped by Ctrl-C or SIGTERM (run/interrupt.h): before a phase, or in a
  // collective whose peer stopped first. The rank did not fail.
  const int interrupted = result->oom ? 0 : result->interrupted != 0 ? result->interrupted
                                          : result->comm_error        ? InterruptSignal().load()
                                                                      : 0;
  if (interrupted != 0) result->error.clear();
  // A timeline that could not be written whole (a full disk) fails the rank;
  // what it holds is still read (its torn tail ignored) and reported.
  if (absl::Status s = session.Finish(); !s.ok() && result->error.empty()) result->error = std::string(s.message());
  RankStatus status;
  status.rank = rank;
  status.exit_code = result->oom                                    ? kExitOutOfMemory
                     : nccl_invalid                                 ? kExitNcclInvalidUsage
                     : interrupted != 0 && result->error.empty()    ? 128 + interrupted
                     : result->comm_error || !result->error.empty() ? kExitRankFailed
                                                                    : 0;
  status.status = result->oom                                 ? "oom"
                  : nccl_invalid                              ? "nccl_error"
                  : interrupted != 0 && result->error.empty() ? "interrupted"
                  : result->comm_error                        ? "comm_error"
                  : result->error.empty()                     ? "ok"
                                                              : "error";
  status.error = result->error;
  status.parameters = result->parameters;
  status.steps_done = result->steps_done;
  status.seconds = seconds;
  status.losses = result->losses;
  status.device = record;
  if (plan.checkpoint.step >= 0) status.checkpoint = CheckpointRecord(plan, result->checkpoint, *assigned, measured);
  if (plan.train.ddp) status.ddp = DdpRecord(plan, *result);
  if (absl::Status s = status.Write(dir.RankStatus(rank)); !s.ok()) {
    if (status.error.empty()) return s;
    return absl::Status(s.code(), absl::StrCat(s.message(), " (after: ", status.error, ")"));
  }
  return status;
}

absl::StatusOr<DataParallelRun> RunDataParallel(const RankPlan& plan, int devices, const RunDirectory& dir) {
  const ScopedTorchBehaviour behaviour(plan.torch_behaviour);
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
  // The process's CUDA context on every device DataParallel uses
  // (--cuda-context-mb, --gpu): one context per GPU the process touches, in
  // device order, before anything is allocated there.
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::vector<int> visible = cvd != nullptr ? VisibleDevices(cvd) : std::vector<int>{};
  std::vector<RankDevice> records(static_cast<std::size_t>(devices));
  std::string context_oom;
  int context_oom_device = -1;
  for (int d = 0; d < devices; ++d) {
    RankDevice& r = records[static_cast<std::size_t>(d)];
    r.ordinal = d;
    r.physical = d < static_cast<int>(visible.size()) ? visible[static_cast<std::size_t>(d)] : d;
    r.how = "DataParallel device_ids";
    if (plan.cuda_context_bytes == 0 || !context_oom.empty()) continue;
    SimDevice& device = sessions[static_cast<std::size_t>(d)]->device();
    if (!device.ChargeOutside(plan.cuda_context_bytes).ok()) {
      const DeviceMemoryInfo info = device.MemoryInfo();
      context_oom = absl::StrCat("CUDA error: out of memory (creating the CUDA context on cuda:", d, ", physical GPU ",
                                 r.physical, ": ", FormatSize(plan.cuda_context_bytes), " needed, ",
                                 FormatSize(info.total_bytes - info.free_bytes), " of its ",
                                 FormatSize(info.total_bytes), " in use)");
      context_oom_device = d;
      continue;
    }
    r.context_bytes = plan.cuda_context_bytes;
  }
  std::vector<DeviceContext*> contexts;
  std::vector<Recorder*> recorders;
  for (std::unique_ptr<RankSession>& s : sessions) {
    if (absl::Status st = s->Start(); !st.ok()) return st;
    contexts.push_back(&s->context());
    recorders.push_back(&s->recorder());
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<DataParallelResult> result;
  if (context_oom.empty()) {
    TrainOptions train = plan.train;
    train.interrupt = &InterruptSignal();
    result = TrainDataParallel(train, contexts, recorders);
  } else {
    // The process stops at its first CUDA call on that device: nothing trains.
    absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(plan.train.model, plan.train.model_options);
    if (!model.ok()) return model.status();
    DataParallelResult ended;
    ended.oom_device = context_oom_device;
    ended.chunk_sizes = ChunkSizes((*model)->batch_size(), devices);
    ended.train.oom = true;
    ended.train.error = context_oom;
    result = std::move(ended);
  }
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
    status.exit_code = here ? (train.oom ? kExitOutOfMemory : kExitRankFailed)
                            : (train.interrupted != 0 ? 128 + train.interrupted : 0);
    status.status = here ? (train.oom ? "oom" : "error") : (train.interrupted != 0 ? "interrupted" : "ok");
    if (here) status.error = train.error;
    status.parameters = train.parameters;
    status.steps_done = train.steps_done;
    status.seconds = seconds;
    if (d == 0) status.losses = train.losses;
    status.device = records[static_cast<std::size_t>(d)];
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
