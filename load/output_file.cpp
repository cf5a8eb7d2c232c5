#include "load/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

absl::Status WriteError(const std::string& path, int error) {
  return absl::InternalError(absl::StrCat("cannot write '", path, "': ", std::strerror(error)));
}

// PATH's temporary name: hidden, beside it (same filesystem, so the rename is atomic), unique per process and call.
std::string TempName(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path p(path);
  const std::string name = absl::StrCat(".", p.filename().string(), ".tmp-", ::getpid(), "-", counter++);
  return (p.parent_path() / name).string();
}

}  // namespace

OutputFile::Buffer::Buffer(int fd) : fd_(fd) { setp(buffer_, buffer_ + sizeof(buffer_)); }

bool OutputFile::Buffer::WriteAll(const char* data, std::size_t size) {
  while (size > 0 && error_ == 0) {
    const ssize_t n = fd_ >= 0 ? ::write(fd_, data, size) : -1;
    if (n < 0) {
      if (fd_ >= 0 && errno == EINTR) continue;
      error_ = fd_ >= 0 ? errno : EBADF;
      break;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return error_ == 0;
}

bool OutputFile::Buffer::Flush() {
  const bool ok = WriteAll(pbase(), static_cast<std::size_t>(pptr() - pbase()));
  setp(buffer_, buffer_ + sizeof(buffer_));
  return ok;
}

OutputFile::Buffer::int_type OutputFile::Buffer::overflow(int_type c) {
  if (!Flush()) return traits_type::eof();
  if (!traits_type::eq_int_type(c, traits_type::eof())) {
    *pptr() = traits_type::to_char_type(c);
    pbump(1);
  }
  return traits_type::not_eof(c);
}

// What is buffered and `s` in one writev (a pickle frame's 9-byte header
// and its 64 KiB body were two write calls), then the rest of whatever a
// short write left, as WriteAll does.
std::streamsize OutputFile::Buffer::xsputn(const char* s, std::streamsize n) {
  if (error_ != 0) return 0;
  if (n < epptr() - pptr()) {
    std::memcpy(pptr(), s, static_cast<std::size_t>(n));
    pbump(static_cast<int>(n));
    return n;
  }
  iovec parts[2] = {{pbase(), static_cast<std::size_t>(pptr() - pbase())},
                    {const_cast<char*>(s), static_cast<std::size_t>(n)}};
  setp(buffer_, buffer_ + sizeof(buffer_));
  int first = parts[0].iov_len == 0 ? 1 : 0;
  while (first < 2 && error_ == 0) {
    const ssize_t written = fd_ >= 0 ? ::writev(fd_, parts + first, 2 - first) : -1;
    if (written < 0) {
      if (fd_ >= 0 && errno == EINTR) continue;
      error_ = fd_ >= 0 ? errno : EBADF;
      break;
    }
    auto left = static_cast<std::size_t>(written);
    while (first < 2 && left >= parts[first].iov_len) left -= parts[first++].iov_len;
    if (first < 2) {
      parts[first].iov_base = static_cast<char*>(parts[first].iov_base) + left;
      parts[first].iov_len -= left;
    }
  }
  return error_ == 0 ? n : 0;
}

OutputFile::OutputFile(std::string path) : path_(std::move(path)), temp_(TempName(path_)), stream_(nullptr) {
  struct stat st;
  if (::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode) && !S_ISDIR(st.st_mode)) {
    // A device or a pipe (-o /dev/stdout, /dev/null): written in place, never replaced.
    direct_ = true;
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  } else {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  }
  if (fd_ < 0) open_error_ = errno;
  buffer_ = std::make_unique<Buffer>(fd_);
  stream_.rdbuf(buffer_.get());
  if (fd_ < 0) stream_.setstate(std::ios::badbit);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && open_error_ == 0 && !direct_) ::unlink(temp_.c_str());
}

absl::Status OutputFile::Commit() {
  if (committed_) return absl::OkStatus();
  if (open_error_ != 0) return WriteError(path_, open_error_);
  int error = buffer_->Flush() ? 0 : buffer_->error();
  if (error == 0 && !stream_) error = EIO;  // a writer set the stream's state
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && error == 0) error = errno;  // NFS and others report late
  if (error == 0 && !direct_ && ::rename(temp_.c_str(), path_.c_str()) != 0) error = errno;
  if (error != 0) return WriteError(path_, error);  // the destructor removes the temporary
  committed_ = true;
  return absl::OkStatus();
}

absl::Status WriteOutputFile(const std::string& path, std::string_view text) {
  OutputFile out(path);
  out.stream().write(text.data(), static_cast<std::streamsize>(text.size()));
  return out.Commit();
}

int OpenForWritingNoFollow(const std::string& path, int extra_flags) {
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC | extra_flags;
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0 && errno == ELOOP) {  // a symlink at PATH: replace it, never write through it
    if (::unlink(path.c_str()) != 0) return -1;
    fd = ::open(path.c_str(), flags | O_EXCL, 0644);
  }
  return fd;
}

}  // namespace memscope
