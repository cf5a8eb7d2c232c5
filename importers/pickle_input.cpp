// The pickle reader's input: a stream through a buffer, bytes in memory or a
// mapped file read in place; the working-memory budget; the entry points
// (importers/pickle_reader.h).

#include "base/input_file.h"
#include "importers/pickle_internal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace memscope::pickle_internal {

// A file mapped for a Reader (ReadPickleFile): the file's bytes, then
// zeros up to kMapPadding bytes at least (an anonymous mapping under it), so
// that reading a little beyond the end finds zeros, never SIGBUS (the
// decoders check every read against the end: this is insurance). The pages
// read are released behind the read position: whole pages more than
// kMapKeep bytes behind it, every kMapReleaseStep bytes read (a mapped
// page counts in the resident set as long as it is mapped). The reader
// rewinds within one trace entry or kFastWindow at most; a page released
// and read again would be read again from the file, the same bytes.
constexpr std::size_t kMapPadding = 64 << 10;
constexpr std::uint64_t kMapKeep = 4 << 20;
constexpr std::uint64_t kMapReleaseStep = 4 << 20;
struct MappedInput {
  MappedInput() = default;
  MappedInput(const MappedInput&) = delete;
  MappedInput& operator=(const MappedInput&) = delete;
  ~MappedInput() {
    if (base != nullptr) munmap(base, reserved);
  }
  // Maps the regular file open as `fd`, of `size` bytes (> 0); false if it cannot.
  bool Map(int fd, std::uint64_t size);
  // The read has reached `read`: the pages wholly before read - kMapKeep released.
  void Release(std::uint64_t read);

  char* base = nullptr;
  std::size_t size = 0;      // the file's bytes
  std::size_t reserved = 0;  // the mapping's bytes (a whole number of pages)
  std::size_t page = 4096;
  std::uint64_t released = 0;                               // bytes from base released
  std::uint64_t next_release = kMapKeep + kMapReleaseStep;  // Release when the read reaches this
};

bool MappedInput::Map(int fd, std::uint64_t file_size) {
  const long p = sysconf(_SC_PAGESIZE);
  page = p > 0 ? static_cast<std::size_t>(p) : 4096;
  if (file_size == 0 || file_size > std::numeric_limits<std::size_t>::max() - 2 * kMapPadding - page) return false;
  size = static_cast<std::size_t>(file_size);
  reserved = (size + page - 1) / page * page + (kMapPadding + page - 1) / page * page;
  void* area = mmap(nullptr, reserved, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED) return false;
  base = static_cast<char*>(area);
  if (mmap(area, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED) return false;
  // Read once, in order. (MADV_WILLNEED, MADV_POPULATE_READ of the whole
  // file or of the next 8 MiB at each release, or no advice at all cost the
  // same CPU on a 80 MB snapshot, cached or not: docs/benchmarks.md.)
  madvise(base, size, MADV_SEQUENTIAL);
  return true;
}

void MappedInput::Release(std::uint64_t read) {
  const std::uint64_t upto = (read - kMapKeep) / page * page;  // (read >= next_release > kMapKeep)
  if (upto > released) {
    madvise(base + released, static_cast<std::size_t>(upto - released), MADV_DONTNEED);
    released = upto;
  }
  next_release = read + kMapReleaseStep;
}

absl::Status Reader::ReadRaw(void* dst, std::size_t n) {
  if (end_ - pos_ >= n) {
    std::memcpy(dst, data_ + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  auto* d = static_cast<char*>(dst);
  while (n > 0) {
    if (pos_ == end_ && !Refill()) return Truncated();
    std::size_t k = std::min(n, end_ - pos_);
    std::memcpy(d, data_ + pos_, k);
    pos_ += k;
    d += k;
    n -= k;
  }
  return absl::OkStatus();
}

absl::Status Reader::ReadLine(std::string& out) {
  out.clear();
  for (;;) {
    std::uint8_t c;
    if (!ReadByte(c)) return Truncated();
    if (c == '\n') return absl::OkStatus();
    if (out.size() >= kMaxLine) return Error("text argument longer than 1 MiB");
    out += static_cast<char>(c);
  }
}

std::uint64_t Reader::WorkingBytes() const {
  const PickleArena& a = *arena_;
  return a.chars.capacity() + (a.shared.capacity() + a.tree.capacity() + cons_refs_.capacity()) * sizeof(PyRef) +
         cons_next_.capacity() * 4 + cons_head_.capacity() * 16 + stack_.capacity() * sizeof(Slot) + memo_.Bytes() +
         tree_memo_.capacity() * 16 + builders_.size() * (sizeof(Builder) + 16) + builder_bytes_ +
         marks_.capacity() * 8 + scratch_.capacity() * sizeof(PyRef) + streaming_.capacity() * 16 +
         records_.capacity() * sizeof(Record) + record_pairs_.capacity() * sizeof(PyRef) + record_index_.capacity() +
         record_memo_.capacity() * 16 + list_cache_.capacity() * 13 +
         list_cache_items_.capacity() * sizeof(CachedList) + list_cache_bytes_.capacity() +
         list_prefix_.capacity() * 13;
}

bool Reader::BudgetOk(std::uint64_t& used, std::uint64_t& read) {
  used = WorkingBytes();
  peak_ = std::max(peak_, used);
  read = base_ + pos_;
  if (map_ != nullptr && read >= map_->next_release) map_->Release(read);
  memo_.PrefaultUpTo(std::max(memo_count_, fast_memo_count_));
  return used <= options_.max_working_bytes_fixed + options_.max_working_bytes_per_input_byte * read;
}

absl::Status Reader::CheckBudget() {
  std::uint64_t used, read;
  if (!BudgetOk(used, read)) {
    return Error(absl::StrCat("the pickle needs more than ", options_.max_working_bytes_per_input_byte,
                              " bytes of working memory per byte of input (", used, " bytes after ", read,
                              " bytes): refused"));
  }
  return absl::OkStatus();
}

}  // namespace memscope::pickle_internal

namespace memscope {

using pickle_internal::MappedInput;
using pickle_internal::Reader;

absl::StatusOr<PickleDoc> ReadPickle(std::istream& in, const std::string& source, const PickleReadOptions& options,
                                     PickleReadStats* stats) {
  Reader r(in, source, options);
  return r.Run(stats);
}

absl::StatusOr<PickleDoc> ReadPickleBytes(std::string_view data, const std::string& source,
                                          const PickleReadOptions& options, PickleReadStats* stats) {
  Reader r(data, nullptr, source, options);
  return r.Run(stats);
}

absl::StatusOr<PickleDoc> ReadPickleFile(const std::string& path, const PickleReadOptions& options,
                                         PickleReadStats* stats) {
  // A regular file of some bytes is mapped; the stat first, so that nothing
  // else (a FIFO: its writer) is opened twice.
  struct stat st;
  if (absl::Status s = CheckInputFileSize(path, "PyTorch snapshot", kMaxPickleFileBytes); !s.ok()) return s;
  if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      MappedInput map;
      const bool mapped = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
                          map.Map(fd, static_cast<std::uint64_t>(st.st_size));
      close(fd);  // (the mapping holds the file)
      if (mapped) {
        Reader r(std::string_view(map.base, map.size), &map, path, options);
        absl::StatusOr<PickleDoc> doc = r.Run(stats);
        if (stats != nullptr) {
          stats->mapped = true;
          stats->released_bytes = map.released;
        }
        return doc;
      }
    }
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  return ReadPickle(in, path, options, stats);
}

}  // namespace memscope
