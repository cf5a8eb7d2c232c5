// CUPTI's device-memory activity records (CUPTI_ACTIVITY_KIND_MEMORY2:
// CUpti_ActivityMemory4, and CUPTI_ACTIVITY_KIND_MEMORY_POOL:
// CUpti_ActivityMemoryPool3) as memscope's DeviceMemoryRecord. Needs only
// CUPTI's headers (built when CMake finds them: MEMSCOPE_HAVE_CUPTI), not
// libcupti: the tests fill real records and parse them.
#ifndef MEMSCOPE_DEVICEMEM_CUPTI_RECORDS_H_
#define MEMSCOPE_DEVICEMEM_CUPTI_RECORDS_H_

#include <cupti_activity.h>

#include <optional>

#include "devicemem/memory_record.h"

namespace memscope {

// The record at `record` (in an activity buffer, as
// cuptiActivityGetNextRecord gives it) as a DeviceMemoryRecord; none for a
// record of another kind, or a MEMORY2 / MEMORY_POOL record whose operation
// is INVALID (or unknown to this CUPTI version).
std::optional<DeviceMemoryRecord> ParseActivity(const CUpti_Activity* record);

}  // namespace memscope

#endif  // MEMSCOPE_DEVICEMEM_CUPTI_RECORDS_H_
