#include "recording/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/input_file.h"

namespace memscope {
namespace {

constexpr std::size_t kChunk = 40;

template <typename T>
void Put(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

absl::Status WriteAll(int fd, const char* data, std::size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("cannot write timeline '", path, "': ", std::strerror(errno)));
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

std::uint32_t MemorySink::Intern(std::string_view text) {
  if (text.empty()) return 0;
  auto [it, inserted] = ids_.emplace(std::string(text), static_cast<std::uint32_t>(timeline_.strings.size()));
  if (inserted) timeline_.strings.emplace_back(text);
  return it->second;
}

absl::StatusOr<std::unique_ptr<TimelineWriter>> TimelineWriter::Create(const std::string& path,
                                                                       const Timeline& header) {
  // Never through a symlink: one at `path` is replaced by the timeline.
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(path.c_str(), kFlags, 0644);
  if (fd < 0 && errno == ELOOP && ::unlink(path.c_str()) == 0) fd = ::open(path.c_str(), kFlags | O_EXCL, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create timeline '", path, "': ", std::strerror(errno)));
  char raw[kTimelineHeaderSize] = {};
  std::memcpy(raw, kTimelineMagic, 8);
  Put<std::uint32_t>(raw + 8, kTimelineVersion);
  Put<std::uint32_t>(raw + 12, 0);  // variable-length records
  Put<std::int32_t>(raw + 16, header.rank);
  Put<std::int32_t>(raw + 20, header.world_size);
  Put<std::int32_t>(raw + 24, header.device_index);
  Put<std::uint32_t>(raw + 28, header.sampled_clock ? kTimelineSampledClock : 0u);  // flags
  Put<std::uint64_t>(raw + 32, header.device_capacity);
  Put<std::int64_t>(raw + 40, header.wall_start_us);
  if (absl::Status s = WriteAll(fd, raw, sizeof(raw), path); !s.ok()) {
    ::close(fd);
    ::unlink(path.c_str());  // no header, nothing recorded: no file that reads as "not a timeline"
    return s;
  }
  std::unique_ptr<TimelineWriter> w(new TimelineWriter(path, fd));
  const std::uint32_t conf_id = w->Intern(header.alloc_conf);
  char config[1 + 3 * 10];
  char* p = config;
  *p++ = static_cast<char>(kRecordConfig);
  p = PutVarint(p, conf_id);
  p = PutVarint(p, header.device_capacity);
  p = PutVarint(p, static_cast<std::uint64_t>(header.device_index));
  w->AppendRaw(std::string_view(config, static_cast<std::size_t>(p - config)));
  if (absl::Status s = w->Flush(); !s.ok()) return s;
  return w;
}

TimelineWriter::TimelineWriter(std::string path, int fd)
    : path_(std::move(path)),
      fd_(fd),
      buffer_(new char[kBufferBytes]),
      slots_(new Slot[std::size_t{1} << kSlotBits]),
      slot_seq_(new std::uint64_t[std::size_t{1} << kSlotBits]) {
  std::fill_n(slot_seq_.get(), std::size_t{1} << kSlotBits, RecordSink::kNoRecord);
  sink_.cur = buffer_.get();
  sink_.slot_seq = slot_seq_.get();
  // Record ids unique in the process: a block recorded by another writer
  // never matches a slot of this one (2^40 allocs per writer).
  static std::atomic<std::uint64_t> writers{0};
  sink_.seq = (writers.fetch_add(1, std::memory_order_relaxed) + 1) << 40;
}

void TimelineWriter::AppendGeneral(EventType type, char* start, std::uint64_t time, std::uint64_t addr,
                                   std::uint64_t size, std::uint64_t requested, std::uint64_t stream,
                                   std::uint64_t name, unsigned kinds, unsigned small) {
  if (type == EventType::kAlloc) SetSlot(addr, size, requested, stream, small);
  // Branch-free: each field's zigzag delta is stored as 8 bytes and the
  // cursor moves by the bytes it needs (0 when unchanged).
  char* p = start + 5;
  std::uint32_t lengths = 0;
  auto field = [&](std::uint64_t zigzag, int index) {
    const unsigned n = ByteCount(zigzag);
    std::memcpy(p, &zigzag, 8);
    p += n;
    lengths |= n << (4 * index);
  };
  field(ZigZag(time - sink_.prev_time), 0);
  field(ZigZag(addr - sink_.prev_addr), 1);
  field(ZigZag(size - sink_.prev_size), 2);
  field(ZigZag(requested - size), 3);
  if (stream != sink_.prev_stream) field(ZigZag(stream - sink_.prev_stream), 4);
  if (name != sink_.prev_name) field(ZigZag(name - sink_.prev_name), 5);
  *p = static_cast<char>(kinds);
  const unsigned has_kinds = kinds != kDefaultKinds ? 1u : 0u;
  p += has_kinds;
  lengths |= has_kinds << 24 | small << 28;
  start[0] = static_cast<char>(type);
  std::memcpy(start + 1, &lengths, 4);
  SetPrevious(time, addr, size, requested, stream, name, kinds, small);
  if (type == EventType::kAlloc) sink_.last_alloc_name = name;
  fold_at_ = nullptr;
  if (type == EventType::kFreeRequested) {
    fold_at_ = start + 4;
    fold_bit_ = 0x20;  // bit 29 of the lengths
  }
  sink_.cur = p;
  fold_end_ = p;
}

TimelineWriter::~TimelineWriter() {
  (void)Flush();
  ::close(fd_);
}

std::uint32_t TimelineWriter::Intern(std::string_view text) {
  if (text.empty()) return 0;
  auto [it, inserted] = ids_.emplace(std::string(text), next_id_);
  if (inserted) {
    ++next_id_;
    char head[1 + 2 * 10];
    char* p = head;
    *p++ = static_cast<char>(kRecordString);
    p = PutVarint(p, it->second);
    p = PutVarint(p, text.size());
    AppendRaw(std::string_view(head, static_cast<std::size_t>(p - head)));
    AppendRaw(text);
  }
  return it->second;
}

void TimelineWriter::AppendRaw(std::string_view bytes) {
  RevokeBudget();  // (the record may fill the buffer)
  fold_at_ = nullptr;  // a free_completed after this is not folded
  while (!bytes.empty()) {
    if (used() == kBufferBytes) WriteBuffer();
    const std::size_t n = std::min(bytes.size(), kBufferBytes - used());
    std::memcpy(sink_.cur, bytes.data(), n);
    sink_.cur += n;
    bytes.remove_prefix(n);
  }
}

void TimelineWriter::WriteBuffer() {
  if (used() != 0 && error_.ok()) {
    Preallocate(used());
    error_ = WriteAll(fd_, buffer_.get(), used(), path_);
    file_bytes_ += used();
  }
  sink_.cur = buffer_.get();
  fold_at_ = nullptr;  // written: its tag can no longer be changed
}

void TimelineWriter::Preallocate(std::size_t bytes) {
#if defined(__linux__)
  // The blocks a write of a full buffer is about to fill, allocated in one
  // call: ext4 otherwise reserves a delayed block per page inside write()
  // (writing 14.3 MB in 1 MiB writes to a new ext4 file here: 3.2-3.6 ms
  // with it, 3.9-8.4 ms without). Only the blocks the write fills entirely
  // (nothing beyond the data; a crash between the two calls leaves at most
  // a buffer's blocks allocated past the end, never in the file), and the
  // file's size does not move (FALLOC_FL_KEEP_SIZE): it still grows by
  // write() alone, so that a torn tail is what it was. An error (a file
  // system without fallocate) only ends the preallocation.
  constexpr std::uint64_t kBlock = 4096;
  constexpr std::size_t kMinBytes = std::size_t{64} << 10;  // phase-end flushes are left alone
  if (!preallocate_ || bytes < kMinBytes) return;
  const std::uint64_t begin = (file_bytes_ + kBlock - 1) & ~(kBlock - 1);
  const std::uint64_t end = (file_bytes_ + bytes) & ~(kBlock - 1);
  if (end <= begin) return;
  if (::fallocate(fd_, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(begin), static_cast<off_t>(end - begin)) != 0) {
    preallocate_ = false;
  }
#else
  (void)bytes;
#endif
}

absl::Status TimelineWriter::Flush() {
  WriteBuffer();
  return error_;
}

absl::Status ValidateTimelineHeader(const Timeline& t, const std::string& source) {
  auto bad = [&](absl::string_view field, auto value, absl::string_view range) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": header ", field, " ", value, " is out of range (", range, "; corrupt file)"));
  };
  if (t.world_size < 1 || t.world_size > kMaxTimelineWorldSize) {
    return bad("world_size", t.world_size, absl::StrCat("1 to ", kMaxTimelineWorldSize));
  }
  // A rank beyond world_size is possible: an imported snapshot's device N is rank N of one.
  if (t.rank < 0 || t.rank >= kMaxTimelineWorldSize) {
    return bad("rank", t.rank, absl::StrCat("0 to ", kMaxTimelineWorldSize - 1));
  }
  if (t.device_index < 0 || t.device_index > kMaxTimelineDeviceIndex) {
    return bad("device_index", t.device_index, absl::StrCat("0 to ", kMaxTimelineDeviceIndex));
  }
  if (t.device_capacity > kMaxTimelineDeviceCapacity) {
    return bad("device_capacity", t.device_capacity, "at most 1 PiB");
  }
  if (t.wall_start_us < 0 || t.wall_start_us > kMaxTimelineWallStartUs) {
    return bad("wall_start_us", t.wall_start_us, "Unix microseconds between 1970 and 3000");
  }
  return absl::OkStatus();
}

namespace {

bool KnownEventType(EventType type) {
  return IsAllocatorAction(type) || type == EventType::kPhaseBegin || type == EventType::kPhaseEnd ||
         type == EventType::kMark || type == EventType::kCollectiveBegin || type == EventType::kCollectiveEnd;
}

absl::Status UnknownType(const std::string& source, std::size_t record, unsigned type) {
  return absl::DataLossError(absl::StrCat(source, ": record ", record, " has unknown type ", type, " (corrupt file)"));
}

// File string ids mapped to a Timeline's ids (they are equal for files
// memscope wrote, but a reader must not trust that).
class StringIds {
 public:
  explicit StringIds(Timeline& t) : t_(t) {}
  // A string (or, in versions 1 and 2, a chunk of one) read from the file.
  void Add(std::uint32_t id, std::string_view text, bool last) {
    partial_[id].append(text);
    if (last && !id_map_.contains(id)) {
      t_.strings.push_back(std::move(partial_[id]));
      partial_.erase(id);
      id_map_[id] = static_cast<std::uint32_t>(t_.strings.size() - 1);
    }
  }
  std::uint32_t Resolve(std::uint32_t file_id) {
    if (file_id == 0) return 0;
    auto it = id_map_.find(file_id);
    if (it != id_map_.end()) return it->second;
    auto p = partial_.find(file_id);  // a string whose last chunk never came
    t_.strings.push_back(p != partial_.end() ? p->second : std::string());
    return id_map_[file_id] = static_cast<std::uint32_t>(t_.strings.size() - 1);
  }

 private:
  Timeline& t_;
  absl::flat_hash_map<std::uint32_t, std::uint32_t> id_map_;
  absl::flat_hash_map<std::uint32_t, std::string> partial_;
};

// Adds `e` (as read, fields resolved) to `t`, and its free_completed when
// the record carried kEventCompletedAtOnce.
void PushEvent(Timeline& t, Event e) {
  if (static_cast<int>(e.category) >= kNumCategories) e.category = Category::kOther;
  if (static_cast<int>(e.phase) >= kNumPhases) e.phase = Phase::kUser;
  const bool folded = e.type == EventType::kFreeRequested && (e.flags & kEventCompletedAtOnce) != 0;
  e.flags &= kEventSmallPool;
  t.events.push_back(e);
  if (folded) {
    e.type = EventType::kFreeCompleted;
    t.events.push_back(e);
  }
}

// Versions 1 and 2: 48-byte records.
absl::Status ParseFixedRecords(std::string_view body, Timeline& t, const std::string& source) {
  const std::size_t records = body.size() / sizeof(Event);
  t.torn_bytes = body.size() % sizeof(Event);
  StringIds ids(t);
  t.events.reserve(records);
  for (std::size_t i = 0; i < records; ++i) {
    const char* r = body.data() + i * sizeof(Event);
    const auto type = static_cast<std::uint8_t>(r[0]);
    if (type == kRecordString) {
      const std::size_t n = std::min<std::size_t>(static_cast<std::uint8_t>(r[3]), kChunk);
      ids.Add(Get<std::uint32_t>(r + 4), std::string_view(r + 8, n), r[2] == 1);
      continue;
    }
    Event e;
    std::memcpy(&e, r, sizeof(Event));
    if (type == kRecordConfig) {
      t.SetAllocConf(t.str(ids.Resolve(e.name)));
      continue;
    }
    if (!KnownEventType(e.type)) return UnknownType(source, i, type);
    e.name = ids.Resolve(e.name);
    PushEvent(t, e);
  }
  return absl::OkStatus();
}

// Reads version 3's varints; `ok` turns false (and stays) when one runs
// past the end (a torn tail) or is longer than 10 bytes (corrupt).
struct VarReader {
  const char* p;
  const char* end;
  bool ok = true;
  bool overlong = false;

  std::uint64_t Varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (p == end) {
        ok = false;
        return 0;
      }
      const auto b = static_cast<std::uint8_t>(*p++);
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    ok = false;
    overlong = true;
    return 0;
  }
  static std::uint64_t UnZigZag(std::uint64_t z) { return (z >> 1) ^ (0 - (z & 1)); }
  std::uint64_t Delta() { return UnZigZag(Varint()); }
};

// The running values that versions 3 and 4's records are deltas of.
struct VarDeltas {
  std::uint64_t time = 0, addr = 0, size = 0, stream = 0, name = 0;
};

// Version 4's lean free of alloc slot `s` (its fields the slot's alloc's; no owner).
[[gnu::always_inline]] inline Event LeanFree(std::uint8_t tag, const TimelineWriter::Slot& s, VarDeltas& d) {
  Event e;
  e.type = EventType::kFreeRequested;
  e.flags = static_cast<std::uint8_t>(s.small | ((tag & 0x40) != 0 ? kEventCompletedAtOnce : 0));
  e.time_ns = static_cast<std::int64_t>(d.time);
  e.addr = d.addr = s.addr;
  e.size = d.size = s.size;
  e.requested_size = s.requested;
  e.stream = d.stream = s.stream;
  d.name = 0;
  return e;
}

// Version 4's compact alloc: the 11 bytes at `p` after its tag (the address's
// delta and the size in 512-byte units, then the slack); the last alloc's owner.
[[gnu::always_inline]] inline Event CompactAlloc(std::uint8_t tag, const char* p, std::uint64_t alloc_name,
                                                 VarDeltas& d) {
  const auto word = Get<std::uint64_t>(p);
  std::uint32_t slack = 0;
  std::memcpy(&slack, p + 8, 3);
  Event e;
  e.type = EventType::kAlloc;
  e.flags = static_cast<std::uint8_t>((tag >> 4) & 1);
  e.time_ns = static_cast<std::int64_t>(d.time);
  d.addr += static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int32_t>(word & 0xffffffffu))) << 9;
  d.size = (word >> 32) << 9;
  e.addr = d.addr;
  e.size = d.size;
  e.requested_size = d.size - slack;
  e.stream = d.stream;
  d.name = alloc_name;
  return e;
}

// A full record's 7 little-endian fields, of the byte lengths in `lengths`'
// nibbles: false for a length over 8; `in.ok` turns false when they run past the end.
[[gnu::always_inline]] inline bool ReadFields(VarReader& in, std::uint32_t lengths, std::uint64_t (&fields)[7]) {
  for (int f = 0; f < 7; ++f) {
    const unsigned n = (lengths >> (4 * f)) & 15;
    if (n > 8) return false;
    fields[f] = 0;
    if (static_cast<std::size_t>(in.end - in.p) < n) {
      in.ok = false;
      break;
    }
    std::memcpy(&fields[f], in.p, n);  // little-endian
    in.p += n;
  }
  return true;
}

// Adds a full record's field deltas to the running values and gives `e` them.
[[gnu::always_inline]] inline void ApplyFields(const std::uint64_t (&fields)[7], VarDeltas& d, Event& e) {
  const std::uint64_t d_requested = VarReader::UnZigZag(fields[3]);
  d.time += VarReader::UnZigZag(fields[0]);
  d.addr += VarReader::UnZigZag(fields[1]);
  d.size += VarReader::UnZigZag(fields[2]);
  d.stream += VarReader::UnZigZag(fields[4]);
  d.name += VarReader::UnZigZag(fields[5]);
  e.time_ns = static_cast<std::int64_t>(d.time);
  e.addr = d.addr;
  e.size = d.size;
  e.requested_size = d.size + d_requested;
  e.stream = d.stream;
}

// Versions 3 and 4: variable-length, delta-encoded records (timeline.h).
absl::Status ParseVarRecords(std::string_view body, Timeline& t, const std::string& source, std::uint32_t version) {
  StringIds ids(t);
  // Records average about 4 bytes per event (docs/benchmarks.md, "Recording"):
  // one allocation of about the final size instead of doubling from empty,
  // which copies the events and touches twice the memory. Capped (16M events,
  // 768 MB) so that a large file of other records cannot reserve gigabytes.
  t.events.reserve(std::min<std::size_t>(body.size() / (version >= 4 ? 4 : 8), std::size_t{1} << 24));
  VarReader in{body.data(), body.data() + body.size()};
  VarDeltas d;
  // Version 4: the alloc slots (as the writer's) and the last alloc's owner.
  std::vector<TimelineWriter::Slot> slots(version >= 4 ? std::size_t{1} << TimelineWriter::kSlotBits : 0);
  std::uint64_t alloc_name = 0;
  auto corrupt = [&](std::size_t record, absl::string_view what) {
    return absl::DataLossError(absl::StrCat(source, ": record ", record, " ", what, " (corrupt file)"));
  };
  // The event read (fields as in the file, `name` a file id), pushed.
  auto push = [&](Event e, std::uint64_t kinds) {
    if (e.type == EventType::kAlloc && version >= 4) {
      slots[TimelineWriter::SlotOf(e.addr)] =
          TimelineWriter::Slot{e.addr, e.size, e.requested_size, e.stream, 0, e.flags & kEventSmallPool ? 1u : 0u};
      alloc_name = d.name;
    }
    e.category = static_cast<Category>(kinds & 15);
    e.phase = static_cast<Phase>((kinds >> 4) & 15);
    // A name beyond 32 bits is no string of this file: it reads as "".
    e.name = d.name <= 0xffffffffu ? ids.Resolve(static_cast<std::uint32_t>(d.name)) : ids.Resolve(0xffffffffu);
    PushEvent(t, e);
  };
  for (std::size_t i = 0; in.p != in.end; ++i) {
    const char* const record_start = in.p;
    const auto tag = static_cast<std::uint8_t>(*in.p++);
    auto torn = [&] { t.torn_bytes = static_cast<std::uint64_t>(in.end - record_start); };
    if (version >= 4 && (tag & TimelineWriter::kLeanFree) != 0) {
      if (in.p == in.end) {
        torn();
        break;
      }
      if ((tag & 0x30) != 0) return corrupt(i, "has a bad slot");
      const std::size_t slot = (tag & 15u) << 8 | static_cast<std::uint8_t>(*in.p++);
      push(LeanFree(tag, slots[slot], d), TimelineWriter::kDefaultKinds);
      continue;
    }
    if (version >= 4 && (tag & TimelineWriter::kCompactAlloc) != 0) {
      if (in.end - in.p < 11) {
        torn();
        break;
      }
      const Event e = CompactAlloc(tag, in.p, alloc_name, d);
      in.p += 11;
      push(e, (tag & 15u) | static_cast<unsigned>(Phase::kUser) << 4);
      continue;
    }
    const unsigned type = tag & 63u;
    if (type == kRecordString) {
      const auto id = static_cast<std::uint32_t>(in.Varint());
      const std::uint64_t n = in.Varint();
      if (in.ok && n > static_cast<std::uint64_t>(in.end - in.p)) in.ok = false;  // torn inside the text
      if (!in.ok) {
        if (in.overlong) return corrupt(i, "has an overlong varint");
        torn();
        break;
      }
      ids.Add(id, std::string_view(in.p, n), true);
      in.p += n;
      continue;
    }
    if (type == kRecordConfig) {
      const auto conf = static_cast<std::uint32_t>(in.Varint());
      (void)in.Varint();  // capacity and device index: the header's
      (void)in.Varint();
      if (!in.ok) {
        if (in.overlong) return corrupt(i, "has an overlong varint");
        torn();
        break;
      }
      t.SetAllocConf(t.str(ids.Resolve(conf)));
      continue;
    }
    if (type == kRecordTime && version >= 4) {
      const std::uint64_t delta = in.Delta();
      if (!in.ok) {
        if (in.overlong) return corrupt(i, "has an overlong varint");
        torn();
        break;
      }
      d.time += delta;
      continue;
    }
    Event e;
    e.type = static_cast<EventType>(type);
    if (!KnownEventType(e.type)) return UnknownType(source, i, type);
    if (in.end - in.p < 4) {
      torn();
      break;
    }
    const auto lengths = Get<std::uint32_t>(in.p);
    in.p += 4;
    // Version 3: the flags in the tag's bits 6 and 7; version 4: in bits 28 and 29 of the lengths.
    const std::uint32_t reserved = version >= 4 ? lengths >> 30 : lengths >> 28;
    if (reserved != 0 || ((lengths >> 24) & 15) > 1) return corrupt(i, "has a bad field length");
    e.flags = static_cast<std::uint8_t>(version >= 4 ? (lengths >> 28) & 3 : tag >> 6);
    std::uint64_t fields[7];
    if (!ReadFields(in, lengths, fields)) return corrupt(i, "has a bad field length");
    if (!in.ok) {
      torn();
      break;
    }
    const std::uint64_t kinds = ((lengths >> 24) & 15) != 0 ? fields[6] : TimelineWriter::kDefaultKinds;
    ApplyFields(fields, d, e);
    push(e, kinds);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Timeline> ParseTimeline(std::string_view bytes, const std::string& source) {
  if (bytes.size() < kTimelineHeaderSize || std::memcmp(bytes.data(), kTimelineMagic, 8) != 0) {
    if (bytes.size() >= 8 && std::memcmp(bytes.data(), kTimelineMagic, 8) == 0) {
      return absl::DataLossError(absl::StrCat(source, ": timeline header is truncated (", bytes.size(), " bytes)"));
    }
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a memscope timeline (bad magic)"));
  }
  const char* h = bytes.data();
  const auto version = Get<std::uint32_t>(h + 8);
  const auto record_size = Get<std::uint32_t>(h + 12);
  if (version < kOldestTimelineVersion || version > kTimelineVersion) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": timeline version ", version,
                                                   " is not supported (this memscope reads versions ",
                                                   kOldestTimelineVersion, " to ", kTimelineVersion, ")"));
  }
  const std::uint32_t expected_size = version >= 3 ? 0 : sizeof(Event);
  if (record_size != expected_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": record size ", record_size, ", expected ", expected_size, " in version ", version));
  }
  Timeline t;
  t.rank = Get<std::int32_t>(h + 16);
  t.world_size = Get<std::int32_t>(h + 20);
  t.device_index = Get<std::int32_t>(h + 24);
  t.device_capacity = Get<std::uint64_t>(h + 32);
  t.wall_start_us = Get<std::int64_t>(h + 40);
  if (absl::Status s = ValidateTimelineHeader(t, source); !s.ok()) return s;
  const std::string_view body = bytes.substr(kTimelineHeaderSize);
  absl::Status s = version >= 3 ? ParseVarRecords(body, t, source, version) : ParseFixedRecords(body, t, source);
  if (!s.ok()) return s;
  // Flags: version 4 only (earlier versions wrote 0 here).
  t.sampled_clock = version >= 4 && (Get<std::uint32_t>(h + 28) & kTimelineSampledClock) != 0;
  if (t.sampled_clock) SpreadSampledTimes(t.events);
  return t;
}

absl::StatusOr<Timeline> ReadTimelineFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open timeline '", path, "'"));
  // The magic first: anything else (/dev/zero, a FIFO of junk) is refused
  // after 8 bytes instead of being read to its end.
  std::string bytes(8, '\0');
  in.read(bytes.data(), 8);
  bytes.resize(static_cast<std::size_t>(in.gcount()));
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kTimelineMagic, 8) != 0) return ParseTimeline(bytes, path);
  // The rest straight into one string (sized from the file when it is a
  // regular file; a pipe grows it), not through a stringstream's copies.
  if (absl::Status s = CheckInputFileSize(path, "timeline", kMaxTimelineFileBytes); !s.ok()) return s;
  std::error_code ec;
  const std::uintmax_t file_size = std::filesystem::file_size(path, ec);
  if (!ec && file_size > 8) bytes.reserve(static_cast<std::size_t>(file_size));
  char chunk[1 << 16];
  while (in.read(chunk, sizeof(chunk)) || in.gcount() > 0) {
    bytes.append(chunk, static_cast<std::size_t>(in.gcount()));
    if (bytes.size() > kMaxTimelineFileBytes) return InputTooLarge(path, "timeline", 0, kMaxTimelineFileBytes);
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read timeline '", path, "'"));
  return ParseTimeline(bytes, path);
}

absl::Status WriteTimelineFile(const std::string& path, const Timeline& timeline) {
  absl::StatusOr<std::unique_ptr<TimelineWriter>> writer = TimelineWriter::Create(path, timeline);
  if (!writer.ok()) return writer.status();
  std::vector<std::uint32_t> ids(timeline.strings.size(), 0);  // the timeline's id -> the file's (0: not yet)
  for (Event e : timeline.events) {
    if (e.name != 0 && e.name < ids.size()) {
      if (ids[e.name] == 0) ids[e.name] = (*writer)->Intern(timeline.strings[e.name]);
      e.name = ids[e.name];
    }
    (*writer)->Append(e);
  }
  return (*writer)->Flush();
}

}  // namespace memscope
