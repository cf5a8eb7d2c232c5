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
#include <string>

#include "absl/status/status.h"
#include "allocator/config.h"
#include "load/recording_session.h"
#include "tensor/tensor.h"

namespace memscope {

// A rank's options: what it records with (load/recording_session.h: rank,
// device, settings, timeline file) and how it executes. `host_backed` and
// `clock` follow `exec`: --exec cpu runs kernels on real bytes behind device
// addresses and times each allocator call by the wall clock; a meta run's
// allocator events take the sampled clock (recording/recorder.h), its phase
// marks and collectives keep the wall time. `memscope run` records the
// rank's device (run/devices.h) as timeline_device_index.
struct RankSessionOptions : RecordingSessionOptions {
  ExecMode exec = ExecMode::kMeta;
  // The cuBLAS/cuBLASLt workspaces the matmuls allocate (none by default;
  // `memscope run` and `plan` use PyTorch's, tensor/blas_workspace.h).
  BlasWorkspaceSizes blas_workspaces;
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
