// `memscope explain`: why a recording ran out of memory (or how close it
// came), in a few lines, then the evidence, every figure of it a replay.
//
// The recording's requests are replayed once under its own settings on the
// memory this process had (the baseline), and recorded, so that the OOM (or
// the peak) is analysed like any recording: what was asked, what was free,
// what filled the device by category and by allocation site. The cause of an
// OOM is one of five, checked in this order:
//   memory fraction  the device had the segment free, but
//                    set_per_process_memory_fraction's cap did not;
//   another process  the GPU's memory (--device-memory, for a PyTorch OOM
//                    snapshot, whose own capacity is reserved + free) less
//                    what this process had was held outside it, and the
//                    segment would have fit in it;
//   private pool     the request was in a private pool (CUDA graph,
//                    MemPool), and the other pools' free cached blocks,
//                    which it cannot use, held at least the request;
//   fragmentation    the live bytes plus the request fit in this process's
//                    memory, but no free block or new segment did;
//   capacity         they did not.
// Then each what-if is the same requests replayed with one change
// (expandable_segments, max_split_size_mb at the large request sizes,
// garbage_collection_threshold under the recording's memory fraction,
// empty_cache() after every phase, no memory fraction, the GPU to itself),
// on the same memory and searched for its smallest GPU (MinDeviceMemory):
// what `memscope replay` prints for the same setting, number for number.
//
//   absl::StatusOr<MemoryExplanation> e = Explain("oom.pickle", {.gpu_memory = 80 * kGiB});
//   if (e.ok()) std::cout << ExplanationText(*e);
#ifndef MEMSCOPE_EXPLAIN_EXPLAIN_H_
#define MEMSCOPE_EXPLAIN_EXPLAIN_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/alloc_tag.h"
#include "analysis/analysis.h"
#include "importers/replayer.h"
#include "nlohmann/json.hpp"

namespace memscope {

struct ExplainOptions {
  int rank = 0;  // of a run directory
  // The GPU's whole memory. For a PyTorch snapshot with an `oom` entry, the
  // process had only what that entry implies (reserved + device_free): the
  // rest was held outside it. For other inputs, the simulated GPU's size.
  std::optional<std::uint64_t> gpu_memory{};
  // The allocator settings the job ran with; default: the recording's own,
  // else PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF, else the defaults.
  std::optional<std::string> alloc_conf{};
  // torch.cuda.set_per_process_memory_fraction, 0 to 1 (default: the settings').
  std::optional<double> memory_fraction{};
};

enum class OomCause { kMemoryFraction, kOtherProcess, kPrivatePool, kFragmentation, kCapacity };
// "memory_fraction", "other_process", "private_pool", "fragmentation", "capacity"
std::string_view OomCauseName(OomCause cause);

// The free cached bytes of one pool at the OOM.
struct PoolCache {
  PoolId pool{};                   // (0, 0): the default pool
  std::uint64_t free_bytes = 0;    // in free cached blocks
  std::uint64_t largest_free = 0;  // the largest of them
};

// One change replayed on the same requests and memory.
struct WhatIf {
  std::string change{};          // "expandable_segments:True", "empty_cache() after every phase", ...
  std::string alloc_conf{};      // the settings replayed (PYTORCH_CUDA_ALLOC_CONF text)
  double memory_fraction = 1.0;  // the fraction replayed (1: none)
  bool empty_cache_at_phase_ends = false;
  std::uint64_t device_memory = 0;  // the simulated GPU replayed on
  std::optional<ReplayOom> oom{};   // where it ran out on that GPU; none: it ran
  std::uint64_t peak_reserved = 0;
  std::optional<std::uint64_t> min_device_memory{};  // MinDeviceMemory; none: over 1 TiB
  // The baseline's min_device_memory less this one's (negative: it needs
  // more); none when either is unknown.
  std::optional<std::int64_t> saved_bytes{};
};

// What was in memory at the moment explained (the OOM, else the peak of allocated).
struct MomentMemory {
  std::string name{};   // "oom" or "peak"
  std::string phase{};  // the innermost open phase ("forward:0"), "" when none
  std::uint64_t allocated = 0;
  std::uint64_t reserved = 0;
  std::array<std::int64_t, kNumCategories> by_category{};
  std::vector<SiteBytes> top_sites{};
  std::vector<PoolCache> cached_by_pool{};  // at an OOM: each pool that holds segments
};

// A training-side change for a run memscope simulated: one `memscope plan`
// strategy at the run's per-rank batch on the run's device memory. Filled
// by the caller (cli/, which may use run/'s plan search); explain/ prints it.
struct TrainingChange {
  std::string strategy{};           // StrategyName: "bf16 ckpt exp", "defaults"
  bool own = false;                 // the run's own strategy
  std::int64_t max_batch = 0;       // the largest per-rank batch that fits, up to the run's (0: not even 1)
  bool fits = false;                // max_batch reached the run's batch
  std::uint64_t peak_reserved = 0;  // at max_batch (0 when it is 0)
  // The own strategy's peak_reserved less this one's, when both fit.
  std::optional<std::int64_t> saved_bytes{};
  std::string error{};  // the strategy failed for another reason than memory
};

struct TrainingChanges {
  std::string command{};               // the `memscope plan` command line that prints the same figures
  std::int64_t batch_size = 0;         // per rank
  std::uint64_t device_memory = 0;     // the run's
  std::vector<TrainingChange> rows{};  // ranked: those that fit first, by bytes saved; then by max_batch
};

struct MemoryExplanation {
  std::string source{};
  int rank = 0;
  std::size_t requests = 0;
  std::string alloc_conf{};                          // the baseline's settings
  double memory_fraction = 1.0;                      // the baseline's fraction (1: none)
  std::uint64_t gpu_memory = 0;                      // the GPU's whole memory
  std::uint64_t device_memory = 0;                   // what this process had: the baseline's simulated GPU
  std::uint64_t outside_bytes = 0;                   // gpu_memory - device_memory: held by other processes
  std::uint64_t lower_bound = 0;                     // peak live requested bytes
  std::optional<std::uint64_t> min_device_memory{};  // the baseline's (MinDeviceMemory)
  std::optional<ReplayOom> oom{};                    // the baseline's OOM
  std::optional<OomCause> cause{};                   // with `oom`
  std::optional<PoolId> oom_pool{};                  // the OOM's request's pool, when a private one
  std::uint64_t peak_reserved = 0;                   // the baseline's (up to its OOM)
  MomentMemory moment{};
  std::vector<WhatIf> what_ifs{};             // ranked: those that run on this memory first, then by bytes saved
  std::vector<std::string> diagnosis{};       // the few lines a person reads first
  std::vector<std::string> notes{};           // the reader's notes (a snapshot replayed, ...)
  std::optional<TrainingChanges> training{};  // a run memscope simulated (AddTrainingChanges in cli/)
  std::string training_note{};                // why a run's training-side changes are not listed
};

// Ranks `rows` (those that fit first, by bytes saved; then by max_batch) and
// fills saved_bytes from the own row.
void RankTrainingChanges(std::vector<TrainingChange>& rows);

// Explains PATH (what `memscope replay` reads: a JSON-lines or RMM trace, a
// PyTorch snapshot, a run directory or timeline). Errors: the input's (one
// line naming it), a bad --alloc-conf or fraction, a rank the recording lacks.
absl::StatusOr<MemoryExplanation> Explain(const std::string& path, const ExplainOptions& options = {});

// The text `memscope explain` prints: the diagnosis, then the evidence and
// the what-if table.
std::string ExplanationText(const MemoryExplanation& e);

// `memscope explain --json` (docs/explain.md), also the report page's
// "explain" section.
nlohmann::json ExplanationJson(const MemoryExplanation& e);

}  // namespace memscope

#endif  // MEMSCOPE_EXPLAIN_EXPLAIN_H_
