#include "recording/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

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

// Emits `text` as string-chunk records.
template <typename AppendFn>
void EmitString(std::uint32_t id, std::string_view text, AppendFn append) {
  std::size_t offset = 0;
  do {
    const std::size_t n = std::min(kChunk, text.size() - offset);
    char raw[sizeof(Event)] = {};
    raw[0] = static_cast<char>(kRecordString);
    raw[2] = offset + n == text.size() ? 1 : 0;
    raw[3] = static_cast<char>(n);
    Put<std::uint32_t>(raw + 4, id);
    std::memcpy(raw + 8, text.data() + offset, n);
    Event e;
    std::memcpy(&e, raw, sizeof(Event));
    append(e);
    offset += n;
  } while (offset < text.size());
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
  Put<std::uint32_t>(raw + 12, sizeof(Event));
  Put<std::int32_t>(raw + 16, header.rank);
  Put<std::int32_t>(raw + 20, header.world_size);
  Put<std::int32_t>(raw + 24, header.device_index);
  Put<std::uint64_t>(raw + 32, header.device_capacity);
  Put<std::int64_t>(raw + 40, header.wall_start_us);
  if (absl::Status s = WriteAll(fd, raw, sizeof(raw), path); !s.ok()) {
    ::close(fd);
    ::unlink(path.c_str());  // no header, nothing recorded: no file that reads as "not a timeline"
    return s;
  }
  std::unique_ptr<TimelineWriter> w(new TimelineWriter(path, fd));
  Event config;
  config.type = static_cast<EventType>(kRecordConfig);
  config.name = w->Intern(header.alloc_conf);
  config.size = header.device_capacity;
  config.addr = static_cast<std::uint64_t>(header.device_index);
  w->Append(config);
  if (absl::Status s = w->Flush(); !s.ok()) return s;
  return w;
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
    EmitString(it->second, text, [this](const Event& e) { Append(e); });
  }
  return it->second;
}

absl::Status TimelineWriter::Flush() {
  if (!buffer_.empty() && error_.ok()) {
    error_ = WriteAll(fd_, reinterpret_cast<const char*>(buffer_.data()), buffer_.size() * sizeof(Event), path_);
  }
  buffer_.clear();
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
  if (record_size != sizeof(Event)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": record size ", record_size, ", expected 48"));
  }
  Timeline t;
  t.rank = Get<std::int32_t>(h + 16);
  t.world_size = Get<std::int32_t>(h + 20);
  t.device_index = Get<std::int32_t>(h + 24);
  t.device_capacity = Get<std::uint64_t>(h + 32);
  t.wall_start_us = Get<std::int64_t>(h + 40);
  if (absl::Status s = ValidateTimelineHeader(t, source); !s.ok()) return s;
  const std::string_view body = bytes.substr(kTimelineHeaderSize);
  const std::size_t records = body.size() / sizeof(Event);
  t.torn_bytes = body.size() % sizeof(Event);
  // File string ids are mapped to this Timeline's ids (they are equal for
  // files memscope wrote, but a reader must not trust that).
  absl::flat_hash_map<std::uint32_t, std::uint32_t> id_map;
  absl::flat_hash_map<std::uint32_t, std::string> partial;
  auto resolve = [&](std::uint32_t file_id) -> std::uint32_t {
    if (file_id == 0) return 0;
    auto it = id_map.find(file_id);
    if (it != id_map.end()) return it->second;
    auto p = partial.find(file_id);  // a string whose last chunk never came
    t.strings.push_back(p != partial.end() ? p->second : std::string());
    return id_map[file_id] = static_cast<std::uint32_t>(t.strings.size() - 1);
  };
  t.events.reserve(records);
  for (std::size_t i = 0; i < records; ++i) {
    const char* r = body.data() + i * sizeof(Event);
    const auto type = static_cast<std::uint8_t>(r[0]);
    if (type == kRecordString) {
      const auto id = Get<std::uint32_t>(r + 4);
      const std::size_t n = std::min<std::size_t>(static_cast<std::uint8_t>(r[3]), kChunk);
      partial[id].append(r + 8, n);
      if (r[2] == 1 && !id_map.contains(id)) {
        t.strings.push_back(std::move(partial[id]));
        partial.erase(id);
        id_map[id] = static_cast<std::uint32_t>(t.strings.size() - 1);
      }
      continue;
    }
    Event e;
    std::memcpy(&e, r, sizeof(Event));
    if (type == kRecordConfig) {
      t.alloc_conf = t.str(resolve(e.name));
      continue;
    }
    const bool known = IsAllocatorAction(e.type) || e.type == EventType::kPhaseBegin ||
                       e.type == EventType::kPhaseEnd || e.type == EventType::kMark ||
                       e.type == EventType::kCollectiveBegin || e.type == EventType::kCollectiveEnd;
    if (!known) {
      return absl::DataLossError(
          absl::StrCat(source, ": record ", i, " has unknown type ", static_cast<int>(type), " (corrupt file)"));
    }
    if (static_cast<int>(e.category) >= kNumCategories) e.category = Category::kOther;
    if (static_cast<int>(e.phase) >= kNumPhases) e.phase = Phase::kUser;
    e.name = resolve(e.name);
    const bool folded = e.type == EventType::kFreeRequested && (e.flags & kEventCompletedAtOnce) != 0;
    e.flags &= kEventSmallPool;
    t.events.push_back(e);
    if (folded) {
      e.type = EventType::kFreeCompleted;
      t.events.push_back(e);
    }
  }
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
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseTimeline(bytes + ss.str(), path);
}

}  // namespace memscope
