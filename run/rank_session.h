// RankSession: what one rank records with, wired once: a RecordingSession
// (load/recording_session.h: a simulated GPU, the caching allocator on it,
// the recorder, and where the events go: a timeline file for `memscope run`,
// or a Timeline in memory for the tests) plus the DeviceContext that tensors
// and the trainer allocate through.
//
//   RankSessionOptions options;
//   options.rank = r;
//   options.timeline_path = dir.Timeline(r);   // RunDirectory
//   RankSession session(options);
//   if (absl::Status s = session.Start(); !s.ok()) ...
//   Train(train_options, session.context(), &session.recorder(), comm);
//   if (absl::Status s = session.Finish(); !s.ok()) ...   // detached, flushed, closed
//
// Destruction does what Finish does (detach the recorder, flush the file)
// for the paths that leave early; Finish is where write errors are seen.
#ifndef MEMSCOPE_RUN_RANK_SESSION_H_
#define MEMSCOPE_RUN_RANK_SESSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "allocator/config.h"
#include "load/recording_session.h"
#include "tensor/tensor.h"

namespace memscope {

struct RankSessionOptions {
  int rank = 0;  // also the device index of the timeline
  int world_size = 1;
  // The simulated GPU's own index (its out-of-memory errors name it); -1:
  // the rank. Replays run on GPU 0 whatever device their trace came from.
  int device_index = -1;
  // The timeline header's device_index; -1: the rank (replays, tests).
  // `memscope run` records the rank's device (run/devices.h).
  int timeline_device_index = -1;
  std::uint64_t device_memory = 80ULL << 30;
  AllocatorConfig config;
  // kCpu makes the device host-backed (real bytes behind device addresses).
  ExecMode exec = ExecMode::kMeta;
  // How allocator events are timed; nullopt: the wall clock per call under
  // kCpu, the sampled clock (recorder.h) under kMeta. Replays of traces
  // with their own times take kWall (the trace's times replace it).
  std::optional<RecordClock> clock;
  // The cuBLAS/cuBLASLt workspaces the matmuls allocate (none by default;
  // `memscope run` and `plan` use PyTorch's, tensor/blas_workspace.h).
  BlasWorkspaceSizes blas_workspaces;
  // Where the events go: this timeline file (created, truncated), stamped
  // with the wall-clock start; empty records into timeline() in memory,
  // without a wall-clock start, so that in-memory recordings are reproducible.
  std::string timeline_path;
};

class RankSession {
 public:
  explicit RankSession(const RankSessionOptions& options);
  ~RankSession();
  RankSession(const RankSession&) = delete;
  RankSession& operator=(const RankSession&) = delete;

  // RecordingSession's (load/recording_session.h).
  absl::Status Open() { return core_.Open(); }
  absl::Status Start() { return core_.Start(); }
  absl::Status Finish() { return core_.Finish(); }

  SimDevice& device() { return core_.device(); }
  CachingAllocator& allocator() { return core_.allocator(); }
  Recorder& recorder() { return core_.recorder(); }  // between Start and Finish
  DeviceContext& context() { return context_; }
  // The recording in memory (its header only, when recording to a file).
  Timeline& timeline() { return core_.timeline(); }

 private:
  RecordingSession core_;
  DeviceContext context_;
};

}  // namespace memscope

#endif  // MEMSCOPE_RUN_RANK_SESSION_H_
