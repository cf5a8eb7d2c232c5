#!/usr/bin/env python3
"""The newest snapshot fields (PyTorch 2.11+; issue 33 item 8), in PyTorch's
shape, written by Python's pickle: a block's requested_size below its size,
the block state active_awaiting_free (memory.py's name for PyTorch's C++
active_pending_free), frames of torch.compile's code with fx_node_op /
fx_node_name / fx_node_target / fx_original_trace, the `annotate` trace
entry (_annotate_memory) and the pinned host memory of
record_pinned_host_memory (host_segments, host_traces). Each is read, shown
where it adds meaning, and written back by `memscope snapshot`; a value of
the wrong type is a one-line error.

`python3 newest_fields_test.py --corpus DIR` writes the fuzz corpus's copy
(tests/fuzz/corpus/pickle/torch_newest_fields_p4.pickle) and nothing else."""
import json
import os
import pickle
import shutil
import sys
import tempfile

if "--corpus" in sys.argv:
    sys.argv = [sys.argv[0], "memscope", "data", *sys.argv[sys.argv.index("--corpus") + 1:]]

from clitest import MiB, check, finish, run  # noqa: E402

BASE = 0x7F0000000000
HOST = 0x7E0000000000

# torch.compile's generated code, carrying the FX node that allocated, then
# PyTorch's own frames, then the user's loop (an outer frame: the user's
# forward is not on the stack, the compiled graph ran instead).
FX = {"filename": "/tmp/torchinductor_u/ab/cab3.py", "line": 40, "name": "call",
      "fx_node_op": "call_function", "fx_node_name": "addmm", "fx_node_target": "aten.addmm.default",
      "fx_original_trace": "  File \"model.py\", line 12, in forward\n    a = self.net1(x)\n"}
DYNAMO = {"filename": "/usr/lib/python3/dist-packages/torch/_dynamo/eval_frame.py", "line": 600, "name": "_fn"}
MAIN = {"filename": "train.py", "line": 80, "name": "main"}
S_FX = [FX, DYNAMO, MAIN]
S_USER = [{"filename": "train.py", "line": 70, "name": "load"}, MAIN]
S_PIN = [{"filename": "train.py", "line": 90, "name": "pin"}, MAIN]


def entry(action, addr, size, t, frames, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames,
         "compile_context": "N/A", "user_metadata": "", "pool_id": (0, 0)}
    e.update(extra)
    return e


def host_entry(action, addr, size, t, frames):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames}


def settings():
    return {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1, "expandable_segments": False,
            "garbage_collection_threshold": 0.0, "roundup_power2_divisions": {"1": 0}}


def host_memory():
    blocks = [{"address": HOST, "size": 1 * MiB, "requested_size": 1000000, "state": "active_allocated",
               "frames": S_PIN},
              {"address": HOST + MiB, "size": 512 * 1024, "requested_size": 500000, "state": "active_awaiting_free",
               "frames": S_PIN},
              {"address": HOST + MiB + 512 * 1024, "size": 512 * 1024, "requested_size": 0, "state": "inactive",
               "frames": []}]
    segs = [{"address": HOST, "total_size": 2 * MiB, "allocated_size": MiB, "active_size": MiB + 512 * 1024,
             "requested_size": 1500000, "frames": S_PIN, "blocks": blocks}]
    trace = [host_entry("segment_alloc", HOST, 2 * MiB, 90, S_PIN), host_entry("alloc", HOST, 1000000, 90, S_PIN),
             host_entry("alloc", HOST + MiB, 500000, 95, S_PIN),
             host_entry("free_requested", HOST + MiB, 500000, 130, S_PIN)]
    return segs, trace


def newest():
    # A 1000-byte request (a 1024-byte block of a 2 MiB small segment), a
    # 6 MiB allocation of the compiled graph's addmm, an annotation between,
    # and a 4 MiB one freed while a stream still uses it (no free_completed:
    # active_awaiting_free at the snapshot).
    tr = [entry("segment_alloc", BASE, 2 * MiB, 100, S_USER), entry("alloc", BASE, 1000, 100, S_USER),
          entry("segment_alloc", BASE + 2 * MiB, 20 * MiB, 110, S_FX), entry("alloc", BASE + 2 * MiB, 6 * MiB, 110, S_FX),
          entry("annotate", 0, 0, 115, [], user_metadata="before the loss"),
          entry("alloc", BASE + 8 * MiB, 4 * MiB, 120, S_USER),
          entry("free_requested", BASE + 8 * MiB, 4 * MiB, 125, S_USER)]
    small = {"device": 0, "address": BASE, "total_size": 2 * MiB, "allocated_size": 1024, "active_size": 1024,
             "requested_size": 1000, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
             "is_expandable": False, "frames": S_USER,
             "blocks": [{"address": BASE, "size": 1024, "requested_size": 1000, "state": "active_allocated",
                         "frames": S_USER},
                        {"address": BASE + 1024, "size": 2 * MiB - 1024, "requested_size": 0, "state": "inactive",
                         "frames": []}]}
    large = {"device": 0, "address": BASE + 2 * MiB, "total_size": 20 * MiB, "allocated_size": 6 * MiB,
             "active_size": 10 * MiB, "requested_size": 10 * MiB, "stream": 0, "segment_type": "large",
             "segment_pool_id": (0, 0), "is_expandable": False, "frames": S_FX,
             "blocks": [{"address": BASE + 2 * MiB, "size": 6 * MiB, "requested_size": 6 * MiB,
                         "state": "active_allocated", "frames": S_FX},
                        {"address": BASE + 8 * MiB, "size": 4 * MiB, "requested_size": 4 * MiB,
                         "state": "active_awaiting_free", "frames": S_USER},
                        {"address": BASE + 12 * MiB, "size": 10 * MiB, "requested_size": 0, "state": "inactive",
                         "frames": []}]}
    host_segments, host_traces = host_memory()
    return {"segments": [small, large], "device_traces": [tr], "allocator_settings": settings(),
            "external_annotations": [], "host_segments": host_segments, "host_traces": host_traces}


def write(path, doc, proto=4):
    with open(path, "wb") as f:
        pickle.dump(doc, f, protocol=proto)


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


if len(sys.argv) > 3:  # --corpus DIR
    write(os.path.join(sys.argv[3], "torch_newest_fields_p4.pickle"), newest())
    sys.exit(0)

tmp = tempfile.mkdtemp(prefix="memscope-newest-")
try:
    src = os.path.join(tmp, "newest.pickle")
    doc = newest()
    write(src, doc)
    # The fuzz corpus holds this very file.
    corpus = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus", "pickle",
                          "torch_newest_fields_p4.pickle")
    with open(src, "rb") as a, open(corpus, "rb") as b:
        check("the corpus copy is this test's snapshot", a.read() == b.read(),
              "regenerate it: newest_fields_test.py --corpus tests/fuzz/corpus/pickle")

    # (a) read without error and written back: pickle and JSON.
    back = os.path.join(tmp, "back.pickle")
    code, out, err = run("snapshot", src, "-o", back, "--at", "exit")
    check("snapshot of the newest fields", code == 0, err)
    got = load(back) if code == 0 else {}
    check("host_segments written back unchanged", got.get("host_segments") == doc["host_segments"],
          f"{got.get('host_segments')!r}")
    check("host_traces written back unchanged", got.get("host_traces") == doc["host_traces"],
          f"{got.get('host_traces')!r}")
    trace = got.get("device_traces", [[]])[0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    check("the fx frames written back unchanged (alloc entry)", len(allocs) == 3 and allocs[1]["frames"] == S_FX,
          f"{allocs!r}")
    blocks = {b["address"]: b for s in got.get("segments", []) for b in s["blocks"]}
    check("the fx frames written back unchanged (block)", blocks.get(BASE + 2 * MiB, {}).get("frames") == S_FX,
          f"{blocks.get(BASE + 2 * MiB)!r}")
    check("a block's requested_size below its size written back",
          (blocks.get(BASE, {}).get("size"), blocks.get(BASE, {}).get("requested_size")) == (1024, 1000),
          f"{blocks.get(BASE)!r}")
    check("the first alloc entry keeps the request", allocs[:1] and allocs[0]["size"] == 1000, f"{allocs[:1]!r}")
    check("the block waiting on a stream is written in PyTorch's C++ spelling",
          blocks.get(BASE + 8 * MiB, {}).get("state") == "active_pending_free", f"{blocks.get(BASE + 8 * MiB)!r}")
    annotates = [e for e in trace if e["action"] == "annotate"]
    check("the annotate entry written back in place",
          [(e["user_metadata"], e["time_us"], e["frames"]) for e in annotates] == [("before the loss", 115, [])] and
          [e["action"] for e in trace].index("annotate") == 4, f"{trace!r}")
    check("the annotate entry is no external annotation", got.get("external_annotations") == [],
          f"{got.get('external_annotations')!r}")
    # The re-export reads back to the same file.
    again = os.path.join(tmp, "again.pickle")
    code, out, err = run("snapshot", back, "-o", again, "--at", "exit")
    check("the re-export reads back", code == 0, err)
    if code == 0:
        second = load(again)
        for key in ("segments", "device_traces", "host_segments", "host_traces", "external_annotations"):
            check(f"a second round trip keeps {key}", second.get(key) == got.get(key), f"{second.get(key)!r}")
    as_json = os.path.join(tmp, "back.json")
    code, out, err = run("snapshot", src, "-o", as_json, "--at", "exit", "--format", "json")
    check("JSON snapshot of the newest fields", code == 0, err)
    if code == 0:
        with open(as_json) as f:
            j = json.load(f)
        check("JSON: host_traces", j["host_traces"] == json.loads(json.dumps(doc["host_traces"])), f"{j['host_traces']!r}")
        check("JSON: fx frames", json.loads(json.dumps(S_FX)) in [e["frames"] for e in j["device_traces"][0]], "")

    # (b), (c), (e): the summary counts the awaiting block as active, not
    # allocated; the compiled graph's node is the owner; the pinned host
    # memory is its own section.
    code, out, err = run("summary", src)
    check("summary of the newest fields", code == 0, err)
    check("the compiled graph's node owns its allocation", "largest owners: fx: addmm (call_function) 6.00 MiB" in out,
          out)
    check("pinned host memory section",
          "pinned host memory: reserved 2.00 MiB in 1 segment, allocated 1024.00 KiB in 1 block (requested 976.56 KiB), "
          "512.00 KiB in 1 block waiting on stream events\n"
          "  host trace: 4 entries (1 segment_alloc, 2 alloc, 1 free_requested)\n" in out, out)
    code, out, err = run("summary", src, "--json")
    check("summary --json of the newest fields", code == 0, err)
    if code == 0:
        at = json.loads(out)["at"][0]
        check("--json: pinned_host_memory", at.get("pinned_host_memory") == {
            "segments": 1, "reserved_bytes": 2 * MiB, "allocated_bytes": MiB, "allocated_blocks": 1,
            "requested_bytes": 1000000, "pending_free_bytes": 512 * 1024, "pending_free_blocks": 1,
            "trace_entries": 4, "trace_actions": {"segment_alloc": 1, "alloc": 2, "free_requested": 1}},
            f"{at.get('pinned_host_memory')!r}")
        stats = at["memory_stats"]
        check("--json: the waiting block is active, not allocated",
              (stats["allocated_bytes.all.current"], stats["active_bytes.all.current"]) ==
              (6 * MiB + 1024, 10 * MiB + 1024), f"{stats['allocated_bytes.all.current']}, {stats['active_bytes.all.current']}")
        # (as PyTorch's free_block: a block waiting on a stream keeps its request counted)
        check("--json: requested bytes are the requests", stats["requested_bytes.all.current"] == 10 * MiB + 1000,
              f"{stats['requested_bytes.all.current']}")
    code, out, err = run("replay", src, "--verify")
    check("replay --verify of the newest fields", code == 0 and "all 2 segment actions match" in out, out + err)

    # Without a trace (the state only): active_awaiting_free is a block
    # waiting on stream events, requested_size its request.
    state = dict(doc, device_traces=[])
    state_path = os.path.join(tmp, "state.pickle")
    write(state_path, state)
    code, out, err = run("summary", state_path, "--json")
    check("summary --json of the state", code == 0, err)
    if code == 0:
        at = json.loads(out)["at"][0]
        stats = at["memory_stats"]
        check("state: the awaiting block is active, not allocated",
              (stats["allocated_bytes.all.current"], stats["active_bytes.all.current"],
               stats["requested_bytes.all.current"]) == (6 * MiB + 1024, 10 * MiB + 1024, 10 * MiB + 1000),
              f"{stats['allocated_bytes.all.current']}, {stats['active_bytes.all.current']}, "
              f"{stats['requested_bytes.all.current']}")
        check("state: pinned host memory", at.get("pinned_host_memory", {}).get("trace_entries") == 4,
              f"{at.get('pinned_host_memory')!r}")
    state_back = os.path.join(tmp, "state-back.pickle")
    code, out, err = run("snapshot", state_path, "-o", state_back)
    check("snapshot of the state", code == 0, err)
    if code == 0:
        sb = load(state_back)
        check("state: host memory written back", (sb.get("host_segments"), sb.get("host_traces")) ==
              (doc["host_segments"], doc["host_traces"]), f"{sb.get('host_segments')!r}")

    # Wrong types: the reader's one-line error, naming the value.
    def bad(name, mutate, message):
        d = newest()
        mutate(d)
        path = os.path.join(tmp, f"bad-{name}.pickle")
        write(path, d)
        code, out, err = run("summary", path)
        lines = err.strip().splitlines()
        check(f"bad {name}: an error", code != 0 and len(lines) == 1 and message in lines[0], f"{code} {err!r}")

    bad("fx", lambda d: d["device_traces"][0][3].__setitem__("frames", [dict(FX, fx_node_name=5)]),
        "a frame's fx_node_name is not a str")
    bad("host_segments", lambda d: d.__setitem__("host_segments", "x"), "host_segments is not a list")
    bad("host_size", lambda d: d["host_traces"][1].__setitem__("size", "big"),
        "host_traces[1].size is not a non-negative int")
    bad("host_block", lambda d: d["host_segments"][0]["blocks"][0].__setitem__("state", 3),
        "host_segments[0].blocks[0].state is not a str")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

finish("newest snapshot fields")
