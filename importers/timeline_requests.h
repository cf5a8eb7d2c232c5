// The request stream of a memscope recording: what the program asked of its
// allocator (allocations with their requested sizes, frees, empty_cache,
// phase marks and marks), without the allocator's decisions, so that
// `memscope replay RUN` can run a whole recorded run under other settings.
#ifndef MEMSCOPE_IMPORTERS_TIMELINE_REQUESTS_H_
#define MEMSCOPE_IMPORTERS_TIMELINE_REQUESTS_H_

#include <string>

#include "importers/request_trace.h"
#include "recording/event.h"

namespace memscope {

// Every alloc becomes a request of its requested size on its stream (with
// its category and owner), every free_requested a free, every empty_cache an
// empty_cache; phase marks and marks are kept. An allocation that ran out of
// memory (an oom event) is requested again, never freed, so a larger device
// replays past it. A request's `line` is its event's index + 1 (as `memscope
// dump` counts, after the header) and its id "event N". Not in a timeline:
// record_stream (a free that waited on a stream completes at once in the
// replay; `delayed_frees` counts them) and the program's own stream syncs.
struct TimelineRequests {
  RequestTrace trace;
  std::size_t delayed_frees = 0;  // frees whose completion the recording shows waiting on a stream
};
TimelineRequests RequestsFromTimeline(const Timeline& timeline, const std::string& source);

}  // namespace memscope

#endif  // MEMSCOPE_IMPORTERS_TIMELINE_REQUESTS_H_
