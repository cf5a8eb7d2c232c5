#include "exporters/json_double.h"

#include <cmath>
#include <cstring>

#include "nlohmann/json.hpp"

namespace memscope {

// What nlohmann's serializer does with a double: its to_chars (Grisu2,
// shortest round trip, ".0" for integral values), "null" when not finite.
void WriteJsonDouble(JsonWriter& w, double v) {
  constexpr std::size_t kMaxBytes = 64;
  char* p = w.BeginRawValue(kMaxBytes);
  if (!std::isfinite(v)) {
    std::memcpy(p, "null", 4);
    w.EndRawValue(p + 4);
    return;
  }
  w.EndRawValue(nlohmann::detail::to_chars(p, p + kMaxBytes, v));
}

}  // namespace memscope
