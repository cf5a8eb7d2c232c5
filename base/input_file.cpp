#include "base/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

// "64 MiB", "1 GiB": the limits are whole MiB or GiB.
std::string LimitText(std::uint64_t bytes) {
  constexpr std::uint64_t kMiB = std::uint64_t{1} << 20, kGiB = std::uint64_t{1} << 30;
  if (bytes % kGiB == 0) return absl::StrCat(bytes / kGiB, " GiB");
  if (bytes % kMiB == 0) return absl::StrCat(bytes / kMiB, " MiB");
  return absl::StrCat(bytes, " bytes");
}

// Closes the descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

absl::Status InputTooLarge(std::string_view path, std::string_view kind, std::uint64_t size, std::uint64_t max_bytes) {
  const std::string k(kind);
  return absl::FailedPreconditionError(absl::StrCat(k, " ", std::string(path), ": ",
                                                    size > 0 ? absl::StrCat(size, " bytes, over") : "more than",
                                                    " the ", k, " limit (", LimitText(max_bytes), ")"));
}

absl::Status CheckInputFileSize(std::string_view path, std::string_view kind, std::uint64_t max_bytes) {
  struct stat st {};
  if (::stat(std::string(path).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return absl::OkStatus();
  const auto size = static_cast<std::uint64_t>(st.st_size);
  return size > max_bytes ? InputTooLarge(path, kind, size, max_bytes) : absl::OkStatus();
}

absl::StatusOr<std::string> ReadInputFile(std::string_view path, std::string_view kind, std::uint64_t max_bytes) {
  const std::string p(path), k(kind);
  Fd in{::open(p.c_str(), O_RDONLY | O_CLOEXEC)};
  if (in.fd < 0) return absl::NotFoundError(absl::StrCat(k, " ", p, ": cannot be read"));
  struct stat st {};
  if (::fstat(in.fd, &st) != 0) return absl::NotFoundError(absl::StrCat(k, " ", p, ": cannot be read"));
  if (S_ISDIR(st.st_mode)) return absl::NotFoundError(absl::StrCat(k, " ", p, ": is a directory"));
  const bool regular = S_ISREG(st.st_mode);
  if (regular && static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    return InputTooLarge(path, kind, static_cast<std::uint64_t>(st.st_size), max_bytes);
  }
  std::string text;
  if (regular) text.reserve(static_cast<std::size_t>(st.st_size));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(in.fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat(k, " ", p, ": cannot be read: ", std::strerror(errno)));
    if (n == 0) break;
    text.append(chunk, static_cast<std::size_t>(n));
    // A stream (or a file that grew) is read no further than the limit.
    if (text.size() > max_bytes) return InputTooLarge(path, kind, regular ? text.size() : 0, max_bytes);
  }
  return text;
}

LineRead ReadBoundedLine(std::istream& in, std::string& line, std::size_t max_bytes) {
  line.clear();
  std::streambuf* buf = in.rdbuf();
  if (buf == nullptr || !in.good()) return LineRead::kEnd;
  for (;;) {
    const std::streambuf::int_type c = buf->sbumpc();
    if (std::streambuf::traits_type::eq_int_type(c, std::streambuf::traits_type::eof())) {
      in.setstate(std::ios::eofbit);
      return line.empty() ? LineRead::kEnd : LineRead::kLine;
    }
    if (c == '\n') return LineRead::kLine;
    if (line.size() >= max_bytes) return LineRead::kTooLong;
    line.push_back(std::streambuf::traits_type::to_char_type(c));
  }
}

}  // namespace memscope
