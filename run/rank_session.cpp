#include "run/rank_session.h"

namespace memscope {
namespace {

RecordingSessionOptions CoreOptions(const RankSessionOptions& o) {
  RecordingSessionOptions core = o;  // the recording's part
  core.host_backed = o.exec == ExecMode::kCpu;
  core.clock = o.exec == ExecMode::kCpu ? RecordClock::kWall : RecordClock::kSampled;
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
