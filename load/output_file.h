// An output file written whole or not at all, never through a symlink.
//
// The bytes go to a temporary file beside PATH (created with O_EXCL |
// O_NOFOLLOW), and Commit() renames it over PATH: a reader sees the old file
// or the new one, never half of one; a full disk leaves no truncated output;
// and a symlink at PATH is replaced, not followed (`summary.txt ->
// ../victim.txt` does not overwrite the victim). The first failed write
// keeps its errno, so the error says why ("cannot write 'RUN/trace.json': No
// space left on device"). A device or a pipe at PATH (/dev/stdout) is
// written in place: it is not a file to replace.
//
//   OutputFile out(path);
//   WriteChromeTrace(..., out.stream());
//   if (absl::Status s = out.Commit(); !s.ok()) ...
#ifndef MEMSCOPE_LOAD_OUTPUT_FILE_H_
#define MEMSCOPE_LOAD_OUTPUT_FILE_H_

#include <memory>
#include <ostream>
#include <streambuf>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace memscope {

class OutputFile {
 public:
  // Creates the temporary file; a failure is reported by Commit().
  explicit OutputFile(std::string path);
  ~OutputFile();  // removes the temporary file unless committed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Where to write. Writes after a failure are dropped.
  std::ostream& stream() { return stream_; }
  const std::string& path() const { return path_; }

  // Flushes, closes and renames the temporary file to PATH. Errors name PATH
  // and the system's reason; the temporary is removed then.
  absl::Status Commit();

 private:
  class Buffer : public std::streambuf {
   public:
    explicit Buffer(int fd);
    int error() const { return error_; }
    bool Flush();

   protected:
    int_type overflow(int_type c) override;
    std::streamsize xsputn(const char* s, std::streamsize n) override;
    int sync() override { return Flush() ? 0 : -1; }

   private:
    bool WriteAll(const char* data, std::size_t size);
    int fd_;
    int error_ = 0;
    char buffer_[1 << 16];
  };

  std::string path_, temp_;
  int fd_ = -1;
  int open_error_ = 0;
  bool committed_ = false;
  bool direct_ = false;  // PATH is a device or a pipe: written in place
  std::unique_ptr<Buffer> buffer_;
  std::ostream stream_;
};

// `text` written to PATH as an OutputFile.
absl::Status WriteOutputFile(const std::string& path, std::string_view text);

// Opens PATH for writing from the start (O_TRUNC) without following a symlink
// at PATH: one there is removed first. Returns the fd, or -1 with errno set.
// For files written as they grow (a timeline, a rank's log), which cannot
// wait for a rename.
int OpenForWritingNoFollow(const std::string& path, int extra_flags = 0);

}  // namespace memscope

#endif  // MEMSCOPE_LOAD_OUTPUT_FILE_H_
