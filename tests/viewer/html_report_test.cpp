// The HTML report's data: bounded segment maps (blocks merged for drawing)
// and a thinned timeline that keeps the peaks; the page is self-contained.
#include "viewer/html_report.h"

#include <catch2/catch.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "importers/request_trace.h"
#include "load/record_replay.h"
#include "run/run.h"

using namespace memscope;
using nlohmann::json;

namespace {

// 3000 blocks of 512 B in one 2 MiB small-pool segment, every other one freed:
// 3000 alternating pieces (allocated, inactive split).
Timeline Checkerboard() {
  std::string text = "{\"action\":\"phase_begin\",\"phase\":\"forward\",\"step\":0}\n";
  for (int i = 0; i < 3000; ++i) text += "{\"action\":\"alloc\",\"id\":" + std::to_string(i) + ",\"size\":512}\n";
  for (int i = 0; i < 3000; i += 2) text += "{\"action\":\"free\",\"id\":" + std::to_string(i) + "}\n";
  text += "{\"action\":\"phase_end\",\"phase\":\"forward\",\"step\":0}\n";
  std::istringstream in(text);
  absl::StatusOr<RequestTrace> trace = ReadJsonlTrace(in, "checkerboard");
  REQUIRE(trace.ok());
  absl::StatusOr<Timeline> t = RecordReplay(*trace, AllocatorConfig{}, 1ULL << 30, 0);
  REQUIRE(t.ok());
  return *t;
}

}  // namespace

TEST_CASE("html report: a segment with thousands of blocks is drawn in bounded slices") {
  const Timeline t = Checkerboard();
  absl::StatusOr<RankReport> r = AnalyzeRank(t);
  REQUIRE(r.ok());
  HtmlReportOptions o;
  o.max_blocks_per_segment = 256;
  o.max_timeline_samples = 100;
  absl::StatusOr<std::string> text = ViewerRankData(t, *r, o);
  REQUIRE(text.ok());
  const std::optional<json> d = json::parse(*text);
  const json& moments = (*d)["moments"];
  REQUIRE(moments.back()["key"] == "end");
  const json& seg = moments.back()["segments"].at(0);
  CHECK(seg["size"] == 2 * 1024 * 1024);
  CHECK(seg["merged"] == true);
  CHECK(seg["blocks"].size() <= 256);
  std::uint64_t offset = 0;
  bool inactive = false, allocated = false;
  for (const json& b : seg["blocks"]) {
    CHECK(b[0] == offset);  // the slices tile the segment
    offset += b[1].get<std::uint64_t>();
    inactive = inactive || b[2] == 10;
    allocated = allocated || b[2] == 9;  // OTHER
  }
  CHECK(offset == seg["size"]);
  CHECK(inactive);
  CHECK(allocated);
  // The moment's numbers are exact, whatever the drawing merged.
  CHECK(moments.back()["fragmentation"]["free_blocks"] == 1501);

  // Thinned timeline: at most 100 samples, the peaks kept.
  CHECK((*d)["thinned"] == true);
  CHECK((*d)["samples_total"] == 1 + 3000 + 2 * 1500);  // segment_alloc, allocs, free_requested + free_completed
  const json& s = (*d)["samples"];
  CHECK(s["t"].size() <= 100);
  std::uint64_t max_allocated = 0, max_reserved = 0;
  for (const json& v : s["allocated"]) max_allocated = std::max(max_allocated, v.get<std::uint64_t>());
  for (const json& v : s["reserved"]) max_reserved = std::max(max_reserved, v.get<std::uint64_t>());
  CHECK(max_allocated == r->peak_allocated.bytes);
  CHECK(max_allocated == 3000 * 512);
  CHECK(max_reserved == r->peak_reserved.bytes);
}

TEST_CASE("html report: one page, data inlined, nothing fetched, '<' escaped") {
  Timeline t = Checkerboard();
  t.strings.push_back("</script><script src=\"https://example.com/x.js\">");
  for (Event& e : t.events) {
    if (e.type == EventType::kAlloc) e.name = static_cast<std::uint32_t>(t.strings.size() - 1);  // an owner
  }
  absl::StatusOr<std::string> html = HtmlReport({{"run", {&t}, {}, {}, {}}});
  REQUIRE(html.ok());
  CHECK(html->find("</script><script src") == std::string::npos);
  CHECK(html->find("\\u003c/script>\\u003cscript src") != std::string::npos);
  CHECK(html->find("default-src 'none'") != std::string::npos);
  CHECK(html->find("@MEMSCOPE_") == std::string::npos);
  const std::size_t begin = html->find("id=\"memscope-data\">");
  REQUIRE(begin != std::string::npos);
  const std::size_t start = begin + 19;
  const json d = json::parse(html->substr(start, html->find("</script>", start) - start));
  CHECK(d["schema"] == "memscope.viewer/1");
  CHECK(d["runs"][0]["ranks"][0]["owners"][1] == "</script><script src=\"https://example.com/x.js\">");
}

TEST_CASE("html report: every rank of a run, and two runs") {
  Timeline r0 = Checkerboard();
  Timeline r1 = Checkerboard();
  r1.rank = 1;
  r1.world_size = r0.world_size = 2;
  absl::StatusOr<std::string> html = HtmlReport({{"a", {&r0, &r1}, {}, {}, {}}, {"b", {&r0}, {}, {}, {}}});
  REQUIRE(html.ok());
  const std::size_t start = html->find("id=\"memscope-data\">") + 19;
  const json d = json::parse(html->substr(start, html->find("</script>", start) - start));
  REQUIRE(d["runs"].size() == 2);
  CHECK(d["runs"][0]["world_size"] == 2);
  CHECK(d["runs"][0]["ranks"].size() == 2);
  CHECK(d["runs"][0]["ranks"][1]["rank"] == 1);
  CHECK(d["runs"][1]["ranks"].size() == 1);
  // Phase rows and bands line up one to one.
  const json& rk = d["runs"][0]["ranks"][1];
  REQUIRE(rk["bands"].size() == rk["report"]["phases"].size());
  CHECK(rk["bands"][0]["name"] == "forward:0");
  CHECK(rk["moments"][rk["bands"][0]["moment"].get<int>()]["key"] == "forward:0");
}

TEST_CASE("html report: analysed in two walks, the page is the one of AnalyzeRank + ViewerRankData") {
  // Two steps, the peak of allocated in step 1 (3 + 8 MiB), then frees and a
  // teardown alloc: the analysis' second walk goes on past the later peak.
  std::string text =
      "{\"action\":\"phase_begin\",\"phase\":\"forward\",\"step\":0}\n"
      "{\"action\":\"alloc\",\"id\":\"a\",\"size\":1048576,\"category\":\"ACTIVATION\",\"owner\":\"fc1\"}\n"
      "{\"action\":\"alloc\",\"id\":\"b\",\"size\":3145728,\"category\":\"PARAMETER\",\"owner\":\"fc2\"}\n"
      "{\"action\":\"free\",\"id\":\"a\"}\n"
      "{\"action\":\"phase_end\",\"phase\":\"forward\",\"step\":0}\n"
      "{\"action\":\"phase_begin\",\"phase\":\"forward\",\"step\":1}\n"
      "{\"action\":\"alloc\",\"id\":\"c\",\"size\":8388608,\"category\":\"ACTIVATION\",\"owner\":\"fc3\"}\n"
      "{\"action\":\"free\",\"id\":\"c\"}\n"
      "{\"action\":\"free\",\"id\":\"b\"}\n"
      "{\"action\":\"phase_end\",\"phase\":\"forward\",\"step\":1}\n"
      "{\"action\":\"alloc\",\"id\":\"d\",\"size\":512}\n";
  std::istringstream in(text);
  absl::StatusOr<RequestTrace> trace = ReadJsonlTrace(in, "two-steps");
  REQUIRE(trace.ok());
  absl::StatusOr<Timeline> t = RecordReplay(*trace, AllocatorConfig{}, 1ULL << 30, 0);
  REQUIRE(t.ok());
  absl::StatusOr<RankReport> r = AnalyzeRank(*t);
  REQUIRE(r.ok());
  CHECK(r->peak_allocated.bytes == 11 * 1048576);
  REQUIRE(r->peak_allocated.event_index + 1 < t->events.size());
  absl::StatusOr<std::string> data = ViewerRankData(*t, *r);
  REQUIRE(data.ok());
  HtmlPageRun page;
  page.label = "run";
  page.ranks.push_back(*data);
  absl::StatusOr<std::string> expected = HtmlPage({page});
  REQUIRE(expected.ok());
  absl::StatusOr<std::string> html = HtmlReport({{"run", {&*t}, {}, {}, {}}});
  REQUIRE(html.ok());
  CHECK(*html == *expected);
  const std::size_t start = html->find("id=\"memscope-data\">") + 19;
  const json d = json::parse(html->substr(start, html->find("</script>", start) - start));
  const json& rank = d["runs"][0]["ranks"][0];
  const json& peak = rank["report"]["peak"]["allocated"];
  CHECK(peak["bytes"] == 11 * 1048576);
  // The second walk's part: the owners at the peak.
  REQUIRE(peak["top_owners"].size() == 2);
  CHECK(peak["top_owners"][0]["owner"] == "fc3");
  CHECK(peak["top_owners"][0]["bytes"] == 8388608);
  CHECK(peak["top_owners"][1]["owner"] == "fc2");
}
