// A snapshot whose trace begins after the program did (PyTorch's ring
// buffer of max_entries dropped its head): the state at the trace's start is
// rebuilt from the file's segments, the replay starts from it, and it ends
// with exactly the file's segments. The figures below follow from the
// allocator's rules (shared/specs/allocator.md), worked out in the comments.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"
#include "importers/replayer.h"
#include "importers/snapshot_import.h"
#include "python_generated.h"

using namespace memscope;

namespace {

constexpr DevicePtr kA = 0x7f0000000000, kB = kA + 32 * kMiB, kS = kA + 64 * kMiB, kF = kA + 96 * kMiB;

// full.pickle holds the program's whole trace; ring.pickle the same file
// with only the entries from the free of a1 on (the head a ring buffer
// drops), both with the segments at the end:
//   head: segment A (20 MiB): a1 6 MiB, a2 8 MiB (6 MiB left); segment B
//         (20 MiB: b1 8 MiB does not fit A's 6 MiB): b1, freed (B wholly
//         free, cached); small segment S: s1 1000 B.
//   kept: free a1; c 12 MiB takes B's 20 MiB (split, 8 MiB left); d 5 MiB
//         takes a1's 6 MiB whole (the lower of A's two 6 MiB blocks; 1 MiB
//         left: not split in the large pool); e 1 MiB + 1 B (1,049,088 B)
//         takes A's other 6 MiB (split, 5,242,368 B left); free s1; f 30 MiB
//         in a new segment F, freed; empty_cache frees F and S (large pool
//         first); g 2 MiB takes e's 5,242,368 B rest (split, 3,145,216 B
//         left). In the file: A with d, a2, e, g and 3,145,216 B free; B
//         with c and 8 MiB free (2 segments; today's guess made other ones).
constexpr const char* kGenerator = R"PY(
import pickle, sys, os
out = sys.argv[1]
MiB = 1 << 20
A0 = 0x7f0000000000
B0, S0, F0 = A0 + 32 * MiB, A0 + 64 * MiB, A0 + 96 * MiB
t = [0]
def e(action, addr, size, frames=()):
    t[0] += 1
    return {'action': action, 'addr': addr, 'size': size, 'stream': 0, 'time_us': 1000 + t[0],
            'frames': list(frames)}
def free(addr, size):
    return [e('free_requested', addr, size), e('free_completed', addr, size)]
fwd = [{'filename': 'train.py', 'line': 55, 'name': 'forward'}]
# The program's whole trace (default settings, stream 0). The ring buffer
# keeps its last entries, from the free of a1 on.
head = [e('segment_alloc', A0, 20 * MiB), e('alloc', A0, 6 * MiB, fwd), e('alloc', A0 + 6 * MiB, 8 * MiB, fwd),
        e('segment_alloc', B0, 20 * MiB), e('alloc', B0, 8 * MiB)] + free(B0, 8 * MiB) + [
        e('segment_alloc', S0, 2 * MiB), e('alloc', S0, 1000)]
tail = free(A0, 6 * MiB) + [
    e('alloc', B0, 12 * MiB, fwd),             # c: B's cached 20 MiB, split
    e('alloc', A0, 5 * MiB, fwd),              # d: a1's 6 MiB, not split (1 MiB left)
    e('alloc', A0 + 14 * MiB, MiB + 1)] + (   # e: A's 6 MiB rest, split
    free(S0, 1000)) + [
    e('segment_alloc', F0, 30 * MiB), e('alloc', F0, 30 * MiB)] + free(F0, 30 * MiB) + [
    e('segment_free', F0, 30 * MiB), e('segment_free', S0, 2 * MiB),   # empty_cache: large pool first
    e('alloc', A0 + 14 * MiB + 1049088, 2 * MiB)]                      # g: e's 5,242,368 B rest, split
def block(addr, size, req, frames=()):
    return {'address': addr, 'size': size, 'requested_size': req,
            'state': 'active_allocated' if req else 'inactive', 'frames': list(frames)}
def segment(addr, size, blocks):
    alloc = sum(b['size'] for b in blocks if b['requested_size'])
    return {'device': 0, 'address': addr, 'total_size': size, 'allocated_size': alloc, 'active_size': alloc,
            'requested_size': sum(b['requested_size'] for b in blocks), 'stream': 0, 'segment_type': 'large',
            'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [], 'blocks': blocks}
segments = [segment(A0, 20 * MiB, [block(A0, 6 * MiB, 5 * MiB, fwd), block(A0 + 6 * MiB, 8 * MiB, 8 * MiB, fwd),
                                   block(A0 + 14 * MiB, 1049088, MiB + 1),
                                   block(A0 + 14 * MiB + 1049088, 2 * MiB, 2 * MiB),
                                   block(A0 + 16 * MiB + 1049088, 3145216, 0)]),
            segment(B0, 20 * MiB, [block(B0, 12 * MiB, 12 * MiB, fwd), block(B0 + 12 * MiB, 8 * MiB, 0)])]
settings = {'PYTORCH_CUDA_ALLOC_CONF': '', 'max_split_size': -1, 'expandable_segments': False}
for name, trace in (('full', head + tail), ('ring', tail)):
    snap = {'segments': segments, 'device_traces': [trace], 'allocator_settings': settings,
            'external_annotations': []}
    with open(os.path.join(out, name + '.pickle'), 'wb') as fh:
        pickle.dump(snap, fh, protocol=4)
)PY";

using Fixture = memscope::testing::PythonGenerated;

const Fixture& Files() {
  static Fixture f("ring_buffer_test", kGenerator);
  return f;
}

ImportedTrace Read(const std::string& name) {
  absl::StatusOr<std::vector<ImportedTrace>> read = ReadPytorchSnapshot((Files() / name).string());
  REQUIRE(read.ok());
  REQUIRE(read->size() == 1);
  return std::move(read->front());
}

// A segment as "address size: block block ..." (a block: offset+size, "free" when inactive).
std::string Layout(const std::vector<SegmentInfo>& segments) {
  std::string text;
  for (const SegmentInfo& s : segments) {
    absl::StrAppend(&text, "0x", absl::Hex(s.address), " ", s.total_size, ":");
    for (const BlockInfo& b : s.blocks) {
      absl::StrAppend(&text, " ", b.address - s.address, "+", b.size, b.state == BlockState::kInactive ? " free" : "");
    }
    text += "\n";
  }
  return text;
}

struct Replayed {
  std::vector<SegmentInfo> segments;
  DeviceStats stats;
  ReplayResult result;
};

Replayed ReplayOf(const ImportedTrace& t) {
  SimDevice device(SimDeviceOptions{.capacity = 80 * kGiB});
  CachingAllocator allocator(device, t.settings);
  absl::StatusOr<ReplayResult> r = ReplayOn(t.requests, allocator, device);
  REQUIRE(r.ok());
  CHECK(allocator.CheckInvariants().ok());
  return Replayed{allocator.Snapshot(), allocator.GetStats(), *std::move(r)};
}

const std::string kFileLayout =
    "0x7f0000000000 20971520: 0+6291456 6291456+8388608 14680064+1049088 15729152+2097152 17826304+3145216 free\n"
    "0x7f0002000000 20971520: 0+12582912 12582912+8388608 free\n";

}  // namespace

TEST_CASE("ring buffer: the state at the trace's start is rebuilt from the file's segments, as it was") {
  const ImportedTrace t = Read("ring.pickle");
  // A and B are in the file and the trace never allocated them; S is freed
  // by the trace, which never allocated it (2 MiB: a small segment).
  const std::vector<RequestTrace::StartSegment>& segs = t.requests.start_segments;
  REQUIRE(segs.size() == 3);
  CHECK((segs[0].address == kA && segs[0].size == 20 * kMiB && !segs[0].small));
  CHECK((segs[1].address == kB && segs[1].size == 20 * kMiB && !segs[1].small));
  CHECK((segs[2].address == kS && segs[2].size == 2 * kMiB && segs[2].small));
  // a1 (freed by the trace: its request rounded, 6 MiB, up to a2), a2 (alive
  // at the end, never allocated by the trace: the file's 8 MiB), s1 (1000 B
  // rounded to 1024 B).
  std::vector<std::string> blocks;
  for (const RequestTrace::StartBlock& b : t.requests.start_blocks) {
    blocks.push_back(absl::StrCat(t.requests.IdOf(b.alloc.slot), " ", b.block_size, " ", b.alloc.size));
  }
  CHECK(blocks == std::vector<std::string>{"0x7f0000000000 6291456 6291456", "0x7f0000600000 8388608 8388608",
                                           "0x7f0004000000 1024 1000"});
  // The segments lead the planned addresses, before the trace's own F.
  REQUIRE(t.requests.planned_mallocs.size() == 4);
  CHECK(t.requests.planned_mallocs[3].addr == kF);
  CHECK(t.final_segments.size() == 2);
  bool said = false;
  for (const std::string& n : t.notes) {
    said |= n.find(
                "the state at its start was rebuilt from the snapshot's 2 segments (3 segments and 3 blocks "
                "alive then)") != std::string::npos;
  }
  CHECK(said);
}

TEST_CASE("ring buffer: the replay from the rebuilt state ends with exactly the file's segments") {
  const Replayed r = ReplayOf(Read("ring.pickle"));
  CHECK(Layout(r.segments) == kFileLayout);
  CHECK(r.result.planned_missed == 0);
  const DeviceStats& s = r.stats;
  // Reserved: A + B at the end; A + B + S at the start, + F's 30 MiB at the peak.
  CHECK(All(s.reserved_bytes).current == 41943040);
  CHECK(All(s.reserved_bytes).peak == 75497472);
  CHECK(All(s.segment).current == 2);
  CHECK(All(s.segment).allocated == 4);  // A, B, S adopted; F
  // d 6 MiB + a2 8 MiB + e 1,049,088 + g 2 MiB + c 12 MiB; the peak with f
  // live (a2 + c + d + e + f: 8 + 12 + 6 + 30 MiB + 1,049,088 B; s1 freed).
  CHECK(All(s.allocated_bytes).current == 30409216);
  CHECK(All(s.allocated_bytes).peak == 59769344);
  CHECK(All(s.requested_bytes).current == 29360129);  // 5 MiB + 8 MiB + (1 MiB + 1) + 2 MiB + 12 MiB
  // A's free 3,145,216 B and B's free 8 MiB sit beside live blocks.
  CHECK(All(s.inactive_split).current == 2);
  CHECK(All(s.inactive_split_bytes).current == 11533824);
}

TEST_CASE("ring buffer: the whole trace and its tail end the same, the tail without guessing") {
  const Replayed full = ReplayOf(Read("full.pickle"));
  const Replayed ring = ReplayOf(Read("ring.pickle"));
  CHECK(Layout(full.segments) == kFileLayout);
  CHECK(Layout(ring.segments) == Layout(full.segments));
  CHECK(All(ring.stats.reserved_bytes).current == All(full.stats.reserved_bytes).current);
  CHECK(All(ring.stats.inactive_split_bytes).current == All(full.stats.inactive_split_bytes).current);
}

TEST_CASE("allocator: an adopted segment and a block inside it count as PyTorch counts them") {
  SimDevice device;
  CachingAllocator allocator(device);
  absl::StatusOr<DevicePtr> base = allocator.AdoptSegment(20 * kMiB, 0, 0, /*small=*/false);
  REQUIRE(base.ok());
  CHECK(All(allocator.GetStats().inactive_split).current == 0);  // one whole free block
  REQUIRE(allocator.AdoptBlock(*base + 6 * kMiB, 4 * kMiB, 4000000).ok());
  const DeviceStats s = allocator.GetStats();
  CHECK(All(s.reserved_bytes).current == 20971520);
  CHECK(All(s.allocated_bytes).current == 4194304);
  CHECK(All(s.requested_bytes).current == 4000000);
  CHECK(All(s.inactive_split).current == 2);  // 6 MiB before it, 10 MiB after
  CHECK(All(s.inactive_split_bytes).current == 16777216);
  CHECK(allocator.CheckInvariants().ok());
  // A range no free block holds is refused; a free of the adopted block merges the segment whole again.
  CHECK(absl::IsInvalidArgument(allocator.AdoptBlock(*base + 8 * kMiB, 4 * kMiB, 1)));
  REQUIRE(allocator.Free(*base + 6 * kMiB).ok());
  CHECK(All(allocator.GetStats().inactive_split).current == 0);
  allocator.EmptyCache();
  CHECK(All(allocator.GetStats().reserved_bytes).current == 0);
}
