#include "load/recording_session.h"

#include <chrono>

namespace memscope {

RecordingSession::RecordingSession(const RecordingSessionOptions& options)
    : options_(options),
      device_({.capacity = options.device_memory,
               .index = options.device_index >= 0 ? options.device_index : options.rank,
               .host_backed = options.host_backed}),
      allocator_(device_, options.config) {
  timeline_.rank = options.rank;
  timeline_.world_size = options.world_size;
  timeline_.device_index = options.timeline_device_index >= 0 ? options.timeline_device_index : options.rank;
  timeline_.device_capacity = options.device_memory;
  timeline_.SetAllocConf(options.config);
  timeline_.sampled_clock = options.clock == RecordClock::kSampled;
}

RecordingSession::~RecordingSession() { (void)Finish(); }

absl::Status RecordingSession::Open() {
  if (sink_ != nullptr) return absl::OkStatus();
  if (options_.timeline_path.empty()) {
    sink_ = std::make_unique<MemorySink>(timeline_);
  } else {
    timeline_.wall_start_us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    absl::StatusOr<std::unique_ptr<TimelineWriter>> writer = TimelineWriter::Create(options_.timeline_path, timeline_);
    if (!writer.ok()) return writer.status();
    sink_ = std::move(*writer);
  }
  return absl::OkStatus();
}

absl::Status RecordingSession::Start() {
  if (absl::Status s = Open(); !s.ok()) return s;
  if (attached_) return absl::OkStatus();
  recorder_ = std::make_unique<Recorder>(*sink_, options_.clock);
  allocator_.SetObserver(recorder_.get());
  attached_ = true;
  return absl::OkStatus();
}

absl::Status RecordingSession::Finish() {
  if (sink_ == nullptr) return absl::OkStatus();
  if (attached_) allocator_.SetObserver(nullptr);
  attached_ = false;
  absl::Status flushed = sink_->Flush();
  // In memory, as a file's reader does (a file's events are spread when read).
  if (options_.timeline_path.empty() && timeline_.sampled_clock) {
    SpreadSampledTimes(timeline_.events, spread_from_);
    spread_from_ = timeline_.events.size();
  }
  // A writer closes its file when destroyed; the recorder goes with its sink.
  if (!options_.timeline_path.empty()) {
    recorder_.reset();
    sink_.reset();
  }
  return flushed;
}

}  // namespace memscope
