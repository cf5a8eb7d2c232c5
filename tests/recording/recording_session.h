// A recording of a real allocator on a simulated GPU, for the profiler tests
// that analyse one: allocate with a category and owner, mark phases, then
// read `t`.
#ifndef MEMSCOPE_TESTS_PROFILER_RECORDING_SESSION_H_
#define MEMSCOPE_TESTS_PROFILER_RECORDING_SESSION_H_

#include <string>

#include "../allocator/test_util.h"
#include "recording/recorder.h"
#include "recording/timeline.h"

namespace memscope::testing {

struct Session {
  explicit Session(std::size_t capacity, const std::string& conf = "")
      : gpu({.capacity = capacity}), a(gpu, Conf(conf)), sink(t), rec(sink) {
    t.device_capacity = capacity;
    t.alloc_conf = conf;
    a.SetObserver(&rec);
  }
  DevicePtr Alloc(std::size_t size, Category c, const char* owner) {
    ScopedTag tag(c, owner);
    return MustMalloc(a, size);
  }
  SimDevice gpu;
  CachingAllocator a;
  Timeline t;
  MemorySink sink;
  Recorder rec;
};

}  // namespace memscope::testing

#endif  // MEMSCOPE_TESTS_PROFILER_RECORDING_SESSION_H_
