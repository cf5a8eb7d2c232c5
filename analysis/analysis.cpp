#include "analysis/analysis.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/sizes.h"
#include "base/terminal_text.h"

namespace memscope {

TableUnit TableUnitFor(std::uint64_t largest) {
  for (const TableUnit unit : {TableUnit{kMiB << 10, "G"}, TableUnit{kMiB, "M"}, TableUnit{1024, "K"}}) {
    if (largest / unit.bytes >= 100) return unit;
  }
  return TableUnit{};
}

std::string FormatInUnit(std::uint64_t bytes, TableUnit unit) { return absl::StrCat(bytes / unit.bytes, unit.suffix); }

std::string FormatDeltaInUnit(std::int64_t bytes, TableUnit unit) {
  if (bytes == 0) return absl::StrCat("0", unit.suffix);
  const std::uint64_t magnitude = bytes < 0 ? 0 - static_cast<std::uint64_t>(bytes) : static_cast<std::uint64_t>(bytes);
  return absl::StrCat(bytes < 0 ? "-" : "+", FormatInUnit(magnitude, unit));
}

std::string PhaseRowName(const PhaseRow& row) { return PhaseMarkName(row.phase, row.step, row.label, row.micro_batch); }

namespace {

// The step column of a phase table: "0", or "0.1" for micro-batch 1 of step
// 0 (--grad-accum), "-" before the first step.
std::string StepText(const PhaseRow& row) {
  std::string step = row.step == kNoStep ? std::string("-") : absl::StrCat(row.step);
  if (row.step != kNoStep && row.micro_batch != kNoMicroBatch) absl::StrAppend(&step, ".", row.micro_batch);
  return step;
}

// The five largest owners of allocated bytes.
std::vector<std::pair<std::string, std::int64_t>> TopOwners(const TraceModel& model, const Timeline& t) {
  std::vector<std::pair<std::string, std::int64_t>> owners;
  model.allocated_by_owner().ForEach([&](std::uint32_t id, std::int64_t bytes) {
    if (bytes > 0) owners.emplace_back(id == 0 ? "(untagged)" : t.str(id), bytes);
  });
  std::sort(owners.begin(), owners.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (owners.size() > 5) owners.resize(5);
  return owners;
}

}  // namespace

std::string SiteOf(const TraceModel::Block& block, const Timeline& t) {
  if (block.stack != 0 && block.stack < t.stacks.size()) return t.stacks[block.stack].site;
  return absl::StrCat(std::string(CategoryName(block.category)), " ",
                      block.owner == 0 ? "(untagged)" : t.str(block.owner));
}

std::vector<SiteBytes> TopSites(const TraceModel& model, const Timeline& t, std::size_t n) {
  // Sum per (stack) or (category, owner) first, then per site text: distinct
  // stacks may have the same user frames.
  absl::flat_hash_map<std::uint64_t, std::pair<std::int64_t, std::uint64_t>> by_key;
  absl::flat_hash_map<std::uint64_t, const TraceModel::Block*> example;
  for (const auto& [addr, b] : model.blocks()) {
    if (b.pending_free) continue;
    const std::uint64_t key =
        b.stack != 0 ? (std::uint64_t{1} << 63) | b.stack : (static_cast<std::uint64_t>(b.category) << 32) | b.owner;
    auto& [bytes, count] = by_key[key];
    bytes += static_cast<std::int64_t>(b.size);
    ++count;
    example.try_emplace(key, &b);
  }
  absl::flat_hash_map<std::string, SiteBytes> by_site;
  for (const auto& [key, sum] : by_key) {
    std::string site = SiteOf(*example[key], t);
    SiteBytes& row = by_site[site];
    row.site = std::move(site);
    row.bytes += sum.first;
    row.allocations += sum.second;
  }
  std::vector<SiteBytes> rows;
  rows.reserve(by_site.size());
  for (auto& [site, row] : by_site) rows.push_back(std::move(row));
  std::sort(rows.begin(), rows.end(), [](const SiteBytes& a, const SiteBytes& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.site < b.site;
  });
  if (rows.size() > n) rows.resize(n);
  return rows;
}

namespace {

// The first walk: the phase table, the peaks (where and what), the first OOM
// and the state at the end.
class FirstWalk final : public WalkListener {
 public:
  FirstWalk(RankReport& r, std::size_t events, bool at_peaks) : r_(r), end_(events), at_peaks_(at_peaks) {}

  // Per event only the comparisons; what a new peak, a phase end, an OOM or
  // the moment `end` records is out of line.
  void OnEvent(const TimelineWalk& walk, const Event& e) override {
    const TraceModel& model = walk.model();
    // The first event at which a new maximum is reached is the peak (event 0
    // always sets both, whatever their value).
    const bool first = walk.applied() == 1;
    if (first || model.allocated() > r_.peak_allocated.bytes) [[unlikely]] {
      NewPeak(walk, model.allocated(), first, r_.peak_allocated, at_allocated_);
    }
    if (first || model.reserved() > r_.peak_reserved.bytes) [[unlikely]] {
      NewPeak(walk, model.reserved(), first, r_.peak_reserved, at_reserved_);
    }
    if (e.type == EventType::kPhaseEnd || e.type == EventType::kOom || walk.applied() == end_) [[unlikely]] {
      Moments(walk, e);
    }
  }

  void OnFinish(const TimelineWalk& walk) override {
    r_.stats = walk.model().stats();
    r_.fragmentation_at_exit = walk.model().Fragmentation();
    if (walk.timeline().events.empty()) r_.fragmentation_at_end = r_.fragmentation_at_exit;
    if (walk.timeline().events.empty()) r_.pools_at_end = BytesByPool(walk.model(), walk.timeline());
    r_.lower_bound = walk.model().peak_live_requested();
    if (at_peaks_) AtPeaks(walk.timeline());
  }

 private:
  // A copy of the model after `applied` events.
  struct Checkpoint {
    std::shared_ptr<const TraceModel> model;
    std::size_t applied = 0;
  };

  // At a new peak: the peak's checkpoint is the latest copy of the model, or
  // a new copy when the latest is `gap_` events or more behind. The state at
  // the final peak is then at most `gap_` events from its checkpoint, and at
  // most one copy is taken per `gap_` events.
  void Keep(const TimelineWalk& walk, Checkpoint& at) {
    if (latest_.model == nullptr || walk.applied() - latest_.applied >= gap_) {
      latest_.model = std::make_shared<const TraceModel>(walk.model());
      latest_.applied = walk.applied();
      // Copying costs about as much as applying a few events per block held:
      // a gap of 16 events per block and segment keeps the copies to a few
      // percent of the walk and the replay from them short.
      gap_ = std::max<std::size_t>(kMinGap, 16 * (walk.model().blocks().size() + walk.model().segments().size()));
    }
    at = latest_;
  }

  // Who held the memory at the peaks (top owners, top sites) and the
  // fragmentation at the peak of allocated: the model at each peak, rebuilt
  // from its checkpoint by applying the events between them (which the walk
  // applied without error).
  void AtPeaks(const Timeline& t) {
    struct Target {
      std::size_t index;
      bool allocated;
      const Checkpoint* from;
    };
    std::vector<Target> targets;
    if (at_allocated_.model != nullptr) targets.push_back({r_.peak_allocated.event_index, true, &at_allocated_});
    if (at_reserved_.model != nullptr) targets.push_back({r_.peak_reserved.event_index, false, &at_reserved_});
    std::sort(targets.begin(), targets.end(), [](const Target& a, const Target& b) { return a.index < b.index; });
    std::optional<TraceModel> model;
    std::size_t applied = 0;
    const Checkpoint* from = nullptr;
    for (const Target& target : targets) {
      if (from != target.from || !model || applied > target.index + 1) {
        from = target.from;
        model.emplace(*from->model);
        applied = from->applied;
      }
      for (; applied < target.index + 1; ++applied) {
        (void)model->Apply(t.events[applied], t.stack_of(applied));
      }
      PeakInfo& peak = target.allocated ? r_.peak_allocated : r_.peak_reserved;
      peak.top_owners = TopOwners(*model, t);
      peak.top_sites = TopSites(*model, t);
      if (target.allocated) r_.fragmentation_at_peak = model->Fragmentation();
    }
    at_allocated_ = at_reserved_ = latest_ = Checkpoint{};
  }

  // Whether a new peak was set.
  static bool Track(const TimelineWalk& walk, std::uint64_t value, bool first, PeakInfo& peak) {
    // (first: event 0 always sets the peaks, whatever their value.)
    if (!first && value <= peak.bytes) return false;
    const Event& e = walk.timeline().events[walk.applied() - 1];
    peak.bytes = value;
    peak.event_index = walk.applied() - 1;
    peak.time_ns = e.time_ns;
    // A phase that begins at this very event is not yet the peak's (only
    // event 0 can set a peak at a phase mark, with nothing allocated).
    peak.phase = first && e.type == EventType::kPhaseBegin ? "" : walk.InnermostPhaseName();
    peak.by_category = walk.model().allocated_by_category();
    return true;
  }

  static PhaseRow Row(const TimelineWalk& walk, const Event& e) {
    const TraceModel& model = walk.model();
    PhaseRow row;
    row.step = e.step();
    row.micro_batch = e.micro_batch();
    row.phase = e.phase;
    row.label = walk.timeline().str(e.name);
    row.allocated = model.allocated();
    row.max_allocated = static_cast<std::uint64_t>(All(model.stats().allocated_bytes).peak);
    row.reserved = model.reserved();
    row.max_reserved = static_cast<std::uint64_t>(All(model.stats().reserved_bytes).peak);
    row.by_category = model.allocated_by_category();
    row.time_ns = e.time_ns;
    row.peak_allocated_in_phase = walk.phase_end().matched ? walk.phase_end().phase.peak_allocated : row.allocated;
    return row;
  }

  static OomReport Oom(const TimelineWalk& walk, const Event& e) {
    OomReport oom;
    oom.event_index = walk.applied() - 1;
    oom.time_ns = e.time_ns;
    oom.phase = walk.InnermostPhaseName();
    oom.requested = e.requested_size;
    oom.rounded = e.size;
    oom.device_free = e.device_free();
    oom.fragmentation = walk.model().Fragmentation();
    oom.caused_by_fragmentation =
        oom.fragmentation.free_in_segments >= oom.rounded && oom.fragmentation.largest_free_block < oom.rounded;
    oom.verdict = oom.caused_by_fragmentation
                      ? absl::StrCat(FormatSize(oom.fragmentation.free_in_segments),
                                     " free in segments but the largest free block is ",
                                     FormatSize(oom.fragmentation.largest_free_block),
                                     ": fragmentation, not capacity, caused this OOM")
                      : absl::StrCat("the device had ", FormatSize(oom.device_free), " free and the cache ",
                                     FormatSize(oom.fragmentation.free_in_segments), "; the request needed ",
                                     FormatSize(oom.rounded), ": capacity caused this OOM");
    oom.top_sites = TopSites(walk.model(), walk.timeline());
    return oom;
  }

  // A phase end, an OOM or the moment `end`.
  [[gnu::noinline]] void Moments(const TimelineWalk& walk, const Event& e) {
    // The moment `end` (EndOfLastStep), found at the first phase end of a
    // step: a recording without steps (an imported snapshot) ends at its last
    // event and is never scanned for one.
    if (e.type == EventType::kPhaseEnd && e.step() != kNoStep && !end_found_) {
      end_ = EndOfLastStep(walk.timeline());  // this event's or a later one's
      end_found_ = true;
    }
    if (walk.applied() == end_) {
      r_.fragmentation_at_end = walk.model().Fragmentation();
      r_.pools_at_end = BytesByPool(walk.model(), walk.timeline());
      r_.model_at_end = std::make_shared<const TraceModel>(walk.model());
      r_.model_at_end_events = walk.applied();
    }
    if (e.type == EventType::kPhaseEnd) {
      r_.phases.push_back(Row(walk, e));
    } else if (e.type == EventType::kOom && !r_.oom) {
      r_.oom = Oom(walk, e);
    }
  }

  [[gnu::noinline]] void NewPeak(const TimelineWalk& walk, std::uint64_t value, bool first, PeakInfo& peak,
                                 Checkpoint& at) {
    if (Track(walk, value, first, peak) && at_peaks_) Keep(walk, at);
  }

  static constexpr std::size_t kMinGap = 4096;

  RankReport& r_;
  // The events up to the moment `end`: all of them until a step's phase end
  // is seen, then EndOfLastStep.
  std::size_t end_;
  bool end_found_ = false;
  const bool at_peaks_;    // take the peaks' owners, sites and fragmentation in this walk
  Checkpoint latest_;
  Checkpoint at_allocated_;
  Checkpoint at_reserved_;
  std::size_t gap_ = kMinGap;
};

// The second walk: owners and fragmentation at the peaks the first found.
class SecondWalk final : public WalkListener {
 public:
  SecondWalk(RankReport& r, bool done) : r_(r), done_(done) {}

  void OnEvent(const TimelineWalk& walk, const Event& /*e*/) override {
    if (done_) return;  // the first walk took them
    const std::size_t i = walk.applied() - 1;
    if (i == r_.peak_allocated.event_index) {
      r_.peak_allocated.top_owners = TopOwners(walk.model(), walk.timeline());
      r_.peak_allocated.top_sites = TopSites(walk.model(), walk.timeline());
      r_.fragmentation_at_peak = walk.model().Fragmentation();
    }
    if (i == r_.peak_reserved.event_index) {
      r_.peak_reserved.top_owners = TopOwners(walk.model(), walk.timeline());
      r_.peak_reserved.top_sites = TopSites(walk.model(), walk.timeline());
    }
  }

 private:
  RankReport& r_;
  const bool done_;
};

}  // namespace

RankAnalysis::RankAnalysis(const Timeline& t, bool peaks_in_first_walk) : peaks_in_first_walk_(peaks_in_first_walk) {
  RankReport& r = report_;
  r.rank = t.rank;
  r.device_index = t.device_index;
  r.device_capacity = t.device_capacity;
  r.alloc_conf = t.alloc_conf;
  r.torn_bytes = t.torn_bytes;
  r.wall_start_us = t.wall_start_us;
  r.events = t.events.size();
  first_ = std::make_unique<FirstWalk>(r, t.events.size(), peaks_in_first_walk);
  second_ = std::make_unique<SecondWalk>(r, peaks_in_first_walk);
}

RankAnalysis::~RankAnalysis() = default;

std::size_t RankAnalysis::second_walk_end() const {
  if (report_.events == 0 || peaks_in_first_walk_) return 0;
  return std::max(report_.peak_allocated.event_index, report_.peak_reserved.event_index) + 1;
}

RunWalks::RunWalks(std::vector<const Timeline*> timelines) : timelines_(std::move(timelines)) {
  for (const Timeline* t : timelines_) analyses_.push_back(std::make_unique<RankAnalysis>(*t));
}

absl::Status RunWalks::First(const std::function<Listeners(std::size_t)>& plan) {
  for (std::size_t i = 0; i < timelines_.size(); ++i) {
    Listeners listeners{&analyses_[i]->first_walk()};
    if (plan) {
      const Listeners more = plan(i);
      listeners.insert(listeners.end(), more.begin(), more.end());
    }
    TimelineWalk walk(*timelines_[i]);
    if (absl::Status s = walk.Run(listeners); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RunWalks::Second(std::size_t i, TimelineWalk& walk, const Listeners& write) {
  Listeners listeners{&analyses_[i]->second_walk()};
  listeners.insert(listeners.end(), write.begin(), write.end());
  return walk.Run(listeners);
}

absl::StatusOr<RankReport> AnalyzeRank(const Timeline& t) {
  RankAnalysis analysis(t, /*peaks_in_first_walk=*/true);
  TimelineWalk first(t);
  if (absl::Status s = first.Run({&analysis.first_walk()}); !s.ok()) return s;
  return std::move(analysis.report());
}

std::size_t EndOfLastStep(const Timeline& t) {
  for (std::size_t i = t.events.size(); i > 0; --i) {
    const Event& e = t.events[i - 1];
    if (e.type == EventType::kPhaseEnd && e.step() != kNoStep) return i;
  }
  return t.events.size();
}

absl::StatusOr<Moment> ParseMoment(std::string_view text) {
  Moment m;
  m.text = std::string(text);
  if (text == "end") return m;
  if (text == "exit") {
    m.kind = Moment::Kind::kExit;
    return m;
  }
  if (text == "peak") {
    m.kind = Moment::Kind::kPeak;
    return m;
  }
  if (text == "oom") {
    m.kind = Moment::Kind::kOom;
    return m;
  }
  m.kind = Moment::Kind::kPhaseEnd;
  const std::size_t colon = text.rfind(':');
  const std::string_view name = colon == std::string_view::npos ? text : text.substr(0, colon);
  if (colon != std::string_view::npos) {
    std::string step_text(text.substr(colon + 1));
    bool ok = true;
    if (const std::size_t dot = step_text.find('.'); dot != std::string::npos) {
      ok = absl::SimpleAtoi(step_text.substr(dot + 1), &m.micro_batch) && m.micro_batch >= 0;
      step_text.resize(dot);
    }
    if (!ok || !absl::SimpleAtoi(step_text, &m.step) || m.step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--at '", std::string(text),
                       "': after ':' comes the step, a non-negative integer, optionally with a micro-batch "
                       "(backward:0.1)"));
    }
  }
  const std::optional<Phase> phase = ParsePhase(name);
  if (name.empty() || !phase) {
    return absl::InvalidArgumentError(
        absl::StrCat("--at '", std::string(text),
                     "': expected end, exit, peak, oom or PHASE:STEP with PHASE one of model, ddp, "
                     "zero_grad, forward, loss, backward, step"));
  }
  m.phase = *phase;
  return m;
}

absl::StatusOr<std::pair<TraceModel, std::size_t>> ModelAt(const Timeline& t, const Moment& moment,
                                                           const RankReport* report) {
  std::size_t end = t.events.size();
  if (moment.kind == Moment::Kind::kEnd) {
    if (report != nullptr && report->model_at_end != nullptr && report->events == t.events.size()) {
      return std::make_pair(*report->model_at_end, report->model_at_end_events);  // the first walk kept it
    }
    end = EndOfLastStep(t);
  } else if (moment.kind == Moment::Kind::kPeak) {
    std::optional<RunWalks> analysed;
    if (report == nullptr) {
      // The first walk alone finds the peak.
      if (absl::Status s = analysed.emplace(std::vector<const Timeline*>{&t}).First(); !s.ok()) return s;
      report = &analysed->analysis(0).report();
    }
    end = t.events.empty() ? 0 : report->peak_allocated.event_index + 1;
  } else if (moment.kind != Moment::Kind::kExit) {
    // The first OOM; a phase's end: the last of its step, or of its micro-batch.
    std::optional<std::size_t> found;
    for (std::size_t i = 0; i < t.events.size(); ++i) {
      const Event& e = t.events[i];
      if (moment.kind == Moment::Kind::kOom && e.type == EventType::kOom) {
        found = i + 1;
        break;
      }
      if (moment.kind == Moment::Kind::kPhaseEnd && e.type == EventType::kPhaseEnd && e.phase == moment.phase &&
          e.step() == moment.step && (moment.micro_batch == kNoMicroBatch || e.micro_batch() == moment.micro_batch)) {
        found = i + 1;
      }
    }
    if (!found) {
      return absl::NotFoundError(absl::StrCat("rank ", t.rank, " has no ",
                                              moment.kind == Moment::Kind::kOom ? "OOM" : "end of phase ",
                                              moment.kind == Moment::Kind::kOom ? "" : moment.text));
    }
    end = *found;
  }
  TimelineWalk walk(t);
  if (absl::Status s = walk.Run({}, end); !s.ok()) return s;
  return std::make_pair(std::move(walk).TakeModel(), end);
}

std::string PhaseTableText(const RankReport& r) {
  std::string out = absl::StrFormat("%-5s %-14s %10s %14s %10s %13s %14s\n", "step", "phase", "allocated",
                                    "max allocated", "reserved", "max reserved", "peak in phase");
  std::uint64_t largest = 0;
  for (const PhaseRow& row : r.phases) {
    largest = std::max(
        {largest, row.allocated, row.max_allocated, row.reserved, row.max_reserved, row.peak_allocated_in_phase});
  }
  const TableUnit unit = TableUnitFor(largest);
  for (const PhaseRow& row : r.phases) {
    const std::string name =
        row.phase == Phase::kUser && !row.label.empty() ? EscapeForTerminal(row.label) : std::string(PhaseName(row.phase));
    absl::StrAppendFormat(&out, "%-5s %-14s %10s %14s %10s %13s %14s\n", StepText(row), name,
                          FormatInUnit(row.allocated, unit), FormatInUnit(row.max_allocated, unit),
                          FormatInUnit(row.reserved, unit), FormatInUnit(row.max_reserved, unit),
                          FormatInUnit(row.peak_allocated_in_phase, unit));
  }
  return out;
}

std::string PhaseCategoryTableText(const RankReport& r) {
  std::vector<int> shown;  // the categories that hold bytes at some phase end
  std::uint64_t largest = 0;
  for (int c = 0; c < kNumCategories; ++c) {
    bool any = false;
    for (const PhaseRow& row : r.phases) {
      const auto bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(row.by_category[c], 0));
      any = any || bytes > 0;
      largest = std::max(largest, bytes);
    }
    if (any) shown.push_back(c);
  }
  const TableUnit unit = TableUnitFor(largest);
  std::string out = absl::StrFormat("%-5s %-14s", "step", "phase");
  for (const int c : shown) absl::StrAppendFormat(&out, " %15s", std::string(CategoryName(static_cast<Category>(c))));
  out += "\n";
  for (const PhaseRow& row : r.phases) {
    const std::string name =
        row.phase == Phase::kUser && !row.label.empty() ? EscapeForTerminal(row.label) : std::string(PhaseName(row.phase));
    absl::StrAppendFormat(&out, "%-5s %-14s", StepText(row), name);
    for (const int c : shown) {
      absl::StrAppendFormat(
          &out, " %15s", FormatInUnit(static_cast<std::uint64_t>(std::max<std::int64_t>(row.by_category[c], 0)), unit));
    }
    out += "\n";
  }
  return out;
}

std::vector<PoolBytes> BytesByPool(const TraceModel& model, const Timeline& t) {
  if (!t.has_private_pools()) return {};
  std::vector<PoolBytes> out(t.pools.size());
  for (std::size_t k = 0; k < t.pools.size(); ++k) out[k].pool = t.pools[k];
  for (const auto& [addr, seg] : model.segments()) {
    if (seg.pool >= out.size()) continue;  // (no pool index past Timeline::pools is recorded)
    PoolBytes& p = out[seg.pool];
    p.reserved += seg.size;
    ++p.segments;
    for (auto it = model.blocks().lower_bound(addr); it != model.blocks().end() && it->first < addr + seg.size; ++it) {
      if (!it->second.pending_free) p.allocated += it->second.size;
    }
  }
  return out;
}

std::string PoolIdText(PoolId pool) { return absl::StrCat("(", pool.first, ", ", pool.second, ")"); }

std::string PoolsText(const std::vector<PoolBytes>& pools) {
  if (pools.empty()) return "";
  std::string out = "by pool:\n";
  for (const PoolBytes& p : pools) {
    absl::StrAppend(&out, "  ", p.pool.is_default() ? "default pool " : "private pool ", PoolIdText(p.pool),
                    ": reserved ", FormatSize(p.reserved), " in ", Counted(p.segments, "segment"), ", allocated ",
                    FormatSize(p.allocated), "\n");
  }
  return out;
}

std::optional<PinnedHostBytes> PinnedHostOf(const Timeline& t) {
  if (!t.host.present) return std::nullopt;
  PinnedHostBytes out;
  for (const HostSegment& s : t.host.segments) {
    ++out.segments;
    out.reserved += s.total_size;
    for (const HostBlock& b : s.blocks) {
      if (b.state == "active_allocated") {
        out.allocated += b.size;
        out.requested += b.requested_size;
        ++out.allocated_blocks;
      } else if (b.state == "active_pending_free" || b.state == "active_awaiting_free") {
        out.pending_free += b.size;
        ++out.pending_free_blocks;
      }
    }
  }
  for (const HostTraceEntry& e : t.host.trace) {
    ++out.trace_entries;
    auto it = std::find_if(out.trace_actions.begin(), out.trace_actions.end(),
                           [&](const auto& a) { return a.first == e.action; });
    if (it == out.trace_actions.end()) it = out.trace_actions.insert(it, {e.action, 0});
    ++it->second;
  }
  return out;
}

std::string PinnedHostText(const std::optional<PinnedHostBytes>& host) {
  if (!host) return "";
  std::string out = absl::StrCat("pinned host memory: reserved ", FormatSize(host->reserved), " in ",
                                 Counted(host->segments, "segment"), ", allocated ", FormatSize(host->allocated),
                                 " in ", Counted(host->allocated_blocks, "block"), " (requested ",
                                 FormatSize(host->requested), ")");
  if (host->pending_free_blocks > 0) {
    absl::StrAppend(&out, ", ", FormatSize(host->pending_free), " in ", Counted(host->pending_free_blocks, "block"),
                    " waiting on stream events");
  }
  absl::StrAppend(&out, "\n  host trace: ", host->trace_entries, host->trace_entries == 1 ? " entry" : " entries");
  for (std::size_t k = 0; k < host->trace_actions.size(); ++k) {
    absl::StrAppend(&out, k == 0 ? " (" : ", ", host->trace_actions[k].second, " ", host->trace_actions[k].first);
  }
  absl::StrAppend(&out, host->trace_actions.empty() ? "" : ")", "\n");
  return out;
}

std::string FragmentationText(const FragmentationInfo& f) {
  std::string out = absl::StrFormat(
      "reserved %s, allocated %s, reserved - allocated %s\n"
      "free in segments %s in %s, largest free block %s, fragmentation %.3f\n"
      "inactive split (non-releasable) %s; %s\n",
      FormatSize(f.reserved), FormatSize(f.allocated), FormatSize(f.reserved_minus_allocated),
      FormatSize(f.free_in_segments), Counted(f.free_blocks, "block"), FormatSize(f.largest_free_block),
      f.fragmentation, FormatSize(f.inactive_split_bytes), Counted(f.segments, "segment"));
  if (f.free_in_segments == 0) return out;
  // The free bytes apart: what empty_cache() would return, and what it keeps.
  absl::StrAppendFormat(&out,
                        "releasable %s (%.3f of reserved): %s wholly free, which empty_cache() would release\n"
                        "fragmented %s (%.3f of reserved): free inside %s holding live blocks\n",
                        FormatSize(f.releasable_bytes), f.releasable_ratio(), Counted(f.releasable_segments, "segment"),
                        FormatSize(f.fragmented_bytes), f.fragmented_ratio(),
                        Counted(f.fragmented_segments, "segment"));
  return out;
}

}  // namespace memscope
