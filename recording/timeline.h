// The per-rank timeline file (RUN/rank-R.timeline): memscope's recording.
//
// Format, version 3, little-endian:
//
//   header, 64 bytes:
//     char     magic[8]     "MSCOPETL"
//     uint32   version      3 (readers also take 1 and 2)
//     uint32   record_size  0: records have variable length (48 in versions 1 and 2)
//     int32    rank, world_size, device_index
//     uint32   reserved (0)
//     uint64   device_capacity    bytes
//     int64    wall_start_us      Unix time of the start
//     uint8    reserved[16] (0)
//   then records. "varint" is LEB128 (7 bits a byte, low first, high bit =
//   more follows; at most 10 bytes); "zigzag" maps a signed delta to
//   unsigned (0, -1, 1, -2 -> 0, 1, 2, 3). Each record starts with a tag
//   byte: bits 0-5 the type, bit 6 kEventSmallPool, bit 7
//   kEventCompletedAtOnce (on a free_requested: its free_completed, with the
//   same fields, follows at once and is not written; the reader restores it).
//   Event records (every type of event.h) then have a uint32 of field
//   lengths, 4 bits per field (field i in bits 4i..4i+3; bits 28-31 are 0),
//   and the fields in order, each as that many little-endian bytes (0 to
//   8; 0 bytes = the value 0):
//     0  time_ns         zigzag(time_ns - previous event's time_ns)
//     1  addr            zigzag(addr - previous event's addr)
//     2  size            zigzag(size - previous event's size)
//     3  requested_size  zigzag(requested_size - this event's size)
//     4  stream          zigzag(stream - previous event's stream)
//     5  name            zigzag(name - previous event's name)
//     6  category | phase << 4 (0 or 1 byte; 0 bytes = kOther, kUser)
//   "Previous" values are all 0 before the first event.
//   String: tag 40, varint id, varint length, the text. It comes before any
//     record that uses its id.
//   Config: tag 41, varint id of the allocator settings text, varint device
//     capacity, varint device index.
//   Strings and configs do not move the "previous event". An alloc and its
//   free thus take about 30 bytes (10 per event) instead of 96.
//
// Versions 1 and 2: 48-byte records, each an Event (event.h): byte 0 the
// type, byte 1 the flags (as the tag's bits 6 and 7), then category, phase,
// name, time_ns, addr, size, requested_size, stream. A string is a run of
// chunk records: type 40, bytes 4..7 = string id, byte 2 = 1 on the last
// chunk, byte 3 = chunk length (<= 40), bytes 8..47 = the text; type 41 is
// the config (name = settings id, size = capacity, addr = device index).
// Version 2 only documented the flags byte that version 1 already wrote.
//
// The file is append-only and written in large blocks, flushed at phase
// ends. A reader keeps every complete record and ignores a torn tail (a last
// record cut short by a crash: in version 3, one whose bytes run past the
// end of the file); in versions 1 and 2 a string whose last chunk is missing
// is read as the chunks present.
#ifndef MEMSCOPE_RECORDING_TIMELINE_H_
#define MEMSCOPE_RECORDING_TIMELINE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "recording/event.h"

namespace memscope {

inline constexpr char kTimelineMagic[8] = {'M', 'S', 'C', 'O', 'P', 'E', 'T', 'L'};
inline constexpr std::uint32_t kTimelineVersion = 3;
inline constexpr std::uint32_t kOldestTimelineVersion = 1;  // still read
inline constexpr std::size_t kTimelineHeaderSize = 64;
inline constexpr std::uint8_t kRecordString = 40;
inline constexpr std::uint8_t kRecordConfig = 41;

// Where a Recorder puts events: a timeline file, or memory.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // The id of `text` in the string table, adding it on first use (0 for "").
  virtual std::uint32_t Intern(std::string_view text) = 0;
  virtual void Append(const Event& event) = 0;
  // Makes everything appended so far durable (written to the file).
  virtual absl::Status Flush() = 0;
};

// Collects events in a Timeline in memory.
class MemorySink final : public EventSink {
 public:
  explicit MemorySink(Timeline& timeline) : timeline_(timeline) {}
  std::uint32_t Intern(std::string_view text) override;
  void Append(const Event& event) override { timeline_.events.push_back(event); }
  absl::Status Flush() override { return absl::OkStatus(); }

 private:
  Timeline& timeline_;
  absl::flat_hash_map<std::string, std::uint32_t> ids_;
};

// Writes a timeline file (version 3). Not thread-safe (one writer per rank
// process). Append encodes the event into a buffer at once (inline: the
// Recorder calls it directly); the buffer is written when full and at Flush.
class TimelineWriter final : public EventSink {
 public:
  // Creates (truncates) `path` and writes the header and the config record.
  static absl::StatusOr<std::unique_ptr<TimelineWriter>> Create(const std::string& path, const Timeline& header);
  ~TimelineWriter() override;  // flushes and closes

  std::uint32_t Intern(std::string_view text) override;
  [[gnu::always_inline]] void Append(const Event& event) override {
    if (event.type == EventType::kFreeCompleted && FoldsIntoLast(event)) {
      buffer_[last_free_requested_] = static_cast<char>(buffer_[last_free_requested_] | kEventCompletedAtOnce << 6);
      last_free_requested_ = kNone;
      return;
    }
    if (used_ + kMaxEventBytes > kBufferBytes) WriteBuffer();
    // Branch-free: each field's zigzag delta is stored as 8 bytes and the
    // cursor moves by the bytes it needs (0 when unchanged). Locals, not
    // members, while encoding: stores through char* may alias anything.
    char* const start = buffer_.get() + used_;
    char* p = start + 5;
    std::uint32_t lengths = 0;
    auto field = [&](std::uint64_t zigzag, int index) {
      const unsigned n = ByteCount(zigzag);
      std::memcpy(p, &zigzag, 8);
      p += n;
      lengths |= n << (4 * index);
    };
    Previous prev = prev_;
    field(ZigZag(static_cast<std::uint64_t>(event.time_ns) - prev.time), 0);
    field(ZigZag(event.addr - prev.addr), 1);
    field(ZigZag(event.size - prev.size), 2);
    field(ZigZag(event.requested_size - event.size), 3);
    // Stream and name rarely change: a branch is cheaper than the bytes' count.
    if (event.stream != prev.stream) field(ZigZag(event.stream - prev.stream), 4);
    if (event.name != prev.name) field(ZigZag(event.name - prev.name), 5);
    const unsigned kinds = static_cast<unsigned>(event.category) | static_cast<unsigned>(event.phase) << 4;
    *p = static_cast<char>(kinds);
    const unsigned has_kinds = kinds != kDefaultKinds ? 1u : 0u;
    p += has_kinds;
    lengths |= has_kinds << 24;
    start[0] = static_cast<char>(static_cast<unsigned>(event.type) | (event.flags & kEventSmallPool) << 6);
    std::memcpy(start + 1, &lengths, 4);
    prev_ = Previous{static_cast<std::uint64_t>(event.time_ns),
                     event.addr,
                     event.size,
                     event.requested_size,
                     event.stream,
                     event.name};
    last_free_requested_ = event.type == EventType::kFreeRequested ? used_ : kNone;
    last_kinds_ = kinds;
    used_ = static_cast<std::size_t>(p - buffer_.get());
  }
  absl::Status Flush() override;
  const std::string& path() const { return path_; }

  // The encoding's pieces, shared with the reader.
  static std::uint64_t ZigZag(std::uint64_t delta) {
    return (delta << 1) ^ static_cast<std::uint64_t>(static_cast<std::int64_t>(delta) >> 63);
  }
  static char* PutVarint(char* p, std::uint64_t v) {
    if (v < 0x80) {
      *p = static_cast<char>(v);
      return p + 1;
    }
    if (v < 0x4000) {
      p[0] = static_cast<char>(v | 0x80);
      p[1] = static_cast<char>(v >> 7);
      return p + 2;
    }
    while (v >= 0x80) {
      *p++ = static_cast<char>(v | 0x80);
      v >>= 7;
    }
    *p++ = static_cast<char>(v);
    return p;
  }
  // Bytes of `v` up to its highest non-zero one (0 for 0).
  static unsigned ByteCount(std::uint64_t v) {
    return v == 0 ? 0u : static_cast<unsigned>(71 - __builtin_clzll(v)) >> 3;
  }
  static constexpr unsigned kDefaultKinds =
      static_cast<unsigned>(Category::kOther) | static_cast<unsigned>(Phase::kUser) << 4;

 private:
  static constexpr std::size_t kBufferBytes = std::size_t{1} << 20;  // 1 MiB per write
  static constexpr std::size_t kMaxEventBytes = 5 + 6 * 8 + 8;       // tag, lengths, fields, an 8-byte store's slack
  static constexpr std::size_t kNone = ~std::size_t{0};
  TimelineWriter(std::string path, int fd);

  // Whether `e` (a free_completed) repeats every field of the last record, a
  // free_requested still in the buffer.
  bool FoldsIntoLast(const Event& e) const {
    return last_free_requested_ != kNone && static_cast<std::uint64_t>(e.time_ns) == prev_.time &&
           e.addr == prev_.addr && e.size == prev_.size && e.requested_size == prev_.requested &&
           e.stream == prev_.stream && e.name == prev_.name &&
           (static_cast<unsigned>(e.category) | static_cast<unsigned>(e.phase) << 4) == last_kinds_ &&
           (e.flags & kEventSmallPool) == ((static_cast<std::uint8_t>(buffer_[last_free_requested_]) >> 6) & 1u);
  }
  void WriteBuffer();                      // writes the buffer's bytes (errors kept in error_)
  void AppendRaw(std::string_view bytes);  // a string or config record

  struct Previous {
    std::uint64_t time = 0, addr = 0, size = 0, requested = 0, stream = 0, name = 0;
  };

  std::string path_;
  int fd_;
  std::unique_ptr<char[]> buffer_;
  std::size_t used_ = 0;
  Previous prev_;
  std::size_t last_free_requested_ = kNone;  // buffer offset of the last record if it is an unfolded free_requested
  unsigned last_kinds_ = kDefaultKinds;
  absl::flat_hash_map<std::string, std::uint32_t> ids_;
  std::uint32_t next_id_ = 1;
  absl::Status error_;
};

// What a real run can hold; a header beyond these is corrupt or hostile
// (a device index of 2^31-1 would make a snapshot of 2^31 device lists).
inline constexpr std::int32_t kMaxTimelineWorldSize = 1 << 17;  // ranks
inline constexpr std::int32_t kMaxTimelineDeviceIndex = (1 << 17) - 1;
inline constexpr std::uint64_t kMaxTimelineDeviceCapacity = std::uint64_t{1} << 50;  // 1 PiB
inline constexpr std::int64_t kMaxTimelineWallStartUs = 32503680000000000;           // 3000-01-01

// OK when every header field of `t` (rank, world_size, device_index,
// device_capacity, wall_start_us) is within what a real run can hold: 0 <=
// rank < 131072, 1 <= world_size <= 131072, 0 <= device_index < 131072, capacity <= 1 PiB,
// a start between 1970 and 3000. The error names `source` and the field.
absl::Status ValidateTimelineHeader(const Timeline& t, const std::string& source);

// Reads a timeline file. Errors name the file and what is wrong (not a
// timeline, unsupported version, truncated header, a header field out of
// range); a torn tail is not an
// error (see Timeline::torn_bytes).
absl::StatusOr<Timeline> ReadTimelineFile(const std::string& path);
absl::StatusOr<Timeline> ParseTimeline(std::string_view bytes, const std::string& source);

}  // namespace memscope

#endif  // MEMSCOPE_RECORDING_TIMELINE_H_
