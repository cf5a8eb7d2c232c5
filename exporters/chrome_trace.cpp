#include "exporters/chrome_trace.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/counter_thinning.h"
#include "analysis/trace_model.h"
#include "base/decimal.h"
#include "base/json_writer.h"

namespace memscope {
namespace {

// ---------------------------------------------------------------------------
// JSON text: one JsonWriter (base/json_writer.h), one event a line.

// Invalid UTF-8 bytes in any text (labels, marks, alloc_conf) become one
// U+FFFD each, so every trace is valid JSON.
constexpr JsonStyle kTraceStyle{.replace_each_byte = true};

// Nanoseconds as microseconds with exactly three decimals ("1234.567"), at
// `p`: at most kMaxMicrosBytes.
constexpr std::size_t kMaxMicrosBytes = 1 + kMaxDecimalBytes + 4;
char* PutMicros(char* p, bool negative, std::uint64_t abs_ns) {
  if (negative) *p++ = '-';
  p = PutDecimal(p, abs_ns / 1000);
  const auto frac = static_cast<unsigned>(abs_ns % 1000);
  p[0] = '.';
  p[1] = static_cast<char>('0' + frac / 100);
  p[2] = static_cast<char>('0' + frac / 10 % 10);
  p[3] = static_cast<char>('0' + frac % 10);
  return p + 4;
}
char* PutMicros(char* p, std::int64_t ns) {
  return PutMicros(p, ns < 0, ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns));
}
void Micros(JsonWriter& w, std::int64_t ns) { w.EndRawValue(PutMicros(w.BeginRawValue(kMaxMicrosBytes), ns)); }
// A slice's duration from `begin_ns` to `end_ns`, 0 when it ends before it
// begins. In unsigned arithmetic: corrupt times must not overflow.
void Duration(JsonWriter& w, std::int64_t begin_ns, std::int64_t end_ns) {
  const std::uint64_t ns =
      end_ns > begin_ns ? static_cast<std::uint64_t>(end_ns) - static_cast<std::uint64_t>(begin_ns) : 0;
  w.EndRawValue(PutMicros(w.BeginRawValue(kMaxMicrosBytes), false, ns));
}

// Counter samples' texts, written at `p` (room for them reserved): the hot path.
char* PutText(char* p, std::string_view text) {
  std::memcpy(p, text.data(), text.size());
  return p + text.size();
}
// `n` bytes of `text` written at `p` in 16-byte steps: up to 15 bytes past
// both ends may be read and written (the texts are padded, the room too).
char* CopyPadded(char* p, const char* text, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 16) std::memcpy(p + i, text + i, 16);
  return p + n;
}
constexpr std::size_t kCopyPaddedOverrun = 32;

// A number of any integer type: Int or UInt by its sign.
template <typename T>
void Number(JsonWriter& w, T v) {
  if constexpr (std::is_signed_v<T>) {
    w.Int(v);
  } else {
    w.UInt(v);
  }
}

}  // namespace

// The traceEvents array: each event an object on a line of its own. The
// text goes to the stream in writes of 64 KiB or more, at an event's end.
class ChromeTraceWriter::Events {
 public:
  explicit Events(std::ostream& out) : w_(out, kTraceStyle, kFlushAt + 4096) {}

  // Starts an event object with its common fields; the caller writes the
  // rest and calls End(). "ts" comes first: Perfetto's JSON tokenizer scans
  // each event for it with a reader that rejects \u escapes, so no string
  // value may come before it.
  JsonWriter& Begin(std::int64_t ts_ns, std::string_view ph, int pid, int tid, std::string_view name) {
    w_.LineBreak();
    w_.BeginObject();
    w_.Key("ts");
    Micros(w_, ph[0] == 'M' ? ts_ns : ts_ns + offset_ns_);
    w_.Key("ph");
    w_.String(ph);
    w_.Key("pid");
    w_.Int(pid);
    w_.Key("tid");
    w_.Int(tid);
    w_.Key("name");
    w_.String(name);
    return w_;
  }
  void End() {
    w_.EndObject();
    EndOfEvents();
  }
  // After an event, or a counter sample's events written raw.
  void EndOfEvents() {
    if (w_.buffered() >= kFlushAt) w_.Flush();
  }
  // The writer, for what is not an event (the header, the end).
  JsonWriter& writer() { return w_; }

  std::int64_t offset_ns() const { return offset_ns_; }
  // Added to every event's time but metadata's: the rank's start on the
  // run's common clock.
  void set_offset_ns(std::int64_t offset) { offset_ns_ = offset; }

 private:
  static constexpr std::size_t kFlushAt = 1 << 16;
  JsonWriter w_;
  std::int64_t offset_ns_ = 0;
};

namespace {

// ---------------------------------------------------------------------------
// The first walk: which counter samples to keep.

struct NoPayload {};

}  // namespace

class ChromeTraceWriter::RankPlan final : public WalkListener {
 public:
  RankPlan(const Timeline& tl, std::size_t max_samples)
      : timeline(tl), span(SampleSpanOf(tl)), thinning(ThinningPolicy::ChromeTrace(max_samples), span) {}

  void OnEvent(const TimelineWalk& walk, const Event& e) override {
    if (e.type == EventType::kCollectiveBegin) has_collectives = true;
    if (!ChangesMemory(e.type)) return;
    if (thinning.thinned()) {
      thinning.Observe(e.time_ns, walk.model().allocated(), walk.model().reserved());
    }
  }
  void OnFinish(const TimelineWalk& /*walk*/) override {
    if (thinning.thinned()) {
      for (const auto& s : thinning.Kept()) keep.push_back(s.ordinal);
    }
  }

  std::uint64_t written() const { return thinning.thinned() ? keep.size() : span.samples; }

  const Timeline& timeline;
  const SampleSpan span;  // span.samples: counter samples before thinning
  CounterThinning<NoPayload> thinning;
  std::vector<std::uint64_t> keep;  // kept sample ordinals, ascending (when thinned)
  bool has_collectives = false;     // a "communication" thread is named only then
};

// ---------------------------------------------------------------------------
// The second walk: the events of one rank.

class ChromeTraceWriter::RankWriter final : public WalkListener {
 public:
  RankWriter(const RankPlan& plan, Events& w) : plan_(plan), tl_(plan.timeline), w_(w) {
    // A counter sample's text between its numbers (OnSample), written once.
    const std::string common = absl::StrCat(",\"ph\":\"C\",\"pid\":", tl_.rank, ",\"tid\":1,\"name\":");
    for (std::size_t k = 0; k < kTracks.size(); ++k) {
      track_text_[k] = common;
      JsonWriter::AppendString(track_text_[k], kTracks[k], kTraceStyle);
      track_text_[k] += ",\"cat\":\"memory\",\"args\":{\"bytes\":";
    }
    category_text_[0] = common;
    JsonWriter::AppendString(category_text_[0], "memory by category", kTraceStyle);
    category_text_[0] += ",\"cat\":\"memory\",\"args\":{";
    for (int c = 0; c < kNumCategories; ++c) {
      if (c > 0) category_text_[c] += ',';
      JsonWriter::AppendString(category_text_[c], CategoryName(static_cast<Category>(c)), kTraceStyle);
      category_text_[c] += ':';
    }
    sample_bytes_ = 0;  // at most: 4 events of separator, ts, texts, numbers and "}}"
    for (const std::string& t : track_text_) sample_bytes_ += t.size();
    for (const std::string& t : category_text_) sample_bytes_ += t.size();
    sample_bytes_ += 4 * (16 + 32 + 2) + (kTracks.size() + kNumCategories) * 24;
    // The texts after each time and after each number of a sample, padded
    // for CopyPadded: a sample is (time, number) x 3, then time, 10 numbers.
    const std::string next_event = "}},\n{\"ts\":";
    std::array<std::string, kNumbers> after_number;
    for (std::size_t k = 0; k < kTracks.size(); ++k) after_number[k] = next_event;
    for (std::size_t c = 1; c < kNumCategories; ++c) after_number[kTracks.size() + c - 1] = category_text_[c];
    after_number[kNumbers - 1] = "}}";
    std::array<std::string, 4> after_time = {track_text_[0], track_text_[1], track_text_[2], category_text_[0]};
    const auto add = [&](const std::string& text) {
      const Piece piece{pieces_.size(), text.size()};
      pieces_ += text;
      pieces_.append(16, ' ');
      return piece;
    };
    for (std::size_t k = 0; k < 4; ++k) after_time_[k] = add(after_time[k]);
    for (std::size_t k = 0; k < kNumbers; ++k) after_number_[k] = add(after_number[k]);
  }

  void OnStart(const TimelineWalk& /*walk*/) override { WriteMetadata(); }

  void OnEvent(const TimelineWalk& walk, const Event& e) override {
    switch (e.type) {
      case EventType::kPhaseEnd: OnPhaseEnd(walk, e); break;
      case EventType::kMark: {
        JsonWriter& m = w_.Begin(e.time_ns, "i", tl_.rank, 0, tl_.str(e.name));
        m.Key("cat");
        m.String("mark");
        m.Key("s");
        m.String("t");
        w_.End();
        break;
      }
      case EventType::kOom: WriteOom(walk.model(), e); break;
      case EventType::kCollectiveBegin: collectives_.push_back(e); break;
      case EventType::kCollectiveEnd:
        if (!collectives_.empty()) {
          WriteCollective(collectives_.back(), e.time_ns, false);
          collectives_.pop_back();
        }
        break;
      case EventType::kEmptyCache: {
        JsonWriter& m = AllocatorInstant(e, "empty_cache");
        m.Key("reserved");
        m.UInt(walk.model().reserved());
        m.EndObject();
        w_.End();
        break;
      }
      case EventType::kAllocRetry: {
        JsonWriter& m = AllocatorInstant(e, "alloc retry");
        m.Key("size");
        m.UInt(e.size);
        m.EndObject();
        w_.End();
        break;
      }
      default: break;
    }
    if (ChangesMemory(e.type)) OnSample(walk.model(), e);
  }

  // Phases still open end at the rank's last event, in the order they began.
  void OnFinish(const TimelineWalk& walk) override {
    std::vector<OpenPhase> open = walk.open_phases();
    open.insert(open.end(), pending_.begin(), pending_.end());
    std::sort(open.begin(), open.end(),
              [](const OpenPhase& x, const OpenPhase& y) { return x.begin_event < y.begin_event; });
    for (const OpenPhase& p : open) WriteSlice(p, walk.last_ns(), true);
    for (const Event& c : collectives_) WriteCollective(c, walk.last_ns(), true);
  }

 private:
  void WriteMetadata();
  void OnPhaseEnd(const TimelineWalk& walk, const Event& e);
  void WriteSlice(const OpenPhase& p, std::int64_t end_ns, bool unfinished);
  void WriteOom(const TraceModel& model, const Event& e);
  // An instant event of the allocator (thread 1), up to its open "args".
  JsonWriter& AllocatorInstant(const Event& e, std::string_view name) {
    JsonWriter& m = w_.Begin(e.time_ns, "i", tl_.rank, 1, name);
    m.Key("cat");
    m.String("allocator");
    m.Key("s");
    m.String("p");
    m.Key("args");
    m.BeginObject();
    return m;
  }
  // A collective as a slice on thread 2, "communication".
  void WriteCollective(const Event& begin, std::int64_t end_ns, bool unfinished) {
    Slice(2, tl_.str(begin.name), "communication", begin.time_ns, end_ns, "bytes", begin.size, unfinished);
  }
  // A slice ("X") on thread `tid` from begin_ns to end_ns, its args one
  // number and, when it never ended, "unfinished".
  template <typename T>
  void Slice(int tid, std::string_view name, std::string_view cat, std::int64_t begin_ns, std::int64_t end_ns,
             std::string_view arg, T value, bool unfinished) {
    JsonWriter& b = w_.Begin(begin_ns, "X", tl_.rank, tid, name);
    b.Key("cat");
    b.String(cat);
    b.Key("dur");
    Duration(b, begin_ns, end_ns);
    b.Key("args");
    b.BeginObject();
    b.Key(arg);
    Number(b, value);
    if (unfinished) {
      b.Key("unfinished");
      b.Bool(true);
    }
    b.EndObject();
    w_.End();
  }
  std::vector<Event> collectives_;  // begun, not yet ended (innermost last)
  void OnSample(const TraceModel& model, const Event& e);

  const RankPlan& plan_;
  static constexpr std::array<std::string_view, 3> kTracks = {"allocated", "reserved", "active"};
  const Timeline& tl_;
  Events& w_;
  std::array<std::string, 3> track_text_;                  // after "ts": up to the track's bytes
  std::array<std::string, kNumCategories> category_text_;  // the category event's, before each category's bytes
  std::size_t sample_bytes_ = 0;                           // the most one sample's four events take
  // The text of each of a sample's numbers, kept from the sample before:
  // between two samples most categories do not change.
  struct NumberText {
    char* Put(char* p, std::int64_t v) {
      if (len == 0 || v != value) {
        value = v;
        len = static_cast<std::size_t>(PutDecimal(text, v) - text);
      }
      std::memcpy(p, text, sizeof text);  // the room for it is reserved (sample_bytes_)
      return p + len;
    }
    std::int64_t value = 0;
    std::size_t len = 0;
    char text[kMaxDecimalBytes + 4];
  };
  static constexpr std::size_t kNumbers = 3 + kNumCategories;
  std::array<NumberText, kNumbers> numbers_;
  struct Piece {
    std::size_t at = 0;  // in pieces_
    std::size_t size = 0;
  };
  std::string pieces_;                        // the texts below, each followed by 16 bytes of padding
  std::array<Piece, 4> after_time_;           // a sample's text after each of its 4 times
  std::array<Piece, kNumbers> after_number_;  // and after each of its numbers
  // Phases the walk closed because an outer phase ended around them: the
  // trace keeps a phase open until its own end (or the end of the timeline).
  std::vector<OpenPhase> pending_;
  std::uint64_t ordinal_ = 0;
  std::size_t next_keep_ = 0;
};

void ChromeTraceWriter::RankWriter::WriteMetadata() {
  const int pid = tl_.rank;
  const auto args = [](JsonWriter& b, std::string_view key) {
    b.Key("args");
    b.BeginObject();
    b.Key(key);
  };
  args(w_.Begin(0, "M", pid, 0, "process_name"), "name");
  w_.writer().String(absl::StrCat("rank ", pid));
  w_.writer().EndObject();
  w_.End();
  args(w_.Begin(0, "M", pid, 0, "process_sort_index"), "sort_index");
  w_.writer().Int(pid);
  w_.writer().EndObject();
  w_.End();
  constexpr std::array<const char*, 3> kThreads = {"phases", "allocator", "communication"};
  for (int tid = 0; tid < (plan_.has_collectives ? 3 : 2); ++tid) {
    args(w_.Begin(0, "M", pid, tid, "thread_name"), "name");
    w_.writer().String(kThreads[static_cast<std::size_t>(tid)]);
    w_.writer().EndObject();
    w_.End();
    args(w_.Begin(0, "M", pid, tid, "thread_sort_index"), "sort_index");
    w_.writer().Int(tid);
    w_.writer().EndObject();
    w_.End();
  }
}

// The trace's rule: an end closes the latest-begun open phase that matches
// it (OpenPhase::ClosedBy, the walk's rule: phase, step, label and
// micro-batch), and nothing else. The walk closed its match and any phase
// open inside it; those inner ones stay open here (pending_), and one of
// them may be the latest match.
void ChromeTraceWriter::RankWriter::OnPhaseEnd(const TimelineWalk& walk, const Event& e) {
  const PhaseEnd& end = walk.phase_end();
  pending_.insert(pending_.end(), end.cut.begin(), end.cut.end());
  std::size_t latest = pending_.size();
  for (std::size_t k = 0; k < pending_.size(); ++k) {
    if (pending_[k].ClosedBy(e) &&
        (latest == pending_.size() || pending_[k].begin_event > pending_[latest].begin_event)) {
      latest = k;
    }
  }
  if (latest == pending_.size() || (end.matched && end.phase.begin_event > pending_[latest].begin_event)) {
    if (end.matched) WriteSlice(end.phase, e.time_ns, false);
    return;
  }
  WriteSlice(pending_[latest], e.time_ns, false);
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(latest));
  if (end.matched) pending_.push_back(end.phase);
}

void ChromeTraceWriter::RankWriter::WriteSlice(const OpenPhase& p, std::int64_t end_ns, bool unfinished) {
  Slice(0, PhaseMarkName(p.phase, p.step, tl_.str(p.label), p.micro_batch), "phase", p.begin_ns, end_ns, "step", p.step,
        unfinished);
}

void ChromeTraceWriter::RankWriter::WriteOom(const TraceModel& model, const Event& e) {
  JsonWriter& m = AllocatorInstant(e, "OOM");
  m.Key("requested_size");
  m.UInt(e.requested_size);
  m.Key("rounded_size");
  m.UInt(e.size);
  m.Key("device_free");
  m.UInt(e.device_free());
  m.Key("allocated");
  m.UInt(model.allocated());
  m.Key("reserved");
  m.UInt(model.reserved());
  m.Key("stream");
  m.UInt(e.stream);
  m.Key("pool");
  m.String(e.small_pool() ? "small" : "large");
  m.EndObject();
  w_.End();
}

void ChromeTraceWriter::RankWriter::OnSample(const TraceModel& model, const Event& e) {
  const std::uint64_t this_sample = ordinal_++;
  if (plan_.thinning.thinned()) {
    if (next_keep_ == plan_.keep.size() || plan_.keep[next_keep_] != this_sample) return;
    ++next_keep_;
  }
  // One counter track each: in one event, trace viewers draw them stacked.
  // The texts are ready (constructor); only the time and the numbers are
  // formatted here, and every text is copied in 16-byte steps.
  char ts[48];
  const std::size_t ts_len = static_cast<std::size_t>(PutMicros(ts, e.time_ns + w_.offset_ns()) - ts);
  const DeviceStats& st = model.stats();
  const std::array<std::int64_t, 3> values = {All(st.allocated_bytes).current, All(st.reserved_bytes).current,
                                              All(st.active_bytes).current};
  const char* texts = pieces_.data();
  JsonWriter& w = w_.writer();
  w.LineBreak();
  char* const start = w.BeginRawValue(sample_bytes_ + kCopyPaddedOverrun);
  char* p = PutText(start, "{\"ts\":");
  for (std::size_t k = 0; k < kTracks.size(); ++k) {
    p = CopyPadded(CopyPadded(p, ts, ts_len), texts + after_time_[k].at, after_time_[k].size);
    p = CopyPadded(numbers_[k].Put(p, values[k]), texts + after_number_[k].at, after_number_[k].size);
  }
  p = CopyPadded(CopyPadded(p, ts, ts_len), texts + after_time_[3].at, after_time_[3].size);
  const auto& by_category = model.allocated_by_category();
  for (std::size_t k = 0; k < kNumCategories; ++k) {
    const std::size_t n = kTracks.size() + k;
    p = CopyPadded(numbers_[n].Put(p, by_category[k]), texts + after_number_[n].at, after_number_[n].size);
  }
  w.EndRawValue(p);
  w_.EndOfEvents();
}

// ---------------------------------------------------------------------------
// The trace.

ChromeTraceWriter::ChromeTraceWriter(const ChromeTraceOptions& options, std::ostream& out)
    : max_samples_(std::max<std::size_t>(options.max_counter_samples_per_rank, 3)),
      out_(out),
      events_(std::make_unique<Events>(out)) {}

ChromeTraceWriter::~ChromeTraceWriter() = default;

WalkListener& ChromeTraceWriter::Plan(const Timeline& timeline) {
  plans_.push_back(std::make_unique<RankPlan>(timeline, max_samples_));
  return *plans_.back();
}

WalkListener& ChromeTraceWriter::Write(const Timeline& timeline) {
  if (!header_written_) WriteHeader();
  const RankPlan* plan = nullptr;
  for (const auto& p : plans_) {
    if (&p->timeline == &timeline) plan = p.get();
  }
  // Every rank on the run's common clock: 0 is the earliest rank's start.
  std::int64_t earliest = timeline.wall_start_us;
  for (const auto& p : plans_) earliest = std::min(earliest, p->timeline.wall_start_us);
  events_->set_offset_ns((timeline.wall_start_us - earliest) * 1000);
  writer_ = std::make_unique<RankWriter>(*plan, *events_);
  return *writer_;
}

// displayTimeUnit first: Perfetto reads it only from the start of the file.
void ChromeTraceWriter::WriteHeader() {
  header_written_ = true;
  JsonWriter& w = events_->writer();
  w.BeginObject();
  w.Key("displayTimeUnit");
  w.String("ms");
  w.LineBreak();
  w.Key("otherData");
  w.BeginObject();
  w.Key("generator");
  w.String("memscope");
  w.Key("ranks");
  w.UInt(plans_.size());
  w.Key("max_counter_samples_per_rank");
  w.UInt(max_samples_);
  for (const auto& plan : plans_) {
    const Timeline& tl = plan->timeline;
    const std::string prefix = absl::StrCat("rank ", tl.rank, " ");
    const auto key = [&](const char* name) -> JsonWriter& {
      w.Key(absl::StrCat(prefix, name));
      return w;
    };
    Number(key("events"), tl.events.size());
    Number(key("counter samples"), plan->span.samples);
    Number(key("counter samples written"), plan->written());
    Number(key("world_size"), tl.world_size);
    Number(key("device"), tl.device_index);
    Number(key("device_capacity"), tl.device_capacity);
    Number(key("wall_start_us"), tl.wall_start_us);
    key("alloc_conf").String(tl.alloc_conf);
  }
  w.EndObject();
  w.LineBreak();
  w.Key("traceEvents");
  w.BeginArray();
}

void ChromeTraceWriter::WriteGpuTable(const nlohmann::json& gpus) {
  if (!header_written_) WriteHeader();
  writer_.reset();
  // The run's span on its common clock: 0 is the earliest rank's start.
  std::int64_t earliest = 0;
  std::int64_t end_ns = 0;
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    const std::int64_t start = plans_[i]->timeline.wall_start_us;
    earliest = i == 0 ? start : std::min(earliest, start);
  }
  for (const auto& p : plans_) {
    const Timeline& tl = p->timeline;
    const std::int64_t last = tl.events.empty() ? 0 : tl.events.back().time_ns;
    end_ns = std::max(end_ns, (tl.wall_start_us - earliest) * 1000 + last);
  }
  Events& events = *events_;
  JsonWriter& w = events.writer();
  events.set_offset_ns(0);
  const int pid = kGpusPid;
  events.Begin(0, "M", pid, 0, "process_name");
  w.Key("args");
  w.BeginObject();
  w.Key("name");
  w.String("GPUs");
  w.EndObject();
  events.End();
  events.Begin(0, "M", pid, 0, "process_sort_index");
  w.Key("args");
  w.BeginObject();
  w.Key("sort_index");
  w.Int(pid);
  w.EndObject();
  events.End();
  const auto bytes = [](const nlohmann::json& o, const char* key) -> std::uint64_t {
    const auto it = o.find(key);
    return it != o.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
  };
  for (const nlohmann::json& gpu : gpus) {
    if (!gpu.is_object()) continue;
    const auto physical = gpu.find("physical");
    const std::string name =
        absl::StrCat("GPU ", physical != gpu.end() && physical->is_number_integer() ? physical->get<int>() : 0);
    std::uint64_t context = 0, reserved = 0, nccl = 0, cublas = 0, cudnn = 0, other = 0;
    bool measured = false;  // a capture's measured rows have every library's column
    if (const auto procs = gpu.find("processes"); procs != gpu.end() && procs->is_array()) {
      for (const nlohmann::json& p : *procs) {
        if (!p.is_object()) continue;
        context += bytes(p, "context_bytes");
        reserved += bytes(p, "reserved_bytes");
        nccl += bytes(p, "nccl_bytes");
        measured = measured || p.value("source", "") == "measured";
        cublas += bytes(p, "cublas_bytes");
        cudnn += bytes(p, "cudnn_bytes");
        other += bytes(p, "other_bytes");
      }
    }
    for (const std::int64_t ts : {std::int64_t{0}, end_ns}) {
      events.Begin(ts, "C", pid, 0, name);
      w.Key("args");
      w.BeginObject();
      w.Key("context");
      w.UInt(context);
      w.Key("reserved");
      w.UInt(reserved);
      w.Key("nccl");
      w.UInt(nccl);
      if (measured) {
        w.Key("cublas");
        w.UInt(cublas);
        w.Key("cudnn");
        w.UInt(cudnn);
        w.Key("other");
        w.UInt(other);
      }
      w.EndObject();
      events.End();
    }
    // "s" before "args": the row's own keys hold no '<' or escapes.
    events.Begin(end_ns, "i", pid, 0, absl::StrCat(name, " processes"));
    w.Key("s");
    w.String("p");
    w.Key("args");
    w.Raw(gpu.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    events.End();
  }
}

absl::Status ChromeTraceWriter::Finish() {
  if (!header_written_) WriteHeader();
  writer_.reset();
  JsonWriter& w = events_->writer();
  w.Verbatim("\n");
  w.EndArray();
  w.EndObject();
  w.Verbatim("\n");
  const bool ok = w.Finish();
  out_.flush();
  if (!ok || !out_) return absl::DataLossError("writing the Chrome trace failed");
  return absl::OkStatus();
}

absl::Status WriteChromeTrace(const std::vector<const Timeline*>& ranks, const ChromeTraceOptions& options,
                              std::ostream& out) {
  std::vector<int> seen;
  for (const Timeline* tl : ranks) {
    if (tl == nullptr) return absl::InvalidArgumentError("WriteChromeTrace: null timeline");
    seen.push_back(tl->rank);
  }
  std::sort(seen.begin(), seen.end());
  if (auto dup = std::adjacent_find(seen.begin(), seen.end()); dup != seen.end()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", *dup, " is given more than once"));
  }

  // Check every rank (and choose its samples) before writing anything.
  ChromeTraceWriter trace(options, out);
  for (const Timeline* tl : ranks) {
    TimelineWalk walk(*tl);
    if (absl::Status s = walk.Run({&trace.Plan(*tl)}); !s.ok()) return s;
  }
  for (const Timeline* tl : ranks) {
    TimelineWalk walk(*tl);
    if (absl::Status s = walk.Run({&trace.Write(*tl)}); !s.ok()) return s;
  }
  if (options.gpus != nullptr && options.gpus->is_array()) trace.WriteGpuTable(*options.gpus);
  return trace.Finish();
}

}  // namespace memscope
