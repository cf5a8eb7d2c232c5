// The per-rank timeline file (RUN/rank-R.timeline): memscope's recording.
//
// Format, version 4, little-endian:
//
//   header, 64 bytes:
//     char     magic[8]     "MSCOPETL"
//     uint32   version      4 (readers also take 1 to 3)
//     uint32   record_size  0: records have variable length (48 in versions 1 and 2)
//     int32    rank, world_size, device_index
//     uint32   flags        bit 0: the allocator events' times come from a
//                           sampled clock (see Times below; 0 in versions 1-3)
//     uint64   device_capacity    bytes
//     int64    wall_start_us      Unix time of the start
//     uint8    reserved[16] (0)
//   then records. "varint" is LEB128 (7 bits a byte, low first, high bit =
//   more follows; at most 10 bytes); "zigzag" maps a signed delta to
//   unsigned (0, -1, 1, -2 -> 0, 1, 2, 3). The reader keeps the "previous
//   event" (its time, addr, size, stream, name; all 0 at the start), the
//   owner (name) of the last alloc, and 4096 alloc slots: every alloc, in
//   whatever form, is stored (addr, size, requested_size, stream, small pool)
//   in slot SlotOf(addr) = (addr * 0x9E3779B97F4A7C15 mod 2^64) >> 52,
//   replacing what was there (the writer keeps the same slots). Each record
//   starts with a tag byte:
//
//   1tss ssss  lean free: a free_requested of the block in slot
//     (bits 0-3 of the tag << 8 | the next byte; tag bits 4-5 are 0):
//     2 bytes. Its addr, size, requested_size, stream and small pool are the
//     slot's, its time the previous event's; category OTHER, phase user, no
//     name. Bit 6 (t): its free_completed, with the same fields, follows at
//     once and is not written (the reader restores it). The writer uses this
//     form when the slot holds exactly the block freed (a caching allocator
//     frees what it handed out: nearly always).
//   01sc cccc  compact alloc (bits 0-3 the category, bit 4 small pool), then
//     8 bytes: bits 0-31 (addr - previous addr) / 512 as an int32, bits
//     32-63 size / 512; then 3 bytes: size - requested_size. 12 bytes. Its
//     time and stream are the previous event's, its owner the last alloc's,
//     phase user. Any alloc that does not fit (addr or size not multiples of
//     512, another stream or owner, a slack of 16 MiB or more) is a general
//     record.
//   00yy yyyy  type y:
//     40 string: varint id, varint length, the text. It comes before any
//        record that uses its id.
//     41 config: varint id of the allocator settings text, varint device
//        capacity, varint device index.
//     42 time: varint zigzag(time_ns - previous event's time_ns); the
//        previous event's time becomes time_ns (the time of the lean and
//        compact records that follow).
//     an event type (event.h): a general event record, as in version 3 but
//        with the flags in the field lengths (below).
//   Strings and configs do not move the "previous event".
//
//   A general event record has, after its tag, a uint32 of field lengths, 4
//   bits per field (field i in bits 4i..4i+3), bit 28 kEventSmallPool, bit 29
//   kEventCompletedAtOnce (as the lean free's bit 6), bits 30-31 0, and the
//   fields in order, each as that many little-endian bytes (0 to 8; 0 bytes
//   = the value 0):
//     0  time_ns         zigzag(time_ns - previous event's time_ns)
//     1  addr            zigzag(addr - previous event's addr)
//     2  size            zigzag(size - previous event's size)
//     3  requested_size  zigzag(requested_size - this event's size)
//     4  stream          zigzag(stream - previous event's stream)
//     5  name            zigzag(name - previous event's name)
//     6  category | phase << 4 (0 or 1 byte; 0 bytes = kOther, kUser)
//
//   Times: a Recorder on a simulated (meta) run keeps a sampled clock
//   (recorder.h, RecordClock::kSampled): the allocator reads no clock, phase
//   marks and collectives read it, and allocator events carry the last time
//   read (refreshed every 64 events). Most events thus repeat the previous
//   time and need no time record. Such a file has header flag bit 0 set, and
//   the reader spreads each run of events sharing a reading evenly up to the
//   next later time (SpreadSampledTimes, event.h), so that a timeline view
//   shows them in order and apart, not at one instant. An alloc and its free take 14 bytes (about
//   5 per event: alloc, free_requested, free_completed) instead of about 28
//   in version 3 and 96 in version 2.
//
// Version 3: the records above without the lean free, the compact alloc and
// the time record: a tag byte (bits 0-5 the type, bit 6 kEventSmallPool, bit
// 7 kEventCompletedAtOnce), then for an event the uint32 of field lengths
// (bits 28-31 0) and the fields; strings and configs as in version 4.
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
// record cut short by a crash: in versions 3 and 4, one whose bytes run past
// the end of the file); in versions 1 and 2 a string whose last chunk is
// missing is read as the chunks present.
#ifndef MEMSCOPE_RECORDING_TIMELINE_H_
#define MEMSCOPE_RECORDING_TIMELINE_H_

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "allocator/record_sink.h"
#include "recording/event.h"

namespace memscope {

inline constexpr char kTimelineMagic[8] = {'M', 'S', 'C', 'O', 'P', 'E', 'T', 'L'};
inline constexpr std::uint32_t kTimelineVersion = 4;
inline constexpr std::uint32_t kOldestTimelineVersion = 1;  // still read
inline constexpr std::size_t kTimelineHeaderSize = 64;
inline constexpr std::uint8_t kRecordString = 40;
// Header flags (the uint32 at offset 28, version 4).
inline constexpr std::uint32_t kTimelineSampledClock = 1;  // Timeline::sampled_clock
inline constexpr std::uint8_t kRecordConfig = 41;
inline constexpr std::uint8_t kRecordTime = 42;  // version 4

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
  // The events appended so far (a Recorder appends the allocator's events here directly).
  std::vector<Event>& events() { return timeline_.events; }

 private:
  Timeline& timeline_;
  absl::flat_hash_map<std::string, std::uint32_t> ids_;
};

// Writes a timeline file (version 4). Not thread-safe (one writer per rank
// process). Append encodes the event into a buffer at once (inline: the
// Recorder calls it directly); the buffer is written when full and at Flush.
// Its state is a RecordSink (allocator/record_sink.h): an allocator given
// it (through a Recorder) writes the hot records itself.
class TimelineWriter final : public EventSink {
 public:
  // Creates (truncates) `path` and writes the header and the config record.
  static absl::StatusOr<std::unique_ptr<TimelineWriter>> Create(const std::string& path, const Timeline& header);
  ~TimelineWriter() override;  // flushes and closes

  std::uint32_t Intern(std::string_view text) override;
  void Append(const Event& event) override {
    if (event.phase == Phase::kUser) {
      AppendAction(event.type, event.flags & kEventSmallPool, static_cast<std::uint64_t>(event.time_ns), event.addr,
                   event.size, event.requested_size, event.stream, event.category, event.name);
      return;
    }
    RevokeBudget();
    fold_at_ = nullptr;
    if (used() + kMaxEventBytes > kBufferBytes) WriteBuffer();
    const unsigned kinds = static_cast<unsigned>(event.category) | static_cast<unsigned>(event.phase) << 4;
    AppendGeneral(event.type, sink_.cur, static_cast<std::uint64_t>(event.time_ns), event.addr, event.size,
                  event.requested_size, event.stream, event.name, kinds, event.flags & kEventSmallPool);
  }
  // Append of an event of phase user, its fields one by one (the Recorder's
  // path: inlined, with the type and, for frees, category and name constant).
  // Ends the fast records' budget (a Recorder grants it again).
  [[gnu::always_inline]] void AppendAction(EventType type, unsigned small, std::uint64_t time, std::uint64_t addr,
                                           std::uint64_t size, std::uint64_t requested, std::uint64_t stream,
                                           Category category, std::uint64_t name, std::uint64_t record_id = 0) {
    RevokeBudget();
    const unsigned kinds = static_cast<unsigned>(category) | static_cast<unsigned>(Phase::kUser) << 4;
    if (type == EventType::kFreeCompleted && foldable() && time == sink_.prev_time && addr == sink_.prev_addr &&
        size == sink_.prev_size && requested == prev_requested_ && stream == sink_.prev_stream &&
        name == sink_.prev_name && kinds == prev_kinds_ && small == prev_small_) {
      // Its free_requested, the last record, says it followed at once.
      *fold_at_ = static_cast<char>(*fold_at_ | fold_bit_);
      fold_at_ = nullptr;
      return;
    }
    if (used() + kMaxEventBytes > kBufferBytes) WriteBuffer();
    char* p = sink_.cur;
    fold_at_ = nullptr;
    if (type == EventType::kFreeRequested) {
      // Lean free: the block's fields are those of the alloc in its slot
      // (the alloc's record id is there; or, for an event without one, the
      // slot's fields, if the general record that wrote them is the last).
      const std::size_t s = SlotOf(addr);
      const Slot& slot = slots_[s];
      const std::uint64_t last = sink_.slot_seq[s];
      if ((record_id != 0 ? last == record_id
                          : slot.seq == last && slot.addr == addr && slot.size == size && slot.requested == requested &&
                                slot.stream == stream && slot.small == small) &&
          kinds == kDefaultKinds && name == 0) {
        if (time != sink_.prev_time) p = PutTime(p, time);
        fold_at_ = p;
        fold_bit_ = 0x40;
        SetPrevious(time, addr, size, requested, stream, name, kinds, small);
        sink_.cur = RecordSink::PutLeanFree(p, s, kLeanFree);
        fold_end_ = sink_.cur;
        return;
      }
    } else if (type == EventType::kAlloc) {
      SetSlot(addr, size, requested, stream, small);
      const std::uint64_t d_addr = addr - sink_.prev_addr;
      const std::uint64_t slack = size - requested;
      const auto d_units = static_cast<std::int64_t>(d_addr) >> 9;
      // Compact alloc: 512-byte units, the previous event's stream, the previous alloc's owner.
      if (((d_addr | size) & 511) == 0 && d_units == static_cast<std::int32_t>(d_units) && (size >> 41) == 0 &&
          slack < (1u << 24) && requested <= size && stream == sink_.prev_stream && name == sink_.last_alloc_name &&
          static_cast<unsigned>(category) < 16) {
        if (time != sink_.prev_time) p = PutTime(p, time);
        SetPrevious(time, addr, size, requested, stream, name, kinds, small);
        sink_.last_alloc_name = name;
        sink_.cur = RecordSink::PutCompactAlloc(p, small, static_cast<unsigned>(category), d_units, size, slack);
        return;
      }
    }
    AppendGeneral(type, p, time, addr, size, requested, stream, name, kinds, small);
  }
  // After an AppendAction of a free_requested: its free_completed, with the
  // same fields and time, follows at once (one bit in the record just written).
  void FoldCompleted() {
    if (!foldable()) return;  // (not after a free_requested: nothing to fold into)
    *fold_at_ = static_cast<char>(*fold_at_ | fold_bit_);
    fold_at_ = nullptr;
  }
  absl::Status Flush() override;
  const std::string& path() const { return path_; }

  // The state the allocator's fast path shares (allocator/record_sink.h).
  RecordSink& record_sink() { return sink_; }
  // A time record moving the previous event's time to `time` (a sampled
  // clock's new reading, before fast records), with room made for it and a
  // record after it.
  void AppendTime(std::uint64_t time) {
    if (used() + kMaxEventBytes > kBufferBytes) WriteBuffer();
    sink_.cur = PutTime(sink_.cur, time);
    sink_.prev_time = time;
  }
  // How many fast records (RecordSink::kMaxFastBytes each) the buffer has room for.
  long fast_room() const { return static_cast<long>((kBufferBytes - used()) / RecordSink::kMaxFastBytes); }
  // The budget the writer took back (every record it writes itself ends the
  // budget) since the last call: a Recorder counts the fast records written
  // as what it granted less what is left and this.
  long TakeRevoked() {
    const long r = revoked_;
    revoked_ = 0;
    return r;
  }

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
  // Version 4's alloc slots (timeline format above).
  static constexpr unsigned kSlotBits = RecordSink::kSlotBits;
  static std::size_t SlotOf(std::uint64_t addr) { return RecordSink::SlotOf(addr); }
  // The fields of a slot's alloc, and its record id (RecordSink::slot_seq).
  struct Slot {
    std::uint64_t addr = 0, size = 0, requested = 0, stream = 0;
    std::uint64_t seq = RecordSink::kNoRecord;
    unsigned small = 0;
  };
  static constexpr unsigned kLeanFree = RecordSink::kLeanFree;
  static constexpr unsigned kCompactAlloc = RecordSink::kCompactAlloc;

 private:
  static constexpr std::size_t kBufferBytes = std::size_t{1} << 20;  // 1 MiB per write
  // A time record, then the longest event record (tag, lengths, 7 fields),
  // and an 8-byte store's slack.
  static constexpr std::size_t kMaxEventBytes = 11 + 5 + 7 * 8 + 8;
  TimelineWriter(std::string path, int fd);

  void RevokeBudget() {
    revoked_ += sink_.budget;
    sink_.budget = 0;
  }
  // An alloc written: it now holds its slot.
  void SetSlot(std::uint64_t addr, std::uint64_t size, std::uint64_t requested, std::uint64_t stream,
               unsigned small) {
    const std::size_t s = SlotOf(addr);
    const std::uint64_t id = ++sink_.seq;
    sink_.slot_seq[s] = id;
    slots_[s] = Slot{addr, size, requested, stream, id, small};
  }
  std::size_t used() const { return static_cast<std::size_t>(sink_.cur - buffer_.get()); }
  // Whether the last record is a free_requested that a free_completed can fold into.
  bool foldable() const { return fold_at_ != nullptr && fold_end_ == sink_.cur; }
  void SetPrevious(std::uint64_t time, std::uint64_t addr, std::uint64_t size, std::uint64_t requested,
                   std::uint64_t stream, std::uint64_t name, unsigned kinds, unsigned small) {
    sink_.prev_time = time;
    sink_.prev_addr = addr;
    sink_.prev_size = size;
    sink_.prev_stream = stream;
    sink_.prev_name = name;
    prev_requested_ = requested;
    prev_kinds_ = kinds;
    prev_small_ = small;
  }
  // A time record (tag 42) moving the time to `time`.
  char* PutTime(char* p, std::uint64_t time) {
    *p++ = static_cast<char>(kRecordTime);
    return PutVarint(p, ZigZag(time - sink_.prev_time));
  }
  // A general record at `start` (the buffer has room).
  void AppendGeneral(EventType type, char* start, std::uint64_t time, std::uint64_t addr, std::uint64_t size,
                     std::uint64_t requested, std::uint64_t stream, std::uint64_t name, unsigned kinds,
                     unsigned small);
  void WriteBuffer();                      // writes the buffer's bytes (errors kept in error_)
  void Preallocate(std::size_t bytes);     // the file's blocks for a write of `bytes` at its end
  void AppendRaw(std::string_view bytes);  // a string or config record

  std::string path_;
  int fd_;
  std::uint64_t file_bytes_ = kTimelineHeaderSize;  // written to fd_ (Create wrote the header)
  bool preallocate_ = true;                         // fallocate works here (Preallocate)
  std::unique_ptr<char[]> buffer_;
  std::unique_ptr<Slot[]> slots_;  // the fields of the allocs in the slots
  std::unique_ptr<std::uint64_t[]> slot_seq_;
  RecordSink sink_;  // the cursor, the previous event (what the fast records move), the slots
  // The rest of the previous event: what only a fold compares (valid when foldable()).
  std::uint64_t prev_requested_ = 0;
  unsigned prev_kinds_ = kDefaultKinds, prev_small_ = 0;
  char* fold_at_ = nullptr;   // the byte to mark when the last record is a foldable free_requested...
  char* fold_end_ = nullptr;  // ...the end of that record (foldable while nothing follows it)...
  unsigned fold_bit_ = 0;     // ...and the bit to set there
  long revoked_ = 0;          // budget taken back (TakeRevoked)
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

// The largest timeline read (docs/timeline.md): a few bytes an event, so
// billions of events.
inline constexpr std::uint64_t kMaxTimelineFileBytes = std::uint64_t{64} << 30;

// Reads a timeline file. Errors name the file and what is wrong (not a
// timeline, unsupported version, truncated header, a header field out of
// range, over kMaxTimelineFileBytes: a regular file's size is checked
// before it is read); a torn tail is not an error (see Timeline::torn_bytes).
absl::StatusOr<Timeline> ReadTimelineFile(const std::string& path);

// Writes a recording made in memory to a timeline file (created,
// truncated): its header, then its events, their names interned again.
// Reading the file back gives the same events and header; what files do not
// hold (stacks, pools, notes) stays in memory. Errors name the file.
absl::Status WriteTimelineFile(const std::string& path, const Timeline& timeline);
absl::StatusOr<Timeline> ParseTimeline(std::string_view bytes, const std::string& source);

}  // namespace memscope

#endif  // MEMSCOPE_RECORDING_TIMELINE_H_
