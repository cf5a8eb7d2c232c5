#include "exporters/pickle_writer.h"

#include <bit>
#include <cstring>
#include <limits>
#include <utility>

#include "base/utf8.h"

namespace memscope {
namespace {

// Opcodes (CPython's Lib/pickle.py names). Only those MemoryViz.js reads.
constexpr std::uint8_t kMark = '(';
constexpr std::uint8_t kStop = '.';
constexpr std::uint8_t kEmptyDict = '}';
constexpr std::uint8_t kEmptyList = ']';
constexpr std::uint8_t kEmptyTuple = ')';
constexpr std::uint8_t kTuple = 't';
constexpr std::uint8_t kTuple1 = 0x85;
constexpr std::uint8_t kTuple2 = 0x86;
constexpr std::uint8_t kTuple3 = 0x87;
constexpr std::uint8_t kSetItems = 'u';
constexpr std::uint8_t kAppends = 'e';
constexpr std::uint8_t kBinInt = 'J';
constexpr std::uint8_t kBinInt1 = 'K';
constexpr std::uint8_t kBinInt2 = 'M';
constexpr std::uint8_t kLong1 = 0x8a;
constexpr std::uint8_t kBinFloat = 'G';
constexpr std::uint8_t kBinUnicode = 'X';
constexpr std::uint8_t kNone = 'N';
constexpr std::uint8_t kNewTrue = 0x88;
constexpr std::uint8_t kNewFalse = 0x89;
constexpr std::uint8_t kProto = 0x80;
constexpr std::uint8_t kFrame = 0x95;
constexpr std::uint8_t kMemoize = 0x94;
constexpr std::uint8_t kBinGet = 'h';
constexpr std::uint8_t kLongBinGet = 'j';

constexpr std::uint8_t kProtocol = 4;
// CPython writes no FRAME header for frames shorter than this (the header
// would cost more than it saves); doing the same keeps small pickles
// byte-identical to pickle.dumps.
constexpr std::size_t kFrameSizeMin = 4;

// Little-endian bytes of the low `n` bytes of `v`.
void PutLittleEndian(std::string& out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Whether `s` is ASCII (and so valid UTF-8), eight bytes at a time.
bool IsAscii(std::string_view s) {
  std::uint64_t high = 0;
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t word;
    std::memcpy(&word, s.data() + i, 8);
    high |= word;
  }
  for (; i < s.size(); ++i) high |= static_cast<unsigned char>(s[i]);
  return (high & 0x8080808080808080ULL) == 0;
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 if the bytes
// there are not one (base/utf8.h: overlong forms, surrogates and code points
// above U+10FFFF are invalid, as Python's decoder says).
std::size_t Utf8SequenceLength(std::string_view s, std::size_t i) {
  if (static_cast<unsigned char>(s[i]) < 0x80) return 1;
  return Utf8Sequence(reinterpret_cast<const unsigned char*>(s.data()), s.size(), i);
}

// `s` with every invalid UTF-8 byte replaced by U+FFFD.
std::string ReplaceInvalidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = Utf8SequenceLength(s, i);
    if (n == 0) {
      out.append("\xef\xbf\xbd");
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

bool IsValidUtf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace

PickleWriter::PickleWriter(std::ostream& out) : out_(out) {
  frame_.resize(kFrameSizeTarget + 1024);
  // PROTO goes before the first frame, as CPython writes it.
  const char header[2] = {static_cast<char>(kProto), static_cast<char>(kProtocol)};
  out_.write(header, 2);
  bytes_written_ = 2;
}

void PickleWriter::Fail(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
}

bool PickleWriter::BeforeValueSlow() {
  if (finished_) {
    Fail(absl::FailedPreconditionError("PickleWriter: a value was written after Finish()"));
    return false;
  }
  if (!status_.ok()) return false;
  if (open_.empty()) {
    if (roots_ > 0) {
      Fail(absl::FailedPreconditionError("PickleWriter: a pickle holds one top-level value"));
      return false;
    }
    return true;
  }
  Open& o = open_.back();
  if (o.kind == Kind::kTuple) {
    if (o.count == o.arity) {
      Fail(absl::FailedPreconditionError("PickleWriter: more tuple values than its declared arity"));
      return false;
    }
  } else if (o.count == 0) {
    Op(kMark);  // first item of a batch
  }
  return true;
}

void PickleWriter::AfterValue() {
  if (open_.empty()) {
    ++roots_;
    return;
  }
  Open& o = open_.back();
  ++o.count;
  if (o.kind == Kind::kList && o.count == kBatchSize) {
    Op(kAppends);
    o.count = 0;
  } else if (o.kind == Kind::kDict && o.count == 2 * kBatchSize) {
    Op(kSetItems);
    o.count = 0;
  }
}

void PickleWriter::OpcodeBoundary() {
  if (frame_size_ >= kFrameSizeTarget) CommitFrame();
}

void PickleWriter::CommitFrame() {
  if (frame_size_ == 0) return;
  if (frame_size_ >= kFrameSizeMin) {
    std::string header(1, static_cast<char>(kFrame));
    ::memscope::PutLittleEndian(header, frame_size_, 8);
    out_.write(header.data(), static_cast<std::streamsize>(header.size()));
    bytes_written_ += header.size();
  }
  out_.write(frame_.data(), static_cast<std::streamsize>(frame_size_));
  bytes_written_ += frame_size_;
  frame_size_ = 0;
  // Stop early rather than format gigabytes into a stream that failed.
  if (!out_) Fail(absl::DataLossError("PickleWriter: writing to the output stream failed"));
}

void PickleWriter::BeginDict() {
  if (!BeforeValue()) return;
  Op(kEmptyDict);
  open_.push_back({Kind::kDict});
  OpcodeBoundary();
}

void PickleWriter::EndDict() {
  if (!status_.ok() || finished_) return;
  if (open_.empty() || open_.back().kind != Kind::kDict) {
    Fail(absl::FailedPreconditionError("PickleWriter: EndDict() without an open dict"));
    return;
  }
  if (open_.back().count % 2 != 0) {
    Fail(absl::FailedPreconditionError("PickleWriter: a dict key has no value"));
    return;
  }
  if (open_.back().count > 0) Op(kSetItems);
  open_.pop_back();
  AfterValue();
  OpcodeBoundary();
}

void PickleWriter::BeginList() {
  if (!BeforeValue()) return;
  Op(kEmptyList);
  open_.push_back({Kind::kList});
  OpcodeBoundary();
}

void PickleWriter::EndList() {
  if (!status_.ok() || finished_) return;
  if (open_.empty() || open_.back().kind != Kind::kList) {
    Fail(absl::FailedPreconditionError("PickleWriter: EndList() without an open list"));
    return;
  }
  if (open_.back().count > 0) Op(kAppends);
  open_.pop_back();
  AfterValue();
  OpcodeBoundary();
}

void PickleWriter::BeginTuple(std::size_t arity) {
  if (!BeforeValue()) return;
  // TUPLE1-3 and EMPTY_TUPLE take their values from the stack top; longer
  // tuples need a MARK.
  if (arity > 3) Op(kMark);
  open_.push_back({Kind::kTuple, arity});
  OpcodeBoundary();
}

void PickleWriter::EndTuple() {
  if (!status_.ok() || finished_) return;
  if (open_.empty() || open_.back().kind != Kind::kTuple) {
    Fail(absl::FailedPreconditionError("PickleWriter: EndTuple() without an open tuple"));
    return;
  }
  const Open& o = open_.back();
  if (o.count != o.arity) {
    Fail(absl::FailedPreconditionError("PickleWriter: fewer tuple values than its declared arity"));
    return;
  }
  switch (o.arity) {
    case 0: Op(kEmptyTuple); break;
    case 1: Op(kTuple1); break;
    case 2: Op(kTuple2); break;
    case 3: Op(kTuple3); break;
    default: Op(kTuple); break;
  }
  open_.pop_back();
  AfterValue();
  OpcodeBoundary();
}

void PickleWriter::None() {
  if (!BeforeValue()) return;
  Op(kNone);
  AfterValue();
  OpcodeBoundary();
}

void PickleWriter::Bool(bool value) {
  if (!BeforeValue()) return;
  Op(value ? kNewTrue : kNewFalse);
  AfterValue();
  OpcodeBoundary();
}

char* PickleWriter::EncodeInt(char* p, std::int64_t value) {
  if (value >= 0 && value <= 0xff) {
    p[0] = static_cast<char>(kBinInt1);
    p[1] = static_cast<char>(value);
    return p + 2;
  }
  if (value >= 0 && value <= 0xffff) {
    p[0] = static_cast<char>(kBinInt2);
    p[1] = static_cast<char>(value & 0xff);
    p[2] = static_cast<char>(value >> 8);
    return p + 3;
  }
  if (value >= std::numeric_limits<std::int32_t>::min() && value <= std::numeric_limits<std::int32_t>::max()) {
    const auto bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(value));
    p[0] = static_cast<char>(kBinInt);  // signed 32-bit little-endian
    for (int i = 0; i < 4; ++i) p[1 + i] = static_cast<char>((bits >> (8 * i)) & 0xff);
    return p + 5;
  }
  return EncodeLong1(p, static_cast<std::uint64_t>(value), value < 0);
}

char* PickleWriter::EncodeUInt(char* p, std::uint64_t value) {
  if (value <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return EncodeInt(p, static_cast<std::int64_t>(value));
  }
  return EncodeLong1(p, value, /*negative=*/false);  // 9 bytes: the top bit needs a 0 sign byte
}

void PickleWriter::Int(std::int64_t value) {
  if (!BeforeValue()) return;
  Reserve(kMaxIntBytes);
  frame_size_ = static_cast<std::size_t>(EncodeInt(frame_.data() + frame_size_, value) - frame_.data());
  AfterValue();
  OpcodeBoundary();
}

void PickleWriter::UInt(std::uint64_t value) {
  if (!BeforeValue()) return;
  Reserve(kMaxIntBytes);
  frame_size_ = static_cast<std::size_t>(EncodeUInt(frame_.data() + frame_size_, value) - frame_.data());
  AfterValue();
  OpcodeBoundary();
}

char* PickleWriter::EncodeLong1(char* p, std::uint64_t bits, bool negative) {
  // Two's complement in 9 bytes (the 64 bits and a sign byte), then the
  // redundant sign bytes dropped: CPython's encode_long gives the same
  // minimal length. The length is that of the magnitude's bits (of ~bits
  // for a negative value) plus a sign bit, at least 1 byte; the 8 bytes are
  // stored whole (the buffer has kMaxIntBytes of room) and the length says
  // how many count.
  const std::uint64_t magnitude = negative ? ~bits : bits;
  const auto n = static_cast<std::size_t>(std::bit_width(magnitude) / 8 + 1);
  p[0] = static_cast<char>(kLong1);
  p[1] = static_cast<char>(n);
  const std::uint64_t little = std::endian::native == std::endian::little ? bits : __builtin_bswap64(bits);
  std::memcpy(p + 2, &little, 8);
  p[10] = static_cast<char>(negative ? 0xff : 0x00);
  return p + 2 + n;
}

void PickleWriter::Float(double value) {
  if (!BeforeValue()) return;
  Op(kBinFloat);
  const auto bits = std::bit_cast<std::uint64_t>(value);
  char big_endian[8];
  for (int i = 7; i >= 0; --i) big_endian[7 - i] = static_cast<char>((bits >> (8 * i)) & 0xff);
  Bytes(big_endian, 8);
  AfterValue();
  OpcodeBoundary();
}

char* PickleWriter::EncodeValidString(char* p, std::string_view utf8) {
  if (utf8.size() < 256) return EncodeShortString(p, utf8);  // the opcode, the length and the text in one go
  p[0] = static_cast<char>(kBinUnicode);
  for (int i = 0; i < 4; ++i) p[1 + i] = static_cast<char>((utf8.size() >> (8 * i)) & 0xff);
  std::memcpy(p + 5, utf8.data(), utf8.size());
  return p + 5 + utf8.size();
}

bool PickleWriter::AppendString(std::string& out, std::string_view utf8) {
  std::string fixed;
  if (!IsAscii(utf8) && !IsValidUtf8(utf8)) {
    fixed = ReplaceInvalidUtf8(utf8);
    utf8 = fixed;
  }
  // BINUNICODE8 would do, but MemoryViz.js does not read it.
  if (utf8.size() > std::numeric_limits<std::uint32_t>::max()) return false;
  const std::size_t at = out.size();
  out.resize(at + utf8.size() + 5);
  out.resize(static_cast<std::size_t>(EncodeValidString(out.data() + at, utf8) - out.data()));
  return true;
}

void PickleWriter::String(std::string_view utf8) {
  if (!BeforeValue()) return;
  std::string fixed;
  if (!IsAscii(utf8) && !IsValidUtf8(utf8)) {  // most keys and values are ASCII: no decoding
    fixed = ReplaceInvalidUtf8(utf8);
    utf8 = fixed;
  }
  if (utf8.size() > std::numeric_limits<std::uint32_t>::max()) {
    // BINUNICODE8 would do, but MemoryViz.js does not read it.
    Fail(absl::InvalidArgumentError("PickleWriter: a string of 4 GiB or more cannot be pickled with BINUNICODE"));
    return;
  }
  Reserve(utf8.size() + 5);
  frame_size_ = static_cast<std::size_t>(EncodeValidString(frame_.data() + frame_size_, utf8) - frame_.data());
  AfterValue();
  OpcodeBoundary();
}

std::uint32_t PickleWriter::MemoizeOpen() {
  if (!status_.ok() || finished_) return memo_size_;
  if (open_.empty() || open_.back().kind == Kind::kTuple || open_.back().count != 0) {
    Fail(absl::FailedPreconditionError("PickleWriter: MemoizeOpen() not right after BeginList or BeginDict"));
    return memo_size_;
  }
  Op(kMemoize);
  OpcodeBoundary();
  return memo_size_++;
}

std::uint32_t PickleWriter::MemoString(std::string_view utf8) {
  if (!BeforeValue()) return memo_size_;
  std::string fixed;
  if (!IsAscii(utf8) && !IsValidUtf8(utf8)) {
    fixed = ReplaceInvalidUtf8(utf8);
    utf8 = fixed;
  }
  if (utf8.size() > std::numeric_limits<std::uint32_t>::max()) {
    Fail(absl::InvalidArgumentError("PickleWriter: a string of 4 GiB or more cannot be pickled with BINUNICODE"));
    return memo_size_;
  }
  Reserve(utf8.size() + 6);
  char* p = EncodeValidString(frame_.data() + frame_size_, utf8);
  frame_size_ = static_cast<std::size_t>(EncodeMemoize(p) - frame_.data());
  AfterValue();
  OpcodeBoundary();
  return memo_size_++;
}

char* PickleWriter::EncodeGet(char* p, std::uint32_t index) {
  if (index < 256) {
    p[0] = static_cast<char>(kBinGet);
    p[1] = static_cast<char>(index);
    return p + 2;
  }
  p[0] = static_cast<char>(kLongBinGet);
  for (int i = 0; i < 4; ++i) p[1 + i] = static_cast<char>((index >> (8 * i)) & 0xff);
  return p + 5;
}

void PickleWriter::Get(std::uint32_t index) {
  if (!BeforeValue()) return;
  if (index >= memo_size_) {
    Fail(absl::FailedPreconditionError("PickleWriter: Get(" + std::to_string(index) + ") of a memo of " +
                                       std::to_string(memo_size_) + " entries"));
    return;
  }
  Reserve(kMaxGetBytes);
  frame_size_ = static_cast<std::size_t>(EncodeGet(frame_.data() + frame_size_, index) - frame_.data());
  AfterValue();
  OpcodeBoundary();
}

char* PickleWriter::BeginRawValue(std::size_t max_bytes) {
  if (!raw_values_ || finished_ || !status_.ok() || open_.empty() || open_.back().kind == Kind::kTuple) return nullptr;
  // The value (and a MARK before it) must leave the frame below its target:
  // the ordinary calls would not have ended the frame inside it either.
  if (frame_size_ + 1 + max_bytes >= kFrameSizeTarget) return nullptr;
  BeforeValue();
  Reserve(max_bytes);
  return frame_.data() + frame_size_;
}

void PickleWriter::EndRawValue(const char* end) {
  frame_size_ = static_cast<std::size_t>(end - frame_.data());
  AfterValue();
  OpcodeBoundary();
}

absl::Status PickleWriter::Finish() {
  if (finished_) return status_.ok() ? absl::FailedPreconditionError("PickleWriter: Finish() called twice") : status_;
  finished_ = true;
  if (!status_.ok()) return status_;
  if (!open_.empty()) {
    Fail(absl::FailedPreconditionError("PickleWriter: Finish() with " + std::to_string(open_.size()) +
                                       " container(s) still open"));
    return status_;
  }
  if (roots_ == 0) {
    Fail(absl::FailedPreconditionError("PickleWriter: Finish() before any value was written"));
    return status_;
  }
  Op(kStop);
  CommitFrame();
  out_.flush();
  if (!out_) Fail(absl::DataLossError("PickleWriter: writing to the output stream failed"));
  return status_;
}

}  // namespace memscope
