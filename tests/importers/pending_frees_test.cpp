// A PyTorch snapshot's free_completed entries say in which order PyTorch
// freed the blocks that waited on stream events (process_events walks its
// map of streams in slot order, allocator/ska_map.h): the replay frees them
// in the trace's order, whatever the order of its own wait streams.
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "allocator/config.h"
#include "importers/replayer.h"
#include "importers/snapshot_import.h"
#include "python_generated.h"

using namespace memscope;

namespace {

constexpr int kAll = 0, kLarge = 2;  // StatArray indices: every pool, the large pool

// Issue 33's checked case as PyTorch records it: a (2,097,664 B) and b
// (2,670,592 B) split a 20 MiB segment; each was used on another stream
// (record_stream), both are freed, a 512 B block c is allocated (its own 2
// MiB segment), then empty_cache completes a and b in its map's order and
// frees their segment. a_first.pickle: free_completed a, then b;
// b_first.pickle: b, then a.
constexpr const char* kGenerator = R"PY(
import pickle, sys, os
out = sys.argv[1]
base = 0x7f0000000000
a, b = base, base + 2097664
def entry(action, addr, size, stream=0):
    return {'action': action, 'addr': addr, 'size': size, 'stream': stream, 'time_us': 1, 'frames': []}
small = base + 0x10000000
head = [entry('segment_alloc', base, 20971520), entry('alloc', a, 2097664), entry('alloc', b, 2670592),
        entry('free_requested', a, 2097664), entry('free_requested', b, 2670592),
        entry('segment_alloc', small, 2097152), entry('alloc', small, 512)]
for name, first, second in (('a_first', (a, 2097664, 94000000001), (b, 2670592, 94000000002)),
                            ('b_first', (b, 2670592, 94000000002), (a, 2097664, 94000000001))):
    trace = head + [entry('free_completed', *first), entry('free_completed', *second),
                    entry('segment_free', base, 20971520)]
    snap = {'segments': [], 'device_traces': [trace], 'allocator_settings': {}, 'external_annotations': []}
    with open(os.path.join(out, name + '.pickle'), 'wb') as fh:
        pickle.dump(snap, fh, protocol=4)
)PY";

// The large pool's inactive_split count and bytes, allocated (cumulative).
std::pair<std::int64_t, std::int64_t> InactiveSplitAllocated(const std::string& name) {
  static const memscope::testing::PythonGenerated files("pending_frees_test", kGenerator);
  absl::StatusOr<std::vector<ImportedTrace>> t = ReadPytorchSnapshot((files.dir / name).string());
  REQUIRE(t.ok());
  REQUIRE(t->size() == 1);
  absl::StatusOr<ReplayResult> r = Replay((*t)[0].requests, (*t)[0].settings, std::size_t{1} << 30, nullptr);
  REQUIRE(r.ok());
  CHECK(r->stats.reserved_bytes[kAll].current == 2097152);  // c's segment
  return {r->stats.inactive_split[kLarge].allocated, r->stats.inactive_split_bytes[kLarge].allocated};
}

}  // namespace

TEST_CASE("snapshot replay: blocks that waited on streams are freed in the order of their free_completed entries") {
  // a first: a leaves a free split block (+1, +2,097,664 B), b's free merges all.
  CHECK(InactiveSplitAllocated("a_first.pickle") == std::pair<std::int64_t, std::int64_t>{2, 20971520});
  // b first: b merges into the free rest (+2,670,592 B, the count stays).
  CHECK(InactiveSplitAllocated("b_first.pickle") == std::pair<std::int64_t, std::int64_t>{1, 21544448});
}
