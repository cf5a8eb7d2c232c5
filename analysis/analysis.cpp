#include "analysis/analysis.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/sizes.h"

namespace memscope {
namespace {

struct OpenPhase {
  Phase phase;
  std::int64_t step;
  std::uint32_t label;
  std::uint64_t peak;  // running max of allocated since the phase began
};

std::string OpenPhaseName(const Timeline& t, const std::vector<OpenPhase>& open) {
  if (open.empty()) return "";
  return PhaseMarkName(open.back().phase, open.back().step, t.str(open.back().label));
}

absl::Status ApplyAt(TraceModel& model, const Timeline& t, std::size_t i) {
  absl::Status s = model.Apply(t.events[i]);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("rank ", t.rank, ": event ", i, ": ", s.message()));
  return s;
}

// The model after applying events [0, end).
absl::StatusOr<TraceModel> Replay(const Timeline& t, std::size_t end) {
  TraceModel model(TimelineConfig(t));
  for (std::size_t i = 0; i < end; ++i) {
    if (absl::Status s = ApplyAt(model, t, i); !s.ok()) return s;
  }
  return model;
}

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

}  // namespace

AllocatorConfig TimelineConfig(const Timeline& timeline) {
  absl::StatusOr<AllocatorConfig> c = AllocatorConfig::Parse(timeline.alloc_conf);
  return c.ok() ? *c : AllocatorConfig{};
}

std::string FormatMib(std::uint64_t bytes) { return absl::StrCat(bytes / kMiB, "M"); }

std::string FormatMibDelta(std::int64_t bytes) {
  if (bytes == 0) return "0M";
  const std::uint64_t magnitude = bytes < 0 ? 0 - static_cast<std::uint64_t>(bytes) : static_cast<std::uint64_t>(bytes);
  return absl::StrCat(bytes < 0 ? "-" : "+", FormatMib(magnitude));
}

std::string PhaseRowName(const PhaseRow& row) { return PhaseMarkName(row.phase, row.step, row.label); }

absl::StatusOr<RankReport> AnalyzeRank(const Timeline& t) {
  RankReport r;
  r.rank = t.rank;
  r.device_index = t.device_index;
  r.device_capacity = t.device_capacity;
  r.alloc_conf = t.alloc_conf;
  r.torn_bytes = t.torn_bytes;
  r.wall_start_us = t.wall_start_us;
  r.events = t.events.size();
  TraceModel model(TimelineConfig(t));
  std::vector<OpenPhase> open;
  std::optional<std::size_t> peak_alloc_index;
  std::optional<std::size_t> peak_reserved_index;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const Event& e = t.events[i];
    if (absl::Status s = ApplyAt(model, t, i); !s.ok()) return s;
    const std::uint64_t allocated = model.allocated();
    const std::uint64_t reserved = model.reserved();
    for (OpenPhase& p : open) p.peak = std::max(p.peak, allocated);
    // The first event at which a new maximum is reached is the peak.
    auto track = [&](std::uint64_t value, std::optional<std::size_t>& index, PeakInfo& peak) {
      if (index && value <= peak.bytes) return;
      index = i;
      peak.bytes = value;
      peak.event_index = i;
      peak.time_ns = e.time_ns;
      peak.phase = OpenPhaseName(t, open);
      peak.by_category = model.allocated_by_category();
    };
    track(allocated, peak_alloc_index, r.peak_allocated);
    track(reserved, peak_reserved_index, r.peak_reserved);
    if (e.type == EventType::kPhaseBegin) {
      open.push_back({e.phase, e.step(), e.name, allocated});
    } else if (e.type == EventType::kPhaseEnd) {
      PhaseRow row;
      row.step = e.step();
      row.phase = e.phase;
      row.label = t.str(e.name);
      row.allocated = allocated;
      row.max_allocated = static_cast<std::uint64_t>(All(model.stats().allocated_bytes).peak);
      row.reserved = reserved;
      row.max_reserved = static_cast<std::uint64_t>(All(model.stats().reserved_bytes).peak);
      row.by_category = model.allocated_by_category();
      row.time_ns = e.time_ns;
      row.peak_allocated_in_phase = allocated;
      // Close the matching open phase (and any left open inside it).
      for (std::size_t k = open.size(); k-- > 0;) {
        if (open[k].phase == e.phase && open[k].step == e.step() && open[k].label == e.name) {
          row.peak_allocated_in_phase = open[k].peak;
          open.resize(k);
          break;
        }
      }
      r.phases.push_back(std::move(row));
    } else if (e.type == EventType::kOom && !r.oom) {
      OomReport oom;
      oom.event_index = i;
      oom.time_ns = e.time_ns;
      oom.phase = OpenPhaseName(t, open);
      oom.requested = e.requested_size;
      oom.rounded = e.size;
      oom.device_free = e.device_free();
      oom.fragmentation = model.Fragmentation();
      oom.caused_by_fragmentation = oom.fragmentation.free_in_segments >= oom.rounded &&
                                    oom.fragmentation.largest_free_block < oom.rounded;
      oom.verdict = oom.caused_by_fragmentation
                        ? absl::StrCat(oom.fragmentation.free_in_segments, " bytes free in segments but the largest "
                                       "free block is ", oom.fragmentation.largest_free_block,
                                       ": fragmentation, not capacity, caused this OOM")
                        : absl::StrCat("the device had ", oom.device_free, " bytes free and the cache ",
                                       oom.fragmentation.free_in_segments, "; the request needed ", oom.rounded,
                                       ": capacity caused this OOM");
      r.oom = std::move(oom);
    }
  }
  r.stats = model.stats();
  r.fragmentation_at_end = model.Fragmentation();
  r.lower_bound = model.peak_live_requested();

  // Second passes: owners and fragmentation at the peaks.
  if (peak_alloc_index) {
    absl::StatusOr<TraceModel> at = Replay(t, *peak_alloc_index + 1);
    if (!at.ok()) return at.status();
    r.peak_allocated.top_owners = TopOwners(*at, t);
    r.fragmentation_at_peak = at->Fragmentation();
  }
  if (peak_reserved_index) {
    absl::StatusOr<TraceModel> at = Replay(t, *peak_reserved_index + 1);
    if (!at.ok()) return at.status();
    r.peak_reserved.top_owners = TopOwners(*at, t);
  }
  return r;
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
      return absl::InvalidArgumentError(absl::StrCat("--at '", std::string(text),
                                                     "': the step after ':' must be a non-negative integer"));
    }
  }
  const std::optional<Phase> phase = ParsePhase(name);
  if (name.empty() || !phase) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--at '", std::string(text), "': expected end, peak, oom or PHASE:STEP with PHASE one of model, ddp, "
        "zero_grad, forward, loss, backward, step"));
  }
  m.phase = *phase;
  return m;
}

absl::StatusOr<std::pair<TraceModel, std::size_t>> ModelAt(const Timeline& t, const Moment& moment,
                                                           const RankReport* report) {
  std::size_t end = t.events.size();
  if (moment.kind == Moment::Kind::kPeak) {
    std::optional<RankReport> analysed;
    if (report == nullptr) {
      absl::StatusOr<RankReport> r = AnalyzeRank(t);
      if (!r.ok()) return r.status();
      report = &analysed.emplace(std::move(*r));
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
  absl::StatusOr<TraceModel> model = Replay(t, end);
  if (!model.ok()) return model.status();
  return std::make_pair(std::move(*model), end);
}

std::string PhaseTableText(const RankReport& r) {
  std::string out = absl::StrFormat("%-5s %-14s %10s %14s %10s %13s %14s\n", "step", "phase", "allocated",
                                    "max allocated", "reserved", "max reserved", "peak in phase");
  for (const PhaseRow& row : r.phases) {
    const std::string name = row.phase == Phase::kUser && !row.label.empty() ? row.label
                                                                              : std::string(PhaseName(row.phase));
    absl::StrAppendFormat(&out, "%-5s %-14s %10s %14s %10s %13s %14s\n",
                          row.step == kNoStep ? std::string("-") : absl::StrCat(row.step), name, FormatMib(row.allocated),
                          FormatMib(row.max_allocated), FormatMib(row.reserved), FormatMib(row.max_reserved),
                          FormatMib(row.peak_allocated_in_phase));
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
