// A recording of a real allocator on a simulated GPU, for the profiler tests
// that analyse one: allocate with a category and owner, mark phases, then
// read `t`. The wiring is a RankSession's (run/rank_session.h), recording in
// memory from construction on.
#ifndef MEMSCOPE_TESTS_PROFILER_RECORDING_SESSION_H_
#define MEMSCOPE_TESTS_PROFILER_RECORDING_SESSION_H_

#include <string>

#include "../allocator/test_util.h"
#include "recording/recorder.h"
#include "recording/timeline.h"
#include "run/rank_session.h"

namespace memscope::testing {

struct Session {
  explicit Session(std::size_t capacity, const std::string& conf = "")
      : session(Options(capacity, conf)),
        gpu(session.device()),
        a(session.allocator()),
        t(session.timeline()),
        rec(Started(session)) {}
  DevicePtr Alloc(std::size_t size, Category c, const char* owner) {
    ScopedTag tag(c, owner);
    return MustMalloc(a, size);
  }
  RankSession session;
  SimDevice& gpu;
  CachingAllocator& a;
  Timeline& t;
  Recorder& rec;

 private:
  static RankSessionOptions Options(std::size_t capacity, const std::string& conf) {
    RankSessionOptions o;
    o.device_memory = capacity;
    o.config = Conf(conf);
    return o;
  }
  static Recorder& Started(RankSession& s) {
    REQUIRE(s.Start().ok());
    return s.recorder();
  }
};

}  // namespace memscope::testing

#endif  // MEMSCOPE_TESTS_PROFILER_RECORDING_SESSION_H_
