// The pickle reader's state machine (importers/pickle_reader.h), private to
// importers/pickle_*.cpp. One class, Reader, whose work is split by job:
//   pickle_input.cpp       the input (stream, bytes, mapped file), the
//                          working-memory budget, the entry points
//   pickle_machine.cpp     the general opcode machine (Step, Run) and its
//                          container and memo opcodes
//   pickle_records.cpp     streamed lists (paths, on_item) and records
//   pickle_fast_dict.cpp   the dict fast path (FastDict, FastPairs)
//   pickle_templates.cpp   the record templates (TemplatePairs)
// What the fast paths call per opcode or per entry is defined in the class
// (inline) or in pickle_values.h; the fast paths' equivalence to the
// general machine is checked by tests/importers/pickle_reader_test.cpp and
// the pickle fuzzer (tests/fuzz/pickle_fuzz.cpp), which read every input
// with each fast path on and off.
#ifndef MEMSCOPE_IMPORTERS_PICKLE_INTERNAL_H_
#define MEMSCOPE_IMPORTERS_PICKLE_INTERNAL_H_

#include <cstdint>
#include <cstring>
#include <istream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "importers/pickle_reader.h"
#include "importers/pickle_values.h"

namespace memscope::pickle_internal {

struct MappedInput;  // pickle_input.cpp

class Reader {
 public:
  // From a stream, through a kBufferSize buffer.
  Reader(std::istream& in, const std::string& source, const PickleReadOptions& options)
      : in_(&in), source_(source), options_(options), buf_(kBufferSize), arena_(std::make_shared<PickleArena>()) {
    data_ = buf_.data();
  }
  // From the whole input in memory, in place: the buffer is a window on
  // the input, moved where a stream's buffer would be filled (Refill,
  // Window) and as large as it would be, without reading or copying
  // anything; so everything else (where a fast path meets the end of the
  // buffer, the strings appended piecewise, the working-memory checks and
  // errors, the stats) is what a stream of the same bytes does. `map`, if
  // given, is the mapped file `data` is: its pages are released behind the
  // read position (at the working-memory checks).
  Reader(std::string_view data, MappedInput* map, const std::string& source, const PickleReadOptions& options)
      : source_(source),
        options_(options),
        input_(data.data()),
        input_size_(data.size()),
        map_(map),
        arena_(std::make_shared<PickleArena>()) {
    data_ = input_;
  }

  absl::StatusOr<PickleDoc> Run(PickleReadStats* stats);

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": offset ", op_offset_, ": ", what));
  }
  absl::Status Truncated() const {
    return Error(absl::StrCat("truncated input in opcode ", OpName(op_) ? OpName(op_) : "?"));
  }

  // ---- Input.
  bool Refill() {
    base_ += end_;
    pos_ = end_ = 0;
    if (eof_) return false;
    end_ = Read(0, kBufferSize);
    if (end_ == 0) {
      eof_ = true;
      return false;
    }
    return true;
  }
  // Reads up to n bytes into the buffer at `at` (the buffer starting at
  // input byte base_): how many (0 at the end of the input). In memory,
  // none is copied: the buffer is input_ + base_, and a read gets all it
  // asks for up to the end, as a stream of a file does.
  std::size_t Read(std::size_t at, std::size_t n) {
    if (in_ == nullptr) {
      data_ = input_ + base_;
      return static_cast<std::size_t>(std::min<std::uint64_t>(n, input_size_ - (base_ + at)));
    }
    in_->read(buf_.data() + at, static_cast<std::streamsize>(n));
    return static_cast<std::size_t>(in_->gcount());
  }
  [[gnu::always_inline]] bool ReadByte(std::uint8_t& b) {
    if (pos_ == end_ && !Refill()) return false;
    b = static_cast<std::uint8_t>(data_[pos_++]);
    return true;
  }
  absl::Status ReadRaw(void* dst, std::size_t n);
  // Appends n bytes to `out`, growing it only as data actually arrives (and
  // within the working-memory budget).
  absl::Status AppendBytes(std::uint64_t n, std::string& out) {
    while (n > 0) {
      if (pos_ == end_ && !Refill()) return Truncated();
      std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, end_ - pos_));
      out.append(data_ + pos_, k);
      pos_ += k;
      n -= k;
      if (n > 0) MEMSCOPE_RETURN_IF_ERROR(CheckBudget());
    }
    return absl::OkStatus();
  }
  absl::Status ReadLine(std::string& out);
  template <typename T>
  [[gnu::always_inline]] absl::Status ReadLE(T& v) {
    unsigned char b[sizeof(T)];
    if (end_ - pos_ >= sizeof(T)) {  // the common case: in the buffer
      std::memcpy(b, data_ + pos_, sizeof(T));
      pos_ += sizeof(T);
    } else {
      MEMSCOPE_RETURN_IF_ERROR(ReadRaw(b, sizeof(T)));
    }
    std::uint64_t x = 0;
    for (std::size_t k = 0; k < sizeof(T); ++k) x |= static_cast<std::uint64_t>(b[k]) << (8 * k);
    v = static_cast<T>(x);
    return absl::OkStatus();
  }

  // ---- Working memory.
  std::uint64_t WorkingBytes() const;
  // The working-memory check without its error: the peak updated, false
  // if the budget is exceeded.
  bool BudgetOk(std::uint64_t& used, std::uint64_t& read);
  absl::Status CheckBudget();

  // ---- Builders.
  std::uint32_t NewBuilder(PyKind kind) {
    std::uint32_t b;
    if (!free_builders_.empty()) {
      b = free_builders_.back();
      free_builders_.pop_back();
    } else {
      b = static_cast<std::uint32_t>(builders_.size());
      builders_.push_back(std::make_unique<Builder>());
    }
    Builder& B = *builders_[b];
    B.kind = kind;
    B.items.clear();
    B.appended = 0;
    B.streamed = -1;
    B.has_path = false;
    B.path.clear();
    B.memo_ids.clear();
    B.token = ++next_token_;
    B.tree_mark = arena_->tree.size();
    B.height = 1;
    B.copied = false;
    B.str_key_bits = 0;
    B.key_index.clear();
    return b;
  }
  void AddItem(Builder& B, const PyRef& r) {
    const std::size_t cap = B.items.capacity();
    B.items.push_back(r);
    if (B.items.capacity() != cap) builder_bytes_ += (B.items.capacity() - cap) * sizeof(PyRef);
  }
  Builder& BuilderOf(const PyRef& r) { return *builders_[static_cast<std::size_t>(r.v)]; }

  // A hash of a container's kind and elements for the shared pool's index
  // (a traceback's frames list per trace entry: this is per entry). Two
  // 64-bit words per element folded by a 128-bit multiply, then into the
  // running hash by an odd multiply (a bijection: no element erases what
  // came before it). A collision costs only a compare (Store compares the
  // elements before sharing).
  static std::uint64_t ContentHash(PyKind kind, const PyRef* items, std::size_t count) {
    static_assert(sizeof(PyRef) == 16);
    __extension__ using U128 = unsigned __int128;
    const auto mum = [](std::uint64_t x, std::uint64_t y) {
      const U128 m = static_cast<U128>(x) * y;
      return static_cast<std::uint64_t>(m) ^ static_cast<std::uint64_t>(m >> 64);
    };
    std::uint64_t h = mum(static_cast<std::uint64_t>(kind) ^ 0xa0761d6478bd642full, count ^ 0xe7037ed1a0b428dbull);
    const auto* bytes = reinterpret_cast<const unsigned char*>(items);
    for (std::size_t k = 0; k < count; ++k) {
      std::uint64_t w0, w1;
      std::memcpy(&w0, bytes + 16 * k, 8);
      std::memcpy(&w1, bytes + 16 * k + 8, 8);
      h = (h ^ mum(w0 ^ 0x8ebc6af09c88c6e3ull, w1 ^ 0x589965cc75374cc3ull)) * 0x9e3779b97f4a7c15ull;
    }
    return h;
  }

  // Stores a finished container and returns its reference: small containers
  // of scalars once per distinct content in the shared pool, others in the tree.
  PyRef Store(PyKind kind, const PyRef* items, std::size_t count, std::uint16_t height) {
    PyRef r;
    r.kind = kind;
    r.height = height;
    r.n = static_cast<std::uint32_t>(kind == PyKind::kDict ? count / 2 : count);
    PickleArena& a = *arena_;
    if (count == 0) {
      r.flags = kPyRefShared;
      return r;
    }
    const bool shared = count <= kMaxSharedElements &&
                        (kind == PyKind::kDict ? height == 1 && count <= 2 * kMaxSharedDictPairs : height <= 2);
    if (!shared) {
      r.v = a.tree.size();
      a.tree.insert(a.tree.end(), items, items + count);
      return r;
    }
    r.flags = kPyRefShared;
    const std::size_t bytes = count * sizeof(PyRef);
    const std::uint64_t h = ContentHash(kind, items, count);
    auto [it, inserted] = cons_head_.try_emplace(h, static_cast<std::uint32_t>(cons_refs_.size()));
    if (!inserted) {
      for (std::uint32_t k = it->second; k != kNoNext; k = cons_next_[k]) {
        const PyRef& c = cons_refs_[k];
        if (c.kind == kind && c.n == r.n && std::memcmp(a.shared.data() + c.v, items, bytes) == 0) return c;
      }
    }
    r.v = a.shared.size();
    a.shared.insert(a.shared.end(), items, items + count);
    cons_next_.push_back(inserted ? kNoNext : it->second);
    it->second = static_cast<std::uint32_t>(cons_refs_.size());
    cons_refs_.push_back(r);
    return r;
  }

  // Finishes an open list/dict: stores it, points its memo entries at it and
  // returns the builder to the pool.
  PyRef Freeze(const PyRef& open) {
    const std::uint32_t b = static_cast<std::uint32_t>(open.v);
    Builder& B = *builders_[b];
    PyRef r = Store(B.kind, B.items.data(), B.items.size(), B.height);
    for (std::uint64_t id : B.memo_ids) {
      const MemoEntry m = memo_.Find(id);
      if (m.ref.kind == PyKind::kMissing || m.token != (B.token & MemoTable::kTokenMask)) continue;
      SetMemo(id, r);
    }
    free_builders_.push_back(b);
    return r;
  }
  // A stack value as a finished reference (freezing an open list/dict).
  PyRef Finish(const Slot& s) {
    if (s.ref.flags & kPyRefRecord) [[unlikely]]
      return BuildRecord(s.ref);
    return s.open() ? Freeze(s.ref) : s.ref;
  }
  // A stack value as a finished reference, a record's placeholder kept as it is.
  PyRef FinishKeepRecord(const Slot& s) { return s.open() ? Freeze(s.ref) : s.ref; }
  void SetMemo(std::uint64_t id, const PyRef& r) {
    if (r.flags & kPyRefRecord) {  // a record's placeholder: forgotten at the batch's end (ReleaseRecords)
      memo_.Set(id, r, 0, base_ + pos_);
      record_memo_.push_back({id, r.v});
      return;
    }
    memo_.Set(id, r, 0, base_ + pos_);
    if (IsContainerKind(r.kind) && r.n > 0 && !(r.flags & kPyRefShared)) tree_memo_.emplace_back(id, r.v);
  }

  // Releases what streamed items built in the tree (everything above `mark`),
  // and the memo entries that point there.
  void ReleaseTree(std::uint64_t mark);

  // ---- Stack.
  [[gnu::always_inline]] std::uint32_t NextLevel(bool for_mark) const {
    if (stack_.empty()) return 1;
    const Slot& p = stack_.back();
    if (p.mark) return p.level + 1;
    // After a list or dict with no MARK open: its element (a one-item APPEND
    // or SETITEM). Inside a batch: the next element of the batch.
    if (!for_mark && p.open() && marks_.empty()) return p.level + 1;
    return p.level;
  }
  absl::Status CheckDepth(std::uint64_t depth) const {
    if (depth > options_.max_depth) {
      return Error(absl::StrCat("nesting deeper than max_depth (", options_.max_depth, ")"));
    }
    return absl::OkStatus();
  }
  absl::Status Push(const PyRef& r) {
    if (stack_.size() >= kMaxPickleStack) {
      return Error(absl::StrCat("more than ", kMaxPickleStack,
                                " values waiting on the pickle stack (a real snapshot needs a few thousand): refused"));
    }
    const std::uint32_t level = NextLevel(false);
    const std::uint64_t depth = IsContainerKind(r.kind) ? std::uint64_t{level} + r.height - 1 : level;
    if (depth > options_.max_depth) return CheckDepth(depth);
    Slot s;
    s.ref = r;
    s.level = level;
    stack_.push_back(s);
    return absl::OkStatus();
  }
  // The common memo reference, a finished value pushed where nothing needs
  // checking; false leaves everything (errors included) to Get.
  [[gnu::always_inline]] bool PushMemoFast(std::uint64_t id) {
    const MemoEntry m = memo_.Find(id);
    if (m.ref.kind == PyKind::kMissing || m.token != 0 || (m.ref.flags & kPyRefRecord) ||
        stack_.size() >= kMaxPickleStack) {
      return false;
    }
    const std::uint32_t level = NextLevel(false);
    const std::uint64_t depth = IsContainerKind(m.ref.kind) ? std::uint64_t{level} + m.ref.height - 1 : level;
    if (depth > options_.max_depth) return false;
    Slot s;
    s.ref = m.ref;
    s.level = level;
    stack_.push_back(s);
    return true;
  }
  absl::Status PushNew(PyKind kind) {                            // an empty list or dict, open for filling
    if (stack_.size() >= kMaxPickleStack) return Push(PyRef());  // the same error
    const std::uint32_t level = NextLevel(false);
    MEMSCOPE_RETURN_IF_ERROR(CheckDepth(level));
    PyRef r;
    r.kind = kind;
    r.flags = kPyRefOpen;
    r.height = 1;
    r.v = NewBuilder(kind);
    Slot s;
    s.ref = r;
    s.level = level;
    stack_.push_back(s);
    return absl::OkStatus();
  }
  absl::Status PushString(PyKind kind, std::size_t start) {
    const std::size_t n = arena_->chars.size() - start;
    if (n > std::numeric_limits<std::uint32_t>::max()) return Error("string longer than 4 GiB: not supported");
    PyRef r = ScalarRef(kind, start);
    r.n = static_cast<std::uint32_t>(n);
    return Push(r);
  }
  // The value entry at the top; error for an empty stack or a MARK.
  absl::Status CheckTopValue(std::size_t n = 1) const {
    if (stack_.size() < n) return Error(absl::StrCat("stack underflow in ", OpName(op_)));
    for (std::size_t k = stack_.size() - n; k < stack_.size(); ++k) {
      if (stack_[k].mark) return Error(absl::StrCat("unexpected MARK on the stack in ", OpName(op_)));
    }
    return absl::OkStatus();
  }
  PyRef PopFinished() {
    Slot s = stack_.back();
    stack_.pop_back();
    return Finish(s);
  }
  // Takes the values above the topmost MARK (finished) into `out`, and the MARK.
  absl::Status TakeFromMark(FastVec<PyRef>& out, std::uint32_t* mark_level = nullptr, bool keep_records = false) {
    if (marks_.empty()) return Error(absl::StrCat("no MARK for ", OpName(op_)));
    std::size_t m = marks_.back();
    marks_.pop_back();
    if (mark_level != nullptr) *mark_level = stack_[m].level;
    const std::size_t n = stack_.size() - m - 1;
    out.reserve(n);
    PyRef* const o = out.data();  // (Finish and Freeze touch neither the stack nor `out`)
    const Slot* const from = stack_.data() + m + 1;
    if (keep_records) {
      for (std::size_t k = 0; k < n; ++k) o[k] = FinishKeepRecord(from[k]);
    } else {
      for (std::size_t k = 0; k < n; ++k) o[k] = Finish(from[k]);
    }
    out.set_size(n);
    stack_.resize(m);
    return absl::OkStatus();
  }
  // A copy of what an open list/dict holds now (GET or DUP of it while it is
  // still on the stack).
  PyRef CopyOpen(const PyRef& open) {
    Builder& B = BuilderOf(open);
    B.copied = true;
    return Store(B.kind, B.items.data(), B.items.size(), B.height);
  }

  // ---- Paths (see the header).
  std::string KeyLabel(const PyRef& k) const;
  static bool IsMutable(const Slot& e) { return !e.mark && IsMutableKind(e.ref.kind); }
  std::uint64_t Count(const Slot& e) const;
  static PicklePath Unknown(PicklePath p) {
    p.push_back("[?]");
    return p;
  }
  // Path of the value at stack position q (for q == stack_.size() or a MARK
  // position: of the value that will be there).
  PicklePath PathAt(std::size_t q, std::uint64_t level);
  PicklePath ComputePath(std::size_t q, std::uint64_t level);
  // Entries c+1 .. q-1 are single elements nested under the container at c
  // (APPEND / SETITEM batches of one, no MARK).
  PicklePath ChainPath(std::size_t c, std::size_t q, std::uint64_t level);

  // Whether the value at stack position q is inside an item of a streamed
  // list: the newest streamed list still open has its batch's MARK open right
  // above it, below q (in a batch, a sibling of the list cannot come before
  // its APPENDS; the path of anything there starts with the list's path and
  // an item index). False when unsure (a one-item APPEND has no MARK): the
  // caller then builds the path. Entries of streaming_ whose list is gone
  // are dropped here.
  bool InsideStreamedList(std::size_t q) {
    while (!streaming_.empty()) {
      const auto [pos, token] = streaming_.back();
      if (pos < stack_.size() && stack_[pos].open() && !stack_[pos].mark && BuilderOf(stack_[pos].ref).token == token) {
        break;
      }
      streaming_.pop_back();
    }
    if (streaming_.empty()) return false;
    const std::size_t s = streaming_.back().first;
    return s + 1 < q && stack_[s + 1].mark;
  }

  // ---- Containers.
  absl::Status OpenTarget(std::size_t target, PyKind kind) {
    if (target >= stack_.size() || stack_[target].mark || stack_[target].ref.kind != kind) {
      return Error(absl::StrCat(OpName(op_), " to something that is not a ", KindName(kind)));
    }
    if (!stack_[target].open()) {
      return Error(absl::StrCat(OpName(op_), " to a ", KindName(kind),
                                " that is complete (a memo reference to it): not supported"));
    }
    if (BuilderOf(stack_[target].ref).copied) {
      return Error(absl::StrCat(OpName(op_), ": a container inside itself (recursive structure): not supported"));
    }
    return absl::OkStatus();
  }
  // The pair of a small dict (fewer than 32 pairs) whose key equals the str
  // key `kr`. A str key equals only a str key with the same bytes (a
  // memoized key is the very same bytes: same offset).
  [[gnu::always_inline]] inline std::optional<std::size_t> FindStrKey(Builder& B, const PyRef& kr);
  absl::Status AppendTo(std::size_t target, FastVec<PyRef>& items);
  absl::Status SetItems(std::size_t target, FastVec<PyRef>& kv);
  absl::Status MakeTuple(FastVec<PyRef>& items, std::uint32_t level);
  absl::Status Memo(std::uint64_t id);
  absl::Status Get(std::uint64_t id);

  // ---- The dict fast path (PickleReadOptions::fast_dicts).
  // Makes at least n bytes available from pos_ (fewer at the end of the input).
  void Window(std::size_t n) {
    if (end_ - pos_ >= n || eof_) return;
    if (in_ != nullptr) std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
    base_ += pos_;
    end_ -= pos_;
    pos_ = 0;
    while (end_ < kBufferSize && !eof_) {
      const std::size_t got = Read(end_, kBufferSize - end_);
      if (got == 0) eof_ = true;
      end_ += got;
    }
  }
  struct FastVal {
    PyRef ref;
    std::int32_t box = -1;  // >= 0: an open list/dict of this decode (fast_boxes_[box])
    bool mark = false;
  };
  struct FastBox {
    FastVec<PyRef> items;
    std::uint64_t memo[4];
    std::uint64_t str_key_bits = 0;
    PyKind kind = PyKind::kDict;
    std::uint16_t height = 1;
    std::uint8_t memos = 0;
  };
  bool FastDict();
  // The fast decoders' marks, boxes and memo writes: none yet.
  void ClearFastState() {
    fast_nmarks_ = 0;
    fast_nboxes_ = 0;
    fast_memo_.clear();
    fast_memo_bloom_ = 0;
    fast_memo_count_ = memo_count_;
  }
  // FastDict's stack machine and its steps (pickle_fast_dict.cpp).
  bool FastStackDict(std::size_t& p, FastVal* st, std::size_t& sp, std::uint64_t& ops);
  bool FastOpenBox(FastVal* st, std::size_t& sp, PyKind kind);
  bool FastPushValue(FastVal* st, std::size_t& sp, const PyRef& r);
  bool FastPut(FastVal* st, std::size_t sp, std::uint64_t id);
  bool FastValuesOnTop(std::size_t sp, std::size_t n) const;
  bool FastStackInto(std::uint8_t op, FastVal* st, std::size_t& sp);
  bool FastStackTuple(std::uint8_t op, FastVal* st, std::size_t& sp);
  // The end of a dict read fast: its value (a dict or a record's
  // placeholder) pushed at `level`, the opcodes it took counted.
  [[gnu::always_inline]] bool FastPush(const PyRef& r, std::uint32_t level, std::uint64_t ops) {
    Slot s;
    s.ref = r;
    s.level = level;
    stack_.push_back(s);
    fast_ops_ = ops;
    ++fast_count_;
    return true;
  }
  template <bool kRecord>
  bool FastPairs(std::size_t& pos);
  struct PairCursor;  // FastPairs' position and steps (pickle_fast_dict.cpp)
  [[gnu::always_inline]] inline bool PairList(PairCursor& c, PyRef& val);
  [[gnu::always_inline]] inline bool PairListItems(PairCursor& c, const std::uint64_t* ids, std::uint8_t nids,
                                                   std::uint16_t& h, PyRef& val);
  [[gnu::always_inline]] inline bool PairScalar(PairCursor& c, std::uint8_t op, PyRef& val);
  [[gnu::always_inline]] inline bool PairRecordKey(std::size_t k, const PyRef& key, std::size_t key_pos,
                                                   std::uint32_t& present);
  struct Template;
  template <bool kChecked>
  [[gnu::always_inline]] inline bool TemplatePairs(const Template& T, std::size_t& pos);
  enum class TmplNext : std::uint8_t;
  struct TmplKey;
  [[gnu::always_inline]] static inline TmplNext TmplPairValue(const TmplKey& t, std::uint64_t w, const unsigned char* b,
                                                              std::size_t& p, std::uint64_t& id, PyRef& val,
                                                              std::uint8_t& op);
  bool TemplateRun();
  // After a record FastDict pushed: true if the next opcode is an
  // EMPTY_DICT that FastDict would read the same way if Run's loop handed it
  // over; the record's opcodes then counted as Run counts them (and Run's
  // working-memory check made when due: if it fails, false, and Run makes it
  // again and stops with its error), the EMPTY_DICT read as Run reads an
  // opcode, the window made.
  [[gnu::always_inline]] inline bool NextTemplateEntry();
  [[gnu::always_inline]] inline bool PushRecord(std::size_t p, std::size_t chars0, bool from_template);
  template <bool kOneMemo>
  [[gnu::always_inline]] inline PyRef CommitRecord(std::uint64_t gen);
  struct TmplState {  // TemplatePairs' memo writes so far
    std::uint64_t bloom = 0, next_id = 0;
    bool list_cache_ok = true;
  };
  std::uint64_t TmplMemoize(TmplState& s) const;
  [[gnu::noinline]] bool TmplScalarTail(std::uint8_t op, std::size_t& p, PyRef& val, TmplState& s);
  [[gnu::noinline]] bool TmplValue(std::uint8_t op, std::size_t& p, PyRef& val, TmplState& s);
  void BuildTemplate(const PyRef* pairs, std::uint32_t n);
  // A memo reference's value as FastLookup gives it outside a decode (no
  // memo write of the decode is readable: their ids are all new): none, an
  // open list/dict of the general path or a record's placeholder is no value.
  [[gnu::always_inline]] bool MemoValue(std::uint64_t id, PyRef& out) const {
    if (const PyRef* d = memo_.Dense(id)) [[likely]] {  // what Find does, without building an entry
      if (d->kind == PyKind::kMissing || (d->flags & (kPyRefOpen | kPyRefRecord))) return false;
      out = *d;
      return true;
    }
    const MemoEntry m = memo_.Find(id);
    if (m.ref.kind == PyKind::kMissing || m.token != 0 || (m.ref.flags & kPyRefRecord)) return false;
    out = m.ref;
    return true;
  }
  std::uint8_t RecordKeyIndex(const PyRef& key) const;
  // Forgets the record keys learnt from strings at chars0 or beyond (dropped:
  // their bytes will be reused).
  void ForgetRecordKeysFrom(std::size_t chars0) {
    for (KeyAt& at : record_key_at_) {
      if (at.v != ~std::uint64_t{0} && at.v + at.n > chars0) at = KeyAt{};
    }
  }
  PyRef BuildRecord(const PyRef& placeholder);
  void ReleaseRecords();
  // The list_cache_ entry of a frames list's item bytes (`span` bytes at
  // `items`, hashed to `hash`), while no memo entry has changed since it was
  // stored: the same bytes are the same list.
  [[gnu::always_inline]] bool CachedListOf(const unsigned char* items, std::size_t span, std::uint64_t hash,
                                           PyRef& out) const {
    auto it = list_cache_.find(hash);
    if (it == list_cache_.end()) return false;
    const CachedList& c = list_cache_items_[it->second];
    if (c.changes != memo_.changes() || c.length != span ||
        std::memcmp(list_cache_bytes_.data() + c.offset, items, span) != 0) {
      return false;
    }
    out = c.list;
    return true;
  }
  [[gnu::always_inline]] bool FastLookup(std::uint64_t id, PyRef& out) const {
    if (fast_memo_bloom_ & (std::uint64_t{1} << (id & 63))) [[unlikely]]
      return FastLookupWritten(id, out);
    return MemoValue(id, out);
  }
  bool FastLookupWritten(std::uint64_t id, PyRef& out) const;
  [[gnu::always_inline]] PyRef FastFinish(const FastVal& v) { return v.box < 0 ? v.ref : FastStore(v.box); }
  PyRef FastStore(std::int32_t box);
  bool FastInto(FastBox& box, FastVal* vals, std::size_t n);
  absl::Status Long(const unsigned char* b, std::size_t n);
  absl::Status Step(std::uint8_t op);

  static constexpr std::uint32_t kNoNext = ~std::uint32_t{0};

  std::istream* in_ = nullptr;  // null: the input is in memory (input_)
  const std::string& source_;
  const PickleReadOptions& options_;
  std::vector<char> buf_;        // a stream's buffer
  const char* input_ = nullptr;  // the input in memory, input_size_ bytes
  std::uint64_t input_size_ = 0;
  const char* data_ = nullptr;  // the buffer: buf_, or input_ + base_ (kBufferSize bytes at most)
  MappedInput* map_ = nullptr;  // the mapped file input_ is, if it is one
  std::size_t pos_ = 0, end_ = 0;
  std::uint64_t base_ = 0;
  bool eof_ = false;
  std::uint64_t op_offset_ = 0;
  std::uint8_t op_ = 0;

  std::shared_ptr<PickleArena> arena_;
  FastVec<Slot> stack_;
  std::vector<std::size_t> marks_;  // positions of the MARKs in stack_
  std::vector<std::unique_ptr<Builder>> builders_;
  std::vector<std::uint32_t> free_builders_;
  std::uint64_t builder_bytes_ = 0;
  MemoTable memo_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> tree_memo_;  // (memo id, tree offset), ascending offsets
  std::vector<PyRef> cons_refs_;                                    // shared containers
  std::vector<std::uint32_t> cons_next_;                            // same-hash chain
  absl::flat_hash_map<std::uint64_t, std::uint32_t> cons_head_;     // content hash -> newest index
  std::uint64_t memo_count_ = 0;                                    // MEMOIZE's index: entries ever memoized
  std::uint64_t next_token_ = 0;
  std::uint64_t peak_ = 0;
  bool path_too_deep_ = false;
  bool stopped_ = false;
  FastVec<PyRef> scratch_;
  // The dict fast path's state, reused from one dict to the next.
  bool fast_dicts_ = false;
  std::uint64_t fast_ops_ = 0;    // opcodes the fast path consumed (for the budget checks)
  std::uint64_t fast_count_ = 0;  // dicts it read
  // Run's opcode count and its next working-memory check (FastDict's run of
  // template records counts the opcodes it reads in their place: see NextTemplateEntry).
  std::uint64_t run_ops_ = 0, run_next_check_ = kBudgetCheckEvery;
  std::uint64_t fast_pair_ops_ = 0;
  std::unique_ptr<FastVal[]> fast_vals_;  // the fast path's stack (kFastMaxStack values)
  std::size_t fast_marks_[kFastMaxMarks] = {};
  std::size_t fast_nmarks_ = 0;
  std::vector<FastBox> fast_boxes_;
  std::size_t fast_nboxes_ = 0;
  FastVec<std::pair<std::uint64_t, PyRef>> fast_memo_;  // memo writes, made when the dict is done
  std::uint64_t fast_memo_bloom_ = 0;                   // bit (id & 63) of every id written by this decode
  std::uint64_t fast_memo_count_ = 0;
  // Records (PickleReadOptions::on_record): placeholders on the stack stand
  // for records_[v & 0xffffffff] of generation v >> 32 (records_ is emptied
  // at the end of each batch of the streamed list, which takes them all).
  struct Record {
    std::uint32_t first = 0;  // its pairs: record_pairs_[2 * first...], record_index_[first...]
    std::uint32_t n = 0;
    std::uint16_t height = 1;
    bool built = false;
    PyRef dict;  // once built
  };
  bool records_on_ = false;
  FastVec<Record> records_;
  FastVec<PyRef> record_pairs_;
  FastVec<std::uint8_t> record_index_;
  FastVec<std::pair<std::uint64_t, std::uint64_t>> record_memo_;  // (memo id, placeholder's v) written
  std::uint64_t record_gen_ = 1;
  std::uint64_t record_count_ = 0;
  bool record_stale_ = false;  // a placeholder outlived its batch (a reader bug: an error, not a crash)
  struct KeyAt {
    std::uint64_t v = ~std::uint64_t{0};
    std::uint32_t n = 0;
    std::uint8_t index = 0;
  };
  KeyAt record_key_at_[kMaxRecordKeys];                  // the key last seen at each position of a record
  std::uint8_t fast_record_index_[kMaxRecordKeys] = {};  // FastPairs<true>: the key index of each pair
  std::uint32_t fast_record_pairs_ = 0;                  // FastPairs<true>: its pairs (in record_pairs_)
  std::uint32_t fast_key_pos_[kMaxRecordKeys] = {};      // FastPairs<true>: where each key's opcode is in the buffer
  // The templates (TemplatePairs): the keys of a record FastPairs<true>
  // read, each a memo reference (its bytes, little-endian, and a mask of
  // their length), the string it gave and its key index; valid while
  // memo_.changes() is `changes`. n 0: none. Two of them, the one last used
  // first (tmpl_[tmpl_first_]): entries of two shapes in turn (an alloc with
  // more keys than a free) take one each.
  // A pair whose value was a memo reference or a BININT1/2/4 also keeps
  // the pair's bytes (8 at most) and that value: the same bytes again are
  // the same value (pair_mask 0 and pair_bytes ~0: none).
  // And the shape of the value: the key's bytes with the value's opcode
  // (and LONG1's length byte) after them, when that opcode is one whose
  // argument has a fixed length: a memo reference, BININT1/2/4, LONG1 of
  // 8 bytes at most (vkind; vmask 0 and vbytes ~0: none). The same bytes
  // again: the value is read from its argument without a look at its opcode.
  enum : std::uint8_t { kVNone, kVMemo1, kVMemo4, kVInt1, kVInt2, kVInt4, kVLong1 };
  struct TmplKey {
    std::uint64_t bytes = 0, mask = 0;
    std::uint64_t pair_bytes = ~std::uint64_t{0}, pair_mask = 0;
    std::uint64_t vbytes = ~std::uint64_t{0}, vmask = 0;
    std::uint64_t varg_mask = 0, vsign = 0;  // LONG1: its argument's bytes, their top bit
    PyRef key, value;
    std::uint16_t value_height = 1;  // what the value adds to the dict's height
    std::uint8_t len = 0, pair_len = 0;
    std::uint8_t vkind = kVNone, vlen = 0, varg = 0;  // vlen: bytes of vbytes; varg: of the argument after them
  };
  struct Template {
    TmplKey keys[kMaxRecordKeys];
    std::uint8_t index[kMaxRecordKeys] = {};
    std::uint32_t n = 0;
    std::uint64_t changes = 0;
  };
  Template tmpl_[2];
  Template tmpl_build_;  // BuildTemplate's
  std::uint32_t tmpl_first_ = 0;
  std::uint64_t tmpl_count_ = 0;  // records read by a template
  // Frames lists by their bytes (FastPairs): the stored list, valid while
  // memo_.changes() is what it was.
  struct CachedList {
    std::size_t offset, length;  // in list_cache_bytes_
    PyRef list;
    std::uint64_t changes;
  };
  absl::flat_hash_map<std::uint64_t, std::uint32_t> list_cache_;  // BytesHash -> list_cache_items_
  std::vector<CachedList> list_cache_items_;
  std::string list_cache_bytes_;
  // The lists of at least 16 bytes by their first 16 (PrefixHash), the one
  // cached last: TmplValue finds a cached list without scanning its items'
  // opcodes for where they end or hashing them all.
  absl::flat_hash_map<std::uint64_t, std::uint32_t> list_prefix_;
  static std::uint64_t PrefixHash(const unsigned char* b) {
    std::uint64_t w0, w1;
    std::memcpy(&w0, b, 8);
    std::memcpy(&w1, b + 8, 8);
    __extension__ using U128 = unsigned __int128;
    const U128 m = static_cast<U128>(w0 ^ 0xa0761d6478bd642full) * (w1 ^ 0xe7037ed1a0b428dbull);
    return static_cast<std::uint64_t>(m) ^ static_cast<std::uint64_t>(m >> 64);
  }
  // Keeps a list read from `span` bytes of memo references (hash BytesHash of them).
  void CacheList(std::uint64_t span_hash, const unsigned char* bytes, std::size_t span, const PyRef& list);
  // A frames list's items from p (after its MARK): true, `list` and p past
  // its APPENDS, if they are the bytes of the list cached last with the same
  // first 16 bytes and an APPENDS follows. Then the scan and the lookup by
  // all their bytes (TmplValue) would find that very list: the bytes are
  // memo references (they were when cached), so the scan would end where
  // they end (the 3 bytes after them in the buffer: the scan's bound for a
  // BINGET there), and the item list_cache_ holds for their hash is the one
  // they were cached in (an item is only ever replaced through its hash).
  [[gnu::always_inline]] inline bool PrefixCachedList(std::size_t& p, PyRef& list) const;
  std::string text_;                                              // protocol 0 text arguments
  std::vector<std::pair<std::size_t, std::uint64_t>> streaming_;  // streamed lists open: (stack position, token)
};

// A record of what box 0 read (its pairs in record_pairs_ beyond its size):
// its memo writes made (the decode's, then the dict's own MEMOIZEs, with the
// placeholder), its key indices kept; the placeholder (generation bits
// `gen`), pushed nowhere yet. kOneMemo: the dict has exactly one MEMOIZE
// (a template's), written without the loop.
template <bool kOneMemo>
[[gnu::always_inline]] inline PyRef Reader::CommitRecord(std::uint64_t gen) {
  const FastBox& D = fast_boxes_[0];
  for (const auto& [id, ref] : fast_memo_) SetMemo(id, ref);
  memo_count_ = fast_memo_count_;
  Record R;
  R.first = static_cast<std::uint32_t>(record_index_.size());
  R.n = fast_record_pairs_;
  R.height = D.height;
  record_index_.reserve(R.first + R.n);
  if (record_index_.capacity() >= R.first + kMaxRecordKeys) [[likely]] {  // one fixed-size copy
    std::memcpy(record_index_.data() + R.first, fast_record_index_, kMaxRecordKeys);
  } else {
    std::memcpy(record_index_.data() + R.first, fast_record_index_, R.n);
  }
  record_index_.set_size(R.first + R.n);
  PyRef r;
  r.kind = PyKind::kDict;
  r.flags = kPyRefRecord;
  r.height = D.height;
  r.n = R.n;
  r.v = records_.size() | gen;
  records_.push_back(R);
  if constexpr (kOneMemo) {
    SetMemo(D.memo[0], r);
  } else {
    for (std::uint8_t k = 0; k < D.memos; ++k) SetMemo(D.memo[k], r);
  }
  ++record_count_;
  return r;
}

}  // namespace memscope::pickle_internal

#endif  // MEMSCOPE_IMPORTERS_PICKLE_INTERNAL_H_
