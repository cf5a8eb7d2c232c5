#!/usr/bin/env python3
"""A PyTorch user's own snapshot (issue 33): stacks recorded with
_record_memory_history(context="all"), whose C++ and interpreter frames sit
between every two Python frames; torch.profiler's ProfilerStep#N scopes
around record_function phases; and, at the end, free bytes that are mostly
wholly free segments (releasable by empty_cache) with a little fragmented
inside a segment holding a live block.

The stacks follow torch/csrc/profiler/combined_traceback.cpp, innermost
first: the unwinder's own frames, the allocator and dispatcher (C++), then
Python frames interleaved with CPython's evaluation loop (Python/ceval.c),
then the interpreter's start-up. PyTorch's viewer omits the unwinder, the
evaluation loop and the boxing glue (torch/cuda/_memory_viz.py,
_frame_filter); the owner is the innermost frame of the user's code,
train.py:55 forward.

The trace follows PyTorch's allocator: the 6 MiB request gets a 20 MiB
segment (kLargeBuffer), the 30 MiB one a segment of its own; the 4 MiB one
is split from the 20 MiB segment."""
import json
import os
import pickle
import shutil
import tempfile

from clitest import MiB, check, finish, run  # noqa: E402

A, B = 0x7F0000000000, 0x7F0002000000


def cpp(file, line, name):
    return {"filename": file, "line": line, "name": name}


UNWIND = [cpp("??", 0, "torch::unwind::unwind()"),
          cpp("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
          cpp("/pytorch/torch/csrc/profiler/combined_traceback.cpp", 81, "torch::gather_with_cpp()"),
          cpp("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 1178,
              "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, "
              "CUstream_st*)"),
          cpp("/pytorch/aten/src/ATen/core/boxing/impl/make_boxed_from_unboxed_functor.h", 468,
              "c10::impl::call_functor_with_args_from_stack_"),
          cpp("/pytorch/build/aten/src/ATen/RegisterCUDA.cpp", 7210, "at::(anonymous namespace)::wrapper_CUDA_mm")]


def python(file, line, name):
    """A Python frame, with the evaluation loop's C frames PyTorch records above it."""
    return [cpp("Python/ceval.c", 5305, "_PyEval_EvalFrameDefault"),
            cpp("./Include/internal/pycore_ceval.h", 73, "_PyEval_EvalFrame"),
            cpp("Objects/call.c", 393, "_PyFunction_Vectorcall"),
            {"filename": file, "line": line, "name": name}]


START = [cpp("Python/pythonrun.c", 1687, "run_mod"), cpp("Modules/main.c", 680, "Py_RunMain"),
         cpp("??", 0, "__libc_start_main"), cpp("??", 0, "_start")]
TORCH = "/usr/lib/python3/dist-packages/torch"
FORWARD = (UNWIND + python(f"{TORCH}/nn/modules/linear.py", 116, "forward") +
           python(f"{TORCH}/nn/modules/module.py", 1527, "_call_impl") +
           python("train.py", 55, "forward") + python(f"{TORCH}/nn/modules/module.py", 1527, "_call_impl") +
           python("train.py", 80, "main") + START)
OPTIM = (UNWIND + python(f"{TORCH}/optim/adam.py", 410, "_single_tensor_adam") +
         python("train.py", 90, "main") + START)
# An allocation from the autograd engine's own thread: no Python frame at all.
ENGINE = UNWIND + [cpp("/pytorch/torch/csrc/autograd/engine.cpp", 1203, "torch::autograd::Engine::thread_main"),
                   cpp("??", 0, "start_thread")]


def entry(action, addr, size, t, frames):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames,
            "compile_context": "N/A", "user_metadata": ""}


def free(addr, size, t, frames):
    return [entry("free_requested", addr, size, t, frames), entry("free_completed", addr, size, t, frames)]


def ann(name, stage, t):
    return {"device": 0, "name": name, "stage": stage, "time_us": t}


TRACE = ([entry("segment_alloc", A, 20 * MiB, 101, FORWARD), entry("alloc", A, 6 * MiB, 101, FORWARD),
          entry("segment_alloc", B, 30 * MiB, 102, FORWARD), entry("alloc", B, 30 * MiB, 102, FORWARD)] +
         free(B, 30 * MiB, 105, FORWARD) +
         [entry("alloc", A + 6 * MiB, 4 * MiB, 106, OPTIM)] + free(A + 6 * MiB, 4 * MiB, 107, OPTIM) +
         [entry("alloc", A + 6 * MiB, 2 * MiB, 111, ENGINE)] + free(A + 6 * MiB, 2 * MiB, 111, ENGINE))
ANNOTATIONS = [ann("ProfilerStep#3", "START", 100), ann("## forward ##", "START", 100),
               ann("## forward ##", "END", 103), ann("## backward ##", "START", 104),
               ann("## backward ##", "END", 108), ann("ProfilerStep#3", "END", 109),
               ann("ProfilerStep#4", "START", 110), ann("## forward ##", "START", 110),
               ann("## forward ##", "END", 112), ann("ProfilerStep#4", "END", 112)]


def snapshot(in_trace=False):
    """The 2.4+ shape (external_annotations), or 2.1-2.3's (user_defined trace entries)."""
    blocks = [{"address": A, "size": 6 * MiB, "requested_size": 6 * MiB, "state": "active_allocated",
               "frames": FORWARD},
              {"address": A + 6 * MiB, "size": 14 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]
    segs = [{"device": 0, "address": A, "total_size": 20 * MiB, "allocated_size": 6 * MiB, "active_size": 6 * MiB,
             "requested_size": 6 * MiB, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
             "is_expandable": False, "frames": FORWARD, "blocks": blocks},
            {"device": 0, "address": B, "total_size": 30 * MiB, "allocated_size": 0, "active_size": 0,
             "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
             "is_expandable": False, "frames": FORWARD,
             "blocks": [{"address": B, "size": 30 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]}]
    trace, annotations = list(TRACE), list(ANNOTATIONS)
    if in_trace:
        for a in annotations:
            trace.append({"action": "user_defined", "addr": 0, "size": 0, "stream": 0, "time_us": a["time_us"],
                          "frames": [], "name": a["name"], "stage": a["stage"]})
        trace.sort(key=lambda e: (e["time_us"], 0 if e.get("stage") == "START" else 1 if "stage" not in e else 2))
        annotations = []
    return {"segments": segs, "device_traces": [trace], "external_annotations": annotations,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                                   "expandable_segments": False, "garbage_collection_threshold": 0.0}}


tmp = tempfile.mkdtemp(prefix="memscope-usersnap-")
try:
    for shape in ("external_annotations", "user_defined"):
        path = os.path.join(tmp, f"{shape}.pickle")
        with open(path, "wb") as f:
            pickle.dump(snapshot(in_trace=shape == "user_defined"), f, protocol=4)

        # 1. Owners: the user's frame, never CPython's evaluation loop.
        code, out, err = run("summary", path, "--json")
        check(f"{shape}: summary", code == 0, err)
        rank = json.loads(out)["ranks"][0] if code == 0 else {}
        peak = rank.get("peak", {}).get("allocated", {})
        check(f"{shape}: peak 36 MiB", peak.get("bytes") == 36 * MiB, peak.get("bytes"))
        check(f"{shape}: top owner is the user's frame",
              peak.get("top_owners") == [{"owner": "train.py:55 forward", "bytes": 36 * MiB}], peak.get("top_owners"))
        check(f"{shape}: top site is the user's frames",
              peak.get("top_sites") == [{"site": "train.py:55 forward <- train.py:80 main", "bytes": 36 * MiB,
                                         "allocations": 2}], peak.get("top_sites"))
        code, out, err = run("summary", path)
        check(f"{shape}: no interpreter frame in summary", code == 0 and "ceval.c" not in out and
              "train.py:55 forward <- train.py:80 main" in out, out)

        # 3. Steps: ProfilerStep#N is step N, for the phases inside it too.
        rows = [(p["phase"], p["step"]) for p in rank.get("phases", [])]
        check(f"{shape}: phases with their steps",
              rows == [("## forward ##", 3), ("## backward ##", 3), ("ProfilerStep", 3), ("## forward ##", 4),
                       ("ProfilerStep", 4)], rank.get("phases"))
        check(f"{shape}: the peak's phase says its step", peak.get("phase") == "## forward ##:3", peak.get("phase"))
        check(f"{shape}: peak in ## forward ##:3 (text)", "in ## forward ##:3" in out, out)
        check(f"{shape}: step column", "3     ## forward ##" in out and "4     ProfilerStep" in out, out)

        # 4. Fragmentation: 44 MiB free, 30 MiB of it a wholly free segment.
        code, out, err = run("frag", path, "--json")
        check(f"{shape}: frag", code == 0, err)
        fr = json.loads(out)["ranks"][0]["fragmentation"] if code == 0 else {}
        want = {"reserved_bytes": 50 * MiB, "allocated_bytes": 6 * MiB, "free_in_segments_bytes": 44 * MiB,
                "largest_free_block_bytes": 30 * MiB, "releasable_bytes": 30 * MiB, "releasable_segments": 1,
                "releasable_ratio": 0.6, "fragmented_bytes": 14 * MiB, "fragmented_segments": 1,
                "fragmented_ratio": 0.28}
        check(f"{shape}: releasable and fragmented", {k: fr.get(k) for k in want} == want, fr)
        code, out, err = run("frag", path)
        check(f"{shape}: frag text", code == 0 and
              "fragmentation 0.318\n" in out and
              "releasable 30.00 MiB (0.600 of reserved): 1 segment wholly free, which empty_cache() would "
              "release\n" in out and
              "fragmented 14.00 MiB (0.280 of reserved): free inside 1 segment holding live blocks\n" in out, out)
        check(f"{shape}: pinned by the user's frame", "14.00 MiB free, pinned by ACTIVATION train.py:55 forward "
              "<- train.py:80 main 6.00 MiB\n" in out, out)
        code, out, err = run("replay", path, "--verify")
        check(f"{shape}: verify", code == 0 and "all 2 segment actions match" in out, (code, out, err))

    # Written back, torch.profiler's scopes keep PyTorch's names.
    path = os.path.join(tmp, "external_annotations.pickle")
    back = os.path.join(tmp, "back.pickle")
    code, out, err = run("snapshot", path, "-o", back)
    check("snapshot", code == 0, err)
    with open(back, "rb") as f:
        again = pickle.load(f)
    names = [(a["name"], a["stage"]) for a in again["external_annotations"]]
    check("ProfilerStep#N written back", ("ProfilerStep#3", "START") in names and ("ProfilerStep#4", "END") in names,
          names)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
finish("a PyTorch user's snapshot: owners, steps, fragmentation")
