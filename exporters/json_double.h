// A double in JSON, as nlohmann::json's dump prints it: its shortest
// round-trip text in nlohmann's layout (Grisu2: "1.0", "0.1", "1e-05",
// "1e+20"), null when not finite. base/json_writer.h writes no doubles
// (base/ uses no JSON library, and std::to_chars's shortest digits differ
// from Grisu2's for about one double in a thousand): this writes them
// through its raw mode.
//
//   JsonWriter w(text);
//   WriteJsonDouble(w, 0.527);  // 0.527
#ifndef MEMSCOPE_EXPORTERS_JSON_DOUBLE_H_
#define MEMSCOPE_EXPORTERS_JSON_DOUBLE_H_

#include "base/json_writer.h"

namespace memscope {

void WriteJsonDouble(JsonWriter& w, double v);

}  // namespace memscope

#endif  // MEMSCOPE_EXPORTERS_JSON_DOUBLE_H_
