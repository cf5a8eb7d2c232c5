// libFuzzer target for the pickle reader (importers/pickle_reader.h), which
// reads PyTorch memory snapshots (torch.cuda.memory._snapshot() pickles).
//
// Reads the input whole, then with every list at depth 2 streamed (as
// device_traces are); walks each value read through PyView (shared nodes
// included). Then streamed as the snapshot importer reads, with the
// trace-entry fast path (PickleReadOptions::fast_dicts) on and off, and on
// with records (PickleReadOptions::on_record, the keys of a PyTorch trace
// entry and two short ones a mutation can reach), with and without the
// record templates (PickleReadOptions::fast_template): all four must succeed
// or fail together and read the same values (a record digested as the dict
// it stands for). Every read is made twice: from a stream (ReadPickle) and
// in place (ReadPickleBytes, the input's own exactly-sized buffer: a read
// beyond its end is a sanitizer report), which must give the same success,
// error text, values, calls and stats. Errors are expected and ignored;
// crashes, sanitizer reports, hangs and a difference between the paths are
// findings.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "importers/pickle_reader.h"

namespace {

// Touches every scalar of `v`, up to a bounded number of nodes (a DAG of
// shared nodes can be exponentially larger as a tree).
void Walk(const memscope::PyView& v, std::uint64_t& budget) {
  if (budget == 0) return;
  --budget;
  (void)v.AsInt();
  (void)v.AsUInt();
  (void)v.AsNumber();
  (void)v.bytes().size();
  for (std::size_t k = 0; k < v.size() && budget > 0; ++k) {
    if (v.is_dict()) {
      Walk(v.key(k), budget);
      Walk(v.value(k), budget);
      (void)v.Get("action");
    } else {
      Walk(v[k], budget);
    }
  }
}

// Text of `v` (kinds and scalars), up to a bounded number of nodes.
void Digest(const memscope::PyView& v, std::uint64_t& budget, std::string& out) {
  if (budget == 0) {
    out += '~';
    return;
  }
  --budget;
  out += static_cast<char>('a' + static_cast<int>(v.kind()));
  if (v.kind() == memscope::PyKind::kInt || v.kind() == memscope::PyKind::kBool ||
      v.kind() == memscope::PyKind::kFloat) {
    out += std::to_string(v.ref().v);
    out += v.is_unsigned() ? 'u' : ';';
  }
  const std::string_view b = v.bytes();
  out += std::to_string(b.size());
  out += ':';
  out += b;
  out += std::to_string(v.size());
  for (std::size_t k = 0; k < v.size() && budget > 0; ++k) {
    if (v.is_dict()) {
      Digest(v.key(k), budget, out);
      Digest(v.value(k), budget, out);
    } else {
      Digest(v[k], budget, out);
    }
  }
}

bool SameStats(const memscope::PickleReadStats& a, const memscope::PickleReadStats& b) {
  return a.input_bytes == b.input_bytes && a.peak_working_bytes == b.peak_working_bytes &&
         a.shared_containers == b.shared_containers && a.fast_dicts == b.fast_dicts && a.records == b.records &&
         a.template_records == b.template_records;
}

// A read of `bytes` with `o`, from a stream or in place (`view`: the
// same bytes); ok, the error text, the stats.
struct Read {
  bool ok = false;
  std::string error;
  memscope::PickleReadStats stats;
};
absl::StatusOr<memscope::PickleDoc> ReadOne(const std::string& bytes, std::string_view view, bool in_place,
                                            const memscope::PickleReadOptions& o, Read& r) {
  absl::StatusOr<memscope::PickleDoc> doc;
  if (in_place) {
    doc = memscope::ReadPickleBytes(view, "fuzz.pickle", o, &r.stats);
  } else {
    std::istringstream in(bytes);
    doc = memscope::ReadPickle(in, "fuzz.pickle", o, &r.stats);
  }
  r.ok = doc.ok();
  if (!doc.ok()) r.error = std::string(doc.status().message());
  return doc;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const std::string_view view(reinterpret_cast<const char*>(data), size);
  std::uint64_t budget = 100000;
  // Whole, then with the lists at depth 2 streamed: from a stream and in place.
  memscope::PickleReadOptions o;
  std::string* sink = nullptr;  // where the items' digests go
  for (int streamed = 0; streamed < 2; ++streamed) {
    if (streamed) {
      o.stream_list = [](const memscope::PicklePath& p) { return p.size() == 2; };
      o.on_item = [&](const memscope::PicklePath&, memscope::PyView item) {
        Walk(item, budget);
        std::uint64_t b = 2000;
        Digest(item, b, *sink);
        *sink += '\n';
        return absl::OkStatus();
      };
    }
    Read r[2];
    std::string d[2];
    for (int in_place = 0; in_place < 2; ++in_place) {
      sink = &d[in_place];
      auto doc = ReadOne(bytes, view, in_place == 1, o, r[in_place]);
      if (doc.ok()) {
        Walk(doc->root(), budget);
        std::uint64_t b = 20000;
        Digest(doc->root(), b, d[in_place]);
      }
    }
    if (r[0].ok != r[1].ok || r[0].error != r[1].error || d[0] != d[1] || !SameStats(r[0].stats, r[1].stats)) {
      __builtin_trap();  // in place is not what a stream reads
    }
  }
  // As the snapshot importer reads: no path for lists inside streamed items,
  // the trace-entry fast path on; and the same with the fast path off, which
  // must read the same values (a difference is a finding). The error texts
  // may differ (one known case: a dict as the key of a SETITEM into an entry
  // the fast path read is "unhashable" in one, "complete" in the other).
  o.stream_inside_items = false;
  std::string digests[4];
  bool ok[4];
  memscope::PickleReadStats stats[4];
  for (int how = 3; how >= 0; --how) {  // 3: records, 2: records without templates, 1: fast dicts, 0: general
    o.fast_dicts = how >= 1;
    o.fast_template = how == 3;
    std::string* d = &digests[how];  // (then the in-place read's)
    o.on_item = [&](const memscope::PicklePath&, memscope::PyView item) {
      std::uint64_t b = 2000;
      Digest(item, b, *d);
      *d += '\n';
      return absl::OkStatus();
    };
    o.record_keys.clear();
    o.on_record = nullptr;
    if (how >= 2) {
      o.record_keys = {"action",          "addr",          "size",    "stream", "time_us", "frames",
                       "compile_context", "user_metadata", "pool_id", "a",      "b"};
      o.on_record = [&](const memscope::PicklePath&, const memscope::PickleRecord& r) {
        // As Digest writes the dict: its kind, no bytes, its size, then its pairs.
        std::uint64_t b = 2000 - 1;  // less the dict's own node
        *d += static_cast<char>('a' + static_cast<int>(memscope::PyKind::kDict));
        *d += "0:";
        *d += std::to_string(r.n);
        for (std::uint32_t k = 0; k < r.n && b > 0; ++k) {
          if (r.key_index[k] >= o.record_keys.size() || r.key(k).AsString() != o.record_keys[r.key_index[k]]) {
            __builtin_trap();  // a key index that is not the key's
          }
          Digest(r.key(k), b, *d);
          Digest(r.value(k), b, *d);
        }
        *d += '\n';
        return absl::OkStatus();
      };
    }
    Read r[2];
    std::string in_place_digest;
    for (int in_place = 0; in_place < 2; ++in_place) {
      if (in_place) d = &in_place_digest;
      auto doc = ReadOne(bytes, view, in_place == 1, o, r[in_place]);
      if (doc.ok()) {
        std::uint64_t b = 20000;
        Digest(doc->root(), b, *d);
      }
    }
    if (r[0].ok != r[1].ok || r[0].error != r[1].error || digests[how] != in_place_digest ||
        !SameStats(r[0].stats, r[1].stats)) {
      __builtin_trap();  // in place is not what a stream reads
    }
    ok[how] = r[0].ok;
    stats[how] = r[0].stats;
  }
  if (ok[0] != ok[1] || digests[0] != digests[1]) __builtin_trap();
  if (ok[0] != ok[2] || digests[0] != digests[2]) __builtin_trap();
  if (ok[2] != ok[3] || digests[2] != digests[3]) __builtin_trap();
  // The templates change nothing but how the records are decoded: the same
  // memory, shared nodes, dicts read fast and records.
  const memscope::PickleReadStats &a = stats[2], &t = stats[3];
  if (a.input_bytes != t.input_bytes || a.peak_working_bytes != t.peak_working_bytes ||
      a.shared_containers != t.shared_containers || a.fast_dicts != t.fast_dicts || a.records != t.records) {
    __builtin_trap();
  }
  return 0;
}
