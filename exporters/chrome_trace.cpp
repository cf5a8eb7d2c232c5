#include "exporters/chrome_trace.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/trace_model.h"

namespace memscope {
namespace {

absl::Status EventError(const Timeline& tl, std::size_t index, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("rank ", tl.rank, ": event ", index, ": ", s.message()));
}

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
    // A multi-byte sequence: its length and the range of its second byte.
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    bool valid = len != 0 && i + len <= n && s[i + 1] >= lo && s[i + 1] <= hi;
    for (std::size_t k = 2; valid && k < len; ++k) valid = s[i + k] >= 0x80 && s[i + k] <= 0xBF;
    if (valid) {
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
  explicit EventWriter(std::ostream& out) : out_(out) { buf_.reserve(kFlushAt + 4096); }

  // Starts an event object with its common fields; the caller appends the
  // rest and calls End(). "ts" comes first: Perfetto's JSON tokenizer scans
  // each event for it with a reader that rejects \u escapes, so no string
  // value may come before it.
  std::string& Begin(std::int64_t ts_ns, const char* ph, int pid, int tid, absl::string_view name) {
    buf_ += first_ ? "\n{\"ts\":" : ",\n{\"ts\":";
    first_ = false;
    AppendMicros(buf_, ts_ns);
    buf_ += ",\"ph\":\"";
    buf_ += ph;
    buf_ += "\",\"pid\":";
    AppendNumber(buf_, pid);
    buf_ += ",\"tid\":";
    AppendNumber(buf_, tid);
    buf_ += ",\"name\":";
    AppendString(buf_, name);
    return buf_;
  }
  void End() {
    buf_ += '}';
    if (buf_.size() >= kFlushAt) Flush();
  }
  void Flush() {
    out_.write(buf_.data(), static_cast<std::streamsize>(buf_.size()));
    buf_.clear();
  }
  std::string& raw() { return buf_; }

 private:
  static constexpr std::size_t kFlushAt = 1 << 16;
  std::ostream& out_;
  std::string buf_;
  bool first_ = true;
};

// ---------------------------------------------------------------------------
// Which counter samples to keep.

struct RankPlan {
  const Timeline* timeline = nullptr;
  std::uint64_t samples = 0;          // counter samples before thinning
  bool thinned = false;
  std::vector<std::uint64_t> keep;    // kept sample ordinals, ascending (when thinned)
};

struct Bucket {
  bool used = false;
  std::uint64_t max_allocated = 0, max_allocated_at = 0;
  std::uint64_t max_reserved = 0, max_reserved_at = 0;
  std::uint64_t last_allocated = 0, last_reserved = 0, last_at = 0;
};

// Pass 1: the number of samples and their time span, without the model.
// Pass 2: replays the events through a model (checking the timeline) and,
// when thinning, finds each bucket's maxima and last sample.
absl::Status Plan(const Timeline& tl, std::size_t max_samples, RankPlan& plan) {
  plan.timeline = &tl;
  std::int64_t t0 = 0, t1 = 0;
  for (const Event& e : tl.events) {
    if (!ChangesMemory(e.type)) continue;
    if (plan.samples == 0) {
      t0 = t1 = e.time_ns;
    } else {
      t0 = std::min(t0, e.time_ns);
      t1 = std::max(t1, e.time_ns);
    }
    ++plan.samples;
  }
  plan.thinned = plan.samples > max_samples;

  const std::size_t num_buckets = plan.thinned ? (max_samples - 1) / 2 : 0;
  std::vector<Bucket> buckets(num_buckets);
  // In double: corrupt times must not overflow.
  const double start = static_cast<double>(t0);
  const double span = static_cast<double>(t1) - start;
  TraceModel model;
  std::uint64_t ordinal = 0;
  for (std::size_t i = 0; i < tl.events.size(); ++i) {
    const Event& e = tl.events[i];
    if (absl::Status s = model.Apply(e); !s.ok()) return EventError(tl, i, s);
    if (!plan.thinned || !ChangesMemory(e.type)) continue;
    std::size_t b = 0;
    if (span > 0) {
      const double x = (static_cast<double>(e.time_ns) - start) / span * static_cast<double>(num_buckets);
      b = x <= 0 ? 0 : std::min(num_buckets - 1, static_cast<std::size_t>(x));
    }
    Bucket& bucket = buckets[b];
    const std::uint64_t allocated = model.allocated();
    const std::uint64_t reserved = model.reserved();
    if (!bucket.used || allocated > bucket.max_allocated) {
      bucket.max_allocated = allocated;
      bucket.max_allocated_at = ordinal;
    }
    if (!bucket.used || reserved > bucket.max_reserved) {
      bucket.max_reserved = reserved;
      bucket.max_reserved_at = ordinal;
    }
    bucket.used = true;
    bucket.last_allocated = allocated;
    bucket.last_reserved = reserved;
    bucket.last_at = ordinal;
    ++ordinal;
  }
  if (!plan.thinned) return absl::OkStatus();

  // The maxima of every bucket and the final sample: at most 2B + 1 <= M.
  std::vector<std::uint64_t>& keep = plan.keep;
  for (const Bucket& b : buckets) {
    if (!b.used) continue;
    keep.push_back(b.max_allocated_at);
    keep.push_back(b.max_reserved_at);
  }
  keep.push_back(plan.samples - 1);
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());

  // Then the buckets' last samples while there is room, largest drop first.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> lasts;  // (drop, ordinal)
  for (const Bucket& b : buckets) {
    if (!b.used || std::binary_search(keep.begin(), keep.end(), b.last_at)) continue;
    lasts.emplace_back(std::max(b.max_allocated - b.last_allocated, b.max_reserved - b.last_reserved), b.last_at);
  }
  const std::size_t room = max_samples - keep.size();
  if (lasts.size() > room) {
    const auto larger_drop = [](const auto& x, const auto& y) {
      return x.first > y.first || (x.first == y.first && x.second < y.second);
    };
    std::nth_element(lasts.begin(), lasts.begin() + static_cast<std::ptrdiff_t>(room), lasts.end(), larger_drop);
    lasts.resize(room);
  }
  for (const auto& last : lasts) keep.push_back(last.second);
  std::sort(keep.begin(), keep.end());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Pass 3: the events of one rank.

std::string SliceName(const Timeline& tl, Phase phase, std::int64_t step, std::uint32_t label) {
  return PhaseMarkName(phase, step, tl.str(label));
}

struct OpenPhase {
  Phase phase;
  std::int64_t step;
  std::uint32_t label;
  std::int64_t begin_ns;
};

void WriteSlice(EventWriter& w, const Timeline& tl, const OpenPhase& p, std::int64_t end_ns, bool unfinished) {
  std::string& b = w.Begin(p.begin_ns, "X", tl.rank, 0, SliceName(tl, p.phase, p.step, p.label));
  b += ",\"cat\":\"phase\",\"dur\":";
  // In unsigned arithmetic: corrupt times must not overflow.
  AppendMicros(b, false, end_ns > p.begin_ns ? static_cast<std::uint64_t>(end_ns) - static_cast<std::uint64_t>(p.begin_ns) : 0);
  b += ",\"args\":{\"step\":";
  AppendNumber(b, p.step);
  if (unfinished) b += ",\"unfinished\":true";
  b += '}';
  w.End();
}

absl::Status WriteRank(const RankPlan& plan, EventWriter& w) {
  const Timeline& tl = *plan.timeline;
  const int pid = tl.rank;

  // Metadata: process and thread names.
  std::string& b = w.Begin(0, "M", pid, 0, "process_name");
  b += ",\"args\":{\"name\":";
  AppendString(b, absl::StrCat("rank ", pid));
  b += '}';
  w.End();
  w.Begin(0, "M", pid, 0, "process_sort_index") += ",\"args\":{\"sort_index\":";
  AppendNumber(w.raw(), pid);
  w.raw() += '}';
  w.End();
  constexpr std::array<const char*, 2> kThreads = {"phases", "allocator"};
  for (int tid = 0; tid < 2; ++tid) {
    w.Begin(0, "M", pid, tid, "thread_name") += ",\"args\":{\"name\":\"";
    w.raw() += kThreads[static_cast<std::size_t>(tid)];
    w.raw() += "\"}";
    w.End();
    w.Begin(0, "M", pid, tid, "thread_sort_index") += ",\"args\":{\"sort_index\":";
    AppendNumber(w.raw(), tid);
    w.raw() += '}';
    w.End();
  }

  std::string category_names[kNumCategories];
  for (int c = 0; c < kNumCategories; ++c) {
    AppendString(category_names[c], CategoryName(static_cast<Category>(c)));
  }

  TraceModel model;
  std::vector<OpenPhase> open;
  std::uint64_t ordinal = 0;
  std::size_t next_keep = 0;
  std::int64_t last_ns = tl.events.empty() ? 0 : tl.events.front().time_ns;
  for (std::size_t i = 0; i < tl.events.size(); ++i) {
    const Event& e = tl.events[i];
    if (absl::Status s = model.Apply(e); !s.ok()) return EventError(tl, i, s);
    last_ns = std::max(last_ns, e.time_ns);
    switch (e.type) {
      case EventType::kPhaseBegin:
        open.push_back({e.phase, e.step(), e.name, e.time_ns});
        break;
      case EventType::kPhaseEnd:
        for (std::size_t k = open.size(); k-- > 0;) {
          if (open[k].phase == e.phase && open[k].step == e.step() && open[k].label == e.name) {
            WriteSlice(w, tl, open[k], e.time_ns, false);
            open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
            break;
          }
        }
        break;
      case EventType::kMark: {
        w.Begin(e.time_ns, "i", pid, 0, tl.str(e.name)) += ",\"cat\":\"mark\",\"s\":\"t\"";
        w.End();
        break;
      }
      case EventType::kOom: {
        std::string& m = w.Begin(e.time_ns, "i", pid, 1, "OOM");
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
        w.End();
        break;
      }
      case EventType::kEmptyCache: {
        std::string& m = w.Begin(e.time_ns, "i", pid, 1, "empty_cache");
        m += ",\"cat\":\"allocator\",\"s\":\"p\",\"args\":{\"reserved\":";
        AppendNumber(m, model.reserved());
        m += '}';
        w.End();
        break;
      }
      case EventType::kAllocRetry: {
        std::string& m = w.Begin(e.time_ns, "i", pid, 1, "alloc retry");
        m += ",\"cat\":\"allocator\",\"s\":\"p\",\"args\":{\"size\":";
        AppendNumber(m, e.size);
        m += '}';
        w.End();
        break;
      }
      default:
        break;
    }
    if (!ChangesMemory(e.type)) continue;
    const std::uint64_t this_sample = ordinal++;
    if (plan.thinned) {
      if (next_keep == plan.keep.size() || plan.keep[next_keep] != this_sample) continue;
      ++next_keep;
    }
    const DeviceStats& st = model.stats();
    std::string& m = w.Begin(e.time_ns, "C", pid, 1, "memory");
    m += ",\"cat\":\"memory\",\"args\":{\"allocated\":";
    AppendNumber(m, All(st.allocated_bytes).current);
    m += ",\"reserved\":";
    AppendNumber(m, All(st.reserved_bytes).current);
    m += ",\"active\":";
    AppendNumber(m, All(st.active_bytes).current);
    m += '}';
    w.End();
    std::string& c = w.Begin(e.time_ns, "C", pid, 1, "memory by category");
    c += ",\"cat\":\"memory\",\"args\":{";
    const auto& by_category = model.allocated_by_category();
    for (int k = 0; k < kNumCategories; ++k) {
      if (k > 0) c += ',';
      c += category_names[k];
      c += ':';
      AppendNumber(c, by_category[static_cast<std::size_t>(k)]);
    }
    c += '}';
    w.End();
  }
  for (const OpenPhase& p : open) WriteSlice(w, tl, p, last_ns, true);
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteChromeTrace(const std::vector<const Timeline*>& ranks, const ChromeTraceOptions& options,
                              std::ostream& out) {
  const std::size_t max_samples = std::max<std::size_t>(options.max_counter_samples_per_rank, 3);
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
  std::vector<RankPlan> plans(ranks.size());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (absl::Status s = Plan(*ranks[r], max_samples, plans[r]); !s.ok()) return s;
  }

  // displayTimeUnit first: Perfetto reads it only from the start of the file.
  EventWriter w(out);
  std::string& b = w.raw();
  b += "{\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"generator\":\"memscope\",\"ranks\":";
  AppendNumber(b, ranks.size());
  b += ",\"max_counter_samples_per_rank\":";
  AppendNumber(b, max_samples);
  for (const RankPlan& plan : plans) {
    const Timeline& tl = *plan.timeline;
    const std::string prefix = absl::StrCat(",\"rank ", tl.rank, " ");
    const auto key = [&](const char* name) -> std::string& { return b.append(prefix).append(name).append("\":"); };
    AppendNumber(key("events"), tl.events.size());
    AppendNumber(key("counter samples"), plan.samples);
    AppendNumber(key("counter samples written"), plan.thinned ? plan.keep.size() : plan.samples);
    AppendNumber(key("world_size"), tl.world_size);
    AppendNumber(key("device"), tl.device_index);
    AppendNumber(key("device_capacity"), tl.device_capacity);
    AppendNumber(key("wall_start_us"), tl.wall_start_us);
    AppendString(key("alloc_conf"), tl.alloc_conf);
  }
  b += "},\n\"traceEvents\":[";
  for (const RankPlan& plan : plans) {
    if (absl::Status s = WriteRank(plan, w); !s.ok()) return s;
  }
  w.raw() += "\n]}\n";
  w.Flush();
  out.flush();
  if (!out) return absl::DataLossError("writing the Chrome trace failed");
  return absl::OkStatus();
}

}  // namespace memscope
