#include "run/rank_session.h"

namespace memscope {
namespace {

RecordingSessionOptions CoreOptions(const RankSessionOptions& o) {
  RecordingSessionOptions core;
  core.rank = o.rank;
  core.world_size = o.world_size;
  core.device_index = o.device_index;
  core.timeline_device_index = o.timeline_device_index;
  core.device_memory = o.device_memory;
  core.config = o.config;
  core.host_backed = o.exec == ExecMode::kCpu;
  // Wall time per allocator call only where kernels really run (--exec cpu):
  // a meta run's allocator events take the sampled clock (recorder.h), its
  // phase marks and collectives keep the wall time.
  core.clock = o.clock ? *o.clock : o.exec == ExecMode::kCpu ? RecordClock::kWall : RecordClock::kSampled;
  core.timeline_path = o.timeline_path;
  return core;
}

}  // namespace

RankSession::RankSession(const RankSessionOptions& options)
    : core_(CoreOptions(options)),
      context_(core_.allocator(), options.exec, options.exec == ExecMode::kCpu ? &core_.device() : nullptr) {
  context_.set_blas_workspaces(options.blas_workspaces);
}

RankSession::~RankSession() { (void)Finish(); }

}  // namespace memscope
