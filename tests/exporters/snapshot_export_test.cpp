// Snapshots in PyTorch's memory._snapshot() shape: checked by Python itself
// (pickle.load, and pickletools for the opcodes MemoryViz.js accepts), and as
// JSON with nlohmann::json.
#include "exporters/snapshot_export.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../allocator/test_util.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/trace_model.h"
#include "exporters/pickle_writer.h"
#include "recording/recorder.h"
#include "recording/timeline.h"

using namespace memscope;
using namespace memscope::testing;

namespace {

// A directory from mkdtemp, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "memscope_snapshot_XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Runs `script` with python3 (arguments: `args`), its output going to the
// test log; returns the exit status. A script reports every mismatch and
// exits 1 if there was any.
int RunPython(const TempDir& dir, const std::string& script, const std::vector<std::string>& args) {
  const std::string script_path = dir.File("check.py");
  WriteFile(script_path, script);
  std::string command = "python3 '" + script_path + "'";
  for (const std::string& a : args) command += " '" + a + "'";
  const int status = std::system(command.c_str());
  if (status == -1 || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// Shared by the Python scripts: the opcodes MemoryViz.js reads, and error
// collection.
constexpr char kPythonPrelude[] = R"py(
import json, pickle, pickletools, sys
ALLOWED = {"PROTO", "FRAME", "MARK", "STOP", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT", "LIST",
           "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SETITEM", "SETITEMS", "APPEND", "APPENDS", "BININT",
           "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "NONE", "NEWTRUE",
           "NEWFALSE", "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT", "MEMOIZE"}
errors = []
def check(cond, what):
    if not cond:
        errors.append(what)
def eq(got, want, what):
    check(got == want, f"{what}: got {got!r}, want {want!r}")
def check_opcodes(data, what):
    ops = [op.name for op, arg, pos in pickletools.genops(data)]
    bad = sorted(set(ops) - ALLOWED)
    check(not bad, f"{what}: opcodes MemoryViz.js does not read: {bad}")
    return ops
def load(data, what):
    # The C unpickler, and the pure-Python one, which also checks that no
    # opcode straddles two frames.
    obj = pickle.loads(data)
    eq(pickle._loads(data), obj, f"{what}: pure-Python unpickler")
    return obj
def done():
    for e in errors:
        print("MISMATCH:", e)
    sys.exit(1 if errors else 0)
)py";

// The known trace: a small segment with an allocated, a pending-free and a
// free block, and a 16 MiB segment wholly taken by one block.
struct KnownTrace {
  static constexpr char kConf[] = "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.6";
  static constexpr std::int64_t kWallStartUs = 1'700'000'000'000'000;

  KnownTrace() : gpu({.capacity = 8 * kGiB}), a(gpu, Conf(kConf)), sink(tl), rec(sink) {
    tl.device_index = 1;  // device 0's trace list must be there, empty
    tl.wall_start_us = kWallStartUs;
    tl.SetAllocConf(kConf);
    a.SetObserver(&rec);
    rec.PhaseBegin(Phase::kForward, 0);
    one_mib = MustMalloc(a, MiB);   // small pool: a 2 MiB segment
    big = MustMalloc(a, 16000000);  // a 16 MiB segment, not split
    MustFree(a, MustMalloc(a, 1));  // alloc, free_requested, free_completed
    pending = MustMalloc(a, 4096);
    REQUIRE(a.RecordStream(pending, 7).ok());
    MustFree(a, pending);  // waits on stream 7: active_pending_free
    rec.Mark("checkpoint saved");
    rec.PhaseEnd(Phase::kForward, 0);
    rec.PhaseBegin(Phase::kUser, kNoStep, "eval");
    rec.PhaseEnd(Phase::kUser, kNoStep, "eval");
    a.SetObserver(nullptr);
  }

  TraceModel ModelAfter(std::size_t n) const {
    TraceModel model(Conf(kConf));
    for (std::size_t i = 0; i < n; ++i) {
      const absl::Status s = model.Apply(tl.events[i]);
      INFO(s.ToString());
      REQUIRE(s.ok());
    }
    return model;
  }

  std::string Write(SnapshotFormat format, std::size_t n) const {
    std::ostringstream out;
    const absl::Status s = WriteSnapshot(tl, ModelAfter(n), n, format, out);
    INFO(s.ToString());
    REQUIRE(s.ok());
    return out.str();
  }

  // time_us of every event, as a Python list.
  std::string TimesUs() const {
    std::vector<std::int64_t> t;
    for (const Event& e : tl.events) t.push_back(kWallStartUs + e.time_ns / 1000);
    return absl::StrCat("[", absl::StrJoin(t, ", "), "]");
  }

  SimDevice gpu;
  CachingAllocator a;
  Timeline tl;
  MemorySink sink;
  Recorder rec;
  DevicePtr one_mib = 0, big = 0, pending = 0;
};

std::string PickleBytes(const std::function<void(PickleWriter&)>& write) {
  std::ostringstream out;
  PickleWriter w(out);
  write(w);
  const absl::Status s = w.Finish();
  INFO(s.ToString());
  REQUIRE(s.ok());
  return out.str();
}

std::string Hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : bytes) {
    hex.push_back(kDigits[c >> 4]);
    hex.push_back(kDigits[c & 15]);
  }
  return hex;
}

}  // namespace

TEST_CASE("the known trace's events are what the checks below assume") {
  const KnownTrace t;
  std::vector<std::string> types;
  for (const Event& e : t.tl.events) types.emplace_back(EventTypeName(e.type));
  CHECK(absl::StrJoin(types, " ") ==
        "phase_begin segment_alloc alloc segment_alloc alloc alloc free_requested free_completed alloc "
        "free_requested mark phase_end phase_begin phase_end");
}

TEST_CASE("the pickled snapshot loads in Python with the expected contents and only MemoryViz opcodes") {
  const KnownTrace t;
  TempDir dir;
  const std::size_t n = t.tl.events.size();
  WriteFile(dir.File("snapshot.pickle"), t.Write(SnapshotFormat::kPickle, n));
  WriteFile(dir.File("snapshot.json"), t.Write(SnapshotFormat::kJson, n));

  const std::string script = absl::StrCat(kPythonPrelude, "SMALL = ", t.one_mib, "\nBIG = ", t.big,
                                          "\nPENDING = ", t.pending, "\nTIMES = ", t.TimesUs(), R"py(
data = open(sys.argv[1], "rb").read()
check_opcodes(data, "snapshot")
s = load(data, "snapshot")
eq(list(s), ["segments", "device_traces", "allocator_settings", "external_annotations"], "top-level keys")

SEGMENT_KEYS = ["device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"]
BLOCK_KEYS = ["address", "size", "requested_size", "state", "frames"]
segs = s["segments"]
eq([g["address"] for g in segs], [SMALL, BIG], "segment addresses, in address order")
for g in segs:
    eq(list(g), SEGMENT_KEYS, "segment keys")
    eq(g["device"], 1, "segment device")
    eq(g["segment_pool_id"], (0, 0), "segment_pool_id")
    eq(type(g["segment_pool_id"]), tuple, "segment_pool_id type")
    eq(g["is_expandable"], False, "is_expandable")
    # the frames of the allocation that made the segment, as PyTorch's cudaMalloc context
    eq(g["frames"], [{"filename": "??", "line": 0, "name": "memscope OTHER"}], "segment frames")
    eq(g["stream"], 0, "segment stream")
    for b in g["blocks"]:
        eq(list(b), BLOCK_KEYS, "block keys")
        # memscope's frame: owner as the file, "memscope CATEGORY" as the function.
        eq(b["frames"], [] if b["state"] == "inactive" else [{"filename": "??", "line": 0, "name": "memscope OTHER"}],
           "block frames")
small, big = segs
eq(small["total_size"], 2097152, "small total_size")
eq(small["segment_type"], "small", "small segment_type")
eq([(b["address"], b["size"], b["requested_size"], b["state"]) for b in small["blocks"]],
   [(SMALL, 1048576, 1048576, "active_allocated"),
    (PENDING, 4096, 4096, "active_pending_free"),
    (PENDING + 4096, 2097152 - 1048576 - 4096, 0, "inactive")], "small blocks")
eq(PENDING, SMALL + 1048576, "pending block address")
eq(small["allocated_size"], 1048576, "small allocated_size")
eq(small["active_size"], 1048576 + 4096, "small active_size")
eq(small["requested_size"], 1048576 + 4096, "small requested_size")
eq(big["total_size"], 16777216, "big total_size")
eq(big["segment_type"], "large", "big segment_type")
eq([(b["address"], b["size"], b["requested_size"], b["state"]) for b in big["blocks"]],
   [(BIG, 16777216, 16000000, "active_allocated")], "big blocks")
eq((big["allocated_size"], big["active_size"], big["requested_size"]), (16777216, 16777216, 16000000), "big sizes")

eq(len(s["device_traces"]), 2, "one trace list per device 0..1")
eq(s["device_traces"][0], [], "device 0 trace")
trace = s["device_traces"][1]
for e in trace:
    eq(list(e), ["action", "addr", "size", "stream", "time_us", "frames"], "trace entry keys")
    # (a segment_alloc: its allocation's frames)
    eq(e["frames"], [{"filename": "??", "line": 0, "name": "memscope OTHER"}]
       if e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc") else [], "trace frames")
got = [(e["action"], e["addr"], e["size"], e["stream"]) for e in trace]
ONE_B = SMALL + 1048576  # the 1 B block, freed, then reused by the 4096 B one
eq(got, [("segment_alloc", SMALL, 2097152, 0),
         ("alloc", SMALL, 1048576, 0),
         ("segment_alloc", BIG, 16777216, 0),
         ("alloc", BIG, 16000000, 0),
         ("alloc", ONE_B, 1, 0),
         ("free_requested", ONE_B, 1, 0),
         ("free_completed", ONE_B, 1, 0),
         ("alloc", PENDING, 4096, 0),
         ("free_requested", PENDING, 4096, 0)], "trace entries")
eq([e["time_us"] for e in trace], TIMES[1:10], "trace times")

settings = s["allocator_settings"]
eq(list(settings), ["PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "max_non_split_rounding_size",
                    "garbage_collection_threshold", "expandable_segments", "roundup_power2_divisions"],
   "allocator_settings keys")
eq(settings["PYTORCH_CUDA_ALLOC_CONF"],
   "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.6", "settings text")
eq(settings["max_split_size"], 128 * 1024 * 1024, "max_split_size")
eq(settings["max_non_split_rounding_size"], 20 * 1024 * 1024, "max_non_split_rounding_size")
eq(settings["garbage_collection_threshold"], 0.6, "garbage_collection_threshold")
eq(type(settings["garbage_collection_threshold"]), float, "garbage_collection_threshold type")
eq(settings["expandable_segments"], False, "expandable_segments")
eq(settings["roundup_power2_divisions"], {str(2 ** i): 4 for i in range(16)}, "roundup_power2_divisions")
eq(list(settings["roundup_power2_divisions"])[-1], "32768", "last division key")

ann = s["external_annotations"]
for a in ann:
    eq(list(a), ["name", "stage", "device", "time_us"], "annotation keys")
eq([(a["name"], a["stage"], a["device"], a["time_us"]) for a in ann],
   [("forward:0", "START", 1, TIMES[0]),
    ("checkpoint saved", "START", 1, TIMES[10]),
    ("forward:0", "END", 1, TIMES[11]),
    ("eval", "START", 1, TIMES[12]),
    ("eval", "END", 1, TIMES[13])], "external_annotations")

# The JSON export is the same structure, tuples as lists.
def untuple(x):
    if isinstance(x, (list, tuple)):
        return [untuple(v) for v in x]
    if isinstance(x, dict):
        return {k: untuple(v) for k, v in x.items()}
    return x
eq(json.load(open(sys.argv[2])), untuple(s), "JSON export")
done()
)py");
  CHECK(RunPython(dir, script, {dir.File("snapshot.pickle"), dir.File("snapshot.json")}) == 0);
}

TEST_CASE("a snapshot covers only the events up to events_until") {
  const KnownTrace t;
  // After the 16 MiB alloc: two segments, two allocations, one annotation.
  const nlohmann::json s = nlohmann::json::parse(t.Write(SnapshotFormat::kJson, 5));
  REQUIRE(s["segments"].size() == 2);
  const auto& small_blocks = s["segments"][0]["blocks"];
  REQUIRE(small_blocks.size() == 2);
  CHECK(small_blocks[0]["state"] == "active_allocated");
  CHECK(small_blocks[1]["state"] == "inactive");
  CHECK(small_blocks[1]["size"] == 1048576);
  CHECK(s["device_traces"][1].size() == 4);
  REQUIRE(s["external_annotations"].size() == 1);
  CHECK(s["external_annotations"][0]["stage"] == "START");

  // Nothing yet.
  const nlohmann::json empty = nlohmann::json::parse(t.Write(SnapshotFormat::kJson, 0));
  CHECK(empty["segments"].empty());
  CHECK(empty["device_traces"] == nlohmann::json::parse("[[], []]"));
  CHECK(empty["external_annotations"].empty());

  std::ostringstream out;
  const absl::Status past = WriteSnapshot(t.tl, t.ModelAfter(0), t.tl.events.size() + 1, SnapshotFormat::kPickle, out);
  CHECK(past.code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the JSON snapshot has the expected contents, laid out as nlohmann's dump(1)") {
  const KnownTrace t;
  const std::string text = t.Write(SnapshotFormat::kJson, t.tl.events.size());
  // The streaming writer's layout is exactly nlohmann's (ordered_json keeps
  // the key order).
  CHECK(nlohmann::ordered_json::parse(text).dump(1) + "\n" == text);

  const nlohmann::json s = nlohmann::json::parse(text);
  REQUIRE(s["segments"].size() == 2);
  const auto& small = s["segments"][0];
  const auto& big = s["segments"][1];
  CHECK(small["total_size"] == 2097152);
  CHECK(small["segment_type"] == "small");
  CHECK(small["segment_pool_id"] == nlohmann::json::parse("[0, 0]"));
  CHECK(small["address"].get<std::uint64_t>() == t.one_mib);
  REQUIRE(small["blocks"].size() == 3);
  CHECK(small["blocks"][0]["size"] == 1048576);
  CHECK(small["blocks"][0]["state"] == "active_allocated");
  CHECK(small["blocks"][1]["size"] == 4096);
  CHECK(small["blocks"][1]["state"] == "active_pending_free");
  CHECK(small["blocks"][2]["size"] == 2097152 - 1048576 - 4096);
  CHECK(small["blocks"][2]["state"] == "inactive");
  CHECK(big["total_size"] == 16777216);
  CHECK(big["segment_type"] == "large");
  REQUIRE(big["blocks"].size() == 1);
  CHECK(big["blocks"][0]["size"] == 16777216);
  CHECK(big["blocks"][0]["requested_size"] == 16000000);

  REQUIRE(s["device_traces"].size() == 2);
  CHECK(s["device_traces"][0].empty());
  const auto& trace = s["device_traces"][1];
  REQUIRE(trace.size() == 9);
  CHECK(trace[1]["action"] == "alloc");
  CHECK(trace[1]["size"] == 1048576);
  CHECK(trace[3]["action"] == "alloc");
  CHECK(trace[3]["size"] == 16000000);  // the request, not the 16 MiB block
  CHECK(trace[4]["size"] == 1);
  CHECK(trace[2]["action"] == "segment_alloc");
  CHECK(trace[2]["size"] == 16777216);
  CHECK(trace[2]["addr"].get<std::uint64_t>() == t.big);

  const auto& settings = s["allocator_settings"];
  CHECK(settings["max_split_size"] == 128 * MiB);
  CHECK(settings["garbage_collection_threshold"] == 0.6);
  CHECK(settings["roundup_power2_divisions"]["32768"] == 4);
  CHECK(settings["roundup_power2_divisions"].size() == 16);

  const auto& ann = s["external_annotations"];
  REQUIRE(ann.size() == 5);
  CHECK(ann[0]["name"] == "forward:0");
  CHECK(ann[0]["stage"] == "START");
  CHECK(ann[2]["name"] == "forward:0");
  CHECK(ann[2]["stage"] == "END");
  CHECK(ann[0]["time_us"] == KnownTrace::kWallStartUs + t.tl.events[0].time_ns / 1000);
}

TEST_CASE("an oom entry carries device_free and the request, memscope-only actions are left out") {
  SimDevice gpu({.capacity = 64 * MiB});
  CachingAllocator a(gpu);
  Timeline tl;
  MemorySink sink(tl);
  Recorder rec(sink);
  a.SetObserver(&rec);
  const DevicePtr keep = MustMalloc(a, 30 * MiB);
  MustFree(a, MustMalloc(a, 20 * MiB));  // cached, freed again by the retry
  REQUIRE_FALSE(a.Malloc(1000000000).ok());
  a.EmptyCache();
  a.SetObserver(nullptr);
  (void)keep;

  bool saw_memscope_only = false;
  std::uint64_t device_free = 0;
  for (const Event& e : tl.events) {
    if (e.type == EventType::kAllocRetry || e.type == EventType::kEmptyCache || e.type == EventType::kSyncAllStreams) {
      saw_memscope_only = true;
    }
    if (e.type == EventType::kOom) device_free = e.device_free();
  }
  REQUIRE(saw_memscope_only);
  REQUIRE(device_free > 0);

  TraceModel model;
  for (const Event& e : tl.events) REQUIRE(model.Apply(e).ok());
  std::ostringstream out;
  REQUIRE(WriteSnapshot(tl, model, tl.events.size(), SnapshotFormat::kJson, out).ok());
  const nlohmann::json s = nlohmann::json::parse(out.str());
  REQUIRE(s["device_traces"].size() == 1);
  int ooms = 0;
  for (const auto& e : s["device_traces"][0]) {
    const auto action = e["action"].get<std::string>();
    CHECK(action != "empty_cache");
    CHECK(action != "alloc_retry");
    CHECK(action != "sync_all_streams");
    if (action == "oom") {
      ++ooms;
      CHECK_FALSE(e.contains("addr"));
      CHECK(e["device_free"].get<std::uint64_t>() == device_free);
      CHECK(e["size"] == 1000000000);
    }
  }
  CHECK(ooms == 1);
  // No settings text: PyTorch's defaults, max_split_size unlimited = -1.
  CHECK(s["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "");
  CHECK(s["allocator_settings"]["max_split_size"] == -1);
  CHECK(s["allocator_settings"]["expandable_segments"] == false);
  CHECK(s["allocator_settings"]["roundup_power2_divisions"]["1"] == 0);
}

TEST_CASE("settings text that does not parse is kept, with default values") {
  Timeline tl;
  tl.SetAllocConf("no_such_key:1");
  std::ostringstream out;
  REQUIRE(WriteSnapshot(tl, TraceModel(), 0, SnapshotFormat::kJson, out).ok());
  const nlohmann::json s = nlohmann::json::parse(out.str());
  CHECK(s["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "no_such_key:1");
  CHECK(s["allocator_settings"]["max_split_size"] == -1);
  CHECK(s["allocator_settings"]["max_non_split_rounding_size"] == 20 * MiB);
}

namespace {

// Python's SAME_BYTES table: each scalar memscope pickles, with the bytes
// PickleWriter wrote for it alone.
std::string SameBytesTable() {
  struct IntCase {
    std::string python;  // the value as a Python expression
    std::function<void(PickleWriter&)> write;
  };
  const std::vector<IntCase> ints = {
      {"0", [](PickleWriter& w) { w.Int(0); }},
      {"255", [](PickleWriter& w) { w.Int(255); }},
      {"256", [](PickleWriter& w) { w.Int(256); }},
      {"65535", [](PickleWriter& w) { w.Int(65535); }},
      {"65536", [](PickleWriter& w) { w.Int(65536); }},
      {"-1", [](PickleWriter& w) { w.Int(-1); }},
      {"-2147483648", [](PickleWriter& w) { w.Int(std::numeric_limits<std::int32_t>::min()); }},
      {"2147483647", [](PickleWriter& w) { w.Int(std::numeric_limits<std::int32_t>::max()); }},
      {"2147483648", [](PickleWriter& w) { w.Int(2147483648LL); }},
      {"-2147483649", [](PickleWriter& w) { w.Int(-2147483649LL); }},
      {"0x7f0000000000", [](PickleWriter& w) { w.UInt(0x7f0000000000ULL); }},
      {"2**63-1", [](PickleWriter& w) { w.Int(std::numeric_limits<std::int64_t>::max()); }},
      {"-2**63", [](PickleWriter& w) { w.Int(std::numeric_limits<std::int64_t>::min()); }},
      {"2**63", [](PickleWriter& w) { w.UInt(std::uint64_t{1} << 63); }},
      {"2**64-1", [](PickleWriter& w) { w.UInt(std::numeric_limits<std::uint64_t>::max()); }},
      {"128", [](PickleWriter& w) { w.UInt(128); }},
      // LONG1 at every length: the last value of each byte count and the first of the next.
      {"2**39-1", [](PickleWriter& w) { w.Int((std::int64_t{1} << 39) - 1); }},
      {"2**39", [](PickleWriter& w) { w.Int(std::int64_t{1} << 39); }},
      {"2**47-1", [](PickleWriter& w) { w.UInt((std::uint64_t{1} << 47) - 1); }},
      {"2**47", [](PickleWriter& w) { w.UInt(std::uint64_t{1} << 47); }},
      {"2**55-1", [](PickleWriter& w) { w.UInt((std::uint64_t{1} << 55) - 1); }},
      {"2**55", [](PickleWriter& w) { w.UInt(std::uint64_t{1} << 55); }},
      {"-2**39", [](PickleWriter& w) { w.Int(-(std::int64_t{1} << 39)); }},
      {"-2**39-1", [](PickleWriter& w) { w.Int(-(std::int64_t{1} << 39) - 1); }},
      {"-2**47-1", [](PickleWriter& w) { w.Int(-(std::int64_t{1} << 47) - 1); }},
      {"-2**55-1", [](PickleWriter& w) { w.Int(-(std::int64_t{1} << 55) - 1); }},
      {"1.5", [](PickleWriter& w) { w.Float(1.5); }},
      {"-0.1", [](PickleWriter& w) { w.Float(-0.1); }},
      {"True", [](PickleWriter& w) { w.Bool(true); }},
      {"False", [](PickleWriter& w) { w.Bool(false); }},
      {"None", [](PickleWriter& w) { w.None(); }},
  };
  // Each scalar alone must be exactly what pickle.dumps(value, protocol=4)
  // gives (no memo is involved for these).
  std::string same_bytes = "SAME_BYTES = [\n";
  for (const IntCase& c : ints) {
    absl::StrAppend(&same_bytes, "    (", c.python, ", bytes.fromhex('", Hex(PickleBytes(c.write)), "')),\n");
  }
  // Shared objects, as CPython's pickler memoizes every str, list and dict:
  // the memo (MEMOIZE after EMPTY_LIST / EMPTY_DICT and after each str,
  // BINGET below 256, LONG_BINGET from 256 on).
  const auto shared = [](PickleWriter& w) {
    w.BeginList();
    w.MemoizeOpen();                           // 0: the list
    const std::uint32_t s = w.MemoString("frames");  // 1
    w.Get(s);
    w.BeginDict();
    const std::uint32_t d = w.MemoizeOpen();  // 2
    w.MemoString("k");                         // 3
    w.Get(s);
    w.MemoString("j");  // 4
    w.Int(1);
    w.EndDict();
    w.Get(d);
    std::uint32_t last = 0;
    for (int i = 0; i < 300; ++i) last = w.MemoString(absl::StrCat("s", i));  // 5..304
    w.Get(last);
    w.EndList();
  };
  absl::StrAppend(&same_bytes, "    ((lambda s, d, t: [s, s, d, d] + t + [t[-1]])(\"frames\", {\"k\": \"frames\", \"j\": 1}, ",
                  "[f\"s{i}\" for i in range(300)]), bytes.fromhex('", Hex(PickleBytes(shared)), "')),\n");
  absl::StrAppend(&same_bytes, "]\n");
  return same_bytes;
}

// One list of every string length class, tuples of each size, nested containers.
std::string MixedPickle() {
  const std::string string300(300, 'x');
  return PickleBytes([&](PickleWriter& w) {
    w.BeginList();
    w.String("");
    w.String(std::string(255, 'a'));  // longest SHORT_BINUNICODE
    w.String(std::string(256, 'b'));  // shortest BINUNICODE
    w.String(string300);
    w.String("d\xc3\xa9j\xc3\xa0 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80");  // "déjà 日本 😀"
    w.String("bad \xff byte \xc3");  // invalid UTF-8: replaced, the pickle still loads
    w.BeginTuple(0);
    w.EndTuple();
    w.BeginTuple(1);
    w.Int(1);
    w.EndTuple();
    w.BeginTuple(3);
    w.Int(1);
    w.String("two");
    w.None();
    w.EndTuple();
    w.BeginTuple(5);
    for (int i = 0; i < 5; ++i) w.Int(i);
    w.EndTuple();
    w.BeginDict();
    w.EndDict();
    w.BeginList();
    w.EndList();
    w.BeginDict();
    w.String("nested");
    w.BeginList();
    w.BeginDict();
    w.String("k");
    w.UInt(0x7f0000000000ULL);
    w.EndDict();
    w.EndList();
    w.EndDict();
    w.EndList();
  });
}

}  // namespace

TEST_CASE("PickleWriter encodes values as Python reads them, integers byte for byte as CPython") {
  const std::string same_bytes = SameBytesTable();
  const std::string mixed = MixedPickle();
  const std::string dict2500 = PickleBytes([](PickleWriter& w) {
    w.BeginDict();
    for (int i = 0; i < 2500; ++i) {
      w.Int(i);
      w.Int(i * 7);
    }
    w.EndDict();
  });
  const std::string list2500 = PickleBytes([](PickleWriter& w) {
    w.BeginList();
    for (int i = 0; i < 2500; ++i) w.Int(i);
    w.EndList();
  });
  // Well over one 64 KiB frame.
  const std::string big = PickleBytes([](PickleWriter& w) {
    w.BeginList();
    for (int i = 0; i < 30000; ++i) {
      w.BeginDict();
      w.String("name");
      w.String(absl::StrCat("entry ", i));
      w.String("addr");
      w.UInt(0x7f0000000000ULL + static_cast<std::uint64_t>(i) * 512);
      w.EndDict();
    }
    w.EndList();
  });

  TempDir dir;
  WriteFile(dir.File("mixed.pickle"), mixed);
  WriteFile(dir.File("dict.pickle"), dict2500);
  WriteFile(dir.File("list.pickle"), list2500);
  WriteFile(dir.File("big.pickle"), big);
  const std::string script = absl::StrCat(kPythonPrelude, same_bytes, R"py(
for value, got in SAME_BYTES:
    check_opcodes(got, repr(value))
    eq(got, pickle.dumps(value, protocol=4), f"bytes of {value!r}")
    eq(pickle.loads(got), value, f"value of {value!r}")
    eq(type(pickle.loads(got)), type(value), f"type of {value!r}")

data = open(sys.argv[1], "rb").read()
check_opcodes(data, "mixed")
eq(load(data, "mixed"),
   ["", "a" * 255, "b" * 256, "x" * 300, "d\u00e9j\u00e0 \u65e5\u672c \U0001F600", "bad \ufffd byte \ufffd",
    (), (1,), (1, "two", None), (0, 1, 2, 3, 4), {}, [], {"nested": [{"k": 0x7f0000000000}]}], "mixed")
ops = [op.name for op, arg, pos in pickletools.genops(data)]
check("BINUNICODE" in ops and "SHORT_BINUNICODE" in ops, "both string opcodes")

def batches(path, what, closer, per_item):
    data = open(path, "rb").read()
    check_opcodes(data, what)
    ops = [op.name for op, arg, pos in pickletools.genops(data) if op.name != "FRAME"]
    sizes, start = [], None
    for i, op in enumerate(ops):
        if op == "MARK":
            start = i
        elif op == closer:
            sizes.append((i - start - 1) // per_item)
    return load(data, what), sizes
d, sizes = batches(sys.argv[2], "dict", "SETITEMS", 2)
eq(d, {i: i * 7 for i in range(2500)}, "dict of 2500")
eq(sizes, [1000, 1000, 500], "SETITEMS batches")
l, sizes = batches(sys.argv[3], "list", "APPENDS", 1)
eq(l, list(range(2500)), "list of 2500")
eq(sizes, [1000, 1000, 500], "APPENDS batches")

data = open(sys.argv[4], "rb").read()
ops = check_opcodes(data, "big")
check(ops.count("FRAME") >= 10, f"frames in a big pickle: {ops.count('FRAME')}")
eq(load(data, "big"), [{"name": f"entry {i}", "addr": 0x7f0000000000 + i * 512} for i in range(30000)], "big")
done()
)py");
  CHECK(RunPython(
            dir, script,
            {dir.File("mixed.pickle"), dir.File("dict.pickle"), dir.File("list.pickle"), dir.File("big.pickle")}) == 0);
}

// The pickle's fast path (whole trace entries, blocks and frame lists as raw
// bytes, the frames of each stack pickled once) must write exactly what the
// ordinary PickleWriter calls write: on a trace of many frames' worth of
// entries, with owners and stack frames that are not ASCII, not valid UTF-8,
// 256 bytes or longer, and a stack of more frames than one APPENDS batch.
TEST_CASE("the pickled snapshot's fast path writes the bytes of the ordinary calls") {
  SimDevice gpu({.capacity = 8 * kGiB});
  CachingAllocator a(gpu, Conf(""));
  Timeline tl;
  tl.wall_start_us = 1'700'000'000'000'000;
  MemorySink sink(tl);
  Recorder rec(sink);
  a.SetObserver(&rec);
  const std::vector<std::string> owners = {"fc1.weight", "d\xc3\xa9j\xc3\xa0", "bad \xff byte", std::string(300, 'o'),
                                           ""};
  std::vector<DevicePtr> live;
  for (int i = 0; i < 3000; ++i) {
    ScopedTag tag(static_cast<Category>(i % kNumCategories), owners[static_cast<std::size_t>(i) % owners.size()]);
    live.push_back(MustMalloc(a, 512 * static_cast<std::size_t>(1 + i % 7)));
    if (i % 3 == 2) {
      MustFree(a, live.front());
      live.erase(live.begin());
    }
  }
  a.SetObserver(nullptr);
  // Stacks, as an imported PyTorch snapshot has them, on some allocations.
  AllocStack deep;
  // More frames than one APPENDS batch, yet small enough for the fast path
  // (under a 64 KiB frame).
  for (int f = 0; f < 1100; ++f) {
    deep.frames.push_back(static_cast<std::uint32_t>(tl.stack_frames.size()));
    tl.stack_frames.push_back({absl::StrCat("m", f), f, "fw", {}, {}, {}, {}});
  }
  tl.stacks.push_back(deep);
  tl.stack_frames.push_back({"caf\xc3\xa9.py", 7, "bad \xfe name", {}, {}, {}, {}});
  tl.stack_frames.push_back({std::string(260, 'f'), -3, "step", {}, {}, {}, {}});
  tl.stacks.push_back({{1100, 1101}, "site"});
  tl.event_stacks.assign(tl.events.size(), 0);
  std::size_t allocs = 0;
  for (std::size_t i = 0; i < tl.events.size(); ++i) {
    if (tl.events[i].type != EventType::kAlloc) continue;
    if (allocs % 7 == 3) tl.event_stacks[i] = 2;
    if (allocs % 401 == 5) tl.event_stacks[i] = 1;  // the deep one, on a few
    ++allocs;
  }

  TempDir dir;
  const std::size_t n = tl.events.size();
  int written = 0;
  for (const std::size_t until : {n, n / 2, std::size_t{7}}) {
    for (const std::size_t max_entries : {std::size_t{0}, std::size_t{100}}) {
      TraceModel model;
      for (std::size_t i = 0; i < until; ++i) REQUIRE(model.Apply(tl.events[i], tl.stack_of(i)).ok());
      std::ostringstream fast, ordinary;
      REQUIRE(WriteSnapshot(tl, model, until, SnapshotFormat::kPickle, fast, max_entries).ok());
      REQUIRE(WritePickleSnapshotWithoutRawValues(tl, model, until, ordinary, max_entries).ok());
      INFO("events " << until << ", max_entries " << max_entries);
      CHECK(fast.str().size() == ordinary.str().size());
      CHECK(fast.str() == ordinary.str());
      WriteFile(dir.File(absl::StrCat("s", written++, ".pickle")), fast.str());
    }
  }
  // And Python reads it, no opcode straddling two frames.
  const std::string script = absl::StrCat(kPythonPrelude, R"py(
data = open(sys.argv[1], "rb").read()
ops = check_opcodes(data, "fast path")
check(ops.count("FRAME") >= 5, f"frames: {ops.count('FRAME')}")
s = load(data, "fast path")
entries = s["device_traces"][0]
check(len(entries) > 3000, f"entries: {len(entries)}")
deep = [e for e in entries if len(e["frames"]) == 1100]
check(len(deep) > 0, "an entry with the 1100 frames")
eq(deep[0]["frames"][1099], {"filename": "m1099", "line": 1099, "name": "fw"}, "the last frame")
odd = [e for e in entries if len(e["frames"]) == 2]
check(len(odd) > 0, "an entry with the odd stack")
eq(odd[0]["frames"], [{"filename": "caf\u00e9.py", "line": 7, "name": "bad \ufffd name"},
                      {"filename": "f" * 260, "line": -3, "name": "step"}], "odd frames")
names = {e["frames"][0]["filename"] for e in entries if len(e["frames"]) == 1}
eq(sorted(names), sorted(["fc1.weight", "d\u00e9j\u00e0", "bad \ufffd byte", "o" * 300, "??"]), "owners")
done()
)py");
  CHECK(RunPython(dir, script, {dir.File("s0.pickle")}) == 0);
}

TEST_CASE("PickleWriter reports misuse from Finish") {
  auto finish = [](const std::function<void(PickleWriter&)>& write) {
    std::ostringstream out;
    PickleWriter w(out);
    write(w);
    return w.Finish().code();
  };
  constexpr auto kFailed = absl::StatusCode::kFailedPrecondition;
  CHECK(finish([](PickleWriter&) {}) == kFailed);  // no value
  CHECK(finish([](PickleWriter& w) { w.EndDict(); }) == kFailed);
  CHECK(finish([](PickleWriter& w) { w.BeginList(); }) == kFailed);
  CHECK(finish([](PickleWriter& w) {
          w.BeginList();
          w.EndDict();
        }) == kFailed);
  CHECK(finish([](PickleWriter& w) {
          w.BeginDict();
          w.String("key without a value");
          w.EndDict();
        }) == kFailed);
  CHECK(finish([](PickleWriter& w) {
          w.BeginTuple(2);
          w.Int(1);
          w.EndTuple();
        }) == kFailed);
  CHECK(finish([](PickleWriter& w) {
          w.BeginTuple(1);
          w.Int(1);
          w.Int(2);
          w.EndTuple();
        }) == kFailed);
  CHECK(finish([](PickleWriter& w) {
          w.Int(1);
          w.Int(2);
        }) == kFailed);

  std::ostringstream out;
  PickleWriter w(out);
  w.Int(1);
  REQUIRE(w.Finish().ok());
  CHECK(w.Finish().code() == kFailed);
}

TEST_CASE("a failing stream is DataLoss") {
  std::ofstream closed;  // never opened: every write fails
  const absl::Status s = WriteSnapshot(Timeline{}, TraceModel(), 0, SnapshotFormat::kPickle, closed);
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  std::ofstream closed_json;
  CHECK(WriteSnapshot(Timeline{}, TraceModel(), 0, SnapshotFormat::kJson, closed_json).code() ==
        absl::StatusCode::kDataLoss);
}
