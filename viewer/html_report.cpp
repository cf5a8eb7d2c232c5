#include "viewer/html_report.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "analysis/counter_thinning.h"
#include "analysis/timeline_walk.h"
#include "analysis/trace_model.h"
#include "exporters/report.h"
#include "viewer/assets.h"

namespace memscope {
namespace {

constexpr int kKindInactiveSplit = 10;  // free, in a segment holding allocations
constexpr int kKindFree = 11;           // free, in an unused (releasable) segment
constexpr int kKindPendingFree = 12;    // freed, waiting on a stream event
constexpr int kNumKinds = 13;

// What the page draws of a counter sample besides allocated and reserved.
struct SamplePayload {
  std::int64_t t = 0;
  std::array<std::int64_t, kNumCategories> by_category{};
};

struct Piece {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  int kind = 0;
  int owner = 0;
};

// Neighbouring pieces of the same kind become one (owner kept when equal).
std::vector<Piece> MergeSameKind(const std::vector<Piece>& in) {
  std::vector<Piece> out;
  for (const Piece& p : in) {
    if (!out.empty() && out.back().kind == p.kind && out.back().offset + out.back().size == p.offset) {
      out.back().size += p.size;
      if (out.back().owner != p.owner) out.back().owner = 0;
    } else {
      out.push_back(p);
    }
  }
  return out;
}

// `slices` equal slices of the segment, each drawn as the kind holding most
// of its bytes, then merged.
std::vector<Piece> Slice(const std::vector<Piece>& in, std::uint64_t segment_size, std::size_t slices) {
  std::vector<Piece> out;
  std::size_t next = 0;  // the piece the current slice starts in
  for (std::size_t s = 0; s < slices; ++s) {
    const std::uint64_t begin = segment_size / slices * s;
    const std::uint64_t end = s + 1 == slices ? segment_size : segment_size / slices * (s + 1);
    if (end <= begin) continue;
    std::array<std::uint64_t, kNumKinds> bytes{};
    std::uint64_t pos = begin;
    while (pos < end && next < in.size()) {
      const Piece& p = in[next];
      const std::uint64_t piece_end = p.offset + p.size;
      const std::uint64_t take_end = std::min(end, piece_end);
      if (take_end > pos) bytes[static_cast<std::size_t>(p.kind)] += take_end - pos;
      pos = std::max(pos, take_end);
      if (piece_end > end) break;  // the piece goes on into the next slice
      ++next;
    }
    const auto best = std::max_element(bytes.begin(), bytes.end());
    out.push_back({begin, end - begin, static_cast<int>(best - bytes.begin()), 0});
  }
  return MergeSameKind(out);
}

class OwnerTable {
 public:
  explicit OwnerTable(const Timeline& t) : t_(t) { names_.push_back(""); }
  int Index(std::uint32_t id) {
    if (id == 0) return 0;
    auto [it, inserted] = index_.try_emplace(id, static_cast<int>(names_.size()));
    if (inserted) names_.push_back(t_.str(id));
    return it->second;
  }
  nlohmann::json Json() const { return names_; }

 private:
  const Timeline& t_;
  absl::flat_hash_map<std::uint32_t, int> index_;
  std::vector<std::string> names_;
};

nlohmann::json SegmentMap(const TraceModel& m, const HtmlReportOptions& o, OwnerTable& owners) {
  std::vector<std::pair<std::uint64_t, const TraceModel::Segment*>> segments;
  for (const auto& [addr, seg] : m.segments()) segments.emplace_back(addr, &seg);
  if (segments.size() > o.max_segments_per_moment) {
    std::stable_sort(segments.begin(), segments.end(),
                     [](const auto& x, const auto& y) { return x.second->size > y.second->size; });
    segments.resize(o.max_segments_per_moment);
    std::sort(segments.begin(), segments.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  }
  const std::size_t per_segment =
      std::clamp<std::size_t>(o.max_blocks_per_moment / std::max<std::size_t>(1, segments.size()), 16,
                              std::max<std::size_t>(16, o.max_blocks_per_segment));
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [addr, seg] : segments) {
    std::vector<Piece> pieces;
    bool has_active = false;
    for (auto it = m.blocks().lower_bound(addr); it != m.blocks().end() && it->first < addr + seg->size; ++it) {
      has_active = true;
    }
    const int gap_kind = has_active ? kKindInactiveSplit : kKindFree;
    std::uint64_t pos = 0;
    for (auto it = m.blocks().lower_bound(addr); it != m.blocks().end() && it->first < addr + seg->size; ++it) {
      const std::uint64_t off = it->first - addr;
      if (off > pos) pieces.push_back({pos, off - pos, gap_kind, 0});
      const TraceModel::Block& b = it->second;
      pieces.push_back(
          {off, b.size, b.pending_free ? kKindPendingFree : static_cast<int>(b.category), owners.Index(b.owner)});
      pos = std::max(pos, off + b.size);
    }
    if (pos < seg->size) pieces.push_back({pos, seg->size - pos, gap_kind, 0});
    bool merged = false;
    if (pieces.size() > per_segment) {
      merged = true;
      pieces = MergeSameKind(pieces);
      if (pieces.size() > per_segment) pieces = Slice(pieces, seg->size, per_segment);
    }
    nlohmann::json blocks = nlohmann::json::array();
    for (const Piece& p : pieces) blocks.push_back({p.offset, p.size, p.kind, p.owner});
    out.push_back({{"addr", addr},
                   {"size", seg->size},
                   {"pool", seg->small ? "small" : "large"},
                   {"stream", seg->stream},
                   {"expandable", seg->expandable},
                   {"merged", merged},
                   {"blocks", std::move(blocks)}});
  }
  return out;
}

// The phase rows (indices into report.phases) that get a segment map.
std::vector<bool> ChooseMoments(const RankReport& r, std::size_t max_moments) {
  const std::vector<PhaseRow>& rows = r.phases;
  std::vector<bool> keep(rows.size(), false);
  if (rows.size() <= max_moments) {
    std::fill(keep.begin(), keep.end(), true);
    return keep;
  }
  std::vector<std::int64_t> steps;  // distinct, in order of appearance
  std::size_t without_step = 0;
  for (const PhaseRow& row : rows) {
    if (row.step == kNoStep) {
      ++without_step;
    } else if (std::find(steps.begin(), steps.end(), row.step) == steps.end()) {
      steps.push_back(row.step);
    }
  }
  std::set<std::int64_t> chosen;
  if (!steps.empty()) {
    const std::size_t budget = max_moments > without_step ? max_moments - without_step : 1;
    const std::size_t per_step = std::max<std::size_t>(1, (rows.size() - without_step) / steps.size());
    const std::size_t k = std::max<std::size_t>(2, budget / per_step);
    // The steps holding the peak and the OOM: the first phase ending after them.
    auto step_at = [&](std::int64_t t) {
      for (const PhaseRow& row : rows) {
        if (row.step != kNoStep && row.time_ns >= t) return row.step;
      }
      return steps.back();
    };
    chosen.insert(steps.front());
    chosen.insert(steps.back());
    chosen.insert(step_at(r.peak_allocated.time_ns));
    if (r.oom) chosen.insert(step_at(r.oom->time_ns));
    for (std::size_t j = 0; j < k && chosen.size() < k; ++j) {
      chosen.insert(steps[k <= 1 ? 0 : j * (steps.size() - 1) / (k - 1)]);
    }
  }
  for (std::size_t i = 0; i < rows.size(); ++i) keep[i] = rows[i].step == kNoStep || chosen.count(rows[i].step) > 0;
  return keep;
}

}  // namespace

class ViewerRankListener::Impl {
 public:
  Impl(const Timeline& t, const RankReport& r, const HtmlReportOptions& o)
      : t_(t),
        r_(r),
        o_(o),
        thinning_(ThinningPolicy::Viewer(o.max_timeline_samples), SampleSpanOf(t)),
        moment_rows_(ChooseMoments(r, std::max<std::size_t>(o.max_phase_moments, 1))),
        owners_(t) {}

  void OnEvent(const TimelineWalk& walk, const Event& e);
  void OnFinish(const TimelineWalk& walk) {
    first_t_ = walk.first_ns();
    last_t_ = walk.last_ns();
    // `end` is after the last step, `exit` after the last event (analysis.h).
    Capture(walk.model(), end_events_ < t_.events.size() ? "exit" : "end", last_t_, t_.events.size());
  }
  nlohmann::json TakeData();

 private:
  int Capture(const TraceModel& m, const std::string& key, std::int64_t time, std::size_t event) {
    moments_.push_back({{"key", key},
                        {"t", time},
                        {"event", event},
                        {"fragmentation", FragmentationJson(m.Fragmentation())},
                        {"segments_total", m.segments().size()},
                        {"segments", SegmentMap(m, o_, owners_)}});
    return static_cast<int>(moments_.size() - 1);
  }
  void OnPhaseEnd(const TimelineWalk& walk, const Event& e);
  nlohmann::json SamplesJson();

  const Timeline& t_;
  const RankReport& r_;
  const HtmlReportOptions o_;
  CounterThinning<SamplePayload> thinning_;
  const std::vector<bool> moment_rows_;  // the phase rows that get a segment map
  OwnerTable owners_;
  nlohmann::json moments_ = nlohmann::json::array();
  nlohmann::json bands_ = nlohmann::json::array();
  std::map<std::int64_t, std::int64_t> step_begin_;
  nlohmann::json marks_ = nlohmann::json::array();
  std::size_t phase_ends_ = 0;
  const std::size_t end_events_ = EndOfLastStep(t_);  // the moment `end`
  std::int64_t first_t_ = 0;
  std::int64_t last_t_ = 0;
};

void ViewerRankListener::Impl::OnEvent(const TimelineWalk& walk, const Event& e) {
  const TraceModel& model = walk.model();
  const std::size_t i = walk.applied() - 1;
  if (ChangesMemory(e.type)) {
    thinning_.Observe(e.time_ns, model.allocated(), model.reserved(), {e.time_ns, model.allocated_by_category()});
  }
  switch (e.type) {
    case EventType::kPhaseBegin:
      if (e.step() != kNoStep) step_begin_.try_emplace(e.step(), e.time_ns);
      break;
    case EventType::kPhaseEnd: OnPhaseEnd(walk, e); break;
    case EventType::kMark:
      if (marks_.size() < 200) marks_.push_back({{"t", e.time_ns}, {"text", t_.str(e.name)}});
      break;
    default: break;
  }
  if (i == r_.peak_allocated.event_index) Capture(model, "peak", e.time_ns, i + 1);
  if (i + 1 == end_events_ && end_events_ < t_.events.size()) Capture(model, "end", e.time_ns, i + 1);
  if (r_.oom && i == r_.oom->event_index) Capture(model, "oom", e.time_ns, i + 1);
}

void ViewerRankListener::Impl::OnPhaseEnd(const TimelineWalk& walk, const Event& e) {
  const PhaseEnd& end = walk.phase_end();
  const std::int64_t begin = end.matched ? end.phase.begin_ns : e.time_ns;
  const std::string name = PhaseMarkName(e.phase, e.step(), t_.str(e.name), e.micro_batch());
  int moment = -1;
  if (phase_ends_ < moment_rows_.size() && moment_rows_[phase_ends_]) {
    moment = Capture(walk.model(), name, e.time_ns, walk.applied());
  }
  bands_.push_back({{"name", name}, {"begin", begin}, {"end", e.time_ns}, {"depth", end.depth}, {"moment", moment}});
  ++phase_ends_;
}

nlohmann::json ViewerRankListener::Impl::SamplesJson() {
  const std::vector<CounterThinning<SamplePayload>::Sample> kept = thinning_.Kept();
  nlohmann::json ts = nlohmann::json::array(), allocated = nlohmann::json::array(), reserved = nlohmann::json::array();
  std::array<bool, kNumCategories> present{};
  for (const auto& s : kept) {
    ts.push_back(s.payload.t);
    allocated.push_back(s.allocated);
    reserved.push_back(s.reserved);
    for (int c = 0; c < kNumCategories; ++c) present[c] = present[c] || s.payload.by_category[c] != 0;
  }
  nlohmann::json by_category = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c) {
    if (!present[c]) continue;
    nlohmann::json series = nlohmann::json::array();
    for (const auto& s : kept) series.push_back(s.payload.by_category[c]);
    by_category[std::string(CategoryName(static_cast<Category>(c)))] = std::move(series);
  }
  return {{"t", std::move(ts)},
          {"allocated", std::move(allocated)},
          {"reserved", std::move(reserved)},
          {"by_category", std::move(by_category)}};
}

nlohmann::json ViewerRankListener::Impl::TakeData() {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& [step, begin] : step_begin_) steps.push_back({{"step", step}, {"t", begin}});
  const std::uint64_t samples_total = thinning_.observed();
  const bool thinned = thinning_.thinned();
  nlohmann::json samples = SamplesJson();

  // report.json's numbers; the phase rows without their by_category (the
  // page does not show it, and it is most of the size of a long run's table).
  nlohmann::json j = ReportJson({&t_}, {r_})["ranks"][0];
  for (nlohmann::json& row : j["phases"]) row.erase("by_category");
  return nlohmann::json{
      {"rank", t_.rank},
      {"report", std::move(j)},
      {"t0", first_t_},
      {"t1", last_t_},
      {"peak_allocated_t", r_.peak_allocated.time_ns},
      {"peak_reserved_t", r_.peak_reserved.time_ns},
      {"oom_t", r_.oom ? nlohmann::json(r_.oom->time_ns) : nlohmann::json(nullptr)},
      {"samples_total", samples_total},
      {"thinned", thinned},
      {"samples", std::move(samples)},
      {"bands", std::move(bands_)},
      {"steps", std::move(steps)},
      {"marks", std::move(marks_)},
      {"moments", std::move(moments_)},
      {"owners", owners_.Json()},
  };
}

ViewerRankListener::ViewerRankListener(const Timeline& timeline, const RankReport& report,
                                       const HtmlReportOptions& options)
    : impl_(std::make_unique<Impl>(timeline, report, options)) {}
ViewerRankListener::~ViewerRankListener() = default;
void ViewerRankListener::OnEvent(const TimelineWalk& walk, const Event& event) { impl_->OnEvent(walk, event); }
void ViewerRankListener::OnFinish(const TimelineWalk& walk) { impl_->OnFinish(walk); }
nlohmann::json ViewerRankListener::TakeData() { return impl_->TakeData(); }

absl::StatusOr<nlohmann::json> ViewerRankData(const Timeline& t, const RankReport& r, const HtmlReportOptions& o) {
  TimelineWalk walk(t);
  ViewerRankListener viewer(t, r, o);
  if (absl::Status s = walk.Run({&viewer}); !s.ok()) return s;
  return viewer.TakeData();
}

absl::StatusOr<std::string> HtmlReport(const std::vector<HtmlReportRun>& runs, const HtmlReportOptions& options) {
  std::vector<HtmlPageRun> pages;
  for (const HtmlReportRun& run : runs) {
    HtmlPageRun& page = pages.emplace_back();
    page.label = run.label;
    for (std::size_t i = 0; i < run.timelines.size(); ++i) {
      const Timeline& t = *run.timelines[i];
      page.world_size = std::max(page.world_size, t.world_size);
      std::optional<RankReport> analysed;
      const RankReport* r = i < run.reports.size() ? run.reports[i] : nullptr;
      if (r == nullptr) {
        absl::StatusOr<RankReport> a = AnalyzeRank(t);
        if (!a.ok()) return a.status();
        r = &analysed.emplace(std::move(*a));
      }
      absl::StatusOr<nlohmann::json> data = ViewerRankData(t, *r, options);
      if (!data.ok()) return data.status();
      page.ranks.push_back(std::move(*data));
    }
  }
  return HtmlPage(std::move(pages));
}

absl::StatusOr<std::string> HtmlPage(std::vector<HtmlPageRun> runs) {
  nlohmann::json runs_json = nlohmann::json::array();
  for (HtmlPageRun& run : runs) {
    nlohmann::json ranks = nlohmann::json::array();
    for (nlohmann::json& data : run.ranks) ranks.push_back(std::move(data));
    runs_json.push_back({{"label", run.label}, {"world_size", run.world_size}, {"ranks", std::move(ranks)}});
  }
  nlohmann::json categories = nlohmann::json::array();
  for (int c = 0; c < kNumCategories; ++c) categories.push_back(std::string(CategoryName(static_cast<Category>(c))));
  const nlohmann::json data = {
      {"schema", "memscope.viewer/1"},
      {"generator", kMemscopeVersion},
      {"categories", categories},
      {"kinds", {"inactive split (free, not releasable)", "free (cached, releasable)", "freed, waiting on a stream"}},
      {"runs", std::move(runs_json)}};
  // Inside <script>, no "</script>" or "<!--" may appear: every '<' (only ever
  // inside JSON strings) becomes \u003c.
  const std::string text = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string escaped;
  escaped.reserve(text.size() + 64);
  for (const char c : text) {
    if (c == '<') {
      escaped += "\\u003c";
    } else {
      escaped += c;
    }
  }

  const std::string_view page = viewer::PageTemplate();
  std::string out;
  out.reserve(page.size() + viewer::PageStyle().size() + viewer::PageScript().size() + escaped.size());
  std::size_t pos = 0;
  const std::array<std::pair<std::string_view, std::string_view>, 3> parts = {{
      {viewer::kStyleMarker, viewer::PageStyle()},
      {viewer::kDataMarker, escaped},
      {viewer::kScriptMarker, viewer::PageScript()},
  }};
  for (const auto& [marker, content] : parts) {
    const std::size_t at = page.find(marker, pos);
    if (at == std::string_view::npos) {
      return absl::InternalError(
          absl::StrCat("the embedded page has no ", std::string(marker), " marker (after byte ", pos, ")"));
    }
    out.append(page.substr(pos, at - pos));
    out.append(content);
    pos = at + marker.size();
  }
  out.append(page.substr(pos));
  return out;
}

}  // namespace memscope
