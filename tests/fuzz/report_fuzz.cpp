// libFuzzer target for the report.json reader (exporters/report.h).
//
// Parses the input as JSON; a document that parses is read as a report
// (ReportFromJson validates every field), and a report that reads is written
// back (ReportToJson), which must not fail on anything the reader accepted.
// Errors are expected and ignored; only crashes, sanitizer reports and hangs
// are findings.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "exporters/report.h"
#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  absl::StatusOr<memscope::Report> report = memscope::ReportFromJson(doc);
  if (!report.ok()) return 0;
  (void)memscope::ReportToJson(*report).dump();
  return 0;
}
