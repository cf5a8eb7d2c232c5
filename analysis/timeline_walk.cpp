#include "analysis/timeline_walk.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace memscope {

TimelineWalk::TimelineWalk(const Timeline& timeline) : timeline_(timeline), model_(timeline.settings) {
  if (!timeline.events.empty()) first_ns_ = last_ns_ = timeline.events.front().time_ns;
}

absl::Status TimelineWalk::Run(const std::vector<WalkListener*>& listeners, std::size_t end) {
  const std::vector<Event>& events = timeline_.events;
  end = std::min(end, events.size());
  if (applied_ == 0) {
    for (WalkListener* l : listeners) l->OnStart(*this);
  }
  while (applied_ < end) {
    const Event& e = events[applied_];
    if (absl::Status s = model_.Apply(e, timeline_.stack_of(applied_)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("rank ", timeline_.rank, ": event ", applied_, ": ", s.message()));
    }
    first_ns_ = std::min(first_ns_, e.time_ns);
    last_ns_ = std::max(last_ns_, e.time_ns);
    // (With no phase open, only a phase mark changes the phases.)
    if (!open_.empty() || e.type == EventType::kPhaseBegin || e.type == EventType::kPhaseEnd) ApplyPhases(e);
    ++applied_;
    for (WalkListener* l : listeners) l->OnEvent(*this, e);
  }
  if (applied_ == events.size()) {
    for (WalkListener* l : listeners) l->OnFinish(*this);
  }
  return absl::OkStatus();
}

void TimelineWalk::ApplyPhases(const Event& e) {
  const std::uint64_t allocated = model_.allocated();
  for (OpenPhase& p : open_) p.peak_allocated = std::max(p.peak_allocated, allocated);
  if (e.type == EventType::kPhaseBegin) {
    open_.push_back({e.phase, e.step(), e.name, e.time_ns, applied_, allocated, e.micro_batch()});
  } else if (e.type == EventType::kPhaseEnd) {
    phase_end_.matched = false;
    phase_end_.depth = open_.size();
    phase_end_.cut.clear();
    for (std::size_t k = open_.size(); k-- > 0;) {
      if (open_[k].ClosedBy(e)) {
        phase_end_.matched = true;
        phase_end_.depth = k;
        phase_end_.phase = open_[k];
        phase_end_.cut.assign(open_.begin() + static_cast<std::ptrdiff_t>(k) + 1, open_.end());
        open_.resize(k);
        break;
      }
    }
  }
}

std::string TimelineWalk::PhaseName(const OpenPhase& p) const {
  return PhaseMarkName(p.phase, p.step, timeline_.str(p.label), p.micro_batch);
}

std::string TimelineWalk::InnermostPhaseName() const { return open_.empty() ? "" : PhaseName(open_.back()); }

}  // namespace memscope
