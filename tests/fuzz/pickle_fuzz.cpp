// libFuzzer target for the pickle reader (importers/pickle_reader.h), which
// reads PyTorch memory snapshots (torch.cuda.memory._snapshot() pickles).
//
// Reads the input twice: whole, then with every list at depth 2 streamed (as
// device_traces are); walks each value read through PyView (shared nodes
// included). Errors are expected and ignored; only crashes, sanitizer
// reports and hangs are findings.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::uint64_t budget = 100000;
  {
    std::istringstream in(bytes);
    auto doc = memscope::ReadPickle(in, "fuzz.pickle");
    if (doc.ok()) Walk(doc->root(), budget);
  }
  memscope::PickleReadOptions o;
  o.stream_list = [](const memscope::PicklePath& p) { return p.size() == 2; };
  o.on_item = [&](const memscope::PicklePath&, memscope::PyView item) {
    Walk(item, budget);
    return absl::OkStatus();
  };
  {
    std::istringstream in(bytes);
    auto doc = memscope::ReadPickle(in, "fuzz.pickle", o);
    if (doc.ok()) Walk(doc->root(), budget);
  }
  // As the snapshot importer reads: no path for lists inside streamed items.
  o.stream_inside_items = false;
  std::istringstream in(bytes);
  auto doc = memscope::ReadPickle(in, "fuzz.pickle", o);
  if (doc.ok()) Walk(doc->root(), budget);
  return 0;
}
