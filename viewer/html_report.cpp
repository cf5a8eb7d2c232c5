#include "viewer/html_report.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "exporters/report.h"
#include "analysis/trace_model.h"
#include "viewer/assets.h"

namespace memscope {
namespace {

constexpr int kKindInactiveSplit = 10;  // free, in a segment holding allocations
constexpr int kKindFree = 11;           // free, in an unused (releasable) segment
constexpr int kKindPendingFree = 12;    // freed, waiting on a stream event
constexpr int kNumKinds = 13;

struct Sample {
  std::int64_t t = 0;
  std::uint64_t allocated = 0;
  std::uint64_t reserved = 0;
  std::array<std::int64_t, kNumCategories> by_category{};
  std::uint64_t ordinal = 0;
};

Sample TakeSample(const TraceModel& m, std::int64_t t, std::uint64_t ordinal) {
  return {t, m.allocated(), m.reserved(), m.allocated_by_category(), ordinal};
}

// Thinning: per time bucket, the first sample, the highest and lowest
// allocated, the highest reserved and the last.
struct Bucket {
  bool used = false;
  Sample first, max_allocated, min_allocated, max_reserved, last;
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
    std::sort(segments.begin(), segments.end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
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
      pieces.push_back({off, b.size, b.pending_free ? kKindPendingFree : static_cast<int>(b.category),
                        owners.Index(b.owner)});
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

absl::StatusOr<nlohmann::json> ViewerRankData(const Timeline& t, const RankReport& r, const HtmlReportOptions& o) {
  // Pass 1: the samples' count and time span.
  std::uint64_t samples_total = 0;
  std::int64_t t0 = 0, t1 = 0;
  for (const Event& e : t.events) {
    if (!ChangesMemory(e.type)) continue;
    if (samples_total++ == 0) {
      t0 = t1 = e.time_ns;
    } else {
      t0 = std::min(t0, e.time_ns);
      t1 = std::max(t1, e.time_ns);
    }
  }
  const std::size_t max_samples = std::max<std::size_t>(o.max_timeline_samples, 10);
  const bool thinned = samples_total > max_samples;
  const std::size_t num_buckets = thinned ? max_samples / 5 : 0;
  std::vector<Bucket> buckets(num_buckets);
  std::vector<Sample> kept;
  const double start = static_cast<double>(t0);
  const double span = static_cast<double>(t1) - start;  // in double: corrupt times must not overflow

  const std::vector<bool> moment_rows = ChooseMoments(r, std::max<std::size_t>(o.max_phase_moments, 1));
  OwnerTable owners(t);
  nlohmann::json moments = nlohmann::json::array();
  auto capture = [&](const TraceModel& m, const std::string& key, std::int64_t time, std::size_t event) {
    moments.push_back({{"key", key},
                       {"t", time},
                       {"event", event},
                       {"fragmentation", FragmentationJson(m.Fragmentation())},
                       {"segments_total", m.segments().size()},
                       {"segments", SegmentMap(m, o, owners)}});
    return static_cast<int>(moments.size() - 1);
  };

  struct Open {
    Phase phase;
    std::int64_t step;
    std::uint32_t label;
    std::int64_t begin;
  };
  std::vector<Open> open;
  nlohmann::json bands = nlohmann::json::array();
  std::map<std::int64_t, std::int64_t> step_begin;
  nlohmann::json marks = nlohmann::json::array();
  std::size_t phase_ends = 0;
  std::int64_t first_t = t.events.empty() ? 0 : t.events.front().time_ns;
  std::int64_t last_t = first_t;

  TraceModel model(TimelineConfig(t));
  std::uint64_t ordinal = 0;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const Event& e = t.events[i];
    if (absl::Status s = model.Apply(e); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", t.rank, ": event ", i, ": ", s.message()));
    }
    first_t = std::min(first_t, e.time_ns);
    last_t = std::max(last_t, e.time_ns);
    if (ChangesMemory(e.type)) {
      const Sample s = TakeSample(model, e.time_ns, ordinal++);
      if (!thinned) {
        kept.push_back(s);
      } else {
        std::size_t b = 0;
        if (span > 0) {
          const double x = (static_cast<double>(e.time_ns) - start) / span * static_cast<double>(num_buckets);
          b = x <= 0 ? 0 : std::min(num_buckets - 1, static_cast<std::size_t>(x));
        }
        Bucket& bucket = buckets[b];
        if (!bucket.used) {
          bucket.used = true;
          bucket.first = bucket.max_allocated = bucket.min_allocated = bucket.max_reserved = s;
        }
        if (s.allocated > bucket.max_allocated.allocated) bucket.max_allocated = s;
        if (s.allocated < bucket.min_allocated.allocated) bucket.min_allocated = s;
        if (s.reserved > bucket.max_reserved.reserved) bucket.max_reserved = s;
        bucket.last = s;
      }
    }
    switch (e.type) {
      case EventType::kPhaseBegin:
        open.push_back({e.phase, e.step(), e.name, e.time_ns});
        if (e.step() != kNoStep) step_begin.try_emplace(e.step(), e.time_ns);
        break;
      case EventType::kPhaseEnd: {
        std::int64_t begin = e.time_ns;
        std::size_t depth = open.size();
        for (std::size_t k = open.size(); k-- > 0;) {
          if (open[k].phase == e.phase && open[k].step == e.step() && open[k].label == e.name) {
            begin = open[k].begin;
            depth = k;
            open.resize(k);
            break;
          }
        }
        const std::string name = PhaseMarkName(e.phase, e.step(), t.str(e.name));
        int moment = -1;
        if (phase_ends < moment_rows.size() && moment_rows[phase_ends]) moment = capture(model, name, e.time_ns, i + 1);
        bands.push_back({{"name", name}, {"begin", begin}, {"end", e.time_ns}, {"depth", depth}, {"moment", moment}});
        ++phase_ends;
        break;
      }
      case EventType::kMark:
        if (marks.size() < 200) marks.push_back({{"t", e.time_ns}, {"text", t.str(e.name)}});
        break;
      default:
        break;
    }
    if (!t.events.empty() && i == r.peak_allocated.event_index) {
      capture(model, "peak", e.time_ns, i + 1);
    }
    if (r.oom && i == r.oom->event_index) capture(model, "oom", e.time_ns, i + 1);
  }
  capture(model, "end", last_t, t.events.size());

  if (thinned) {
    for (const Bucket& b : buckets) {
      if (!b.used) continue;
      for (const Sample* s : {&b.first, &b.max_allocated, &b.min_allocated, &b.max_reserved, &b.last}) {
        kept.push_back(*s);
      }
    }
    std::sort(kept.begin(), kept.end(), [](const Sample& x, const Sample& y) { return x.ordinal < y.ordinal; });
    kept.erase(std::unique(kept.begin(), kept.end(),
                           [](const Sample& x, const Sample& y) { return x.ordinal == y.ordinal; }),
               kept.end());
  }
  nlohmann::json ts = nlohmann::json::array(), allocated = nlohmann::json::array(),
                 reserved = nlohmann::json::array();
  std::array<bool, kNumCategories> present{};
  for (const Sample& s : kept) {
    ts.push_back(s.t);
    allocated.push_back(s.allocated);
    reserved.push_back(s.reserved);
    for (int c = 0; c < kNumCategories; ++c) present[c] = present[c] || s.by_category[c] != 0;
  }
  nlohmann::json by_category = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c) {
    if (!present[c]) continue;
    nlohmann::json series = nlohmann::json::array();
    for (const Sample& s : kept) series.push_back(s.by_category[c]);
    by_category[std::string(CategoryName(static_cast<Category>(c)))] = std::move(series);
  }
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& [step, begin] : step_begin) steps.push_back({{"step", step}, {"t", begin}});

  // report.json's numbers; the phase rows without their by_category (the
  // page does not show it, and it is most of the size of a long run's table).
  nlohmann::json j = ReportJson({&t}, {r})["ranks"][0];
  for (nlohmann::json& row : j["phases"]) row.erase("by_category");
  return nlohmann::json{
      {"rank", t.rank},
      {"report", std::move(j)},
      {"t0", first_t},
      {"t1", last_t},
      {"peak_allocated_t", r.peak_allocated.time_ns},
      {"peak_reserved_t", r.peak_reserved.time_ns},
      {"oom_t", r.oom ? nlohmann::json(r.oom->time_ns) : nlohmann::json(nullptr)},
      {"samples_total", samples_total},
      {"thinned", thinned},
      {"samples", {{"t", std::move(ts)}, {"allocated", std::move(allocated)}, {"reserved", std::move(reserved)},
                   {"by_category", std::move(by_category)}}},
      {"bands", std::move(bands)},
      {"steps", std::move(steps)},
      {"marks", std::move(marks)},
      {"moments", std::move(moments)},
      {"owners", owners.Json()},
  };
}

absl::StatusOr<std::string> HtmlReport(const std::vector<HtmlReportRun>& runs, const HtmlReportOptions& options) {
  nlohmann::json runs_json = nlohmann::json::array();
  for (const HtmlReportRun& run : runs) {
    nlohmann::json ranks = nlohmann::json::array();
    int world_size = 1;
    for (std::size_t i = 0; i < run.timelines.size(); ++i) {
      const Timeline& t = *run.timelines[i];
      world_size = std::max(world_size, t.world_size);
      std::optional<RankReport> analysed;
      const RankReport* r = i < run.reports.size() ? run.reports[i] : nullptr;
      if (r == nullptr) {
        absl::StatusOr<RankReport> a = AnalyzeRank(t);
        if (!a.ok()) return a.status();
        r = &analysed.emplace(std::move(*a));
      }
      absl::StatusOr<nlohmann::json> data = ViewerRankData(t, *r, options);
      if (!data.ok()) return data.status();
      ranks.push_back(std::move(*data));
    }
    runs_json.push_back({{"label", run.label}, {"world_size", world_size}, {"ranks", std::move(ranks)}});
  }
  nlohmann::json categories = nlohmann::json::array();
  for (int c = 0; c < kNumCategories; ++c) categories.push_back(std::string(CategoryName(static_cast<Category>(c))));
  const nlohmann::json data = {{"schema", "memscope.viewer/1"},
                               {"generator", kMemscopeVersion},
                               {"categories", categories},
                               {"kinds", {"inactive split (free, not releasable)", "free (cached, releasable)",
                                          "freed, waiting on a stream"}},
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
      return absl::InternalError(absl::StrCat("the embedded page has no ", std::string(marker), " marker (after byte ", pos, ")"));
    }
    out.append(page.substr(pos, at - pos));
    out.append(content);
    pos = at + marker.size();
  }
  out.append(page.substr(pos));
  return out;
}

}  // namespace memscope
