#include "analysis/analysis.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/sizes.h"

namespace memscope {

std::string FormatMib(std::uint64_t bytes) { return absl::StrCat(bytes / kMiB, "M"); }

std::string FormatMibDelta(std::int64_t bytes) {
  if (bytes == 0) return "0M";
  const std::uint64_t magnitude = bytes < 0 ? 0 - static_cast<std::uint64_t>(bytes) : static_cast<std::uint64_t>(bytes);
  return absl::StrCat(bytes < 0 ? "-" : "+", FormatMib(magnitude));
}

std::string PhaseRowName(const PhaseRow& row) { return PhaseMarkName(row.phase, row.step, row.label); }

namespace {

// The five largest owners of allocated bytes.
std::vector<std::pair<std::string, std::int64_t>> TopOwners(const TraceModel& model, const Timeline& t) {
  std::vector<std::pair<std::string, std::int64_t>> owners;
  for (const auto& [id, bytes] : model.allocated_by_owner()) {
    if (bytes > 0) owners.emplace_back(id == 0 ? "(untagged)" : t.str(id), bytes);
  }
  std::sort(owners.begin(), owners.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (owners.size() > 5) owners.resize(5);
  return owners;
}

// The first walk: the phase table, the peaks (where and what), the first OOM
// and the state at the end.
class FirstWalk final : public WalkListener {
 public:
  explicit FirstWalk(RankReport& r) : r_(r) {}

  void OnEvent(const TimelineWalk& walk, const Event& e) override {
    const TraceModel& model = walk.model();
    const std::size_t i = walk.applied() - 1;
    // The first event at which a new maximum is reached is the peak.
    const bool first = i == 0;
    Track(walk, model.allocated(), first, r_.peak_allocated);
    Track(walk, model.reserved(), first, r_.peak_reserved);
    if (e.type == EventType::kPhaseEnd) {
      r_.phases.push_back(Row(walk, e));
    } else if (e.type == EventType::kOom && !r_.oom) {
      r_.oom = Oom(walk, e);
    }
  }

  void OnFinish(const TimelineWalk& walk) override {
    r_.stats = walk.model().stats();
    r_.fragmentation_at_end = walk.model().Fragmentation();
    r_.lower_bound = walk.model().peak_live_requested();
  }

 private:
  static void Track(const TimelineWalk& walk, std::uint64_t value, bool first, PeakInfo& peak) {
    // (first: event 0 always sets the peaks, whatever their value.)
    if (!first && value <= peak.bytes) return;
    const Event& e = walk.timeline().events[walk.applied() - 1];
    peak.bytes = value;
    peak.event_index = walk.applied() - 1;
    peak.time_ns = e.time_ns;
    // A phase that begins at this very event is not yet the peak's (only
    // event 0 can set a peak at a phase mark, with nothing allocated).
    peak.phase = first && e.type == EventType::kPhaseBegin ? "" : walk.InnermostPhaseName();
    peak.by_category = walk.model().allocated_by_category();
  }

  static PhaseRow Row(const TimelineWalk& walk, const Event& e) {
    const TraceModel& model = walk.model();
    PhaseRow row;
    row.step = e.step();
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
    oom.verdict =
        oom.caused_by_fragmentation
            ? absl::StrCat(oom.fragmentation.free_in_segments,
                           " bytes free in segments but the largest "
                           "free block is ",
                           oom.fragmentation.largest_free_block, ": fragmentation, not capacity, caused this OOM")
            : absl::StrCat("the device had ", oom.device_free, " bytes free and the cache ",
                           oom.fragmentation.free_in_segments, "; the request needed ", oom.rounded,
                           ": capacity caused this OOM");
    return oom;
  }

  RankReport& r_;
};

// The second walk: owners and fragmentation at the peaks the first found.
class SecondWalk final : public WalkListener {
 public:
  explicit SecondWalk(RankReport& r) : r_(r) {}

  void OnEvent(const TimelineWalk& walk, const Event& /*e*/) override {
    const std::size_t i = walk.applied() - 1;
    if (i == r_.peak_allocated.event_index) {
      r_.peak_allocated.top_owners = TopOwners(walk.model(), walk.timeline());
      r_.fragmentation_at_peak = walk.model().Fragmentation();
    }
    if (i == r_.peak_reserved.event_index) r_.peak_reserved.top_owners = TopOwners(walk.model(), walk.timeline());
  }

 private:
  RankReport& r_;
};

}  // namespace

RankAnalysis::RankAnalysis(const Timeline& t) {
  RankReport& r = report_;
  r.rank = t.rank;
  r.device_index = t.device_index;
  r.device_capacity = t.device_capacity;
  r.alloc_conf = t.alloc_conf;
  r.torn_bytes = t.torn_bytes;
  r.wall_start_us = t.wall_start_us;
  r.events = t.events.size();
  first_ = std::make_unique<FirstWalk>(r);
  second_ = std::make_unique<SecondWalk>(r);
}

RankAnalysis::~RankAnalysis() = default;

std::size_t RankAnalysis::second_walk_end() const {
  if (report_.events == 0) return 0;
  return std::max(report_.peak_allocated.event_index, report_.peak_reserved.event_index) + 1;
}

absl::StatusOr<RankReport> AnalyzeRank(const Timeline& t) {
  RankAnalysis analysis(t);
  TimelineWalk first(t);
  if (absl::Status s = first.Run({&analysis.first_walk()}); !s.ok()) return s;
  TimelineWalk second(t);
  if (absl::Status s = second.Run({&analysis.second_walk()}, analysis.second_walk_end()); !s.ok()) return s;
  return std::move(analysis.report());
}

absl::StatusOr<Moment> ParseMoment(std::string_view text) {
  Moment m;
  m.text = std::string(text);
  if (text == "end") return m;
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
    const std::string step_text(text.substr(colon + 1));
    if (!absl::SimpleAtoi(step_text, &m.step) || m.step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--at '", std::string(text), "': the step after ':' must be a non-negative integer"));
    }
  }
  const std::optional<Phase> phase = ParsePhase(name);
  if (name.empty() || !phase) {
    return absl::InvalidArgumentError(
        absl::StrCat("--at '", std::string(text),
                     "': expected end, peak, oom or PHASE:STEP with PHASE one of model, ddp, "
                     "zero_grad, forward, loss, backward, step"));
  }
  m.phase = *phase;
  return m;
}

absl::StatusOr<std::pair<TraceModel, std::size_t>> ModelAt(const Timeline& t, const Moment& moment,
                                                           const RankReport* report) {
  std::size_t end = t.events.size();
  if (moment.kind == Moment::Kind::kPeak) {
    std::optional<RankAnalysis> analysed;
    if (report == nullptr) {
      // The first walk alone finds the peak.
      TimelineWalk first(t);
      if (absl::Status s = first.Run({&analysed.emplace(t).first_walk()}); !s.ok()) return s;
      report = &analysed->report();
    }
    end = t.events.empty() ? 0 : report->peak_allocated.event_index + 1;
  } else if (moment.kind != Moment::Kind::kEnd) {
    std::optional<std::size_t> found;
    for (std::size_t i = 0; i < t.events.size() && !found; ++i) {
      const Event& e = t.events[i];
      if (moment.kind == Moment::Kind::kOom && e.type == EventType::kOom) found = i + 1;
      if (moment.kind == Moment::Kind::kPhaseEnd && e.type == EventType::kPhaseEnd && e.phase == moment.phase &&
          e.step() == moment.step) {
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
  for (const PhaseRow& row : r.phases) {
    const std::string name =
        row.phase == Phase::kUser && !row.label.empty() ? row.label : std::string(PhaseName(row.phase));
    absl::StrAppendFormat(&out, "%-5s %-14s %10s %14s %10s %13s %14s\n",
                          row.step == kNoStep ? std::string("-") : absl::StrCat(row.step), name,
                          FormatMib(row.allocated), FormatMib(row.max_allocated), FormatMib(row.reserved),
                          FormatMib(row.max_reserved), FormatMib(row.peak_allocated_in_phase));
  }
  return out;
}

std::string FragmentationText(const FragmentationInfo& f) {
  return absl::StrFormat(
      "reserved %s, allocated %s, reserved - allocated %s\n"
      "free in segments %s in %d blocks, largest free block %s, fragmentation %.3f\n"
      "inactive split (non-releasable) %s; %d segments\n",
      FormatSize(f.reserved), FormatSize(f.allocated), FormatSize(f.reserved_minus_allocated),
      FormatSize(f.free_in_segments), f.free_blocks, FormatSize(f.largest_free_block), f.fragmentation,
      FormatSize(f.inactive_split_bytes), f.segments);
}

}  // namespace memscope
