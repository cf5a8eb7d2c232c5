// alloc_bench: replays one deterministic, training-like allocation trace
// through an allocator and reports ns per alloc+free pair and peak memory.
//
//   alloc_bench caching [--alloc-conf STR] [--runs N] [--json] [--dump-stats FILE]
//       memscope::CachingAllocator on a SimDevice (80 GiB, not host-backed).
//       Also reports the "cached path": Malloc+Free of sizes the cache holds,
//       and a hash of memory_stats() and of the snapshot after the replay
//       (the allocator's decisions: equal hashes before and after a change to
//       the allocator mean it decided the same); --dump-stats writes the
//       flattened memory_stats() to FILE, one "key value" a line.
//   alloc_bench system --label NAME [--runs N] [--json]
//       the process's malloc/free (glibc, or whatever LD_PRELOAD puts first).
//
// Common options: --pairs N (minimum alloc+free pairs in the trace, default
// 1000000), --cached-iters N (caching, default 2000000), --footprint-steps N
// (system: steps replayed with touched pages for the RSS figure, default 40,
// 0 = all), --label NAME.
//
// This is a benchmark, not a test: it prints figures and never judges them.
// It exits non-zero only if an allocation fails or the command line is wrong.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/sim_device.h"
#include "allocator/sizes.h"
#include "allocator/snapshot.h"
#include "allocator/stats.h"
#include "analysis/analysis.h"
#include "exporters/chrome_trace.h"
#include "exporters/report.h"
#include "exporters/snapshot_export.h"
#include "recording/recorder.h"
#include "recording/timeline.h"
#include "viewer/html_report.h"

namespace {

using memscope::kGiB;
using memscope::kMiB;
constexpr std::uint64_t kKiB = 1024;

// ---------------------------------------------------------------------------
// The trace.

// One allocator call. size > 0: allocate `size` bytes and keep the pointer in
// `slot`; size == 0: free the pointer in `slot`.
struct Op {
  std::uint64_t size;
  std::uint32_t slot;
  std::uint32_t step;
};

struct Trace {
  std::vector<Op> ops;
  std::uint32_t slots = 0;        // distinct slots (max live allocations)
  std::uint64_t pairs = 0;        // allocations; each is freed once
  std::uint64_t small_pairs = 0;  // of which < 1 MiB
  std::uint64_t peak_live = 0;    // max sum of live requested bytes
  std::uint64_t bytes_allocated = 0;
  std::uint32_t steps = 0;
  std::vector<std::uint64_t> cached_sizes;  // 16 sizes for the cached-path loop
};

class TraceBuilder {
 public:
  explicit TraceBuilder(std::uint64_t seed) : rng_(seed) {}

  std::uint32_t Alloc(std::uint64_t size) {
    size = std::max<std::uint64_t>(size, 1);
    std::uint32_t slot = 0;
    if (free_slots_.empty()) {
      slot = static_cast<std::uint32_t>(slot_size_.size());
      slot_size_.push_back(0);
    } else {
      slot = free_slots_.back();
      free_slots_.pop_back();
    }
    slot_size_[slot] = size;
    live_ += size;
    t_.peak_live = std::max(t_.peak_live, live_);
    t_.bytes_allocated += size;
    ++t_.pairs;
    if (size < kMiB) ++t_.small_pairs;
    t_.ops.push_back(Op{size, slot, step_});
    return slot;
  }

  void Free(std::uint32_t slot) {
    live_ -= slot_size_[slot];
    t_.ops.push_back(Op{0, slot, step_});
    free_slots_.push_back(slot);
  }

  // Short-lived temporaries: allocated in order, at most `window` live at
  // once (the oldest is freed first), the rest freed newest first.
  void Burst(const std::vector<std::uint64_t>& sizes, std::size_t window) {
    std::vector<std::uint32_t> live;
    for (std::uint64_t s : sizes) {
      live.push_back(Alloc(s));
      if (live.size() > window) {
        Free(live.front());
        live.erase(live.begin());
      }
    }
    for (auto it = live.rbegin(); it != live.rend(); ++it) Free(*it);
  }

  // Uniform in [0, 1), the same on every platform (no std:: distributions).
  double Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  std::uint64_t Below(std::uint64_t n) { return rng_() % n; }
  // Log-uniform in [lo, hi), a multiple of 4 bytes (fp32 elements).
  std::uint64_t LogUniform(std::uint64_t lo, std::uint64_t hi) {
    const double l = std::log(static_cast<double>(lo));
    const double h = std::log(static_cast<double>(hi));
    const auto v = static_cast<std::uint64_t>(std::exp(l + (h - l) * Uniform()));
    return std::max<std::uint64_t>(4, v / 4 * 4);
  }

  void set_step(std::uint32_t step) { step_ = step; }
  std::uint64_t pairs() const { return t_.pairs; }
  Trace Finish() {
    t_.slots = static_cast<std::uint32_t>(slot_size_.size());
    return std::move(t_);
  }
  Trace& trace() { return t_; }

 private:
  std::mt19937_64 rng_;
  Trace t_;
  std::vector<std::uint64_t> slot_size_;
  std::vector<std::uint32_t> free_slots_;
  std::uint64_t live_ = 0;
  std::uint32_t step_ = 0;
};

// The model's shapes, drawn once. Activation-like sizes are per full batch
// and scaled by each step's batch.
struct Model {
  static constexpr int kLayers = 16;
  static constexpr int kActsPerLayer = 6;    // saved for backward
  static constexpr int kFwdSmallPerAct = 5;  // temporaries before each saved activation
  static constexpr int kFwdLarge = 2;        // e.g. attention scores
  static constexpr int kBwdSmall = 60;
  static constexpr int kBwdLarge = 3;
  static constexpr std::uint64_t kFullBatch = 32;

  std::vector<std::uint64_t> params;                  // 200 tensors
  std::vector<std::vector<int>> layer_params;         // indices into params
  std::vector<int> extra_params;                      // embedding, final norm, head
  std::vector<std::vector<std::uint64_t>> acts;       // [layer][k]
  std::vector<std::vector<std::uint64_t>> fwd_small;  // [layer][k]
  std::vector<std::vector<std::uint64_t>> fwd_large;
  std::vector<std::vector<std::uint64_t>> bwd_small;
  std::vector<std::vector<std::uint64_t>> bwd_large;
  std::uint64_t hidden = 0;  // hidden-state activation / its gradient
  std::uint64_t input = 0;   // token ids
  std::uint64_t labels = 0;
};

Model MakeModel(TraceBuilder& b) {
  Model m;
  auto small = [&] { return b.LogUniform(4 * kKiB, 512 * kKiB); };
  for (int l = 0; l < Model::kLayers; ++l) {
    std::vector<int> idx;
    // 4 weight matrices and 8 biases / norm parameters per layer.
    for (int k = 0; k < 12; ++k) {
      idx.push_back(static_cast<int>(m.params.size()));
      m.params.push_back(k % 3 == 0 ? b.LogUniform(1 * kMiB, 12 * kMiB) : small());
    }
    m.layer_params.push_back(idx);
  }
  // Embedding, positional embedding, final norm and head biases: 8 more.
  m.extra_params.push_back(static_cast<int>(m.params.size()));
  m.params.push_back(b.LogUniform(32 * kMiB, 64 * kMiB));
  m.extra_params.push_back(static_cast<int>(m.params.size()));
  m.params.push_back(b.LogUniform(1 * kMiB, 4 * kMiB));
  for (int k = 0; k < 6; ++k) {
    m.extra_params.push_back(static_cast<int>(m.params.size()));
    m.params.push_back(small());
  }
  for (int l = 0; l < Model::kLayers; ++l) {
    std::vector<std::uint64_t> acts, fs, fl, bs, bl;
    for (int k = 0; k < Model::kActsPerLayer; ++k) {
      acts.push_back(k < 4 ? b.LogUniform(2 * kMiB, 16 * kMiB) : small());
    }
    for (int k = 0; k < Model::kActsPerLayer * Model::kFwdSmallPerAct; ++k) fs.push_back(small());
    for (int k = 0; k < Model::kFwdLarge; ++k) fl.push_back(b.LogUniform(4 * kMiB, 32 * kMiB));
    for (int k = 0; k < Model::kBwdSmall; ++k) bs.push_back(small());
    for (int k = 0; k < Model::kBwdLarge; ++k) bl.push_back(b.LogUniform(2 * kMiB, 16 * kMiB));
    m.acts.push_back(acts);
    m.fwd_small.push_back(fs);
    m.fwd_large.push_back(fl);
    m.bwd_small.push_back(bs);
    m.bwd_large.push_back(bl);
  }
  m.hidden = 8 * kMiB;
  m.input = 64 * kKiB;
  m.labels = 64 * kKiB;
  return m;
}

// Builds steps (forward, backward, optimizer, zero_grad) until the trace has
// at least `min_pairs` alloc+free pairs, then frees the model.
Trace MakeTrace(std::uint64_t min_pairs, std::uint64_t seed) {
  TraceBuilder b(seed);
  const Model m = MakeModel(b);
  std::vector<std::uint32_t> param_slot;
  for (std::uint64_t s : m.params) param_slot.push_back(b.Alloc(s));
  std::vector<std::uint32_t> exp_avg, exp_avg_sq;  // Adam state, from the first step on

  std::uint32_t step = 0;
  while (b.pairs() < min_pairs) {
    b.set_step(++step);
    // Batch-size-like jitter: 28..32 of a full batch of 32.
    const std::uint64_t batch = Model::kFullBatch - b.Below(5);
    auto scaled = [&](std::uint64_t full) {
      return std::max<std::uint64_t>(4, full * batch / Model::kFullBatch / 4 * 4);
    };
    auto scaled_all = [&](const std::vector<std::uint64_t>& v, std::size_t from, std::size_t n) {
      std::vector<std::uint64_t> out;
      for (std::size_t i = from; i < from + n; ++i) out.push_back(scaled(v[i]));
      return out;
    };

    const std::uint32_t input = b.Alloc(scaled(m.input));
    const std::uint32_t labels = b.Alloc(scaled(m.labels));

    // Forward: activations are allocated layer by layer and kept.
    const std::uint32_t embedded = b.Alloc(scaled(m.hidden));
    std::vector<std::vector<std::uint32_t>> saved(Model::kLayers);
    for (int l = 0; l < Model::kLayers; ++l) {
      for (int k = 0; k < Model::kActsPerLayer; ++k) {
        b.Burst(
            scaled_all(m.fwd_small[l], static_cast<std::size_t>(k) * Model::kFwdSmallPerAct, Model::kFwdSmallPerAct),
            3);
        saved[l].push_back(b.Alloc(scaled(m.acts[l][k])));
        if (k == 2) b.Burst(scaled_all(m.fwd_large[l], 0, Model::kFwdLarge), 2);
      }
    }
    const std::uint32_t loss = b.Alloc(4);
    b.Burst({scaled(m.labels), 4, 4}, 2);

    // Backward: gradients of activations come and go, parameter gradients
    // are kept until zero_grad, activations are freed in reverse order.
    std::vector<std::uint32_t> grads(m.params.size());
    std::uint32_t grad_hidden = b.Alloc(scaled(m.hidden));
    for (int l = Model::kLayers - 1; l >= 0; --l) {
      b.Burst(scaled_all(m.bwd_small[l], 0, Model::kBwdSmall / 2), 4);
      b.Burst(scaled_all(m.bwd_large[l], 0, Model::kBwdLarge), 2);
      const auto& idx = m.layer_params[l];
      for (auto it = idx.rbegin(); it != idx.rend(); ++it) grads[*it] = b.Alloc(m.params[*it]);
      b.Burst(scaled_all(m.bwd_small[l], Model::kBwdSmall / 2, Model::kBwdSmall / 2), 4);
      const std::uint32_t next = b.Alloc(scaled(m.hidden));
      b.Free(grad_hidden);
      grad_hidden = next;
      for (auto it = saved[l].rbegin(); it != saved[l].rend(); ++it) b.Free(*it);
    }
    for (int p : m.extra_params) grads[p] = b.Alloc(m.params[p]);
    b.Free(grad_hidden);
    b.Free(embedded);
    b.Free(loss);

    // Optimizer (Adam): state on the first step, then one temporary and a
    // scalar norm per parameter; zero_grad(set_to_none) frees the gradients.
    if (exp_avg.empty()) {
      for (std::uint64_t s : m.params) {
        exp_avg.push_back(b.Alloc(s));
        exp_avg_sq.push_back(b.Alloc(s));
      }
    }
    for (std::size_t p = 0; p < m.params.size(); ++p) {
      const std::uint32_t norm = b.Alloc(4);
      const std::uint32_t tmp = b.Alloc(m.params[p]);
      b.Free(tmp);
      b.Free(norm);
    }
    for (std::uint32_t g : grads) b.Free(g);
    b.Free(labels);
    b.Free(input);
  }
  b.set_step(step + 1);
  for (std::size_t p = m.params.size(); p-- > 0;) {
    b.Free(exp_avg_sq[p]);
    b.Free(exp_avg[p]);
    b.Free(param_slot[p]);
  }

  Trace t = b.Finish();
  t.steps = step;
  // Cached-path sizes: 8 small and 8 large shapes the trace allocates.
  for (int k = 0; k < 8; ++k) t.cached_sizes.push_back(m.fwd_small[0][static_cast<std::size_t>(k)]);
  for (int k = 0; k < 4; ++k) t.cached_sizes.push_back(m.acts[1][static_cast<std::size_t>(k)]);
  for (int k = 0; k < 2; ++k) t.cached_sizes.push_back(m.fwd_large[2][static_cast<std::size_t>(k)]);
  for (int k = 0; k < 2; ++k) t.cached_sizes.push_back(m.bwd_large[3][static_cast<std::size_t>(k)]);
  return t;
}

// ---------------------------------------------------------------------------
// Helpers.

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

std::string Bytes(std::uint64_t n) {
  char buf[64];
  if (n >= kGiB) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(n) / static_cast<double>(kGiB));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(n) / static_cast<double>(kMiB));
  }
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonNumbers(const std::vector<double>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.2f", i == 0 ? "" : ", ", v[i]);
    out += buf;
  }
  return out + "]";
}

std::string RunsText(const std::vector<double>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.1f", i == 0 ? "" : " ", v[i]);
    out += buf;
  }
  return out;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "alloc_bench: %s\n", what.c_str());
  std::exit(1);
}

// A "VmXXX:   1234 kB" field of /proc/self/status, in bytes; 0 if absent.
std::uint64_t ProcStatusBytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::size_t len = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, len, field) == 0 && line.size() > len && line[len] == ':') {
      return std::strtoull(line.c_str() + len + 1, nullptr, 10) * 1024;
    }
  }
  return 0;
}

// Resets VmHWM to the current RSS (Linux >= 4.0). False if not possible.
bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

// Which malloc the process really uses (a preload that did not take shows).
std::string MallocLibrary() {
  std::ifstream in("/proc/self/maps");
  std::string line;
  for (const char* name : {"jemalloc", "mimalloc", "tcmalloc"}) {
    in.clear();
    in.seekg(0);
    while (std::getline(in, line)) {
      if (line.find(std::string("lib") + name) != std::string::npos) return name;
    }
  }
  return "libc";
}

struct Options {
  std::string mode;
  std::string label;
  std::string alloc_conf;
  int runs = 5;
  std::uint64_t min_pairs = 1000000;
  std::uint64_t cached_iters = 2000000;
  // Steps replayed with touched pages for the RSS figure (0 = all). Touching
  // every page of the whole trace takes minutes under jemalloc, which returns
  // and re-faults pages; the peak is reached within the first few steps.
  std::uint32_t footprint_steps = 40;
  bool json = false;
  std::string dump_stats;      // caching: file for the flattened memory_stats()
  bool export_outputs = true;  // record: export the recording to every format
  bool warmup = false;         // record: an untimed replay without the recorder first
};

struct Result {
  std::string name;
  std::uint64_t pairs = 0;
  std::vector<double> ns_runs;
  std::vector<double> cached_runs;  // caching only
  std::uint64_t peak_reserved = 0;
  std::string peak_reserved_kind;  // "allocator" or "rss"
  std::uint64_t peak_live = 0;
  std::string extra_json;  // more "key": value pairs
  std::string extra_text;
};

void Report(const Options& o, const Result& r) {
  const double median = Median(r.ns_runs);
  const double ratio = r.peak_live == 0 ? 0.0 : static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_live);
  std::string cached;
  if (!r.cached_runs.empty()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "  cached path %.1f ns/pair", Median(r.cached_runs));
    cached = buf;
  }
  std::printf("%-36s %9.1f ns/pair (median of %zu: %s)%s  peak reserved%s %s  peak live %s  reserved/live %.3f%s\n",
              r.name.c_str(), median, r.ns_runs.size(), RunsText(r.ns_runs).c_str(), cached.c_str(),
              r.peak_reserved_kind == "rss" ? " (RSS)" : "", Bytes(r.peak_reserved).c_str(), Bytes(r.peak_live).c_str(),
              ratio, r.extra_text.c_str());
  if (o.json) {
    std::string j = "{\"name\": " + JsonString(r.name) + ", \"mode\": " + JsonString(o.mode);
    char buf[256];
    std::snprintf(buf, sizeof buf, ", \"pairs\": %llu, \"ns_per_pair_median\": %.2f",
                  static_cast<unsigned long long>(r.pairs), median);
    j += buf;
    j += ", \"ns_per_pair_runs\": " + JsonNumbers(r.ns_runs);
    if (!r.cached_runs.empty()) {
      std::snprintf(buf, sizeof buf, ", \"cached_path_ns_per_pair\": %.2f", Median(r.cached_runs));
      j += buf;
      j += ", \"cached_path_ns_per_pair_runs\": " + JsonNumbers(r.cached_runs);
    }
    std::snprintf(buf, sizeof buf, ", \"peak_reserved_bytes\": %llu, \"peak_live_bytes\": %llu",
                  static_cast<unsigned long long>(r.peak_reserved), static_cast<unsigned long long>(r.peak_live));
    j += buf;
    j += ", \"peak_reserved_kind\": " + JsonString(r.peak_reserved_kind);
    j += r.extra_json + "}";
    std::printf("%s\n", j.c_str());
  }
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------
// caching: memscope::CachingAllocator on a SimDevice.

// FNV-1a, 64 bits: a stable fingerprint of the allocator's state.
class Fnv1a {
 public:
  void Add(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h_ = (h_ ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ULL;
    }
  }
  void Add(const std::string& s) {
    for (unsigned char c : s) h_ = (h_ ^ c) * 0x100000001b3ULL;
    Add(s.size());
  }
  std::uint64_t value() const { return h_; }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ULL;
};

// Every key and value of memory_stats(), in key order.
std::uint64_t StatsHash(const memscope::DeviceStats& stats) {
  Fnv1a h;
  for (const auto& [key, value] : memscope::FlattenStats(stats)) {
    h.Add(key);
    h.Add(static_cast<std::uint64_t>(value));
  }
  return h.value();
}

// Every segment and block: address, size, requested size, state.
std::uint64_t SnapshotHash(const std::vector<memscope::SegmentInfo>& segments) {
  Fnv1a h;
  for (const memscope::SegmentInfo& seg : segments) {
    h.Add(seg.address);
    h.Add(seg.stream);
    h.Add(seg.total_size);
    h.Add(static_cast<std::uint64_t>(seg.is_large) | static_cast<std::uint64_t>(seg.is_expandable) << 1);
    for (const memscope::BlockInfo& b : seg.blocks) {
      h.Add(b.address);
      h.Add(b.size);
      h.Add(b.requested_size);
      h.Add(static_cast<std::uint64_t>(b.state));
    }
  }
  return h.value();
}

double ReplayCaching(const Trace& t, memscope::CachingAllocator& a, std::vector<memscope::DevicePtr>& slots) {
  const double t0 = NowSeconds();
  for (const Op& op : t.ops) {
    if (op.size != 0) {
      absl::StatusOr<memscope::DevicePtr> p = a.Malloc(op.size);
      if (!p.ok()) Die("caching Malloc failed: " + std::string(p.status().message()));
      slots[op.slot] = *p;
    } else {
      absl::Status s = a.Free(slots[op.slot]);
      if (!s.ok()) Die("caching Free failed: " + std::string(s.message()));
    }
  }
  return NowSeconds() - t0;
}

// Malloc+Free cycling through sizes the cache already holds. Returns ns per
// pair, and the device allocations it caused in `device_allocs` (0 = all hits).
double CachedPath(const Trace& t, memscope::CachingAllocator& a, std::uint64_t iters, std::int64_t* device_allocs) {
  const std::vector<std::uint64_t>& sizes = t.cached_sizes;
  auto cycle = [&](std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) {
      absl::StatusOr<memscope::DevicePtr> p = a.Malloc(sizes[i % sizes.size()]);
      if (!p.ok()) Die("caching Malloc failed: " + std::string(p.status().message()));
      absl::Status s = a.Free(*p);
      if (!s.ok()) Die("caching Free failed: " + std::string(s.message()));
    }
  };
  cycle(sizes.size() * 64);  // warm-up: every size is cached after this
  const std::int64_t before = a.GetStats().num_device_alloc;
  const double t0 = NowSeconds();
  cycle(iters);
  const double elapsed = NowSeconds() - t0;
  *device_allocs = a.GetStats().num_device_alloc - before;
  return elapsed * 1e9 / static_cast<double>(iters);
}

int RunCaching(const Options& o, const Trace& t) {
  absl::StatusOr<memscope::AllocatorConfig> config = memscope::AllocatorConfig::Parse(o.alloc_conf);
  if (!config.ok()) Die(std::string(config.status().message()));
  Result r;
  r.name = !o.label.empty() ? o.label : o.alloc_conf.empty() ? "caching" : "caching (" + o.alloc_conf + ")";
  r.pairs = t.pairs;
  r.peak_reserved_kind = "allocator";
  std::vector<memscope::DevicePtr> slots(t.slots, 0);
  memscope::DeviceStats stats;
  std::int64_t cached_device_allocs = 0;
  std::size_t cached_blocks = 0;
  std::uint64_t stats_hash = 0;
  std::uint64_t snapshot_hash = 0;
  for (int run = 0; run < o.runs; ++run) {
    memscope::SimDevice device({.capacity = 80 * kGiB, .index = 0, .host_backed = false});
    memscope::CachingAllocator allocator(device, *config);
    const double seconds = ReplayCaching(t, allocator, slots);
    r.ns_runs.push_back(seconds * 1e9 / static_cast<double>(t.pairs));
    stats = allocator.GetStats();
    if (run == 0) {
      // What the cached-path loop searches: the free blocks left in the pools.
      const std::vector<memscope::SegmentInfo> snapshot = allocator.Snapshot();
      for (const memscope::SegmentInfo& seg : snapshot) {
        for (const memscope::BlockInfo& blk : seg.blocks) cached_blocks += blk.state == memscope::BlockState::kInactive;
      }
      stats_hash = StatsHash(stats);
      snapshot_hash = SnapshotHash(snapshot);
      if (!o.dump_stats.empty()) {
        std::ofstream out(o.dump_stats);
        for (const auto& [key, value] : memscope::FlattenStats(stats)) out << key << ' ' << value << '\n';
        if (!out) Die("cannot write " + o.dump_stats);
      }
    }
    if (o.cached_iters > 0) {
      std::int64_t n = 0;
      r.cached_runs.push_back(CachedPath(t, allocator, o.cached_iters, &n));
      cached_device_allocs += n;
    }
  }
  const auto all = static_cast<int>(memscope::StatType::kAll);
  r.peak_reserved = static_cast<std::uint64_t>(stats.reserved_bytes[all].peak);
  r.peak_live = static_cast<std::uint64_t>(stats.requested_bytes[all].peak);
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                ", \"alloc_conf\": %s, \"peak_allocated_bytes\": %llu, \"num_device_alloc\": %lld, "
                "\"num_device_free\": %lld, \"num_alloc_retries\": %lld, \"peak_inactive_split_bytes\": %llu, "
                "\"cached_path_device_allocs\": %lld, \"free_blocks_after_replay\": %zu, "
                "\"memory_stats_hash\": \"%016llx\", \"snapshot_hash\": \"%016llx\"",
                JsonString(o.alloc_conf).c_str(), static_cast<unsigned long long>(stats.allocated_bytes[all].peak),
                static_cast<long long>(stats.num_device_alloc), static_cast<long long>(stats.num_device_free),
                static_cast<long long>(stats.num_alloc_retries),
                static_cast<unsigned long long>(stats.inactive_split_bytes[all].peak),
                static_cast<long long>(cached_device_allocs), cached_blocks,
                static_cast<unsigned long long>(stats_hash), static_cast<unsigned long long>(snapshot_hash));
  r.extra_json = buf;
  std::snprintf(buf, sizeof buf,
                "  [device allocs %lld, peak allocated (rounded) %s, peak inactive split %s, %zu free blocks cached "
                "after the replay; memory_stats hash %016llx, snapshot hash %016llx]",
                static_cast<long long>(stats.num_device_alloc),
                Bytes(static_cast<std::uint64_t>(stats.allocated_bytes[all].peak)).c_str(),
                Bytes(static_cast<std::uint64_t>(stats.inactive_split_bytes[all].peak)).c_str(), cached_blocks,
                static_cast<unsigned long long>(stats_hash), static_cast<unsigned long long>(snapshot_hash));
  r.extra_text = buf;
  if (cached_device_allocs != 0) {
    std::fprintf(stderr, "alloc_bench: note: the cached-path loop made %lld device allocations (not all hits)\n",
                 static_cast<long long>(cached_device_allocs));
  }
  Report(o, r);
  return 0;
}

// ---------------------------------------------------------------------------
// system: the process's malloc/free.

double ReplaySystem(const Trace& t, std::vector<void*>& slots) {
  const double t0 = NowSeconds();
  for (const Op& op : t.ops) {
    if (op.size != 0) {
      void* p = std::malloc(op.size);
      if (p == nullptr) Die("malloc failed");
      slots[op.slot] = p;
    } else {
      std::free(slots[op.slot]);
    }
  }
  return NowSeconds() - t0;
}

// Replays the steps up to `last_step` (0 = all) writing one byte in every
// 4 KiB page of each allocation, then frees what is still live. Returns the
// peak RSS growth over the RSS before the replay.
std::uint64_t FootprintSystem(const Trace& t, std::uint32_t last_step, std::vector<void*>& slots, bool* reset_ok) {
  std::vector<char> live(t.slots, 0);
  *reset_ok = ResetPeakRss();
  const std::uint64_t rss_before = ProcStatusBytes("VmRSS");
  for (const Op& op : t.ops) {
    if (last_step != 0 && op.step > last_step) break;
    if (op.size != 0) {
      auto* p = static_cast<volatile char*>(std::malloc(op.size));
      if (p == nullptr) Die("malloc failed");
      for (std::uint64_t off = 0; off < op.size; off += 4096) p[off] = 1;
      p[op.size - 1] = 1;
      slots[op.slot] = const_cast<char*>(p);
      live[op.slot] = 1;
    } else {
      std::free(slots[op.slot]);
      live[op.slot] = 0;
    }
  }
  const std::uint64_t hwm = ProcStatusBytes("VmHWM");
  for (std::uint32_t s = 0; s < t.slots; ++s) {
    if (live[s] != 0) std::free(slots[s]);
  }
  return hwm > rss_before ? hwm - rss_before : 0;
}

int RunSystem(const Options& o, const Trace& t) {
  Result r;
  r.name = o.label.empty() ? "system" : o.label;
  r.pairs = t.pairs;
  r.peak_reserved_kind = "rss";
  std::vector<void*> slots(t.slots, nullptr);
  // Footprint first, while the malloc holds no memory from earlier replays.
  bool reset_ok = false;
  r.peak_reserved = FootprintSystem(t, o.footprint_steps, slots, &reset_ok);
  if (!reset_ok) std::fprintf(stderr, "alloc_bench: note: could not reset VmHWM; RSS peak may be overstated\n");
  // Peak live of the replayed prefix (the whole trace when footprint_steps is 0).
  std::uint64_t live = 0, peak = 0;
  {
    std::vector<std::uint64_t> size(t.slots, 0);
    for (const Op& op : t.ops) {
      if (o.footprint_steps != 0 && op.step > o.footprint_steps) break;
      if (op.size != 0) {
        size[op.slot] = op.size;
        live += op.size;
        peak = std::max(peak, live);
      } else {
        live -= size[op.slot];
      }
    }
  }
  r.peak_live = peak;
  for (int run = 0; run < o.runs; ++run) {
    const double seconds = ReplaySystem(t, slots);
    r.ns_runs.push_back(seconds * 1e9 / static_cast<double>(t.pairs));
  }
  const std::string lib = MallocLibrary();
  const std::uint32_t steps = o.footprint_steps == 0 ? t.steps : std::min(o.footprint_steps, t.steps);
  char buf[256];
  std::snprintf(buf, sizeof buf, ", \"malloc_library\": %s, \"footprint_steps\": %u, \"trace_peak_live_bytes\": %llu",
                JsonString(lib).c_str(), steps, static_cast<unsigned long long>(t.peak_live));
  r.extra_json = buf;
  std::snprintf(buf, sizeof buf, "  [malloc from %s; RSS over %u of %u steps]", lib.c_str(), steps, t.steps);
  r.extra_text = buf;
  Report(o, r);
  return 0;
}

// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// record: the cost of recording (Recorder + timeline file) on the replay, and
// the time to export the recorded events to every format.

// One replay on a fresh allocator without a recorder. Not inlined, so that
// callgrind reports its instructions apart (bench/record_bench).
[[gnu::noinline]] double PlainReplay(const Trace& t, const memscope::AllocatorConfig& conf) {
  memscope::SimDevice device({.capacity = 80ULL << 30});
  memscope::CachingAllocator a(device, conf);
  std::vector<memscope::DevicePtr> slots(t.slots, 0);
  return ReplayCaching(t, a, slots);
}

// The same replay with a Recorder writing a timeline file to `path`,
// creating and flushing the file included.
[[gnu::noinline]] double RecordedReplay(const Trace& t, const memscope::AllocatorConfig& conf, const Options& o,
                                        const std::string& path) {
  memscope::SimDevice device({.capacity = 80ULL << 30});
  memscope::CachingAllocator a(device, conf);
  std::vector<memscope::DevicePtr> slots(t.slots, 0);
  const double t0 = NowSeconds();
  memscope::Timeline header;
  header.device_capacity = 80ULL << 30;
  header.alloc_conf = o.alloc_conf;
  auto writer = memscope::TimelineWriter::Create(path, header);
  if (!writer.ok()) Die(std::string(writer.status().message()));
  memscope::Recorder recorder(**writer, memscope::RecordClock::kSampled);  // as a meta run's rank (rank_session.cpp)
  a.SetObserver(&recorder);
  ReplayCaching(t, a, slots);
  if (!(*writer)->Flush().ok()) Die("timeline flush failed");
  a.SetObserver(nullptr);
  return NowSeconds() - t0;
}

int RunRecord(const Options& o, const Trace& t) {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/memscope-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die("mkdtemp failed");
  const fs::path dir(tmpl);
  const std::string timeline_path = (dir / "rank-0.timeline").string();
  auto conf = memscope::AllocatorConfig::Parse(o.alloc_conf);
  if (!conf.ok()) Die(std::string(conf.status().message()));
  std::vector<double> plain, recorded;
  // --warmup: the first replay of a process is the one that grows the heap
  // (the allocator's blocks and pools); without it, the replay without the
  // recorder, timed first, pays that alone.
  if (o.warmup) PlainReplay(t, *conf);
  for (int run = 0; run < o.runs; ++run) {
    plain.push_back(PlainReplay(t, *conf) * 1e9 / static_cast<double>(t.pairs));
    // A new file each time, as a run writes (truncating the last run's
    // 14 MB of dirty pages would be timed too: ext4 frees them in open and
    // starts their writeback at close).
    fs::remove(timeline_path);
    recorded.push_back(RecordedReplay(t, *conf, o, timeline_path) * 1e9 / static_cast<double>(t.pairs));
  }
  const double overhead = Median(recorded) / Median(plain) - 1.0;
  std::printf("record: replay %.1f ns/pair without the recorder, %.1f with it (median of %d): %+.1f%%\n", Median(plain),
              Median(recorded), o.runs, overhead * 100.0);

  const double read0 = NowSeconds();
  auto timeline = memscope::ReadTimelineFile(timeline_path);
  if (!timeline.ok()) Die(std::string(timeline.status().message()));
  const double read_s = NowSeconds() - read0;
  const std::size_t events = timeline->events.size();
  auto timed = [&](const char* name, const fs::path& path, auto write) {
    const double t0 = NowSeconds();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    absl::Status s = write(out);
    out.close();
    if (!s.ok()) Die(std::string(name) + ": " + std::string(s.message()));
    const double secs = NowSeconds() - t0;
    std::printf("export %-22s %7.2f s  %8.1f MB\n", name, secs, static_cast<double>(fs::file_size(path)) / 1e6);
    return secs;
  };
  const auto file_bytes = static_cast<double>(fs::file_size(timeline_path));
  std::printf("timeline: %zu events, %.1f MB (%.2f bytes per event), read in %.2f s\n", events, file_bytes / 1e6,
              file_bytes / static_cast<double>(events), read_s);
  if (!o.export_outputs) {
    if (o.json) {
      std::printf(
          "{\"name\": \"record\", \"events\": %zu, \"timeline_bytes\": %.0f, \"replay_ns_per_pair\": %.2f, "
          "\"recorded_ns_per_pair\": %.2f, \"overhead\": %.4f, \"read_s\": %.3f}\n",
          events, file_bytes, Median(plain), Median(recorded), overhead, read_s);
    }
    fs::remove_all(dir);
    return 0;
  }
  const double report_s = timed("report.json (analysis)", dir / "report.json", [&](std::ostream& out) {
    auto r = memscope::AnalyzeRank(*timeline);
    if (!r.ok()) return r.status();
    out << memscope::ReportJson({&*timeline}, {*r}).dump(1);
    return absl::OkStatus();
  });
  const double trace_s = timed("trace.json (Chrome)", dir / "trace.json", [&](std::ostream& out) {
    return memscope::WriteChromeTrace({&*timeline}, memscope::ChromeTraceOptions{}, out);
  });
  const double html_s = timed("report.html (viewer)", dir / "report.html", [&](std::ostream& out) {
    auto html = memscope::HtmlReport({{"bench", {&*timeline}, {}, {}, {}}});
    if (!html.ok()) return html.status();
    out << *html;
    return absl::OkStatus();
  });
  auto end_model = memscope::ModelAt(*timeline, memscope::Moment{});
  if (!end_model.ok()) Die(std::string(end_model.status().message()));
  const double pickle_s = timed("snapshot .pickle", dir / "snapshot.pickle", [&](std::ostream& out) {
    return memscope::WriteSnapshot(*timeline, end_model->first, end_model->second, memscope::SnapshotFormat::kPickle,
                                   out);
  });
  const double json_s = timed("snapshot .json", dir / "snapshot.json", [&](std::ostream& out) {
    return memscope::WriteSnapshot(*timeline, end_model->first, end_model->second, memscope::SnapshotFormat::kJson,
                                   out);
  });
  if (o.json) {
    std::printf(
        "{\"name\": \"record\", \"events\": %zu, \"replay_ns_per_pair\": %.2f, \"recorded_ns_per_pair\": %.2f, "
        "\"overhead\": %.4f, \"read_s\": %.3f, \"report_s\": %.3f, \"trace_s\": %.3f, \"pickle_s\": %.3f, "
        "\"snapshot_json_s\": %.3f, \"html_s\": %.3f}\n",
        events, Median(plain), Median(recorded), overhead, read_s, report_s, trace_s, pickle_s, json_s, html_s);
  }
  fs::remove_all(dir);
  return 0;
}

void Usage() {
  std::fprintf(
      stderr,
      "usage: alloc_bench caching [--alloc-conf STR] [--cached-iters N] [--dump-stats FILE] [options]\n"
      "       alloc_bench system [--footprint-steps N (40; 0 = all)] [options]\n"
      "       alloc_bench record [--alloc-conf STR] [--no-export] [--warmup] [options]   (recording overhead, export times)\n"
      "options: --runs N (5)  --label NAME  --json  --pairs N (minimum trace pairs, 1000000)\n");
}

std::uint64_t ParseNumber(const std::string& flag, const char* text) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || text[0] == '-') Die(flag + " needs a non-negative integer, got '" + text + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (argc < 2) {
    Usage();
    return 2;
  }
  o.mode = argv[1];
  if (o.mode == "-h" || o.mode == "--help") {
    Usage();
    return 0;
  }
  if (o.mode != "caching" && o.mode != "system" && o.mode != "record") {
    Usage();
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) Die(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--json") {
      o.json = true;
    } else if (arg == "--no-export") {
      o.export_outputs = false;
    } else if (arg == "--warmup") {
      o.warmup = true;
    } else if (arg == "--alloc-conf") {
      o.alloc_conf = value();
    } else if (arg == "--label") {
      o.label = value();
    } else if (arg == "--runs") {
      o.runs = static_cast<int>(std::max<std::uint64_t>(1, ParseNumber(arg, value())));
    } else if (arg == "--pairs") {
      o.min_pairs = ParseNumber(arg, value());
    } else if (arg == "--dump-stats") {
      o.dump_stats = value();
    } else if (arg == "--cached-iters") {
      o.cached_iters = ParseNumber(arg, value());
    } else if (arg == "--footprint-steps") {
      o.footprint_steps = static_cast<std::uint32_t>(ParseNumber(arg, value()));
    } else {
      Usage();
      Die("unknown argument '" + arg + "'");
    }
  }

  const double t0 = NowSeconds();
  const Trace trace = MakeTrace(o.min_pairs, /*seed=*/20240601);
  std::printf(
      "trace: %llu alloc+free pairs (%llu < 1 MiB), %u steps, peak live %s (%llu bytes), %s allocated in "
      "total, %u slots (built in %.2f s)\n",
      static_cast<unsigned long long>(trace.pairs), static_cast<unsigned long long>(trace.small_pairs), trace.steps,
      Bytes(trace.peak_live).c_str(), static_cast<unsigned long long>(trace.peak_live),
      Bytes(trace.bytes_allocated).c_str(), trace.slots, NowSeconds() - t0);
  std::fflush(stdout);
  if (o.mode == "record") return RunRecord(o, trace);
  return o.mode == "caching" ? RunCaching(o, trace) : RunSystem(o, trace);
}
