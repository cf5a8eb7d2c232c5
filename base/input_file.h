// Input files read whole, with a size limit that fits their kind: a model
// file, a Hugging Face config, report.json, ... each layer names its kind
// and its limit where it reads it (docs/ list them beside each format). The
// limit is checked before a byte is read (stat) for a regular file, and
// anything else (/dev/zero, a FIFO) is read up to the limit and no further,
// so no input can make memscope allocate without bound or read forever.
//
//   absl::StatusOr<std::string> text = ReadInputFile(path, "model file", kMaxModelFileBytes);
//   // "model file big.json: 5368709120 bytes, over the model file limit (64 MiB)"
#ifndef MEMSCOPE_BASE_INPUT_FILE_H_
#define MEMSCOPE_BASE_INPUT_FILE_H_

#include <cstdint>
#include <istream>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace memscope {

// The whole file at `path`, `kind` naming it in messages ("model file").
// Errors: NotFound (it cannot be opened: "KIND PATH: cannot be read"),
// FailedPrecondition (more than max_bytes: one line naming the file, its
// kind and the limit), DataLoss (a read error).
absl::StatusOr<std::string> ReadInputFile(std::string_view path, std::string_view kind, std::uint64_t max_bytes);

// For readers that stream or map the file themselves: FailedPrecondition, as
// above, when `path` is a regular file of more than max_bytes; OK otherwise
// (a file that is missing is the reader's to report; a stream that is not
// a regular file the reader bounds as it reads).
absl::Status CheckInputFileSize(std::string_view path, std::string_view kind, std::uint64_t max_bytes);

// The refusal of an input larger than `max_bytes` (`size`: its size, or 0
// when unknown, for a stream).
absl::Status InputTooLarge(std::string_view path, std::string_view kind, std::uint64_t size, std::uint64_t max_bytes);

// What ReadBoundedLine found.
enum class LineRead { kLine, kEnd, kTooLong };

// The next line of `in` (without its '\n'; a last line without one counts)
// into `line`, read no further than max_bytes: kTooLong when the line goes
// on past them (a reader of lines refuses the input then: /dev/zero has no
// line break), kEnd when nothing is left.
LineRead ReadBoundedLine(std::istream& in, std::string& line, std::size_t max_bytes);

}  // namespace memscope

#endif  // MEMSCOPE_BASE_INPUT_FILE_H_
