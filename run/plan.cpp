#include "run/plan.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/analysis.h"
#include "reducer/communicator.h"
#include "run/rank_session.h"

namespace memscope {
namespace {

constexpr std::uint64_t kMiB = 1ULL << 20;
// The device of the runs that measure what a batch needs: larger than any GPU.
constexpr std::uint64_t kUnlimited = 1ULL << 44;

struct Probe {
  bool fits = false;
  std::optional<RankReport> report;  // when recorded
};

class Planner {
 public:
  Planner(const PlanOptions& o, int zero_rank) : o_(o), zero_rank_(zero_rank) {}

  // Trains `micro` x `accum` under strategy `s` on a GPU of `device` bytes;
  // records and analyses the run when `record`.
  absl::StatusOr<Probe> Run(const PlanStrategy& s, std::int64_t micro, std::int64_t accum, std::uint64_t device,
                            bool record) {
    ++probes_;
    TrainOptions t;
    t.model = o_.model;
    t.model_options = o_.model_options;
    t.model_options.batch_size = micro;
    t.model_options.checkpoint_activations = s.checkpoint;
    t.steps = o_.steps;
    t.optimizer = o_.optimizer;
    t.amp = s.amp;
    t.grad_accum = accum;
    std::unique_ptr<reducer::Communicator> comm;
    if (s.ddp != "off") {
      reducer::DdpOptions d;
      d.gradient_as_bucket_view = s.ddp == "view";
      t.ddp = d;
      // Under ZeRO a rank's memory depends on its share of the partition:
      // the planned rank, alone, its collectives no-ops (meta execution).
      t.zero = o_.zero;
      comm = o_.zero ? reducer::CreateSimulatedCommunicator(zero_rank_, o_.world_size)
                     : reducer::CreateLocalCommunicator();
    }
    RankSessionOptions so;
    so.device_memory = device;
    so.config = o_.config;
    so.blas_workspaces = o_.blas_workspaces;
    if (s.expandable && !so.config.expandable_segments) {
      absl::StatusOr<AllocatorConfig> c =
          AllocatorConfig::Parse(o_.config.text.empty() ? "expandable_segments:True"
                                                        : absl::StrCat(o_.config.text, ",expandable_segments:True"));
      if (!c.ok()) return c.status();
      so.config = *c;
    }
    RankSession session(so);
    Recorder* recorder = nullptr;
    if (record) {
      if (absl::Status st = session.Start(); !st.ok()) return st;
      recorder = &session.recorder();
    }
    absl::StatusOr<TrainResult> r = Train(t, session.context(), recorder, comm.get());
    if (!r.ok()) return r.status();
    if (!r->error.empty() && !r->oom) return absl::AbortedError(r->error);  // the row's error, not the plan's
    Probe p;
    p.fits = !r->oom;
    if (record) {
      if (absl::Status st = session.Finish(); !st.ok()) return st;
      absl::StatusOr<RankReport> report = AnalyzeRank(session.timeline());
      if (!report.ok()) return report.status();
      p.report = std::move(*report);
    }
    return p;
  }

  absl::StatusOr<bool> Fits(const PlanStrategy& s, std::int64_t batch) {
    absl::StatusOr<Probe> p = Run(s, batch, 1, o_.device_memory, false);
    if (!p.ok()) return p.status();
    return p->fits;
  }

  // The largest batch that fits: from `guess` (another row's answer),
  // doubling up or halving down to bracket it, then bisection.
  absl::StatusOr<std::pair<std::int64_t, bool>> MaxBatch(const PlanStrategy& s, std::int64_t guess) {
    guess = std::clamp<std::int64_t>(guess, 1, o_.max_batch);
    absl::StatusOr<bool> g = Fits(s, guess);
    if (!g.ok()) return g.status();
    std::int64_t lo = 0, hi = 0;  // lo fits (0: nothing known to), hi does not
    if (*g) {
      lo = guess;
      hi = guess * 2;
      while (true) {
        if (hi > o_.max_batch) {
          if (lo == o_.max_batch) return std::pair<std::int64_t, bool>{lo, true};
          absl::StatusOr<bool> cap = Fits(s, o_.max_batch);
          if (!cap.ok()) return cap.status();
          if (*cap) return std::pair<std::int64_t, bool>{o_.max_batch, true};
          hi = o_.max_batch;
          break;
        }
        absl::StatusOr<bool> f = Fits(s, hi);
        if (!f.ok()) return f.status();
        if (!*f) break;
        lo = hi;
        hi *= 2;
      }
    } else {
      hi = guess;
      while (hi > 1) {
        const std::int64_t down = hi / 2;
        absl::StatusOr<bool> f = Fits(s, down);
        if (!f.ok()) return f.status();
        if (*f) {
          lo = down;
          break;
        }
        hi = down;
      }
      if (lo == 0) return std::pair<std::int64_t, bool>{0, false};
    }
    while (hi - lo > 1) {  // lo fits, hi does not
      const std::int64_t mid = lo + (hi - lo) / 2;
      absl::StatusOr<bool> f = Fits(s, mid);
      if (!f.ok()) return f.status();
      (*f ? lo : hi) = mid;
    }
    return std::pair<std::int64_t, bool>{lo, false};
  }

  // The smallest GPU (whole MiB, within 1/256) on which micro x accum runs.
  absl::StatusOr<std::uint64_t> MinDevice(const PlanStrategy& s, std::int64_t micro, std::int64_t accum) {
    absl::StatusOr<Probe> big = Run(s, micro, accum, kUnlimited, true);
    if (!big.ok()) return big.status();
    if (!big->fits) return std::uint64_t{0};
    // Without a cap the run never frees its cache for lack of memory, so its
    // peak reserved suffices; no GPU below the peak of live bytes can do it.
    std::uint64_t hi = (big->report->peak_reserved.bytes + kMiB - 1) / kMiB * kMiB;
    std::uint64_t lo = std::max<std::uint64_t>(big->report->lower_bound / kMiB * kMiB, kMiB);
    if (lo >= hi) return hi;
    lo -= kMiB;  // lo does not fit (or is below the bound)
    while (hi - lo > std::max<std::uint64_t>(kMiB, hi / 256)) {
      const std::uint64_t mid = (lo + (hi - lo) / 2) / kMiB * kMiB;
      if (mid <= lo || mid >= hi) break;
      absl::StatusOr<Probe> p = Run(s, micro, accum, mid, false);
      if (!p.ok()) return p.status();
      (p->fits ? hi : lo) = mid;
    }
    return hi;
  }

  std::int64_t probes() const { return probes_; }

 private:
  const PlanOptions& o_;
  int zero_rank_ = 0;  // the rank planned under ZeRO
  std::int64_t probes_ = 0;
};

// One row: the largest batch, a recorded run at it, the target batch on
// this GPU and the smallest GPU for the target.
absl::StatusOr<PlanRow> PlanOne(Planner& planner, const PlanOptions& o, const PlanStrategy& s, std::int64_t target,
                                std::int64_t guess) {
  PlanRow row;
  row.strategy = s;
  const std::int64_t before = planner.probes();
  absl::StatusOr<std::pair<std::int64_t, bool>> max = planner.MaxBatch(s, guess);
  if (!max.ok() && absl::IsAborted(max.status())) {  // this strategy cannot train the model at all
    row.error = std::string(max.status().message());
    row.probes = planner.probes() - before;
    return row;
  }
  if (!max.ok()) return max.status();
  row.max_batch = max->first;
  row.capped = max->second;
  if (row.max_batch > 0) {
    absl::StatusOr<Probe> at = planner.Run(s, row.max_batch, 1, o.device_memory, true);
    if (!at.ok()) return at.status();
    const RankReport& r = *at->report;
    row.peak_allocated = r.peak_allocated.bytes;
    row.peak_reserved = r.peak_reserved.bytes;
    row.lower_bound = r.lower_bound;
    row.fragmentation = r.fragmentation_at_peak.fragmentation;
  }
  // The target on this GPU: the fewest accumulation steps (dividing it)
  // whose micro-batches run, accumulation included (gradients then live
  // through the next micro-batch's forward, so a micro-batch that fits
  // alone may not fit accumulated).
  for (std::int64_t a = 1; a <= target && row.max_batch > 0; ++a) {
    if (target % a != 0 || target / a > row.max_batch) continue;
    absl::StatusOr<Probe> p = planner.Run(s, target / a, a, o.device_memory, false);
    if (!p.ok()) return p.status();
    if (p->fits) {
      row.micro_batch = target / a;
      row.grad_accum = a;
      break;
    }
  }
  // The smallest GPU for the target batch in one step.
  absl::StatusOr<std::uint64_t> min = planner.MinDevice(s, target, 1);
  if (!min.ok()) return min.status();
  row.min_device_memory = *min;
  row.probes = planner.probes() - before;
  return row;
}

}  // namespace

std::string StrategyName(const PlanStrategy& s) {
  std::vector<std::string> parts;
  if (s.amp) parts.push_back(*s.amp == DType::kFloat16 ? "fp16" : "bf16");
  if (s.checkpoint) parts.push_back("ckpt");
  if (s.ddp != "off") parts.push_back(s.ddp);
  if (s.expandable) parts.push_back("exp");
  return parts.empty() ? "defaults" : absl::StrJoin(parts, " ");
}

absl::StatusOr<PlanResult> MakePlan(const PlanOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  if (o.device_memory == 0) return absl::InvalidArgumentError("--device-memory must be greater than 0");
  if (o.world_size < 1) return absl::InvalidArgumentError("--world-size must be at least 1");
  if (o.global_batch < 0 || o.batch_size < 0) return absl::InvalidArgumentError("batch sizes must be positive");
  if (o.global_batch > 0 && o.global_batch % o.world_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--global-batch ", o.global_batch, " is not a multiple of --world-size ", o.world_size));
  }
  ModelOptions probe_options = o.model_options;
  absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(o.model, probe_options);
  if (!model.ok()) return model.status();
  PlanResult result;
  result.model = o.model;
  result.parameters = (*model)->NumParameters();
  result.trainable_parameters = (*model)->NumTrainableParameters();
  result.target_batch = o.global_batch > 0 ? o.global_batch / o.world_size
                        : o.batch_size > 0 ? o.batch_size
                                           : (*model)->batch_size();
  const int states = o.optimizer.kind == OptimizerKind::kSgd ? (o.optimizer.momentum > 0 ? 1 : 0) : 2;
  result.model_state_bytes = static_cast<std::uint64_t>(result.parameters) * 4 +
                             static_cast<std::uint64_t>(result.trainable_parameters) * 4 * (1 + states);
  if (o.zero) {
    if (o.world_size < 2)
      return absl::InvalidArgumentError("--zero needs --world-size > 1 (it shards over DDP's ranks)");
    // ZeroRedundancyOptimizer's partition: every rank's elements; the first
    // rank with the most holds the most optimizer state.
    const std::vector<std::int64_t> numels = (*model)->TrainableNumels();
    if (numels.empty()) return absl::InvalidArgumentError("--zero: the model has no trainable parameters");
    std::vector<std::int64_t> held(static_cast<std::size_t>(o.world_size), 0);
    const std::vector<int> rank_of = ZeroPartition(numels, o.world_size);
    for (std::size_t i = 0; i < numels.size(); ++i) held[static_cast<std::size_t>(rank_of[i])] += numels[i];
    const auto most = std::max_element(held.begin(), held.end());
    result.zero_rank = static_cast<int>(most - held.begin());
    result.zero_rank_elements = *most;
  }
  probe_options.checkpoint_activations = true;
  const bool can_checkpoint = CreateModel(o.model, probe_options).ok();

  std::vector<PlanStrategy> strategies;
  const std::vector<std::optional<DType>> amps = {std::nullopt, DType::kFloat16, DType::kBFloat16};
  for (const std::optional<DType>& amp : amps) {
    for (const bool ckpt : {false, true}) {
      if (ckpt && !can_checkpoint) continue;
      for (const char* ddp : {"copy", "view"}) {
        if (o.world_size == 1 && std::string(ddp) == "view") continue;
        for (const bool exp : {false, true}) {
          strategies.push_back({amp, ckpt, o.world_size == 1 ? "off" : ddp, exp});
        }
      }
    }
  }
  // Rows run on worker threads (each simulated run is independent: its own
  // session, model and thread-local autograd state). A row starts its search
  // from the answer of the first row with the same checkpointing (its seed,
  // handed out before it), so the searches, and the number of runs, do not
  // depend on which thread finishes first.
  std::vector<PlanRow> rows(strategies.size());
  std::vector<absl::Status> errors(strategies.size());
  std::vector<std::int64_t> done(strategies.size(), -1);  // -1: not finished; 0: failed
  std::mutex mu;
  std::condition_variable finished;
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    Planner planner(o, result.zero_rank);
    for (std::size_t i = next++; i < strategies.size(); i = next++) {
      std::size_t seed = 0;
      while (strategies[seed].checkpoint != strategies[i].checkpoint) ++seed;
      std::int64_t guess = 1;
      if (seed != i) {
        std::unique_lock<std::mutex> lock(mu);
        finished.wait(lock, [&] { return done[seed] >= 0; });
        guess = std::max<std::int64_t>(1, done[seed]);
      }
      absl::StatusOr<PlanRow> row = PlanOne(planner, o, strategies[i], result.target_batch, guess);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (row.ok()) {
          rows[i] = std::move(*row);
          done[i] = rows[i].max_batch;
        } else {
          errors[i] = row.status();
          done[i] = 0;
        }
      }
      finished.notify_all();
    }
  };
  const int threads = std::max(1, std::min<int>(o.threads, static_cast<int>(strategies.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  for (const absl::Status& e : errors) {
    if (!e.ok()) return e;
  }
  result.rows = std::move(rows);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace memscope
