#include "viewer/html_report.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "analysis/counter_thinning.h"
#include "analysis/timeline_walk.h"
#include "analysis/trace_model.h"
#include "base/decimal.h"
#include "base/json_writer.h"
#include "exporters/report.h"
#include "viewer/assets.h"

namespace memscope {
namespace {

// The page's data sits in a <script>: no '<' in its JSON.
constexpr JsonStyle kHtmlJson{.escape_lt = true};

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

// JSON text (nlohmann's dump) with every '<', which is only ever inside a
// string, written as \u003c.
std::string EscapeLessThan(std::string text) {
  if (text.find('<') == std::string::npos) return text;
  std::string out;
  out.reserve(text.size() + 64);
  for (const char c : text) {
    if (c == '<') {
      out += "\\u003c";
    } else {
      out += c;
    }
  }
  return out;
}

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
  void Write(JsonWriter& w) const {
    w.BeginArray();
    for (const std::string& name : names_) w.String(name);
    w.EndArray();
  }

 private:
  const Timeline& t_;
  absl::flat_hash_map<std::uint32_t, int> index_;
  std::vector<std::string> names_;
};

// Fixed text written at `p`.
char* PutText(char* p, std::string_view text) {
  std::memcpy(p, text.data(), text.size());
  return p + text.size();
}
// The most a segment's text takes besides its pieces, and a piece.
constexpr std::size_t kSegmentTextBytes = 128 + 3 * kMaxDecimalBytes;
constexpr std::size_t kPieceTextBytes = 6 + 4 * kMaxDecimalBytes;

// An array of integers, written in place.
template <typename Samples, typename Value>
void WriteIntegers(JsonWriter& w, const Samples& samples, Value value) {
  char* p = w.BeginRawValue(2 + samples.size() * (kMaxDecimalBytes + 1));
  *p++ = '[';
  bool first = true;
  for (const auto& s : samples) {
    if (!first) *p++ = ',';
    first = false;
    p = PutDecimal(p, value(s));
  }
  *p++ = ']';
  w.EndRawValue(p);
}

// The segments of a moment, as the "segments" array (keys in nlohmann's
// sorted order, so the page's data is what a tree would have dumped).
void WriteSegmentMap(const TraceModel& m, const HtmlReportOptions& o, OwnerTable& owners, JsonWriter& w) {
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
  std::vector<Piece> pieces;
  w.BeginArray();
  for (const auto& [addr, seg] : segments) {
    pieces.clear();
    const auto first = m.blocks().lower_bound(addr);
    const bool has_active = first != m.blocks().end() && first->first < addr + seg->size;
    const int gap_kind = has_active ? kKindInactiveSplit : kKindFree;
    std::uint64_t pos = 0;
    for (auto it = first; it != m.blocks().end() && it->first < addr + seg->size; ++it) {
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
    // {"addr", "blocks": [[offset, size, kind, owner]], "expandable",
    // "merged", "pool", "size", "stream"}, written in place: what the
    // writer's calls would write, without a call per number.
    char* p = w.BeginRawValue(kSegmentTextBytes + pieces.size() * kPieceTextBytes);
    p = PutText(PutDecimal(PutText(p, "{\"addr\":"), std::uint64_t{addr}), ",\"blocks\":[");
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const Piece& piece = pieces[i];
      if (i > 0) *p++ = ',';
      *p++ = '[';
      p = PutDecimal(p, std::uint64_t{piece.offset});
      *p++ = ',';
      p = PutDecimal(p, std::uint64_t{piece.size});
      *p++ = ',';
      p = PutDecimal(p, std::int64_t{piece.kind});
      *p++ = ',';
      p = PutDecimal(p, std::int64_t{piece.owner});
      *p++ = ']';
    }
    p = PutText(p, seg->expandable ? "],\"expandable\":true" : "],\"expandable\":false");
    p = PutText(p, merged ? ",\"merged\":true" : ",\"merged\":false");
    p = PutText(p, seg->small ? ",\"pool\":\"small\",\"size\":" : ",\"pool\":\"large\",\"size\":");
    p = PutText(PutDecimal(p, std::uint64_t{seg->size}), ",\"stream\":");
    p = PutDecimal(p, std::uint64_t{seg->stream});
    *p++ = '}';
    w.EndRawValue(p);
  }
  w.EndArray();
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
        owners_(t) {
    moments_.BeginArray();
    bands_.BeginArray();
    marks_.BeginArray();
  }

  void OnEvent(const TimelineWalk& walk, const Event& e);
  void OnFinish(const TimelineWalk& walk) {
    first_t_ = walk.first_ns();
    last_t_ = walk.last_ns();
    // `end` is after the last step, `exit` after the last event (analysis.h).
    Capture(walk.model(), end_events_ < t_.events.size() ? "exit" : "end", last_t_, t_.events.size());
  }
  std::vector<std::string> TakeDataPieces();

 private:
  // A moment: {"event", "fragmentation", "key", "segments", "segments_total", "t"}.
  int Capture(const TraceModel& m, std::string_view key, std::int64_t time, std::size_t event) {
    JsonWriter& w = moments_;
    w.BeginObject();
    w.Key("event");
    w.UInt(event);
    w.Key("fragmentation");
    WriteFragmentationJson(w, m.Fragmentation());
    w.Key("key");
    w.String(key);
    w.Key("segments");
    WriteSegmentMap(m, o_, owners_, w);
    w.Key("segments_total");
    w.UInt(m.segments().size());
    w.Key("t");
    w.Int(time);
    w.EndObject();
    return moments_count_++;
  }
  void OnPhaseEnd(const TimelineWalk& walk, const Event& e);
  void WriteSamples(JsonWriter& w);

  const Timeline& t_;
  const RankReport& r_;
  const HtmlReportOptions o_;
  CounterThinning<SamplePayload> thinning_;
  const std::vector<bool> moment_rows_;  // the phase rows that get a segment map
  OwnerTable owners_;
  // The arrays "moments", "bands" and "marks" as JSON text, written as the
  // walk goes; the moments' segment maps (megabytes) in pieces.
  std::vector<std::string> moments_pieces_;
  std::string bands_text_, marks_text_;
  JsonWriter moments_{moments_pieces_, kHtmlJson}, bands_{bands_text_, kHtmlJson}, marks_{marks_text_, kHtmlJson};
  int moments_count_ = 0;
  std::size_t marks_count_ = 0;
  std::map<std::int64_t, std::int64_t> step_begin_;
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
      if (marks_count_ < 200) {
        ++marks_count_;
        marks_.BeginObject();
        marks_.Key("t");
        marks_.Int(e.time_ns);
        marks_.Key("text");
        marks_.String(t_.str(e.name));
        marks_.EndObject();
      }
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
  bands_.BeginObject();
  bands_.Key("begin");
  bands_.Int(begin);
  bands_.Key("depth");
  bands_.Int(end.depth);
  bands_.Key("end");
  bands_.Int(e.time_ns);
  bands_.Key("moment");
  bands_.Int(moment);
  bands_.Key("name");
  bands_.String(name);
  bands_.EndObject();
  ++phase_ends_;
}

// {"allocated", "by_category": {CATEGORY: [...]} (sorted by name), "reserved", "t"}.
void ViewerRankListener::Impl::WriteSamples(JsonWriter& w) {
  const std::vector<CounterThinning<SamplePayload>::Sample> kept = thinning_.Kept();
  std::array<bool, kNumCategories> present{};
  for (const auto& s : kept) {
    for (int c = 0; c < kNumCategories; ++c) present[c] = present[c] || s.payload.by_category[c] != 0;
  }
  std::vector<std::pair<std::string_view, int>> categories;
  for (int c = 0; c < kNumCategories; ++c) {
    if (present[c]) categories.emplace_back(CategoryName(static_cast<Category>(c)), c);
  }
  std::sort(categories.begin(), categories.end());
  using Sample = CounterThinning<SamplePayload>::Sample;
  w.BeginObject();
  w.Key("allocated");
  WriteIntegers(w, kept, [](const Sample& s) { return std::uint64_t{s.allocated}; });
  w.Key("by_category");
  w.BeginObject();
  for (const auto& [name, c] : categories) {
    w.Key(name);
    const auto k = static_cast<std::size_t>(c);
    WriteIntegers(w, kept, [k](const Sample& s) { return std::int64_t{s.payload.by_category[k]}; });
  }
  w.EndObject();
  w.Key("reserved");
  WriteIntegers(w, kept, [](const Sample& s) { return std::uint64_t{s.reserved}; });
  w.Key("t");
  WriteIntegers(w, kept, [](const Sample& s) { return std::int64_t{s.payload.t}; });
  w.EndObject();
}

// The rank's object, its keys in nlohmann's sorted order.
std::vector<std::string> ViewerRankListener::Impl::TakeDataPieces() {
  moments_.EndArray();
  bands_.EndArray();
  marks_.EndArray();
  moments_.Finish();
  bands_.Finish();
  marks_.Finish();

  // report.json's numbers; the phase rows without their by_category (the
  // page does not show it, and it is most of the size of a long run's table).
  nlohmann::json report = ReportJson({&t_}, {r_})["ranks"][0];
  for (nlohmann::json& row : report["phases"]) row.erase("by_category");

  std::vector<std::string> out;
  JsonWriter w(out, kHtmlJson);
  w.BeginObject();
  w.Key("bands");
  w.Raw(bands_text_);
  w.Key("marks");
  w.Raw(marks_text_);
  w.Key("moments");
  w.RawPieces(std::move(moments_pieces_));
  w.Key("oom_t");
  r_.oom ? w.Int(r_.oom->time_ns) : w.Null();
  w.Key("owners");
  owners_.Write(w);
  w.Key("peak_allocated_t");
  w.Int(r_.peak_allocated.time_ns);
  w.Key("peak_reserved_t");
  w.Int(r_.peak_reserved.time_ns);
  w.Key("rank");
  w.Int(t_.rank);
  w.Key("report");
  w.Raw(EscapeLessThan(report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  w.Key("samples");
  WriteSamples(w);
  w.Key("samples_total");
  w.UInt(thinning_.observed());
  w.Key("steps");
  w.BeginArray();
  for (const auto& [step, begin] : step_begin_) {
    w.BeginObject();
    w.Key("step");
    w.Int(step);
    w.Key("t");
    w.Int(begin);
    w.EndObject();
  }
  w.EndArray();
  w.Key("t0");
  w.Int(first_t_);
  w.Key("t1");
  w.Int(last_t_);
  w.Key("thinned");
  w.Bool(thinning_.thinned());
  w.EndObject();
  w.Finish();
  return out;
}

ViewerRankListener::ViewerRankListener(const Timeline& timeline, const RankReport& report,
                                       const HtmlReportOptions& options)
    : impl_(std::make_unique<Impl>(timeline, report, options)) {}
ViewerRankListener::~ViewerRankListener() = default;
void ViewerRankListener::OnEvent(const TimelineWalk& walk, const Event& event) { impl_->OnEvent(walk, event); }
void ViewerRankListener::OnFinish(const TimelineWalk& walk) { impl_->OnFinish(walk); }
std::vector<std::string> ViewerRankListener::TakeDataPieces() { return impl_->TakeDataPieces(); }
std::string ViewerRankListener::TakeData() {
  const std::vector<std::string> pieces = impl_->TakeDataPieces();
  std::size_t size = 0;
  for (const std::string& piece : pieces) size += piece.size();
  std::string out;
  out.reserve(size);
  for (const std::string& piece : pieces) out.append(piece);
  return out;
}

absl::StatusOr<std::string> ViewerRankData(const Timeline& t, const RankReport& r, const HtmlReportOptions& o) {
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
    page.gpus = run.gpus;
    page.explain = run.explain;
    for (std::size_t i = 0; i < run.timelines.size(); ++i) {
      const Timeline& t = *run.timelines[i];
      page.world_size = std::max(page.world_size, t.world_size);
      const RankReport* r = i < run.reports.size() ? run.reports[i] : nullptr;
      if (r != nullptr) {
        absl::StatusOr<std::string> data = ViewerRankData(t, *r, options);
        if (!data.ok()) return data.status();
        page.ranks.push_back(std::move(*data));
        continue;
      }
      // Analysed here: the viewer rides along the analysis' second walk
      // (taken to the end), as run/ WriteRunOutputs does: two walks, not three.
      RunWalks walks({&t});
      if (absl::Status s = walks.First(); !s.ok()) return s;
      ViewerRankListener viewer(t, walks.analysis(0).report(), options);
      TimelineWalk second(t);
      if (absl::Status s = walks.Second(0, second, {&viewer}); !s.ok()) return s;
      page.ranks.push_back(viewer.TakeData());
    }
  }
  return HtmlPage(pages);
}

namespace {

// The data of the page: {"categories", "generator", "kinds", "runs", "schema"}.
void WritePageData(const std::vector<HtmlPageRun>& runs, JsonWriter& w) {
  w.BeginObject();
  w.Key("categories");
  w.BeginArray();
  for (int c = 0; c < kNumCategories; ++c) w.String(CategoryName(static_cast<Category>(c)));
  w.EndArray();
  w.Key("generator");
  w.String(kMemscopeVersion);
  w.Key("kinds");
  w.BeginArray();
  for (const char* kind :
       {"inactive split (free, not releasable)", "free (cached, releasable)", "freed, waiting on a stream"}) {
    w.String(kind);
  }
  w.EndArray();
  w.Key("runs");
  w.BeginArray();
  for (const HtmlPageRun& run : runs) {
    w.BeginObject();
    if (!run.explain.empty()) {
      w.Key("explain");
      w.Raw(run.explain);
    }
    if (!run.gpus.empty()) {
      w.Key("gpus");
      w.Raw(run.gpus);
    }
    w.Key("label");
    w.String(run.label);
    w.Key("ranks");
    w.BeginArray();
    if (!run.rank_pieces.empty()) {
      for (const std::vector<std::string>& data : run.rank_pieces) w.RawPieces(data);
    } else {
      for (const std::string& data : run.ranks) w.Raw(data);
    }
    w.EndArray();
    w.Key("world_size");
    w.Int(run.world_size);
    w.EndObject();
  }
  w.EndArray();
  w.Key("schema");
  w.String("memscope.viewer/1");
  w.EndObject();
}

}  // namespace

absl::Status WriteHtmlPage(const std::vector<HtmlPageRun>& runs, std::ostream& out) {
  // Every marker is found before anything is written.
  const std::string_view page = viewer::PageTemplate();
  const std::array<std::string_view, 3> markers = {viewer::kStyleMarker, viewer::kDataMarker, viewer::kScriptMarker};
  std::array<std::size_t, 3> at{};
  std::size_t pos = 0;
  for (std::size_t k = 0; k < markers.size(); ++k) {
    at[k] = page.find(markers[k], pos);
    if (at[k] == std::string_view::npos) {
      return absl::InternalError(
          absl::StrCat("the embedded page has no ", std::string(markers[k]), " marker (after byte ", pos, ")"));
    }
    pos = at[k] + markers[k].size();
  }
  // Inside <script>, no "</script>" or "<!--" may appear: every '<' (only
  // ever inside JSON strings) is written as \u003c.
  JsonWriter w(out, kHtmlJson);
  pos = 0;
  for (std::size_t k = 0; k < markers.size(); ++k) {
    w.Verbatim(page.substr(pos, at[k] - pos));
    if (k == 0) w.Verbatim(viewer::PageStyle());
    if (k == 1) WritePageData(runs, w);
    if (k == 2) w.Verbatim(viewer::PageScript());
    pos = at[k] + markers[k].size();
  }
  w.Verbatim(page.substr(pos));
  if (!w.Finish()) return absl::DataLossError("writing the HTML report failed");
  return absl::OkStatus();
}

absl::StatusOr<std::string> HtmlPage(const std::vector<HtmlPageRun>& runs) {
  std::ostringstream out;
  if (absl::Status s = WriteHtmlPage(runs, out); !s.ok()) return s;
  return std::move(out).str();
}

}  // namespace memscope
