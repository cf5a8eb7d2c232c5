// A request trace: the sequence of calls a program made to its allocator
// (allocate, free, record_stream, empty_cache, stream sync), without any of
// the allocator's decisions. Replaying it through a CachingAllocator with
// other settings answers "what would that setting have done?".
//
// The JSON-lines format, one object per line (blank lines and lines starting
// with '#' are skipped):
//   {"action":"alloc","id":"a","size":1048576,"stream":0}   stream optional, default 0
//   {"action":"free","id":"a"}
//   {"action":"record_stream","id":"a","stream":1}
//   {"action":"empty_cache"}
//   {"action":"sync"}                                      all pending stream work completes
//   {"action":"sync","stream":1}                           the work queued on stream 1 completes
//   {"action":"phase_begin","phase":"forward","step":0}    phase marks (step optional: model, ddp)
//   {"action":"phase_end","phase":"forward","step":0}
//   {"action":"mark","text":"checkpoint saved"}            a free-form mark
// ids are strings or integers, unique among live allocations; an id may be
// reused after its free. An alloc may carry "category" (PARAMETER, ACTIVATION,
// ... as in the PyTorch profiler, plus DDP_BUCKET, COMM_TEMP; default OTHER)
// and "owner" (e.g. "encoder.rnn"). Phases are model, ddp, zero_grad,
// forward, loss, backward, step, or "user" with a "label".
#ifndef MEMSCOPE_IMPORTERS_REQUEST_TRACE_H_
#define MEMSCOPE_IMPORTERS_REQUEST_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/device.h"
#include "allocator/sim_device.h"
#include "base/input_file.h"
#include "recording/event.h"

namespace memscope {

// kReleasePool: a private pool is gone (its CUDA graph or MemPool deleted):
// the next empty_cache may free its segments (a PyTorch snapshot's
// segment_free of a private pool's segment says so; JSON traces have none).
enum class RequestOp : std::uint8_t {
  kAlloc,
  kFree,
  kRecordStream,
  kEmptyCache,
  kSync,
  kPhaseBegin,
  kPhaseEnd,
  kMark,
  kReleasePool,
  // A PyTorch snapshot's `annotate` trace entry: a mark (text) that is
  // written back as that entry (Recorder::Annotate).
  kAnnotate,
  // A PyTorch snapshot's free_completed of a block that waited on stream
  // events: the work of `stream` (the block's own wait stream) completes and
  // the allocator processes its events at once, so the block is freed where
  // the trace says and several such frees come back in the trace's order
  // (PyTorch's own, which a sync and the next malloc's process_events would
  // replace by the order of the wait streams' slots).
  kFreeCompleted
};

// Request::stream of a sync that completes every stream.
inline constexpr StreamId kAllStreams = ~StreamId{0};

// 56 bytes (a 1 GB snapshot holds ~10M of them): the small fields first,
// then the 8-byte ones. Initialise by name (designated initialisers).
struct Request {
  RequestOp op;
  Category category = Category::kOther;  // alloc
  Phase phase = Phase::kUser;            // phase marks
  std::uint8_t pool = 0;                 // alloc, release_pool: index into pools (0: the default pool)
  std::uint32_t slot = 0;                // dense index of the id (alloc/free/record_stream)
  std::size_t size = 0;                  // alloc
  StreamId stream = 0;                   // alloc, record_stream, sync (kAllStreams: every stream)
  std::uint64_t line = 0;                // 1-based line in the source, for messages
  std::int64_t step = kNoStep;           // phase marks
  std::uint32_t text = 0;                // index into strings: alloc owner, user phase label, mark text
  std::uint32_t stack = 0;               // alloc: index into stacks (a PyTorch snapshot's frames), 0 for none
  std::int64_t time_us = -1;             // when the source says it happened (PyTorch's time_us); -1: unknown
};
static_assert(sizeof(Request) == 56, "Request: keep the small fields together");

struct RequestTrace {
  std::vector<Request> requests;
  std::vector<std::string> ids;  // slot -> the id as written
  // Or, for a source whose ids are addresses (a PyTorch snapshot), slot ->
  // address, the id "0x" and its hex digits (IdOf); a trace has one or the other.
  std::vector<std::uint64_t> address_ids;
  std::vector<std::string> strings{""};  // owners, labels, mark texts; 0 is ""
  // The memory pools the requests name: [0] is the default pool, the others
  // private pools (a PyTorch snapshot's pool_id / segment_pool_id), at most
  // kMaxEventPool of them.
  std::vector<PoolId> pools{PoolId{}};
  std::string source;  // file name, or "<embedded>"
  // Unix microseconds of the source's first request when it has times (a
  // PyTorch snapshot's time_us); -1 otherwise. A replay recorded with a
  // recorder then keeps the source's times (relative to this origin).
  std::int64_t time_origin_us = -1;
  // The allocations' stacks (a PyTorch snapshot's frames); 0 is none.
  std::vector<AllocStack> stacks{AllocStack{}};
  std::vector<StackFrame> stack_frames;  // the frames the stacks' indices name, each distinct frame once
  // A PyTorch snapshot's pinned host memory (host_segments, host_traces; on
  // its first device's trace), its frames in `stacks`: handed to the replay's timeline.
  PinnedHostMemory host;
  // The addresses the source's device gave, in order (a PyTorch snapshot's
  // segment_alloc entries; the first segment_map of each expandable
  // segment): a replay places its segments there while its calls follow the
  // source's (SimDevice::PlanAddresses), so its blocks get the file's addresses.
  std::vector<PlannedAddress> planned_mallocs;
  std::vector<PlannedAddress> planned_reservations;
  // The plan applies from this request on (the requests before it recreate
  // blocks the trace never allocated: their segments are not in the plan).
  std::size_t planned_from_request = 0;

  // The allocator's state when the trace starts, when the source rebuilt it
  // (a PyTorch snapshot whose trace begins after the program did: its ring
  // buffer dropped the head, or recording began late): segments at the
  // source's addresses, then the blocks allocated in them, each an alloc
  // request (slot, requested size, tags; its address is the slot's
  // address_ids entry) and the block's size. The replay adopts them
  // (CachingAllocator::AdoptSegment / AdoptBlock) before the first request;
  // their segments lead planned_mallocs.
  struct StartSegment {
    DevicePtr address = 0;
    std::size_t size = 0;
    StreamId stream = 0;
    std::uint8_t pool = 0;  // index into pools
    bool small = false;
  };
  struct StartBlock {
    Request alloc;
    std::size_t block_size = 0;
  };
  std::vector<StartSegment> start_segments;
  std::vector<StartBlock> start_blocks;

  // How many slots there are, and the id of one as written.
  std::size_t slot_count() const { return address_ids.empty() ? ids.size() : address_ids.size(); }
  std::string IdOf(std::uint32_t slot) const;
};

// The limits of a request trace (JSON lines here, RMM's CSV in
// snapshot_import.h; docs/replay.md): a line is one request of a few dozen
// bytes, a file ten million of them in under a GiB.
inline constexpr std::size_t kMaxTraceLineBytes = std::size_t{1} << 20;
inline constexpr std::uint64_t kMaxTraceFileBytes = std::uint64_t{64} << 30;

// Reads a JSON-lines request trace. Any malformed line is an error naming the
// source and line number, e.g. "trace.jsonl:12: free of unknown id \"x\"";
// so is a line over kMaxTraceLineBytes, and a file over kMaxTraceFileBytes
// (a regular file's size is checked before it is read).
absl::StatusOr<RequestTrace> ReadJsonlTrace(std::istream& in, const std::string& source);
absl::StatusOr<RequestTrace> ReadJsonlTraceFile(const std::string& path);

// A line of a request trace (JSON lines or RMM's CSV) as ReadBoundedLine
// read it, the trace's bytes so far: an error naming the source and line
// when the line or the trace is over its limit above.
absl::Status CheckTraceLine(const std::string& source, std::uint64_t line, LineRead read, std::uint64_t bytes);

// The peak of live requested bytes over the whole trace: the lower bound no
// allocator setting can beat (independent of any setting, so also of where a
// replay under one of them ran out of memory).
std::uint64_t PeakLiveBytes(const RequestTrace& trace);

// A built-in training-like trace (embedded, no file needed): a model whose
// batch grows a little every step, so each step's activations no longer fit
// the blocks the previous step cached - the pattern PyTorch's notes give for
// expandable segments. Used by `memscope replay` when no file is given.
RequestTrace DemoTrace();

}  // namespace memscope

#endif  // MEMSCOPE_IMPORTERS_REQUEST_TRACE_H_
