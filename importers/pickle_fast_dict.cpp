// The dict fast path (PickleReadOptions::fast_dicts): a trace entry read
// straight from the buffer (FastPairs), or on a small stack of its own
// (FastDict), into what the general machine would build.

#include "importers/pickle_internal.h"

namespace memscope::pickle_internal {

// ---- The dict fast path.
//
// A dict inside an item of a streamed list (a trace entry: EMPTY_DICT,
// MEMOIZE, MARK, key/value pairs, SETITEMS) is decoded here straight from
// the read buffer, on a small stack of its own: no levels, paths, builders
// or budget checks per opcode. It accepts the opcodes such dicts are made
// of (scalars, str, memo references to finished values, memo writes,
// FRAME, small lists, dicts and tuples of those) and builds what the general
// path would: the same Store calls (so the same shared nodes), the same memo
// entries (written when the dict is done, in order), the dict pushed as a
// finished value at the level the general path gives it. It ends when the
// dict is complete and the next opcode is another EMPTY_DICT or APPENDS (so
// nothing can add to the dict later: the general path would keep it open for
// a SETITEM that follows). Anything else returns false having changed
// nothing the general path can see (strings and tree nodes it added are
// dropped; distinct containers it stored in the shared pool are found again
// by the general path), and the general path reads the dict from its
// EMPTY_DICT.

void Reader::CacheList(std::uint64_t span_hash, const unsigned char* bytes, std::size_t span, const PyRef& list) {
  auto [it, added] = list_cache_.try_emplace(span_hash, static_cast<std::uint32_t>(list_cache_items_.size()));
  if (!added) {  // the same hash: the newer list replaces the older
    list_cache_items_[it->second] = CachedList{list_cache_bytes_.size(), span, list, memo_.changes()};
  } else {
    list_cache_items_.push_back(CachedList{list_cache_bytes_.size(), span, list, memo_.changes()});
  }
  list_cache_bytes_.append(reinterpret_cast<const char*>(bytes), span);
  if (span >= 16) list_prefix_[PrefixHash(bytes)] = it->second;
}

namespace {

// Whether `items` (key, value, key, value..., every key a str) holds a key
// with the bytes of the str key `key`.
[[gnu::always_inline]] inline bool HoldsStrKey(const FastVec<PyRef>& items, const char* chars, const PyRef& key) {
  for (std::size_t j = 0; j < items.size(); j += 2) {
    const PyRef& e = items[j];
    if (e.n == key.n && (e.v == key.v || std::memcmp(chars + e.v, chars + key.v, key.n) == 0)) return true;
  }
  return false;
}

}  // namespace

// FastLookup of an id this decode wrote (or one sharing its bit).
bool Reader::FastLookupWritten(std::uint64_t id, PyRef& out) const {
  for (std::size_t k = fast_memo_.size(); k-- > 0;) {
    if (fast_memo_[k].first == id) {
      out = fast_memo_[k].second;
      return true;
    }
  }
  for (std::size_t b = 0; b < fast_nboxes_; ++b) {  // a list/dict of this decode still open
    const FastBox& B = fast_boxes_[b];
    for (std::uint8_t k = 0; k < B.memos; ++k) {
      if (B.memo[k] == id) return false;
    }
  }
  const MemoEntry m = memo_.Find(id);
  // none, open in the general path, or a record's placeholder
  if (m.ref.kind == PyKind::kMissing || m.token != 0 || (m.ref.flags & kPyRefRecord)) return false;
  out = m.ref;
  return true;
}

PyRef Reader::FastStore(std::int32_t box) {
  const FastBox& B = fast_boxes_[static_cast<std::size_t>(box)];
  const PyRef r = Store(B.kind, B.items.data(), B.items.size(), B.height);
  for (std::uint8_t k = 0; k < B.memos; ++k) fast_memo_.push_back({B.memo[k], r});
  return r;
}

bool Reader::FastInto(FastBox& box, FastVal* vals, std::size_t n) {
  if (box.kind == PyKind::kList) {
    if (box.items.size() + n > kFastMaxListItems) return false;
    for (std::size_t k = 0; k < n; ++k) {
      const PyRef r = FastFinish(vals[k]);
      if (IsContainerKind(r.kind)) box.height = std::max(box.height, AddHeight(r.height));
      box.items.push_back(r);
    }
    return true;
  }
  if (n % 2 != 0 || box.items.size() + n > kFastMaxDictItems) return false;
  for (std::size_t k = 0; k < n; k += 2) {
    const PyRef& key = vals[k].ref;
    if (vals[k].box >= 0 || key.kind != PyKind::kString) return false;
    const char* chars = arena_->chars.data();
    const std::uint64_t bit = StrKeyBit(chars, key);
    // (maybe a duplicate key: the general path replaces in place)
    if ((box.str_key_bits & bit) && HoldsStrKey(box.items, chars, key)) return false;
    box.str_key_bits |= bit;
    const PyRef val = FastFinish(vals[k + 1]);
    if (IsContainerKind(val.kind)) box.height = std::max(box.height, AddHeight(val.height));
    box.items.push_back(key);
    box.items.push_back(val);
  }
  return true;
}

// FastPairs' reading position in the buffer and what it needs besides: its
// steps over the opcodes (the next one after FRAMEs, a look at it, a memo
// write, a memo reference), each inlined where it is used.
struct Reader::PairCursor {
  Reader& r;
  const unsigned char* const b;
  const std::size_t end;
  std::size_t p;
  FastBox& D;
  // Whether a frames list may come from list_cache_: not after a memo write
  // of this decode over an existing entry (not counted in memo_.changes()
  // until it is made).
  bool list_cache_ok = true;
  const std::uint64_t* open_ids = nullptr;  // memo ids of the list being read (not finished: not readable)
  std::uint8_t open_n = 0;

  // The next opcode, after FRAMEs; 0 at the end of the buffer (not an opcode this reads).
  [[gnu::always_inline]] std::uint8_t Next() {
    if (p < end && b[p] != 0x95) [[likely]]
      return b[p++];
    while (p < end && b[p] == 0x95) {
      if (end - p < 9) return 0;
      p += 9;
    }
    if (p >= end) return 0;
    return b[p++];
  }
  [[gnu::always_inline]] std::uint8_t Peek() const {
    if (p < end && b[p] != 0x95) [[likely]]
      return b[p];
    std::size_t q = p;
    while (q < end && b[q] == 0x95) q += 9;
    return q < end ? b[q] : 0;
  }
  // A memo opcode's id: 1 byte (`short_id`: BINGET, BINPUT) or 4
  // (LONG_BINGET, LONG_BINPUT), little-endian; false at the buffer's end.
  [[gnu::always_inline]] bool Id(bool short_id, std::uint64_t& id) {
    if (short_id) {
      if (end - p < 1) return false;
      id = b[p++];
    } else {
      if (end - p < 4) return false;
      id = LoadLE32(b + p);
      p += 4;
    }
    return true;
  }
  // A memo write (MEMOIZE, BINPUT, LONG_BINPUT) of `v`, if one comes next:
  // its id to *id_out, or the write to fast_memo_.
  bool Memo(const PyRef& v, std::uint64_t* id_out) {
    const std::uint8_t op = Peek();
    if (op != 0x94 && op != 'q' && op != 'r') return true;
    (void)Next();
    std::uint64_t id;
    if (op == 0x94) {
      id = r.fast_memo_count_;
    } else if (!Id(op == 'q', id)) {
      return false;
    }
    const std::uint64_t bit = std::uint64_t{1} << (id & 63);
    if (const PyRef* d = r.memo_.Dense(id); d == nullptr || d->kind != PyKind::kMissing) {
      list_cache_ok = false;  // a write over an entry (or one not known to be empty): no cached frames lists
    }
    if (r.fast_memo_bloom_ & bit) {
      for (const auto& [k, w] : r.fast_memo_) {
        if (k == id) return false;
      }
      for (std::uint8_t k = 0; k < D.memos; ++k) {
        if (D.memo[k] == id) return false;
      }
    }
    r.fast_memo_bloom_ |= bit;
    r.fast_memo_count_ = std::max(r.fast_memo_count_, id + 1);
    if (id_out != nullptr) {
      *id_out = id;
    } else {
      r.fast_memo_.push_back({id, v});
    }
    return true;
  }
  // The memo write of a value, if one comes next (a list's comes before its items).
  [[gnu::always_inline]] bool MemoNext(const PyRef& v) {
    const std::uint8_t o = Peek();
    return (o != 0x94 && o != 'q' && o != 'r') || Memo(v, nullptr);
  }
  // A memo reference (BINGET or LONG_BINGET, `op` read) to a finished value.
  [[gnu::always_inline]] bool Get(std::uint8_t op, PyRef& out) {
    std::uint64_t id;
    if (!Id(op == 'h', id)) return false;
    for (std::uint8_t k = 0; k < open_n; ++k) {
      if (open_ids[k] == id) return false;
    }
    return r.FastLookup(id, out);
  }
};

// A list value of FastPairs (EMPTY_LIST read): its memo writes, then MARK,
// memo references and APPENDS (a traceback's frames), or one memo
// reference and APPEND, or nothing (the next key follows). Its memo writes
// go to fast_memo_, and D's height rises to hold it.
bool Reader::PairList(PairCursor& c, PyRef& val) {
  std::uint64_t ids[4];
  std::uint8_t nids = 0;
  for (std::uint8_t o = c.Peek(); o == 0x94 || o == 'q' || o == 'r'; o = c.Peek()) {
    if (nids == 4 || !c.Memo(PyRef(), &ids[nids])) return false;
    ++nids;
  }
  c.open_ids = ids;
  c.open_n = nids;
  scratch_.clear();
  std::uint16_t h = 1;
  const std::uint8_t o = c.Peek();
  bool stored = false;
  if (o == '(') {
    (void)c.Next();
    if (!PairListItems(c, ids, nids, h, val)) return false;
    stored = true;
  } else if (o == 'h' || o == 'j') {  // one item and APPEND, or empty and the next key
    const std::size_t save = c.p;
    PyRef r;
    (void)c.Next();
    if (c.Get(o, r) && c.Peek() == 'a') {
      (void)c.Next();
      if (IsContainerKind(r.kind)) h = std::max(h, AddHeight(r.height));
      scratch_.push_back(r);
    } else {
      c.p = save;
    }
  }
  c.open_n = 0;
  if (!stored) val = Store(PyKind::kList, scratch_.data(), scratch_.size(), h);
  for (std::uint8_t k = 0; k < nids; ++k) fast_memo_.push_back({ids[k], val});
  c.D.height = std::max(c.D.height, AddHeight(val.height));
  return true;
}

// PairList's items after the MARK, up to the APPENDS: the list stored in
// `val` (`h` its height so far). The items' bytes (BINGET / LONG_BINGET up
// to APPENDS): a list of the same bytes read before, while no memo entry has
// changed since, is the same list (list_cache_).
bool Reader::PairListItems(PairCursor& c, const std::uint64_t* ids, std::uint8_t nids, std::uint16_t& h, PyRef& val) {
  const unsigned char* const b = c.b;
  const std::size_t end = c.end;
  std::size_t& p = c.p;
  const auto item = [&](std::uint8_t o) {
    PyRef r;
    if ((o != 'h' && o != 'j') || !c.Get(o, r)) return false;
    if (IsContainerKind(r.kind)) h = std::max(h, AddHeight(r.height));
    scratch_.push_back(r);
    return true;
  };
  const std::size_t q = ScanMemoRefs(b, p, end);
  const std::size_t span = q - p;
  const bool cacheable = c.list_cache_ok && q < end && b[q] == 'e' && span > 0 && span <= kListCacheMaxBytes;
  std::uint64_t span_hash = 0;
  bool cached = false;
  if (cacheable) {
    span_hash = BytesHash(b + p, span);
    if (CachedListOf(b + p, span, span_hash, val)) {
      p = q + 1;
      cached = true;
    }
  }
  // The items: read in a tight loop (a traceback's 10 to 30 frames
  // per entry); anything else (FRAME, the buffer's end) by the steps above.
  scratch_.reserve(kFastMaxListItems);
  PyRef* const out = scratch_.data();
  std::size_t count = 0;
  bool clean = cacheable;  // every item a finished value of the memo as it stands
  for (; !cached;) {
    std::uint64_t id;
    if (end - p >= 5 && b[p] == 'h') [[likely]] {
      id = b[p + 1];
      p += 2;
    } else if (end - p >= 5 && b[p] == 'j') {
      id = LoadLE32(b + p + 1);
      p += 5;
    } else {
      const std::uint8_t o = c.Next();
      if (o == 'e') break;
      clean = false;
      scratch_.set_size(count);
      if (count == kFastMaxListItems || !item(o)) return false;
      ++count;
      continue;
    }
    if (fast_memo_bloom_ & (std::uint64_t{1} << (id & 63))) clean = false;  // maybe this decode's
    if (count == kFastMaxListItems) return false;
    for (std::uint8_t k = 0; k < nids; ++k) {
      if (ids[k] == id) return false;  // the list itself, not finished
    }
    PyRef& r = out[count];
    if (!FastLookup(id, r)) return false;
    if (IsContainerKind(r.kind)) h = std::max(h, AddHeight(r.height));
    ++count;
  }
  if (!cached) {
    scratch_.set_size(count);
    val = Store(PyKind::kList, scratch_.data(), scratch_.size(), h);
    if (clean && (val.flags & kPyRefShared) && list_cache_items_.size() < kListCacheMaxLists) {
      CacheList(span_hash, b + (q - span), span, val);
    }
  }
  return true;
}

// A scalar or string value of FastPairs (`op` read), as FastDict's stack
// machine reads it; a number may be the first of a tuple of up to three (a
// pool_id: (0, 0), written anew for each entry): more numbers (no key can be
// one), then TUPLE1/2/3. Then the value's memo write, if one comes.
bool Reader::PairScalar(PairCursor& c, std::uint8_t op, PyRef& val) {
  std::string& chars = arena_->chars;
  if (DecodeFastScalar(op, c.b, c.p, c.end, chars, val) != FastScalar::kOk) return false;
  std::uint8_t o = c.Peek();
  if (IsTupleNumberOp(op) && (IsTupleNumberOp(o) || o == 0x85)) {
    PyRef t[3];
    t[0] = val;
    std::size_t n = 1;
    for (; n < 3 && IsTupleNumberOp(o); o = c.Peek()) {
      (void)c.Next();
      if (DecodeFastScalar(o, c.b, c.p, c.end, chars, t[n++]) != FastScalar::kOk) return false;
    }
    if (o != 0x84 + n) return false;
    (void)c.Next();
    val = Store(PyKind::kTuple, t, n, 1);
    c.D.height = std::max(c.D.height, AddHeight(val.height));
  }
  return c.MemoNext(val);
}

// FastPairs<true>: the k-th pair's key index (a key met twice, or not a
// record key: false, left to the dict paths), kept with where its key's
// opcode is (`key_pos`).
bool Reader::PairRecordKey(std::size_t k, const PyRef& key, std::size_t key_pos, std::uint32_t& present) {
  if (k >= kMaxRecordKeys) return false;
  KeyAt& at = record_key_at_[k];
  std::uint8_t index = at.index;
  if (at.v != key.v || at.n != key.n) [[unlikely]] {
    index = RecordKeyIndex(key);
    if (index == 0xff) return false;
    at = KeyAt{key.v, key.n, index};
  }
  const std::uint32_t bit = std::uint32_t{1} << index;
  if (present & bit) return false;
  present |= bit;
  fast_record_index_[k] = index;
  fast_key_pos_[k] = static_cast<std::uint32_t>(key_pos);
  return true;
}

// The common shape of a trace entry, read straight into the dict (box 0,
// just opened): [memo] MARK, then key/value pairs: keys str (memo references,
// or SHORT_BINUNICODE and a memo write), values ints, floats, None, bools,
// str and memo references to finished values, or lists of memo references;
// SETITEMS, and next another EMPTY_DICT or APPENDS. Adding each pair to the
// dict as it is read is what the MARK ... SETITEMS batch does at its end.
// False at anything else (the caller starts again on its stack).
//
// kRecord (PickleReadOptions::on_record): the same, and each key's index in
// record_keys too (fast_record_index_), found by where its bytes are (the
// key at the same position of the previous record: a memo reference to the
// same stored string) or else by its text; false for a key not among them,
// one met twice, more than kMaxRecordKeys pairs, or a dict that holds no
// container (the general path would keep it in the shared pool).
template <bool kRecord>
bool Reader::FastPairs(std::size_t& pos) {
  PickleArena& a = *arena_;
  FastBox& D = fast_boxes_[0];
  PairCursor c{*this, reinterpret_cast<const unsigned char*>(data_), end_, pos, D};
  // The dict's own memo write, then its MARK.
  std::uint8_t op = c.Next();
  if (op == 0x94 || op == 'q' || op == 'r') {
    --c.p;
    std::uint64_t id = 0;
    if (!c.Memo(PyRef(), &id)) return false;
    D.memo[D.memos++] = id;
    op = c.Next();
  }
  if (op != '(') return false;
  [[maybe_unused]] std::uint32_t present = 0;  // kRecord: the key indices met
  // kRecord: its pairs go straight to record_pairs_ (room made here; its size set at the end).
  [[maybe_unused]] const std::size_t record_pairs0 = record_pairs_.size();
  [[maybe_unused]] PyRef* record_out = nullptr;
  [[maybe_unused]] std::size_t record_n = 0;
  if constexpr (kRecord) {
    record_pairs_.reserve(record_pairs0 + 2 * kMaxRecordKeys);
    record_out = record_pairs_.data() + record_pairs0;
  }
  for (;;) {
    op = c.Next();
    if (op == 'u') break;
    PyRef key, val;
    [[maybe_unused]] const std::size_t key_pos = c.p - 1;  // (Next() read the opcode at p - 1)
    if (op == 'h' || op == 'j') {
      if (!c.Get(op, key)) return false;
    } else if (op == 0x8c) {
      if (DecodeFastScalar(op, c.b, c.p, c.end, a.chars, key) != FastScalar::kOk || !c.Memo(key, nullptr)) {
        return false;
      }
    } else {
      return false;
    }
    if (key.kind != PyKind::kString) return false;
    op = c.Next();
    if (op == 'h' || op == 'j') {
      if (!c.Get(op, val)) return false;
      if (IsContainerKind(val.kind)) D.height = std::max(D.height, AddHeight(val.height));
      // A str read by reference and memoized again is left to the general path.
      if (val.kind != PyKind::kString && !c.MemoNext(val)) return false;
    } else if (op == ']') {  // a list of memo references (a traceback's frames)
      if (!PairList(c, val)) return false;
    } else if (!PairScalar(c, op, val)) {  // the scalars and strings FastDict's stack machine reads too
      return false;
    }
    if constexpr (kRecord) {
      if (!PairRecordKey(record_n, key, key_pos, present)) return false;
      record_out[2 * record_n] = key;  // straight where the record keeps them
      record_out[2 * record_n + 1] = val;
      ++record_n;
      continue;
    }
    // Into the dict, as SETITEMS would (a duplicate key: left to the general path).
    if (D.items.size() + 2 > kFastMaxDictItems) return false;
    const char* chars = a.chars.data();
    const std::uint64_t bit = StrKeyBit(chars, key);
    if ((D.str_key_bits & bit) && HoldsStrKey(D.items, chars, key)) return false;
    D.str_key_bits |= bit;
    D.items.push_back(key);
    D.items.push_back(val);
  }
  if constexpr (kRecord) {
    if (D.height < 2) return false;
    fast_record_pairs_ = static_cast<std::uint32_t>(record_n);
  }
  const std::uint8_t after = c.Peek();
  if (after != '}' && after != 'e') return false;
  if constexpr (kRecord) record_pairs_.set_size(record_pairs0 + 2 * record_n);
  fast_pair_ops_ = (c.p - pos) / 2;  // about: every opcode here takes 2 bytes or more
  pos = c.p;
  return true;
}

// The end of a record FastPairs<true> or TemplatePairs read (up to p, the
// dict in box 0, its pairs in record_pairs_ beyond its size): its memo
// writes made, its pairs and key indices kept for on_record, a placeholder
// pushed. False, having made none of that, when it would be too deep (the
// caller drops what was read; the general path gives the error).
bool Reader::PushRecord(std::size_t p, std::size_t chars0, bool from_template) {
  const FastBox& D = fast_boxes_[0];
  const std::uint32_t level = NextLevel(false);
  if (std::uint64_t{level} + D.height > options_.max_depth || records_.size() >= 0xffffffffu) {
    ForgetRecordKeysFrom(chars0);
    record_pairs_.resize(2 * record_index_.size());
    return false;
  }
  pos_ = p;
  const PyRef r = CommitRecord<false>((record_gen_ & 0xffffffffu) << 32);
  if (from_template) {
    ++tmpl_count_;
  } else if (options_.fast_template) {
    BuildTemplate(record_pairs_.data() + 2 * std::size_t{records_.back().first}, r.n);
  }
  return FastPush(r, level, fast_pair_ops_);
}

// FastDict's stack: a new list or dict (open: a box of this decode) pushed.
bool Reader::FastOpenBox(FastVal* st, std::size_t& sp, PyKind kind) {
  if (fast_nboxes_ == kFastMaxBoxes || sp >= kFastMaxStack) return false;
  if (fast_nboxes_ == fast_boxes_.size()) fast_boxes_.emplace_back();
  FastBox& B = fast_boxes_[fast_nboxes_];
  B.items.clear();
  B.str_key_bits = 0;
  B.kind = kind;
  B.height = 1;
  B.memos = 0;
  st[sp].ref = PyRef();
  st[sp].ref.kind = kind;
  st[sp].box = static_cast<std::int32_t>(fast_nboxes_++);
  st[sp].mark = false;
  ++sp;
  return true;
}

// FastDict's stack: a finished value pushed.
bool Reader::FastPushValue(FastVal* st, std::size_t& sp, const PyRef& r) {
  if (sp >= kFastMaxStack) return false;
  st[sp].ref = r;
  st[sp].box = -1;
  st[sp].mark = false;
  ++sp;
  return true;
}

// FastDict's stack: the memo write of the value on top (an open box's made
// when the box is stored).
bool Reader::FastPut(FastVal* st, std::size_t sp, std::uint64_t id) {
  if (sp == 0 || st[sp - 1].mark) return false;
  const std::uint64_t bit = std::uint64_t{1} << (id & 63);
  if (fast_memo_bloom_ & bit) {  // written twice by one dict: left to the general path
    for (const auto& [k, r] : fast_memo_) {
      if (k == id) return false;
    }
    for (std::size_t j = 0; j < fast_nboxes_; ++j) {
      for (std::uint8_t k = 0; k < fast_boxes_[j].memos; ++k) {
        if (fast_boxes_[j].memo[k] == id) return false;
      }
    }
  }
  fast_memo_bloom_ |= bit;
  fast_memo_count_ = std::max(fast_memo_count_, id + 1);
  const FastVal& top = st[sp - 1];
  if (top.box >= 0) {
    FastBox& B = fast_boxes_[static_cast<std::size_t>(top.box)];
    if (B.memos == 4) return false;
    B.memo[B.memos++] = id;
  } else {
    fast_memo_.push_back({id, top.ref});
  }
  return true;
}

// The topmost n values of FastDict's stack are values, not MARKs, and do
// not reach the dict itself.
bool Reader::FastValuesOnTop(std::size_t sp, std::size_t n) const {
  if (sp < n + 1) return false;
  return fast_nmarks_ == 0 || fast_marks_[fast_nmarks_ - 1] < sp - n;
}

// SETITEMS, APPENDS (the values above the MARK) or SETITEM, APPEND (the
// topmost two or one) on FastDict's stack: into the list/dict below them.
bool Reader::FastStackInto(std::uint8_t op, FastVal* st, std::size_t& sp) {
  std::size_t below, first;  // the list/dict's position, the first value's
  if (op == 'u' || op == 'e') {
    if (fast_nmarks_ == 0) return false;
    below = fast_marks_[--fast_nmarks_] - 1;  // (the MARK is above the dict itself, at 0)
    first = below + 2;
  } else {
    const std::size_t n = op == 's' ? 2 : 1;
    if (!FastValuesOnTop(sp, n)) return false;
    below = sp - n - 1;
    first = sp - n;
  }
  const FastVal& t = st[below];
  if (t.mark || t.box < 0) return false;
  FastBox& B = fast_boxes_[static_cast<std::size_t>(t.box)];
  if (B.kind != (op == 'u' || op == 's' ? PyKind::kDict : PyKind::kList)) return false;
  if (!FastInto(B, st + first, sp - first)) return false;
  sp = below + 1;
  return true;
}

// TUPLE1, TUPLE2, TUPLE3 (the topmost values) or TUPLE (the values above
// the MARK) on FastDict's stack.
bool Reader::FastStackTuple(std::uint8_t op, FastVal* st, std::size_t& sp) {
  std::size_t from;
  if (op == 't') {
    if (fast_nmarks_ == 0) return false;
    from = fast_marks_[--fast_nmarks_];
  } else {
    const std::size_t n = op - 0x84u;
    if (!FastValuesOnTop(sp, n)) return false;
    from = sp - n;
  }
  const std::size_t first = op == 't' ? from + 1 : from;
  scratch_.clear();
  std::uint16_t h = 1;
  for (std::size_t k = first; k < sp; ++k) {
    const PyRef r = FastFinish(st[k]);
    if (IsContainerKind(r.kind)) h = std::max(h, AddHeight(r.height));
    scratch_.push_back(r);
  }
  sp = from;
  return FastPushValue(st, sp, Store(PyKind::kTuple, scratch_.data(), scratch_.size(), h));
}

// FastDict's stack machine: the dict open at st[0] read on from p, an
// opcode at a time (each counted in `ops`), until it is complete and the
// next opcode is another EMPTY_DICT or APPENDS (true), or until anything it
// does not read (false: the caller drops what it added).
bool Reader::FastStackDict(std::size_t& p, FastVal* st, std::size_t& sp, std::uint64_t& ops) {
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  const std::size_t end = end_;
  for (;;) {
    if (sp == 1 && fast_nmarks_ == 0) {
      std::size_t q = p;
      while (q < end && b[q] == 0x95) q += 9;       // FRAME
      if (q >= end) return false;                   // cannot tell what follows
      if (b[q] == '}' || b[q] == 'e') return true;  // complete: nothing can add to it
    }
    if (p >= end) return false;
    const std::uint8_t op = b[p++];
    ++ops;
    const std::size_t left = end - p;
    PyRef r;
    switch (op) {
      case 'h':  // BINGET
        if (left < 1 || !FastLookup(b[p++], r) || !FastPushValue(st, sp, r)) return false;
        break;
      case 'j':  // LONG_BINGET
        if (left < 4) return false;
        p += 4;
        if (!FastLookup(LoadLE32(b + p - 4), r) || !FastPushValue(st, sp, r)) return false;
        break;
      case 0x94:  // MEMOIZE
        if (!FastPut(st, sp, fast_memo_count_)) return false;
        break;
      case 'q':  // BINPUT
        if (left < 1 || !FastPut(st, sp, b[p++])) return false;
        break;
      case 'r':  // LONG_BINPUT
        if (left < 4) return false;
        p += 4;
        if (!FastPut(st, sp, LoadLE32(b + p - 4))) return false;
        break;
      case 0x95:  // FRAME: the frame's opcodes follow
        if (left < 8) return false;
        p += 8;
        break;
      case '}':
      case ']':
        if (!FastOpenBox(st, sp, op == '}' ? PyKind::kDict : PyKind::kList)) return false;
        break;
      case ')':
        if (!FastPushValue(st, sp, Store(PyKind::kTuple, nullptr, 0, 1))) return false;
        break;
      case '(':
        if (fast_nmarks_ == kFastMaxMarks || sp >= kFastMaxStack) return false;
        fast_marks_[fast_nmarks_++] = sp;
        st[sp].box = -1;
        st[sp].mark = true;
        ++sp;
        break;
      case 'u':  // SETITEMS
      case 'e':  // APPENDS
      case 's':  // SETITEM
      case 'a':  // APPEND
        if (!FastStackInto(op, st, sp)) return false;
        break;
      case 0x85:  // TUPLE1
      case 0x86:  // TUPLE2
      case 0x87:  // TUPLE3
      case 't':   // TUPLE
        if (!FastStackTuple(op, st, sp)) return false;
        break;
      default:  // the scalars and strings FastPairs reads too
        if (DecodeFastScalar(op, b, p, end, arena_->chars, r) != FastScalar::kOk || !FastPushValue(st, sp, r)) {
          return false;
        }
        break;
    }
  }
}

bool Reader::FastDict() {
  // Only inside an item of a streamed list: no path is asked for there.
  if (!InsideStreamedList(stack_.size()) || stack_.size() + kFastMaxStack >= kMaxPickleStack) return false;
  Window(kFastWindow);
  if (tmpl_[tmpl_first_].n != 0) {
    // A run of entries: while the next opcode is another entry's
    // EMPTY_DICT, it is read here, as Run and Step would read it (the same
    // opcode counts and working-memory checks: see NextTemplateEntry),
    // without going back to the opcode loop (TemplateRun). An entry no
    // template reads is read on below, as without the run.
    if (TemplateRun()) return true;  // records pushed; Run reads on
  }
  std::size_t p = pos_;
  PickleArena& a = *arena_;
  const std::size_t chars0 = a.chars.size(), tree0 = a.tree.size();
  if (!fast_vals_) fast_vals_ = std::make_unique<FastVal[]>(kFastMaxStack);
  FastVal* const st = fast_vals_.get();
  std::size_t sp = 0;  // values on st
  ClearFastState();
  fast_pair_ops_ = 0;
  std::uint64_t ops = 0;
  const auto fail = [&] {
    a.chars.resize(chars0);
    a.tree.resize(tree0);
    return false;
  };
  const auto restart = [&] {  // again from the EMPTY_DICT
    fail();
    p = pos_;
    ClearFastState();
    sp = 0;
    return FastOpenBox(st, sp, PyKind::kDict);
  };
  if (!FastOpenBox(st, sp, PyKind::kDict)) return false;
  if (records_on_) {
    if (FastPairs<true>(p)) {
      if (PushRecord(p, chars0, false)) return true;
      return fail();
    }
    record_pairs_.resize(2 * record_index_.size());  // what it wrote there
    // Not a record. The keys it learnt from strings read now (dropped
    // below: their bytes will be reused) are forgotten.
    ForgetRecordKeysFrom(chars0);
    if (!restart()) return false;
  }
  if (!FastPairs<false>(p)) {
    // Not the common shape: again from the EMPTY_DICT, on the stack.
    if (!restart()) return false;
    if (!FastStackDict(p, st, sp, ops)) return fail();
  }
  // The dict is complete.
  ops += fast_pair_ops_;
  const PyRef r = FastFinish(st[0]);
  const std::uint32_t level = NextLevel(false);
  if (std::uint64_t{level} + r.height > options_.max_depth) return fail();
  pos_ = p;
  for (const auto& [id, ref] : fast_memo_) SetMemo(id, ref);
  memo_count_ = fast_memo_count_;
  return FastPush(r, level, ops);
}

}  // namespace memscope::pickle_internal
