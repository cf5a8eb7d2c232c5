// The record templates (PickleReadOptions::fast_template): trace entries of
// one shape read by comparing their bytes with the last record's.

#include "importers/pickle_internal.h"

namespace memscope::pickle_internal {

// ---- The template (records).
//
// Trace entries repeat one shape: the same keys, each the same memo
// reference to the same stored string, in the same order, each with a value
// of the same few opcodes. BuildTemplate keeps, from the last record
// FastPairs<true> read, each key's bytes ('h' and its id, or 'j' and its
// four) and what they gave; TemplatePairs then reads an entry by comparing
// its key bytes with those (one load and a compare each) and decoding each
// value straight from its opcode: no FRAME scan per opcode, no key index
// lookup, no duplicate check (the keys are the template's, distinct). It
// takes a subset of what FastPairs<true> takes, and reads it the same way,
// into the same places: the record's pairs and key indices, the same Store
// calls in the same order, the same memo writes (fast_memo_, D.memo) and
// frames lists cache decisions, the same opcode count. Anything else
// returns false (the caller drops what it read and runs FastPairs<true> from
// the EMPTY_DICT), notably: another key or order, a FRAME anywhere in the
// entry (FastPairs reads through it), a memo write other than MEMOIZE (a
// MEMOIZE writes a new id, never over an entry), a memo reference to
// anything not a finished value of the memo as it stands (this decode's own
// writes included), an opcode it does not decode, the end of the buffer.
//
// The keys' strings are what the memo held when the template was made:
// valid while no entry a finished value could have read has changed
// (memo_.changes()).
//
// Two templates: BuildTemplate makes one of the record's keys (the same keys
// as a template's: that one again, its memo changes count renewed; else in
// place of the one used longer ago), and TemplateRun tries the one used
// last first.

[[gnu::always_inline]] bool Reader::PrefixCachedList(std::size_t& p, PyRef& list) const {
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  if (end_ - p < 16 || list_prefix_.empty()) return false;
  const auto it = list_prefix_.find(PrefixHash(b + p));
  if (it == list_prefix_.end()) return false;
  const CachedList& c = list_cache_items_[it->second];
  if (c.changes != memo_.changes() || end_ - p < c.length + 3 || b[p + c.length] != 'e' ||
      std::memcmp(list_cache_bytes_.data() + c.offset, b + p, c.length) != 0) {
    return false;
  }
  list = c.list;
  p += c.length + 1;
  return true;
}

[[gnu::always_inline]] bool Reader::NextTemplateEntry() {
  if (pos_ >= end_ || data_[pos_] != '}') return false;
  // (Still inside the streamed list's item batch: FastDict found it so,
  // and the stack has only grown by the records pushed since.)
  if (stack_.size() + kFastMaxStack >= kMaxPickleStack) return false;
  const std::uint64_t ops = run_ops_ + 1 + fast_ops_;
  if (ops >= run_next_check_) {  // Run's check, made here; if it fails, Run makes it again and stops
    std::uint64_t used, read;
    if (!BudgetOk(used, read)) return false;
    run_next_check_ = ops + kBudgetCheckEvery;
  }
  run_ops_ = ops;
  fast_ops_ = 0;
  op_offset_ = base_ + pos_;
  op_ = '}';
  ++pos_;
  Window(kFastWindow);
  return true;
}

// The masks of the low k bytes of a word (k = 0 to 8).
constexpr std::array<std::uint64_t, 9> kLowBytes = [] {
  std::array<std::uint64_t, 9> m{};
  for (std::size_t k = 0; k < 8; ++k) m[k] = (std::uint64_t{1} << (8 * k)) - 1;
  m[8] = ~std::uint64_t{0};
  return m;
}();

void Reader::BuildTemplate(const PyRef* pairs, std::uint32_t n) {
  Template& T = tmpl_build_;
  T.n = 0;
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  for (std::uint32_t k = 0; k < n; ++k) {
    const std::size_t at = fast_key_pos_[k];
    TmplKey& t = T.keys[k];
    std::uint64_t id;
    if (at + 5 > end_) return;
    if (b[at] == 'h') {
      t.len = 2;
      id = b[at + 1];
    } else if (b[at] == 'j') {
      t.len = 5;
      id = b[at + 1] | (std::uint64_t{b[at + 2]} << 8) | (std::uint64_t{b[at + 3]} << 16) |
           (std::uint64_t{b[at + 4]} << 24);
    } else {
      return;  // a key written out (its first use): no template yet
    }
    t.bytes = 0;
    for (std::size_t j = 0; j < t.len; ++j) t.bytes |= std::uint64_t{b[at + j]} << (8 * j);
    t.mask = t.len == 2 ? 0xffffu : 0xffffffffffu;
    // What the reference reads now (the memo writes of the entry made) is
    // the key the record holds.
    if (!MemoValue(id, t.key) || t.key.kind != PyKind::kString ||
        std::memcmp(&t.key, &pairs[2 * k], sizeof(PyRef)) != 0) {
      return;
    }
    T.index[k] = fast_record_index_[k];
    // The value's shape.
    t.vkind = kVNone;
    t.vbytes = ~std::uint64_t{0};
    t.vmask = 0;
    if (const std::size_t v = at + t.len; v + 2 <= end_) {
      std::uint8_t kind = kVNone, vlen = static_cast<std::uint8_t>(t.len + 1), arg = 0;
      switch (b[v]) {
        case 'h': kind = kVMemo1, arg = 1; break;
        case 'j': kind = kVMemo4, arg = 4; break;
        case 'K': kind = kVInt1, arg = 1; break;
        case 'M': kind = kVInt2, arg = 2; break;
        case 'J': kind = kVInt4, arg = 4; break;
        case 0x8a:
          if (b[v + 1] <= 8) kind = kVLong1, arg = b[v + 1], ++vlen;
          break;
        default: break;
      }
      if (kind != kVNone) {
        t.vkind = kind;
        t.vlen = vlen;
        t.varg = arg;
        t.vmask = kLowBytes[vlen];
        t.vbytes = 0;
        for (std::size_t j = 0; j < vlen; ++j) t.vbytes |= std::uint64_t{b[at + j]} << (8 * j);
        t.varg_mask = kLowBytes[arg];
        t.vsign = arg == 0 ? 0 : std::uint64_t{0x80} << (8 * (arg - 1));
      }
    }
    // The value's bytes, when they alone say what it is.
    t.pair_bytes = ~std::uint64_t{0};
    t.pair_mask = 0;
    const std::size_t v = at + t.len;
    std::size_t vlen = 0;
    if (v < end_) {
      switch (b[v]) {
        case 'h':
        case 'K': vlen = 2; break;
        case 'M': vlen = 3; break;
        case 'j':
        case 'J': vlen = 5; break;
        default: break;
      }
    }
    const PyRef& value = pairs[2 * k + 1];
    if (vlen != 0 && t.len + vlen <= 8 && v + vlen <= end_) {
      // What the bytes read now is the value the record holds (a memo
      // reference's entry; an int, not the first number of a tuple).
      const std::uint32_t u32 = v + 5 > end_ ? 0
                                             : b[v + 1] | (std::uint32_t{b[v + 2]} << 8) |
                                                   (std::uint32_t{b[v + 3]} << 16) | (std::uint32_t{b[v + 4]} << 24);
      PyRef now;
      bool same;
      switch (b[v]) {
        case 'h': same = MemoValue(b[v + 1], now); break;
        case 'j': same = MemoValue(u32, now); break;
        case 'K': now = IntRef(b[v + 1]), same = true; break;
        case 'M': now = IntRef(b[v + 1] | (std::int64_t{b[v + 2]} << 8)), same = true; break;
        default: now = IntRef(static_cast<std::int32_t>(u32)), same = true; break;
      }
      same = same && std::memcmp(&now, &value, sizeof(PyRef)) == 0;
      if (same) {
        t.pair_len = static_cast<std::uint8_t>(t.len + vlen);
        t.pair_bytes = 0;
        for (std::size_t j = 0; j < t.pair_len; ++j) t.pair_bytes |= std::uint64_t{b[at + j]} << (8 * j);
        t.pair_mask = t.pair_len == 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * t.pair_len)) - 1;
        t.value = value;
        t.value_height = IsContainerKind(value.kind) ? AddHeight(value.height) : 1;
      }
    }
  }
  T.n = n;
  T.changes = memo_.changes();
  const auto same_keys = [&](const Template& o) {
    if (o.n != n) return false;
    for (std::uint32_t k = 0; k < n; ++k) {
      if (o.keys[k].bytes != T.keys[k].bytes || o.keys[k].mask != T.keys[k].mask) return false;
    }
    return true;
  };
  std::uint32_t slot = same_keys(tmpl_[tmpl_first_]) ? tmpl_first_ : 1 - tmpl_first_;
  tmpl_[slot] = T;
  tmpl_first_ = slot;
}

// A MEMOIZE of TemplatePairs: the id, as FastPairs' memo() takes it.
[[gnu::always_inline]] inline std::uint64_t Reader::TmplMemoize(TmplState& s) const {
  const std::uint64_t id = s.next_id++;
  if (const PyRef* d = memo_.Dense(id); d == nullptr || d->kind != PyKind::kMissing) s.list_cache_ok = false;
  s.bloom |= std::uint64_t{1} << (id & 63);
  return id;
}

// The opcodes after a number that TmplScalarTail reads (a number, TUPLE1,
// MEMOIZE): one load of this table instead of seven compares.
constexpr std::array<bool, 256> kAfterNumber = [] {
  std::array<bool, 256> t{};
  for (const std::uint8_t o : {std::uint8_t{'K'}, std::uint8_t{'M'}, std::uint8_t{'J'}, std::uint8_t{0x8a},
                               std::uint8_t{'N'}, std::uint8_t{0x85}, std::uint8_t{0x94}}) {
    t[o] = true;
  }
  return t;
}();

// What may follow a number of TemplatePairs (`op`, its value `val`, read up
// to p): more numbers and TUPLE1/2/3 (a tuple), then a MEMOIZE; as FastPairs
// reads them.
bool Reader::TmplScalarTail(std::uint8_t op, std::size_t& p, PyRef& val, TmplState& s) {
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  const std::size_t end = end_;
  if (p >= end) return false;
  std::uint8_t o = b[p];
  if (IsTupleNumberOp(op) && (IsTupleNumberOp(o) || o == 0x85)) {
    PyRef tv[3];
    tv[0] = val;
    std::size_t nt = 1;
    while (nt < 3 && IsTupleNumberOp(o)) {
      ++p;
      if (DecodeFastScalar(o, b, p, end, arena_->chars, tv[nt++]) != FastScalar::kOk || p >= end) return false;
      o = b[p];
    }
    if (o != 0x84 + nt) return false;
    ++p;
    val = Store(PyKind::kTuple, tv, nt, 1);
    FastBox& D = fast_boxes_[0];
    D.height = std::max(D.height, AddHeight(val.height));
    if (p >= end) return false;
  }
  if (b[p] == 0x94) {
    ++p;
    fast_memo_.push_back({TmplMemoize(s), val});
  }
  return true;
}

// The values TemplatePairs' loop leaves (`op` read, its argument from p): a
// new list, the other scalars and strings.
bool Reader::TmplValue(std::uint8_t op, std::size_t& p, PyRef& val, TmplState& s) {
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  const std::size_t end = end_;
  if (op != ']') {  // a scalar or string, a tuple of up to three numbers; then maybe its MEMOIZE
    if (DecodeFastScalar(op, b, p, end, arena_->chars, val) != FastScalar::kOk) return false;
    return TmplScalarTail(op, p, val, s);
  }
  // A new list: MEMOIZE, then MARK, memo references, APPENDS; or one and APPEND; or none.
  if (end - p < 2 || b[p] != 0x94) return false;
  ++p;
  const std::uint64_t list_id = TmplMemoize(s);
  scratch_.clear();
  std::uint16_t h = 1;
  const std::uint8_t o = b[p];
  if (o == '(') {
    ++p;
    if (s.list_cache_ok && PrefixCachedList(p, val)) {
      scratch_.reserve(kFastMaxListItems);  // (as below: the same capacities)
      fast_memo_.push_back({list_id, val});
      FastBox& D = fast_boxes_[0];
      D.height = std::max(D.height, AddHeight(val.height));
      return true;
    }
    const std::size_t q = ScanMemoRefs(b, p, end);
    if (q >= end || b[q] != 'e') return false;
    const std::size_t span = q - p;
    const bool cacheable = s.list_cache_ok && span > 0 && span <= kListCacheMaxBytes;
    std::uint64_t span_hash = 0;
    bool cached = false;
    if (cacheable) {
      span_hash = BytesHash(b + p, span);
      cached = CachedListOf(b + p, span, span_hash, val);
    }
    scratch_.reserve(kFastMaxListItems);
    if (!cached) {
      PyRef* const items = scratch_.data();
      std::size_t count = 0;
      bool clean = cacheable;
      for (std::size_t r = p; r < q;) {  // the scan above read their opcodes: in the buffer
        std::uint64_t id;
        if (b[r] == 'h') {
          id = b[r + 1];
          r += 2;
        } else {
          id = LoadLE32(b + r + 1);
          r += 5;
        }
        if (s.bloom & (std::uint64_t{1} << (id & 63))) clean = false;
        if (count == kFastMaxListItems || !MemoValue(id, items[count])) return false;
        if (IsContainerKind(items[count].kind)) h = std::max(h, AddHeight(items[count].height));
        ++count;
      }
      scratch_.set_size(count);
      val = Store(PyKind::kList, scratch_.data(), scratch_.size(), h);
      if (clean && (val.flags & kPyRefShared) && list_cache_items_.size() < kListCacheMaxLists) {
        CacheList(span_hash, b + p, span, val);
      }
    }
    p = q + 1;
  } else if ((o == 'h' && end - p >= 3 && b[p + 2] == 'a') || (o == 'j' && end - p >= 6 && b[p + 5] == 'a')) {
    PyRef r;
    if (!MemoValue(o == 'h' ? b[p + 1] : LoadLE32(b + p + 1), r)) return false;
    p += o == 'h' ? 3 : 6;
    if (IsContainerKind(r.kind)) h = std::max(h, AddHeight(r.height));
    scratch_.push_back(r);
    val = Store(PyKind::kList, scratch_.data(), scratch_.size(), h);
  } else {  // empty: the next key follows (anything else fails there)
    val = Store(PyKind::kList, scratch_.data(), 0, h);
  }
  fast_memo_.push_back({list_id, val});
  FastBox& D = fast_boxes_[0];
  D.height = std::max(D.height, AddHeight(val.height));
  return true;
}

// The longest a pair TemplatePairs reads inline takes, and the one byte it
// looks at after it: a key (5 bytes at most) and a value of 10 at most
// (LONG1 of 8 bytes). One bound check for the whole entry (MEMOIZE, MARK,
// n such pairs, SETITEMS) lets the pairs read without one each; a value of
// another length (TmplValue, TmplScalarTail) checks again for the pairs left.
constexpr std::size_t kTmplPairBytes = 16;

// What TemplatePairs does with a pair's value once TmplPairValue has read
// its key: a memo reference (its id), a number (its value), another value
// (TmplValue, from the value's opcode at p); kFail: not the template's key.
enum class Reader::TmplNext : std::uint8_t { kFail, kMemo, kNumber, kOther };

// A pair of the template's key `t` (`w`: the 8 bytes at b + p): the key's
// bytes, then the value's opcode and argument when TemplatePairs reads it
// inline: by the template's shape (key and the value's opcode in one
// compare), else by the opcode after the key: an int as DecodeFastScalar
// reads it (BININT1, BININT2, BININT, a non-negative LONG1 of 8 bytes at
// most) or a memo reference. p is past what was read; for kOther, at the
// value's opcode (`op`).
Reader::TmplNext Reader::TmplPairValue(const TmplKey& t, std::uint64_t w, const unsigned char* b, std::size_t& p,
                                       std::uint64_t& id, PyRef& val, std::uint8_t& op) {
  if ((w & t.vmask) == t.vbytes) {  // the key and the value's opcode of the template's shape
    const unsigned char* const arg = b + p + t.vlen;
    op = b[p + t.len];
    switch (t.vkind) {
      case kVMemo1:
        id = arg[0];
        p += t.vlen + 1;
        return TmplNext::kMemo;
      case kVMemo4:
        id = LoadLE32(arg);
        p += t.vlen + 4;
        return TmplNext::kMemo;
      case kVInt1:
        val.v = arg[0];
        p += t.vlen + 1;
        return TmplNext::kNumber;
      case kVInt2:
        val.v = arg[0] | (std::uint64_t{arg[1]} << 8);
        p += t.vlen + 2;
        return TmplNext::kNumber;
      case kVInt4:
        val.v = static_cast<std::uint64_t>(std::int64_t{static_cast<std::int32_t>(LoadLE32(arg))});
        p += t.vlen + 4;
        return TmplNext::kNumber;
      default: {  // kVLong1
        std::uint64_t v;
        std::memcpy(&v, arg, 8);  // (within the pair's 16 bytes)
        if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
        v &= t.varg_mask;
        if (v & t.vsign) {  // negative: by TmplValue
          p += t.len;
          return TmplNext::kOther;
        }
        val.v = v;
        p += t.vlen + t.varg;
        return TmplNext::kNumber;
      }
    }
  }
  if ((w & t.mask) != t.bytes) return TmplNext::kFail;
  p += t.len;
  op = b[p];
  switch (op) {
    case 'h':  // a memo reference (no memo write may follow: the next key or SETITEMS must)
      id = b[p + 1];
      p += 2;
      return TmplNext::kMemo;
    case 'j':
      id = LoadLE32(b + p + 1);
      p += 5;
      return TmplNext::kMemo;
    case 'K':
      val.v = b[p + 1];
      p += 2;
      return TmplNext::kNumber;
    case 'M':
      val.v = b[p + 1] | (std::uint64_t{b[p + 2]} << 8);
      p += 3;
      return TmplNext::kNumber;
    case 'J':
      val.v = static_cast<std::uint64_t>(std::int64_t{static_cast<std::int32_t>(LoadLE32(b + p + 1))});
      p += 5;
      return TmplNext::kNumber;
    case 0x8a: {
      const std::size_t nb = b[p + 1];
      if (nb > 8 || (nb != 0 && (b[p + 1 + nb] & 0x80) != 0)) return TmplNext::kOther;
      std::uint64_t v;
      if constexpr (std::endian::native == std::endian::little) {
        std::memcpy(&v, b + p + 2, 8);  // (within the pair's 16 bytes)
        v &= kLowBytes[nb];
      } else {
        v = 0;
        for (std::size_t j = nb; j > 0; --j) v = (v << 8) | b[p + 1 + j];
      }
      val.v = v;  // (below 2^63: a plain int)
      p += 2 + nb;
      return TmplNext::kNumber;
    }
    default: return TmplNext::kOther;
  }
}

template <bool kChecked>
bool Reader::TemplatePairs(const Template& T, std::size_t& pos) {
  if (T.changes != memo_.changes()) return false;
  const std::uint32_t n = T.n;
  const auto* const b = reinterpret_cast<const unsigned char*>(data_);
  const std::size_t end = end_;
  std::size_t p = pos;
  // The dict's MEMOIZE, its MARK; room for every pair and the SETITEMS (kChecked: the
  // end of the buffer is nearer: a check per pair instead, as many bytes wanted).
  if ((kChecked ? end - p < 2 : end - p < 3 + kTmplPairBytes * std::size_t{n}) || b[p] != 0x94 || b[p + 1] != '(') {
    return false;
  }
  p += 2;
  FastBox& D = fast_boxes_[0];
  // (no memo entry changes during the read: its writes are made at its end)
  const PyRef* const dense = memo_.DenseData();
  const std::size_t dense_n = memo_.DenseSize();
  TmplState s;
  s.next_id = fast_memo_count_;
  D.memo[0] = TmplMemoize(s);
  D.memos = 1;
  const std::size_t record_pairs0 = record_pairs_.size();
  record_pairs_.reserve(record_pairs0 + 2 * kMaxRecordKeys);
  PyRef* o = record_pairs_.data() + record_pairs0;
  std::uint16_t height = 1;  // of the values read here (the others raise D.height)
  constexpr PyRef kInt = [] {
    PyRef r;
    r.kind = PyKind::kInt;
    return r;
  }();
  const TmplKey* const t_end = T.keys + n;
  for (const TmplKey* t = T.keys; t != t_end; ++t, o += 2) {
    if constexpr (kChecked) {
      if (end - p < kTmplPairBytes) return false;
    }
    std::uint64_t w;
    std::memcpy(&w, b + p, 8);
    if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
    if ((w & t->pair_mask) == t->pair_bytes) {  // the very bytes of the template's pair: its value
      p += t->pair_len;
      o[0] = t->key;
      o[1] = t->value;
      height = std::max(height, t->value_height);
      continue;
    }
    std::uint64_t id;
    PyRef val = kInt;
    std::uint8_t op;
    const TmplNext next = TmplPairValue(*t, w, b, p, id, val, op);
    if (next == TmplNext::kFail) return false;
    o[0] = t->key;
    if (next == TmplNext::kMemo) {  // the memo reference's value: MemoValue, its first case here
      if (id < dense_n) [[likely]] {
        const PyRef& d = dense[id];
        if (d.kind == PyKind::kMissing || (d.flags & (kPyRefOpen | kPyRefRecord))) return false;
        o[1] = d;
        if (IsContainerKind(d.kind)) height = std::max(height, AddHeight(d.height));
      } else {
        if (!MemoValue(id, o[1])) return false;
        if (IsContainerKind(o[1].kind)) height = std::max(height, AddHeight(o[1].height));
      }
      continue;
    }
    if (next == TmplNext::kNumber) {
      o[1] = val;
      // A tuple or a MEMOIZE may follow a number.
      if (!kAfterNumber[b[p]]) [[likely]]
        continue;
      std::size_t q = p;
      if (!TmplScalarTail(op, q, o[1], s)) return false;
      p = q;
    } else {  // kOther
      std::size_t q = p + 1;
      if (!TmplValue(op, q, o[1], s)) return false;
      p = q;
    }
    if (!kChecked && end - p < 1 + kTmplPairBytes * static_cast<std::size_t>(t_end - t - 1)) return false;
  }
  // SETITEMS, and next (after FRAMEs, as FastPairs peeks) another entry or the APPENDS of the batch.
  D.height = std::max(D.height, height);
  if ((kChecked && p >= end) || b[p] != 'u' || D.height < 2) return false;
  ++p;
  std::size_t q = p;
  while (q < end && b[q] == 0x95) q += 9;
  if (q >= end || (b[q] != '}' && b[q] != 'e')) return false;
  std::memcpy(fast_record_index_, T.index, kMaxRecordKeys);
  fast_record_pairs_ = n;
  record_pairs_.set_size(record_pairs0 + 2 * std::size_t{n});
  fast_memo_count_ = s.next_id;
  fast_memo_bloom_ |= s.bloom;
  fast_pair_ops_ = (p - pos) / 2;
  pos = p;
  return true;
}

// FastDict's run of entries read by the templates: a record by a template
// (TemplatePairs from the EMPTY_DICT with the one used last, then the
// other; then PushRecord's work), and while the next opcode is another
// entry's EMPTY_DICT (NextTemplateEntry), on. What stays the same for the
// whole run is found once: the records' level (after the first record, the
// stack's top is the record pushed before, at that level) and their
// generation. True when it ends after a record pushed (Run reads on);
// false having changed nothing the dict paths can see (what it added to
// the arena dropped) when the entry at pos_ is one no template reads, or
// would be too deep: FastDict reads it as without templates.
bool Reader::TemplateRun() {
  PickleArena& a = *arena_;
  if (fast_boxes_.empty()) fast_boxes_.emplace_back();
  FastBox& D = fast_boxes_[0];
  const std::uint32_t level = NextLevel(false);
  const std::uint64_t gen = (record_gen_ & 0xffffffffu) << 32;
  for (;;) {
    // A record by a template: the one used last, then the other.
    const std::size_t chars0 = a.chars.size(), tree0 = a.tree.size();
    std::uint32_t slot = tmpl_first_;
    std::size_t p = 0;
    bool read = false;
    for (std::uint32_t k = 0; k < 2; ++k, slot = 1 - slot) {
      const Template& T = tmpl_[slot];
      if (T.n == 0) break;
      D.height = 1;
      D.memos = 0;
      ClearFastState();
      fast_nboxes_ = 1;
      p = pos_;
      read = end_ - p >= 3 + kTmplPairBytes * std::size_t{T.n} ? TemplatePairs<false>(T, p)
                                                                : TemplatePairs<true>(T, p);
      if (read) break;
      a.chars.resize(chars0);
      a.tree.resize(tree0);
    }
    if (!read) return false;
    // PushRecord, from a template.
    if (std::uint64_t{level} + D.height > options_.max_depth || records_.size() >= 0xffffffffu) {
      ForgetRecordKeysFrom(chars0);
      record_pairs_.resize(2 * record_index_.size());
      a.chars.resize(chars0);
      a.tree.resize(tree0);
      return false;  // too deep: so it is without templates
    }
    tmpl_first_ = slot;
    pos_ = p;
    const PyRef r = CommitRecord<true>(gen);  // (TemplatePairs: the dict's one MEMOIZE)
    ++tmpl_count_;
    FastPush(r, level, fast_pair_ops_);
    if (!NextTemplateEntry()) return true;
  }
}

}  // namespace memscope::pickle_internal
