// RecordingSession: a simulated GPU, the caching allocator on it and the
// recorder observing the allocator, wired once, with where the events go (a
// timeline file, or a Timeline in memory). A replay records through one
// (load/record_replay.h); a rank of `memscope run` through a RankSession
// (run/rank_session.h), which adds what tensors allocate through.
//
//   RecordingSessionOptions options;
//   options.device_memory = 1ULL << 30;
//   RecordingSession session(options);                  // in memory
//   if (absl::Status s = session.Start(); !s.ok()) ...
//   ... session.allocator().Malloc(...) ...
//   if (absl::Status s = session.Finish(); !s.ok()) ...   // detached, flushed
//   Timeline t = std::move(session.timeline());
//
// Destruction does what Finish does (detach the recorder, flush the file)
// for the paths that leave early; Finish is where write errors are seen.
#ifndef MEMSCOPE_LOAD_RECORDING_SESSION_H_
#define MEMSCOPE_LOAD_RECORDING_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/sim_device.h"
#include "recording/recorder.h"
#include "recording/timeline.h"

namespace memscope {

struct RecordingSessionOptions {
  int rank = 0;  // also the device index of the timeline
  int world_size = 1;
  // The simulated GPU's own index (its out-of-memory errors name it); -1:
  // the rank. Replays run on GPU 0 whatever device their trace came from.
  int device_index = -1;
  // The timeline header's device_index; -1: the rank (replays, tests).
  int timeline_device_index = -1;
  std::uint64_t device_memory = 80ULL << 30;
  AllocatorConfig config;
  // Real bytes behind device addresses (`memscope run --exec cpu`).
  bool host_backed = false;
  // How allocator events are timed (recording/recorder.h).
  RecordClock clock = RecordClock::kSampled;
  // Where the events go: this timeline file (created, truncated), stamped
  // with the wall-clock start; empty records into timeline() in memory,
  // without a wall-clock start, so that in-memory recordings are reproducible.
  std::string timeline_path;
};

class RecordingSession {
 public:
  explicit RecordingSession(const RecordingSessionOptions& options);
  ~RecordingSession();
  RecordingSession(const RecordingSession&) = delete;
  RecordingSession& operator=(const RecordingSession&) = delete;

  // Creates the timeline file (a no-op in memory), so that a rank that fails
  // before it records anything (a rendezvous error) still leaves its
  // timeline. The error names the file. Idempotent.
  absl::Status Open();

  // Opens when not yet open, then attaches the recorder to the allocator:
  // nothing is recorded before, and event times count from here.
  absl::Status Start();

  // Detaches the recorder and flushes and closes the file. Idempotent.
  absl::Status Finish();

  SimDevice& device() { return device_; }
  CachingAllocator& allocator() { return allocator_; }
  Recorder& recorder() { return *recorder_; }  // between Start and Finish
  // The recording in memory (its header only, when recording to a file).
  Timeline& timeline() { return timeline_; }

 private:
  RecordingSessionOptions options_;
  SimDevice device_;
  CachingAllocator allocator_;
  Timeline timeline_;
  std::unique_ptr<EventSink> sink_;
  std::unique_ptr<Recorder> recorder_;
  bool attached_ = false;
  std::size_t spread_from_ = 0;  // in memory: events before this have had SpreadSampledTimes
};

}  // namespace memscope

#endif  // MEMSCOPE_LOAD_RECORDING_SESSION_H_
