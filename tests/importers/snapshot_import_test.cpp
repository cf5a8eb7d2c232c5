// The importer's structures for stacks and ids: one frame table per trace
// (each distinct frame once, whether its dict is shared or repeated), one
// stack per distinct list of frames, owners interned per frame; slots whose
// ids are addresses; annotations placed by time whether or not the
// entries' times are whole microseconds.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "importers/request_trace.h"
#include "importers/snapshot_import.h"
#include "python_generated.h"

using namespace memscope;

namespace {

// Python writes the snapshots (pickle protocol 4, as torch.save's pickler).
// stacks.pickle: frame dicts f0, f1, f2 shared by the lists (memo
// references); list A = [f0, f1], list B = [f0, f1] (a separate list, equal
// content), list C = [f2, f1], list D = [{f0's content in a new dict}, f1];
// one alloc holds A twice (the same list object).
// times.pickle: fractional time_us and a record_function scope whose START
// falls between an entry's time and its whole microsecond.
constexpr const char* kGenerator = R"PY(
import pickle, sys, os
out = sys.argv[1]
f0 = {'filename': '/src/model.py', 'line': 10, 'name': 'forward'}
f1 = {'filename': '/usr/lib/python3/site-packages/torch/nn/modules/module.py', 'line': 1500, 'name': '_call_impl'}
f2 = {'filename': '/src/train.py', 'line': 7, 'name': 'main'}
A = [f0, f1]
B = [f0, f1]
C = [f2, f1]
D = [dict(f0), f1]
def alloc(addr, size, frames, t):
    return {'action': 'alloc', 'addr': addr, 'size': size, 'stream': 0, 'time_us': t, 'frames': frames}
def free(addr, size, t):
    return [{'action': 'free_requested', 'addr': addr, 'size': size, 'stream': 0, 'time_us': t, 'frames': []},
            {'action': 'free_completed', 'addr': addr, 'size': size, 'stream': 0, 'time_us': t, 'frames': []}]
base = 0x7f0000000000
trace = [{'action': 'segment_alloc', 'addr': base, 'size': 20971520, 'stream': 0, 'time_us': 100, 'frames': []},
         alloc(base, 1048576, A, 101), alloc(base + 1048576, 1048576, B, 102), alloc(base + 2097152, 1048576, C, 103),
         alloc(base + 3145728, 1048576, D, 104), alloc(base + 4194304, 1048576, A, 105)]
trace += free(base, 1048576, 106)
snap = {'segments': [], 'device_traces': [trace], 'allocator_settings': {}, 'external_annotations': []}
with open(os.path.join(out, 'stacks.pickle'), 'wb') as fh:
    pickle.dump(snap, fh, protocol=4)
trace = [{'action': 'segment_alloc', 'addr': base, 'size': 20971520, 'stream': 0, 'time_us': 100.25, 'frames': []},
         alloc(base, 1048576, [], 100.5), alloc(base + 1048576, 1048576, [], 101.75)]
ann = [{'device': 0, 'name': 'forward:0', 'stage': 'START', 'time_us': 100.3},
       {'device': 0, 'name': 'forward:0', 'stage': 'END', 'time_us': 101.75}]
snap = {'segments': [], 'device_traces': [trace], 'allocator_settings': {}, 'external_annotations': ann}
with open(os.path.join(out, 'times.pickle'), 'wb') as fh:
    pickle.dump(snap, fh, protocol=4)
def fr(file, line, name):
    return {'filename': file, 'line': line, 'name': name}
unwind = [fr('??', 0, 'torch::unwind::unwind()'), fr('??', 0, 'torch::CapturedTraceback::gather(bool, bool, bool)')]
alloc_cpp = fr('/pytorch/c10/cuda/CUDACachingAllocator.cpp', 1178, 'DeviceCachingAllocator::malloc')
ceval = [fr('Python/ceval.c', 5305, '_PyEval_EvalFrameDefault'), fr('Objects/call.c', 393, '_PyFunction_Vectorcall')]
user = unwind + [alloc_cpp] + ceval + [fr('train.py', 55, 'forward')] + ceval + [fr('train.py', 80, 'main')] + [
    fr('Modules/main.c', 680, 'Py_RunMain'), fr('??', 0, '__libc_start_main'), fr('??', 0, '_start')]
engine = unwind + [alloc_cpp, fr('??', 0, 'start_thread')]
hook = unwind + [alloc_cpp] + ceval + [fr('train.py', 12, 'on_train_start')] + ceval + [fr('train.py', 80, 'main')]
trace = [{'action': 'segment_alloc', 'addr': base, 'size': 20971520, 'stream': 0, 'time_us': 1, 'frames': user},
         alloc(base, 1048576, user, 1), alloc(base + 1048576, 1048576, engine, 2),
         alloc(base + 2097152, 1048576, hook, 3)]
snap = {'segments': [], 'device_traces': [trace], 'allocator_settings': {}, 'external_annotations': []}
with open(os.path.join(out, 'context_all.pickle'), 'wb') as fh:
    pickle.dump(snap, fh, protocol=4)
)PY";

using Fixture = memscope::testing::PythonGenerated;

const Fixture& Files() {
  static Fixture f("snapshot_import_test", kGenerator);
  return f;
}

std::string Frames(const RequestTrace& t, const AllocStack& s) {
  std::string text;
  for (const std::uint32_t id : s.frames) {
    const StackFrame& f = t.stack_frames[id];
    absl::StrAppend(&text, id, "=", f.filename, ":", f.line, " ", f.name, ";");
  }
  return text;
}

}  // namespace

TEST_CASE("snapshot import: one frame table, one stack per distinct list of frames, owners interned") {
  for (const bool records : {true, false}) {
    INFO("records " << records);
    const auto imported =
        ReadPytorchSnapshot((Files().dir / "stacks.pickle").string(), {.records = records, .fast_dicts = records});
    REQUIRE(imported.ok());
    REQUIRE(imported->size() == 1);
    const RequestTrace& t = imported->front().requests;
    // Three distinct frames, the first met first (f0's copy in D is f0).
    REQUIRE(t.stack_frames.size() == 3);
    CHECK(t.stack_frames[0] == StackFrame{"/src/model.py", 10, "forward", {}, {}, {}, {}});
    CHECK(t.stack_frames[1] ==
          StackFrame{"/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1500, "_call_impl", {}, {}, {}, {}});
    CHECK(t.stack_frames[2] == StackFrame{"/src/train.py", 7, "main", {}, {}, {}, {}});
    // Stacks: 0 is none, then [f0, f1] (A, B and D) and [f2, f1] (C).
    REQUIRE(t.stacks.size() == 3);
    CHECK(t.stacks[0].frames.empty());
    CHECK(Frames(t, t.stacks[1]) ==
          "0=/src/model.py:10 forward;1=/usr/lib/python3/site-packages/torch/nn/modules/module.py:1500 _call_impl;");
    CHECK(t.stacks[1].site == "/src/model.py:10 forward");
    CHECK(Frames(t, t.stacks[2]) ==
          "2=/src/train.py:7 main;1=/usr/lib/python3/site-packages/torch/nn/modules/module.py:1500 _call_impl;");
    CHECK(t.stacks[2].site == "/src/train.py:7 main");
    // Owners: one string per frame that is an owner.
    CHECK(t.strings == std::vector<std::string>{"", "/src/model.py:10 forward", "/src/train.py:7 main"});
    // The requests: five allocs (stacks 1, 1, 2, 1, 1; owners 1, 1, 2, 1, 1), then the free of the first.
    std::vector<std::uint32_t> stacks, texts;
    std::vector<int> categories;
    for (const Request& r : t.requests) {
      if (r.op != RequestOp::kAlloc) continue;
      stacks.push_back(r.stack);
      texts.push_back(r.text);
      categories.push_back(static_cast<int>(r.category));
    }
    CHECK(stacks == std::vector<std::uint32_t>{1, 1, 2, 1, 1});
    CHECK(texts == std::vector<std::uint32_t>{1, 1, 2, 1, 1});
    // torch/nn/modules/ and "forward": ACTIVATION for every one of them.
    CHECK(categories == std::vector<int>(5, static_cast<int>(Category::kActivation)));
    // Slots: one per alloc, ids the addresses as PyTorch's hex.
    REQUIRE(t.slot_count() == 5);
    CHECK(t.ids.empty());
    CHECK(t.address_ids == std::vector<std::uint64_t>{0x7f0000000000, 0x7f0000100000, 0x7f0000200000,
                                                       0x7f0000300000, 0x7f0000400000});
    CHECK(t.IdOf(0) == "0x7f0000000000");
    CHECK(t.IdOf(4) == "0x7f0000400000");
    CHECK(t.IdOf(5).empty());
  }
}

TEST_CASE("request trace: IdOf gives the ids as written, or the address ids in hex") {
  RequestTrace t;
  t.ids = {"a", "b"};
  CHECK(t.slot_count() == 2);
  CHECK(t.IdOf(1) == "b");
  CHECK(t.IdOf(2).empty());
  RequestTrace a;
  a.address_ids = {0, 0xf, 0x10, 0xffffffffffffffff};
  CHECK(a.slot_count() == 4);
  CHECK(a.IdOf(0) == "0x0");
  CHECK(a.IdOf(1) == "0xf");
  CHECK(a.IdOf(2) == "0x10");
  CHECK(a.IdOf(3) == "0xffffffffffffffff");
}

TEST_CASE("snapshot import: annotations placed by the entries' own times, fractional ones too") {
  const auto imported = ReadPytorchSnapshot((Files().dir / "times.pickle").string());
  REQUIRE(imported.ok());
  REQUIRE(imported->size() == 1);
  const RequestTrace& t = imported->front().requests;
  // START at 100.3 (before the alloc at 100.5: not after it, as its time
  // 100 as a whole microsecond would place it), END at 101.75 (after the
  // entries of its time).
  std::vector<std::string> ops;
  for (const Request& r : t.requests) {
    ops.push_back(absl::StrCat(static_cast<int>(r.op), "@", r.time_us));
  }
  const int alloc = static_cast<int>(RequestOp::kAlloc), begin = static_cast<int>(RequestOp::kPhaseBegin),
            end = static_cast<int>(RequestOp::kPhaseEnd);
  CHECK(ops == std::vector<std::string>{absl::StrCat(begin, "@100"), absl::StrCat(alloc, "@100"),
                                        absl::StrCat(alloc, "@101"), absl::StrCat(end, "@101")});
}

TEST_CASE("snapshot import: context=\"all\" stacks, owners and sites without the frames PyTorch's viewer omits") {
  // torch/cuda/_memory_viz.py's _frame_filter leaves out the unwinder,
  // CPython's evaluation loop and call machinery, and the interpreter's
  // start-up; C and C++ frames are never the user's.
  const auto imported = ReadPytorchSnapshot((Files().dir / "context_all.pickle").string());
  REQUIRE(imported.ok());
  const RequestTrace& t = imported->front().requests;
  std::vector<std::string> owners, sites;
  for (const Request& r : t.requests) {
    if (r.op != RequestOp::kAlloc) continue;
    owners.push_back(t.strings[r.text]);
    sites.push_back(t.stacks[r.stack].site);
  }
  // (The viewer omits C functions named like "_start"; a Python function so named is the user's.)
  CHECK(owners == std::vector<std::string>{"train.py:55 forward", "", "train.py:12 on_train_start"});
  // With no frame of the user's, the site is the innermost frame the viewer shows.
  CHECK(sites ==
        std::vector<std::string>{"train.py:55 forward <- train.py:80 main",
                                 "/pytorch/c10/cuda/CUDACachingAllocator.cpp:1178 DeviceCachingAllocator::malloc",
                                 "train.py:12 on_train_start <- train.py:80 main"});
}
