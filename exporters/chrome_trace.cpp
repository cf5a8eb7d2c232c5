#include "exporters/chrome_trace.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/counter_thinning.h"
#include "analysis/trace_model.h"
#include "exporters/decimal.h"
#include "exporters/utf8.h"

namespace memscope {
namespace {

// ---------------------------------------------------------------------------
// JSON text.

template <typename T>
void AppendNumber(std::string& out, T v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

// Nanoseconds as microseconds with exactly three decimals ("1234.567").
void AppendMicros(std::string& out, bool negative, std::uint64_t abs_ns) {
  if (negative) out += '-';
  AppendNumber(out, abs_ns / 1000);
  const auto frac = static_cast<unsigned>(abs_ns % 1000);
  const char digits[4] = {'.', static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
                          static_cast<char>('0' + frac % 10)};
  out.append(digits, 4);
}
void AppendMicros(std::string& out, std::int64_t ns) {
  AppendMicros(out, ns < 0, ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns));
}

// The same three, written at `p` (room for them reserved): the hot path of
// the counter samples.
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
char* PutMicros(char* p, std::int64_t ns) {
  const bool negative = ns < 0;
  const std::uint64_t abs_ns = negative ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  if (negative) *p++ = '-';
  p = PutDecimal(p, abs_ns / 1000);
  const auto frac = static_cast<unsigned>(abs_ns % 1000);
  p[0] = '.';
  p[1] = static_cast<char>('0' + frac / 100);
  p[2] = static_cast<char>('0' + frac / 10 % 10);
  p[3] = static_cast<char>('0' + frac % 10);
  return p + 4;
}

// A JSON string literal. Invalid UTF-8 bytes become U+FFFD, so any text
// (labels, marks, alloc_conf) yields valid JSON.
template <typename Text>
void AppendString(std::string& out, const Text& text) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  out += '"';
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20) {
            const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
            out.append(esc, 6);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // A multi-byte sequence; each byte of an invalid one becomes U+FFFD.
    const std::size_t len = Utf8Sequence(s, n, i);
    if (len != 0) {
      out.append(reinterpret_cast<const char*>(s + i), len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    }
  }
  out += '"';
}

// Streams the traceEvents array: each event is appended to a buffer, which
// goes to the stream in large writes.
class EventWriter {
 public:
  explicit EventWriter(std::ostream& out) : out_(out) { buf_.resize(kFlushAt + 4096); }

  // Starts an event object with its common fields; the caller appends the
  // rest and calls End(). "ts" comes first: Perfetto's JSON tokenizer scans
  // each event for it with a reader that rejects \u escapes, so no string
  // value may come before it.
  std::string& Begin(std::int64_t ts_ns, const char* ph, int pid, int tid, absl::string_view name) {
    text_ += first_ ? "\n{\"ts\":" : ",\n{\"ts\":";
    first_ = false;
    AppendMicros(text_, ph[0] == 'M' ? ts_ns : ts_ns + offset_ns_);
    text_ += ",\"ph\":\"";
    text_ += ph;
    text_ += "\",\"pid\":";
    AppendNumber(text_, pid);
    text_ += ",\"tid\":";
    AppendNumber(text_, tid);
    text_ += ",\"name\":";
    AppendString(text_, name);
    return text_;
  }
  void End() {
    text_ += '}';
    Commit();
  }
  // Text written with Begin or raw() goes to the trace.
  void Commit() {
    Put(text_.data(), text_.size());
    text_.clear();
    if (pos_ >= kFlushAt) Flush();
  }
  void Flush() {
    Put(text_.data(), text_.size());
    text_.clear();
    out_.write(buf_.data(), static_cast<std::streamsize>(pos_));
    pos_ = 0;
  }
  // The text of the event begun, or of what goes before the next one.
  std::string& raw() { return text_; }

  // Raw writing for the hot path: Open returns room for `max_bytes` (and 32
  // more that may be written past it, CopyPadded's), EventStart writes an
  // event's separator and "{\"ts\":" there, and Close takes the end of what
  // was written.
  char* Open(std::size_t max_bytes) {
    if (!text_.empty()) Commit();
    Room(max_bytes + 32);
    return buf_.data() + pos_;
  }
  char* EventStart(char* p) {
    p = PutText(p, first_ ? std::string_view("\n{\"ts\":") : std::string_view(",\n{\"ts\":"));
    first_ = false;
    return p;
  }
  void Close(const char* end) {
    pos_ = static_cast<std::size_t>(end - buf_.data());
    if (pos_ >= kFlushAt) Flush();
  }
  std::int64_t offset_ns() const { return offset_ns_; }
  // Added to every event's time but metadata's: the rank's start on the
  // run's common clock.
  void set_offset_ns(std::int64_t offset) { offset_ns_ = offset; }

 private:
  // Room for `n` more bytes in the buffer.
  void Room(std::size_t n) {
    if (pos_ + n <= buf_.size()) return;
    out_.write(buf_.data(), static_cast<std::streamsize>(pos_));
    pos_ = 0;
    if (n > buf_.size()) buf_.resize(n);
  }
  void Put(const char* s, std::size_t n) {
    Room(n);
    std::memcpy(buf_.data() + pos_, s, n);
    pos_ += n;
  }

  std::int64_t offset_ns_ = 0;
  static constexpr std::size_t kFlushAt = 1 << 16;
  std::ostream& out_;
  std::string buf_;  // its first pos_ bytes are the trace's next bytes
  std::size_t pos_ = 0;
  std::string text_;  // Begin's and raw()'s text, not yet in buf_
  bool first_ = true;
};

// ---------------------------------------------------------------------------
// The first walk: which counter samples to keep.

struct NoPayload {};

bool SamePhase(const OpenPhase& p, const Event& e) {
  return p.phase == e.phase && p.step == e.step() && p.label == e.name;
}

}  // namespace

class ChromeTraceWriter::Events final : public EventWriter {
 public:
  using EventWriter::EventWriter;
};

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
  RankWriter(const RankPlan& plan, EventWriter& w) : plan_(plan), tl_(plan.timeline), w_(w) {
    // A counter sample's text between its numbers (OnSample), written once.
    const std::string common = absl::StrCat(",\"ph\":\"C\",\"pid\":", tl_.rank, ",\"tid\":1,\"name\":");
    for (std::size_t k = 0; k < kTracks.size(); ++k) {
      track_text_[k] = common;
      AppendString(track_text_[k], kTracks[k]);
      track_text_[k] += ",\"cat\":\"memory\",\"args\":{\"bytes\":";
    }
    category_text_[0] = common;
    AppendString(category_text_[0], std::string_view("memory by category"));
    category_text_[0] += ",\"cat\":\"memory\",\"args\":{";
    for (int c = 0; c < kNumCategories; ++c) {
      if (c > 0) category_text_[c] += ',';
      AppendString(category_text_[c], CategoryName(static_cast<Category>(c)));
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
      case EventType::kMark:
        w_.Begin(e.time_ns, "i", tl_.rank, 0, tl_.str(e.name)) += ",\"cat\":\"mark\",\"s\":\"t\"";
        w_.End();
        break;
      case EventType::kOom: WriteOom(walk.model(), e); break;
      case EventType::kCollectiveBegin: collectives_.push_back(e); break;
      case EventType::kCollectiveEnd:
        if (!collectives_.empty()) {
          WriteCollective(collectives_.back(), e.time_ns, false);
          collectives_.pop_back();
        }
        break;
      case EventType::kEmptyCache: {
        std::string& m = w_.Begin(e.time_ns, "i", tl_.rank, 1, "empty_cache");
        m += ",\"cat\":\"allocator\",\"s\":\"p\",\"args\":{\"reserved\":";
        AppendNumber(m, walk.model().reserved());
        m += '}';
        w_.End();
        break;
      }
      case EventType::kAllocRetry: {
        std::string& m = w_.Begin(e.time_ns, "i", tl_.rank, 1, "alloc retry");
        m += ",\"cat\":\"allocator\",\"s\":\"p\",\"args\":{\"size\":";
        AppendNumber(m, e.size);
        m += '}';
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
  // A collective as a slice on thread 2, "communication".
  void WriteCollective(const Event& begin, std::int64_t end_ns, bool unfinished) {
    std::string& b = w_.Begin(begin.time_ns, "X", tl_.rank, 2, tl_.str(begin.name));
    b += ",\"cat\":\"communication\",\"dur\":";
    // In unsigned arithmetic: corrupt times must not overflow.
    AppendMicros(
        b, false,
        end_ns > begin.time_ns ? static_cast<std::uint64_t>(end_ns) - static_cast<std::uint64_t>(begin.time_ns) : 0);
    b += ",\"args\":{\"bytes\":";
    AppendNumber(b, begin.size);
    if (unfinished) b += ",\"unfinished\":true";
    b += '}';
    w_.End();
  }
  std::vector<Event> collectives_;  // begun, not yet ended (innermost last)
  void OnSample(const TraceModel& model, const Event& e);

  const RankPlan& plan_;
  static constexpr std::array<std::string_view, 3> kTracks = {"allocated", "reserved", "active"};
  const Timeline& tl_;
  EventWriter& w_;
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
  std::string& b = w_.Begin(0, "M", pid, 0, "process_name");
  b += ",\"args\":{\"name\":";
  AppendString(b, absl::StrCat("rank ", pid));
  b += '}';
  w_.End();
  w_.Begin(0, "M", pid, 0, "process_sort_index") += ",\"args\":{\"sort_index\":";
  AppendNumber(w_.raw(), pid);
  w_.raw() += '}';
  w_.End();
  constexpr std::array<const char*, 3> kThreads = {"phases", "allocator", "communication"};
  for (int tid = 0; tid < (plan_.has_collectives ? 3 : 2); ++tid) {
    w_.Begin(0, "M", pid, tid, "thread_name") += ",\"args\":{\"name\":\"";
    w_.raw() += kThreads[static_cast<std::size_t>(tid)];
    w_.raw() += "\"}";
    w_.End();
    w_.Begin(0, "M", pid, tid, "thread_sort_index") += ",\"args\":{\"sort_index\":";
    AppendNumber(w_.raw(), tid);
    w_.raw() += '}';
    w_.End();
  }
}

// The trace's rule: an end closes the latest-begun open phase with the same
// phase, step and label, and nothing else. The walk closed its match and any
// phase open inside it; those inner ones stay open here (pending_), and one
// of them may be the latest match.
void ChromeTraceWriter::RankWriter::OnPhaseEnd(const TimelineWalk& walk, const Event& e) {
  const PhaseEnd& end = walk.phase_end();
  pending_.insert(pending_.end(), end.cut.begin(), end.cut.end());
  std::size_t latest = pending_.size();
  for (std::size_t k = 0; k < pending_.size(); ++k) {
    if (SamePhase(pending_[k], e) &&
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
  std::string& b =
      w_.Begin(p.begin_ns, "X", tl_.rank, 0, PhaseMarkName(p.phase, p.step, tl_.str(p.label), p.micro_batch));
  b += ",\"cat\":\"phase\",\"dur\":";
  // In unsigned arithmetic: corrupt times must not overflow.
  AppendMicros(b, false,
               end_ns > p.begin_ns ? static_cast<std::uint64_t>(end_ns) - static_cast<std::uint64_t>(p.begin_ns) : 0);
  b += ",\"args\":{\"step\":";
  AppendNumber(b, p.step);
  if (unfinished) b += ",\"unfinished\":true";
  b += '}';
  w_.End();
}

void ChromeTraceWriter::RankWriter::WriteOom(const TraceModel& model, const Event& e) {
  std::string& m = w_.Begin(e.time_ns, "i", tl_.rank, 1, "OOM");
  m += ",\"cat\":\"allocator\",\"s\":\"p\",\"args\":{\"requested_size\":";
  AppendNumber(m, e.requested_size);
  m += ",\"rounded_size\":";
  AppendNumber(m, e.size);
  m += ",\"device_free\":";
  AppendNumber(m, e.device_free());
  m += ",\"allocated\":";
  AppendNumber(m, model.allocated());
  m += ",\"reserved\":";
  AppendNumber(m, model.reserved());
  m += ",\"stream\":";
  AppendNumber(m, e.stream);
  m += e.small_pool() ? ",\"pool\":\"small\"}" : ",\"pool\":\"large\"}";
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
  char* p = w_.EventStart(w_.Open(sample_bytes_));
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
  w_.Close(p);
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
  std::string& b = events_->raw();
  b += "{\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"generator\":\"memscope\",\"ranks\":";
  AppendNumber(b, plans_.size());
  b += ",\"max_counter_samples_per_rank\":";
  AppendNumber(b, max_samples_);
  for (const auto& plan : plans_) {
    const Timeline& tl = plan->timeline;
    const std::string prefix = absl::StrCat(",\"rank ", tl.rank, " ");
    const auto key = [&](const char* name) -> std::string& { return b.append(prefix).append(name).append("\":"); };
    AppendNumber(key("events"), tl.events.size());
    AppendNumber(key("counter samples"), plan->span.samples);
    AppendNumber(key("counter samples written"), plan->written());
    AppendNumber(key("world_size"), tl.world_size);
    AppendNumber(key("device"), tl.device_index);
    AppendNumber(key("device_capacity"), tl.device_capacity);
    AppendNumber(key("wall_start_us"), tl.wall_start_us);
    AppendString(key("alloc_conf"), tl.alloc_conf);
  }
  b += "},\n\"traceEvents\":[";
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
  Events& w = *events_;
  w.set_offset_ns(0);
  const int pid = kGpusPid;
  w.Begin(0, "M", pid, 0, "process_name") += ",\"args\":{\"name\":\"GPUs\"}";
  w.End();
  w.Begin(0, "M", pid, 0, "process_sort_index") += ",\"args\":{\"sort_index\":";
  AppendNumber(w.raw(), pid);
  w.raw() += '}';
  w.End();
  const auto bytes = [](const nlohmann::json& o, const char* key) -> std::uint64_t {
    const auto it = o.find(key);
    return it != o.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
  };
  for (const nlohmann::json& gpu : gpus) {
    if (!gpu.is_object()) continue;
    const auto physical = gpu.find("physical");
    const std::string name =
        absl::StrCat("GPU ", physical != gpu.end() && physical->is_number_integer() ? physical->get<int>() : 0);
    std::uint64_t context = 0, reserved = 0, nccl = 0;
    if (const auto procs = gpu.find("processes"); procs != gpu.end() && procs->is_array()) {
      for (const nlohmann::json& p : *procs) {
        if (!p.is_object()) continue;
        context += bytes(p, "context_bytes");
        reserved += bytes(p, "reserved_bytes");
        nccl += bytes(p, "nccl_bytes");
      }
    }
    for (const std::int64_t ts : {std::int64_t{0}, end_ns}) {
      std::string& b = w.Begin(ts, "C", pid, 0, name);
      b += ",\"args\":{\"context\":";
      AppendNumber(b, context);
      b += ",\"reserved\":";
      AppendNumber(b, reserved);
      b += ",\"nccl\":";
      AppendNumber(b, nccl);
      b += '}';
      w.End();
    }
    // "s" before "args": the row's own keys hold no '<' or escapes.
    std::string& b = w.Begin(end_ns, "i", pid, 0, absl::StrCat(name, " processes"));
    b += ",\"s\":\"p\",\"args\":";
    b += gpu.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    w.End();
  }
}

absl::Status ChromeTraceWriter::Finish() {
  if (!header_written_) WriteHeader();
  writer_.reset();
  events_->raw() += "\n]}\n";
  events_->Flush();
  out_.flush();
  if (!out_) return absl::DataLossError("writing the Chrome trace failed");
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
