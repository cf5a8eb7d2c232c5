// The per-rank timeline file (RUN/rank-R.timeline): memscope's recording.
//
// Format, version 2, little-endian:
//
//   header, 64 bytes:
//     char     magic[8]     "MSCOPETL"
//     uint32   version      2 (readers also take 1)
//     uint32   record_size  48
//     int32    rank, world_size, device_index
//     uint32   reserved (0)
//     uint64   device_capacity    bytes
//     int64    wall_start_us      Unix time of the start
//     uint8    reserved[16] (0)
//   then 48-byte records, each an Event (event.h): byte 0 the type, byte 1
//   the flags, then category, phase, name, time_ns, addr, size,
//   requested_size, stream. Flags:
//     bit 0 (kEventSmallPool)        the block or segment is in the small pool
//     bit 1 (kEventCompletedAtOnce)  on a free_requested: its free_completed,
//                                    with the same fields, follows at once and
//                                    is not written; the reader restores it
//   Version 1 files are the same records; version 2 only documents the
//   flags byte that version 1 already wrote. Phase marks carry a micro-batch
//   (requested_size = index + 1, 0 when none) and the record types 35/36,
//   collective_begin/_end, were added within version 2: an older reader
//   rejects a file that has them, and every older file reads unchanged.
//   Two record types exist only in
//   the file:
//     type 40, string chunk: bytes 4..7 = string id, byte 2 = 1 on the last
//       chunk, byte 3 = chunk length (<= 40), bytes 8..47 = the chunk's text.
//       A string's chunks come in order, before any record that uses its id.
//     type 41, config: name = id of the allocator settings text,
//       size = device capacity, addr = device index.
//
// The file is append-only and written in large blocks, flushed at phase
// ends. A reader keeps every complete record and ignores a torn tail (a last
// record cut short by a crash); a string whose last chunk is missing is read
// as the chunks present.
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
inline constexpr std::uint32_t kTimelineVersion = 2;
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

// Writes a timeline file. Not thread-safe (one writer per rank process).
class TimelineWriter final : public EventSink {
 public:
  // Creates (truncates) `path` and writes the header and the config record.
  static absl::StatusOr<std::unique_ptr<TimelineWriter>> Create(const std::string& path, const Timeline& header);
  ~TimelineWriter() override;  // flushes and closes

  std::uint32_t Intern(std::string_view text) override;
  void Append(const Event& event) override {
    if (event.type == EventType::kFreeCompleted && !buffer_.empty()) {
      Event& last = buffer_.back();
      if (last.type == EventType::kFreeRequested && last.addr == event.addr && last.time_ns == event.time_ns &&
          last.size == event.size && last.requested_size == event.requested_size && last.stream == event.stream &&
          (last.flags & kEventCompletedAtOnce) == 0) {
        last.flags |= kEventCompletedAtOnce;
        return;
      }
    }
    buffer_.push_back(event);
    if (buffer_.size() == kBufferRecords) (void)Flush();
  }
  absl::Status Flush() override;
  const std::string& path() const { return path_; }

 private:
  static constexpr std::size_t kBufferRecords = 16384;  // 768 KiB per write
  TimelineWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) { buffer_.reserve(kBufferRecords); }

  std::string path_;
  int fd_;
  std::vector<Event> buffer_;
  absl::flat_hash_map<std::string, std::uint32_t> ids_;
  std::uint32_t next_id_ = 1;
  absl::Status error_;
};

// What a real run can hold; a header beyond these is corrupt or hostile
// (a device index of 2^31-1 would make a snapshot of 2^31 device lists).
inline constexpr std::int32_t kMaxTimelineWorldSize = 1 << 17;     // ranks
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
