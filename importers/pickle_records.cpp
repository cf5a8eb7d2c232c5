// Streamed lists and records: the paths stream_list is asked about, the
// items handed to on_item and the records to on_record, and what a batch
// releases when it is done.

#include "importers/pickle_internal.h"

namespace memscope::pickle_internal {

void Reader::ReleaseTree(std::uint64_t mark) {
  PickleArena& a = *arena_;
  if (a.tree.size() <= mark) return;
  while (!tree_memo_.empty() && tree_memo_.back().second >= mark) {
    const std::uint64_t id = tree_memo_.back().first;
    const MemoEntry m = memo_.Find(id);
    if (m.token == 0 && IsContainerKind(m.ref.kind) && !(m.ref.flags & kPyRefShared) && m.ref.v >= mark) {
      memo_.Erase(id);
    }
    tree_memo_.pop_back();
  }
  a.tree.resize(mark);
}

std::string Reader::KeyLabel(const PyRef& k) const {
  PyView v(arena_.get(), k);
  if (v.kind() == PyKind::kString) return std::string(v.bytes());
  if (v.kind() == PyKind::kInt) return v.is_unsigned() ? absl::StrCat(*v.AsUInt()) : absl::StrCat(*v.AsInt());
  return "[?]";
}

std::uint64_t Reader::Count(const Slot& e) const {
  if (!e.open()) return e.ref.n;
  const Builder& B = *builders_[static_cast<std::size_t>(e.ref.v)];
  return B.kind == PyKind::kList ? B.appended : B.items.size() / 2;
}

PicklePath Reader::PathAt(std::size_t q, std::uint64_t level) {
  if (level > options_.max_depth) {
    path_too_deep_ = true;
    return {};
  }
  const bool cacheable = q < stack_.size() && !stack_[q].mark && stack_[q].open();
  if (cacheable && BuilderOf(stack_[q].ref).has_path) return BuilderOf(stack_[q].ref).path;
  PicklePath p = ComputePath(q, level);
  if (cacheable) {
    Builder& B = BuilderOf(stack_[q].ref);
    B.path = p;
    B.has_path = true;
  }
  return p;
}

PicklePath Reader::ComputePath(std::size_t q, std::uint64_t level) {
  if (q == 0) return {};
  auto it = std::lower_bound(marks_.begin(), marks_.end(), q);
  if (it == marks_.begin()) return ChainPath(0, q, level);  // no MARK below q
  std::size_t m = *(it - 1);
  std::size_t lo = m + 1;
  if (m == 0 || stack_[m - 1].mark || !IsMutable(stack_[m - 1])) {
    // A tuple (or list/dict built by LIST/DICT) still being built at m.
    PicklePath p = PathAt(m, level + 1);
    p.push_back(absl::StrCat("[", q - lo, "]"));
    return p;
  }
  const Slot& owner = stack_[m - 1];
  if (owner.ref.kind == PyKind::kList) {
    PicklePath p = PathAt(m - 1, level + 1);
    p.push_back(absl::StrCat("[", Count(owner) + (q - lo), "]"));
    return p;
  }
  // A dict's batch: key, value, key, value...
  for (std::size_t j = lo;; j += 2) {
    if (j >= q) return Unknown(PathAt(m - 1, level + 1));
    if (j + 1 == q) {
      PicklePath p = PathAt(m - 1, level + 1);
      p.push_back(KeyLabel(stack_[j].ref));
      return p;
    }
    // A list or dict where a key should be cannot be a key: it belongs to
    // the value before it.
    if (j + 2 == q || IsMutable(stack_[j + 2])) {
      if (IsMutable(stack_[j + 1])) return ChainPath(j + 1, q, level + 1);
      return Unknown(PathAt(m - 1, level + 1));
    }
  }
}

PicklePath Reader::ChainPath(std::size_t c, std::size_t q, std::uint64_t level) {
  PicklePath p = PathAt(c, level + 1);
  for (;;) {
    const Slot& e = stack_[c];
    if (!IsMutable(e)) return Unknown(std::move(p));
    std::size_t next;
    if (e.ref.kind == PyKind::kList) {
      p.push_back(absl::StrCat("[", Count(e), "]"));
      next = c + 1;
    } else {
      if (c + 1 >= q) return Unknown(std::move(p));
      p.push_back(KeyLabel(stack_[c + 1].ref));
      next = c + 2;
    }
    if (next == q) return p;
    if (next > q || p.size() > options_.max_depth) return Unknown(std::move(p));
    c = next;
  }
}

absl::Status Reader::AppendTo(std::size_t target, FastVec<PyRef>& items) {
  MEMSCOPE_RETURN_IF_ERROR(OpenTarget(target, PyKind::kList));
  if (items.empty()) return absl::OkStatus();
  Builder* B = &BuilderOf(stack_[target].ref);
  if (B->streamed < 0) {
    B->streamed = 0;
    if (options_.stream_list && (options_.stream_inside_items || !InsideStreamedList(target))) {
      PicklePath p = PathAt(target, 0);
      if (path_too_deep_) return CheckDepth(options_.max_depth + 1);
      B = &BuilderOf(stack_[target].ref);
      B->path = std::move(p);
      B->has_path = true;
      B->streamed = options_.stream_list(B->path) ? 1 : 0;
      if (B->streamed == 1 && !options_.stream_inside_items) {
        (void)InsideStreamedList(0);  // drops the lists that are gone
        streaming_.emplace_back(target, B->token);
      }
    }
  }
  const std::uint64_t max_depth = options_.max_depth;
  if (B->streamed != 1) {
    for (const PyRef& e : items) {
      const std::uint16_t h = IsContainerKind(e.kind) ? AddHeight(e.height) : 1;
      if (h > max_depth) return CheckDepth(h);
      ++B->appended;
      B->height = std::max(B->height, h);
      AddItem(*B, (e.flags & kPyRefRecord) ? BuildRecord(e) : e);
    }
    items.clear();
    return absl::OkStatus();
  }
  // Streamed: each item to on_item, or its record to on_record.
  const std::uint64_t gen = record_gen_ & 0xffffffffu;
  PickleRecord rec;
  rec.arena = arena_.get();
  for (const PyRef& e : items) {
    const std::uint16_t h = IsContainerKind(e.kind) ? AddHeight(e.height) : 1;
    if (h > max_depth) return CheckDepth(h);
    ++B->appended;
    if (e.flags & kPyRefRecord) {  // a record: to on_record, unless something built its dict
      const std::size_t i = static_cast<std::size_t>(e.v & 0xffffffffu);
      if ((e.v >> 32) != gen || i >= records_.size()) {
        record_stale_ = true;
        return Error("internal error: a record outlived its batch");
      }
      const Record& R = records_[i];
      if (R.built) {
        if (options_.on_item) MEMSCOPE_RETURN_IF_ERROR(options_.on_item(B->path, PyView(arena_.get(), R.dict)));
      } else {
        rec.pairs = record_pairs_.data() + 2 * std::size_t{R.first};
        rec.key_index = record_index_.data() + R.first;
        rec.n = R.n;
        MEMSCOPE_RETURN_IF_ERROR(options_.on_record(B->path, rec));
      }
    } else if (options_.on_item) {
      MEMSCOPE_RETURN_IF_ERROR(options_.on_item(B->path, PyView(arena_.get(), e)));
    }
  }
  ReleaseTree(B->tree_mark);
  ReleaseRecords();
  items.clear();
  return absl::OkStatus();
}

std::uint8_t Reader::RecordKeyIndex(const PyRef& key) const {
  const std::string_view text(arena_->chars.data() + key.v, key.n);
  for (std::size_t k = 0; k < options_.record_keys.size(); ++k) {
    if (options_.record_keys[k] == text) return static_cast<std::uint8_t>(k);
  }
  return 0xff;
}

// The dict a record's placeholder stands for (built once; the memo entries
// that pointed at the placeholder then point at the dict, as they would have
// all along without records).
PyRef Reader::BuildRecord(const PyRef& placeholder) {
  const std::size_t i = static_cast<std::size_t>(placeholder.v & 0xffffffffu);
  if ((placeholder.v >> 32) != (record_gen_ & 0xffffffffu) || i >= records_.size()) {
    record_stale_ = true;  // Run reports it
    return ScalarRef(PyKind::kNone, 0);
  }
  Record& R = records_[i];
  if (!R.built) {
    R.dict = Store(PyKind::kDict, record_pairs_.data() + 2 * std::size_t{R.first}, 2 * std::size_t{R.n}, R.height);
    R.built = true;
    for (std::size_t k = 0; k < record_memo_.size(); ++k) {  // record_memo_ grows in SetMemo: by index
      const auto [id, v] = record_memo_[k];
      if (v != placeholder.v) continue;
      const MemoEntry m = memo_.Find(id);
      if ((m.ref.flags & kPyRefRecord) && m.ref.v == v) SetMemo(id, R.dict);
    }
  }
  return R.dict;
}

// The end of a streamed list's batch, which took every placeholder: the memo
// forgets those still named (the general path's dict, in the tree, would be
// released now: ReleaseTree), and the records go.
void Reader::ReleaseRecords() {
  if (records_.empty() && record_memo_.empty()) return;
  for (const auto& [id, v] : record_memo_) memo_.EraseRecord(id, v);
  record_memo_.clear();
  records_.clear();
  record_pairs_.clear();
  record_index_.clear();
  ++record_gen_;
}

}  // namespace memscope::pickle_internal
