#!/usr/bin/env python3
"""End-to-end tests of PyTorch snapshots and RMM logs as inputs, replay --verify,
and what-if replay under other settings."""
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

from clitest import DATA, MiB, check, data, finish, run  # noqa: E402


def entry(action, addr, size, t, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t, "frames": []}


tmp = tempfile.mkdtemp(prefix="memscope-import-")
try:
    # memscope's own snapshot of a recorded run replays to the same segment sizes (--verify).
    rundir = os.path.join(tmp, "run")
    code, out, err = run("replay", os.path.join(DATA, "phases.jsonl"), "--out", rundir)
    check("record", code == 0, err)
    snap = os.path.join(tmp, "end.pickle")
    code, out, err = run("snapshot", rundir, "--at", "exit", "-o", snap)
    check("snapshot", code == 0, err)
    code, out, err = run("replay", snap, "--verify")
    check("verify own", code == 0 and "all 4 segment actions match, in order (3 segment_alloc, 1 segment_free)" in out, (code, out, err))
    # Commands take the snapshot directly: the same phase table as the run.
    code, out, err = run("summary", snap, "--json")
    check("summary of a snapshot", code == 0, err)
    if code == 0:
        phases = [(p["phase"], p["allocated_bytes"] // MiB) for p in json.loads(out)["ranks"][0]["phases"]]
        check("snapshot phases", phases == [("model", 30), ("forward", 70), ("backward", 60)], phases)
        check("note on stderr", "replayed under its own allocator settings" in err, err)

    # A snapshot written by Python (protocol 2, 4, 5) shaped like PyTorch 2.x, whose
    # ring buffer dropped its head: "w" was allocated before the trace began.
    base = 0x7F0000000000
    segments = [{"device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 6 * MiB,
                 "active_size": 6 * MiB, "requested_size": 6 * MiB, "stream": 0, "segment_type": "large",
                 "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                 "blocks": [{"address": base, "size": 6 * MiB, "requested_size": 6 * MiB,
                             "state": "active_allocated", "frames": []},
                            {"address": base + 6 * MiB, "size": 14 * MiB, "requested_size": 0,
                             "state": "inactive", "frames": []}]}]
    trace = [entry("free_requested", base + 40 * MiB, 1024, 10),  # a block from before the trace
             entry("segment_alloc", base + 20 * MiB, 20 * MiB, 11),
             entry("alloc", base + 20 * MiB, 6 * MiB, 12),
             entry("free_requested", base + 20 * MiB, 6 * MiB, 13),
             entry("free_completed", base + 20 * MiB, 6 * MiB, 13)]
    doc = {"segments": segments, "device_traces": [trace],
           "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                  "expandable_segments": False},
           "external_annotations": [{"name": "forward:0", "stage": "START", "device": 0, "time_us": 11},
                                    {"name": "forward:0", "stage": "END", "device": 0, "time_us": 13}]}
    for proto in (2, 4, 5):
        path = os.path.join(tmp, f"torch-p{proto}.pickle")
        with open(path, "wb") as f:
            pickle.dump(doc, f, protocol=proto)
        code, out, err = run("summary", path, "--json")
        check(f"p{proto} summary", code == 0, err)
        if code == 0:
            r0 = json.loads(out)["ranks"][0]
            check(f"p{proto} ring buffer note", "does not start at the beginning" in err and
                  "1 blocks alive at the snapshot" in err and "1 frees of earlier blocks were ignored" in err, err)
            check(f"p{proto} peak", r0["peak"]["allocated"]["bytes"] == 12 * MiB, r0["peak"]["allocated"])
            check(f"p{proto} phase", [p["phase"] for p in r0["phases"]] == ["forward"], r0["phases"])
    # A free that completes later (the block was used on another stream) keeps
    # its block until its free_completed: b needs a segment of its own, as in
    # PyTorch, and c then reuses a's block. --verify checks the segment sizes.
    a, b2 = base, base + 12 * MiB
    delayed = [entry("segment_alloc", a, 12 * MiB, 1), entry("alloc", a, 12 * MiB, 1),
               entry("free_requested", a, 12 * MiB, 2),
               entry("segment_alloc", b2, 12 * MiB, 3), entry("alloc", b2, 12 * MiB, 3),
               entry("free_completed", a, 12 * MiB, 4),
               entry("alloc", a, 12 * MiB, 5)]
    delayed_doc = dict(doc, segments=[], device_traces=[delayed], external_annotations=[])
    path = os.path.join(tmp, "delayed.pickle")
    with open(path, "wb") as f:
        pickle.dump(delayed_doc, f, protocol=4)
    code, out, err = run("replay", path, "--verify")
    check("delayed free verify", code == 0 and "all 2 segment actions match, in order (2 segment_alloc)" in out and
          "1 frees of device 0 completed later than requested" in err, (code, out, err))
    # The same free completed at once: b reuses a's block, one segment in all
    # (treating it as delayed would give b a segment of its own).
    prompt = [entry("segment_alloc", a, 12 * MiB, 1), entry("alloc", a, 12 * MiB, 1),
              entry("free_requested", a, 12 * MiB, 2), entry("free_completed", a, 12 * MiB, 2),
              entry("alloc", a, 12 * MiB, 3)]
    with open(path, "wb") as f:
        pickle.dump(dict(delayed_doc, device_traces=[prompt]), f, protocol=4)
    code, out, err = run("replay", path, "--verify")
    check("prompt free verify", code == 0 and "all 1 segment actions match, in order (1 segment_alloc)" in out and
          "completed later" not in err, (code, out, err))

    # Snapshots without a trace show their state: the 1.13 list format (blocks
    # without addresses, request sizes in their history) and a 2.x one recorded
    # without history.
    legacy = [{"device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 6 * MiB,
               "active_size": 6 * MiB, "stream": 0, "segment_type": "large",
               "blocks": [{"size": 6 * MiB, "state": "active_allocated",
                           "history": [{"addr": base, "real_size": 6 * MiB - 100, "frames": []}]},
                          {"size": 14 * MiB, "state": "inactive", "history": []}]},
              {"device": 0, "address": base + 64 * MiB, "total_size": 2 * MiB, "allocated_size": 512,
               "active_size": 1024, "stream": 0, "segment_type": "small",
               "blocks": [{"size": 512, "state": "active_allocated", "history": []},
                          {"size": 512, "state": "active_pending_free", "history": []},
                          {"size": 2 * MiB - 1024, "state": "inactive", "history": []}]}]
    no_history = dict(doc, device_traces=[[]])
    for name, obj in [("legacy", legacy), ("no-history", no_history)]:
        path = os.path.join(tmp, f"{name}.pickle")
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2)
        code, out, err = run("frag", path, "--json")
        check(f"{name} frag", code == 0 and "no history" in err, (code, err))
        if code == 0:
            fr = json.loads(out)["ranks"][0]["fragmentation"]
            expect = (22 * MiB, 6 * MiB + 512) if name == "legacy" else (20 * MiB, 6 * MiB)
            check(f"{name} state", (fr["reserved_bytes"], fr["allocated_bytes"]) == expect, fr)
    code, out, err = run("replay", os.path.join(tmp, "legacy.pickle"))
    check("legacy replay refused", code == 2 and "1.13" in err, err)

    # Objects are refused, naming the opcode.
    import collections
    evil = os.path.join(tmp, "evil.pickle")
    with open(evil, "wb") as f:
        pickle.dump(collections.OrderedDict(a=1), f, protocol=2)
    code, out, err = run("summary", evil)
    check("refuse GLOBAL", code == 2 and "GLOBAL" in err and err.count("\n") == 1, (code, err))
    trunc = os.path.join(tmp, "trunc.pickle")
    with open(trunc, "wb") as f:
        f.write(open(os.path.join(tmp, "torch-p4.pickle"), "rb").read()[:-30])
    code, out, err = run("replay", trunc)
    check("truncated", code == 2 and err.count("\n") == 1, (code, err))

    # RMM's CSV log: the fragmentation trace; allocate failures are skipped.
    code, out, err = run("replay", os.path.join(DATA, "rmm.csv"), "--device-memory", "30MiB", "--json")
    check("rmm", code == 0, err)
    if code == 0:
        r = json.loads(out)["runs"][0]
        check("rmm oom", r["oom"] is not None and r["oom"]["request_index"] == 3, r["oom"])

    # What-if: the pattern max_split_size_mb exists for. A cached 60 MiB block is
    # split by a 4 MiB request (defaults), so a new 60 MiB request cannot fit on a
    # 100 MiB GPU. max_split_size_mb:20 keeps the oversize block whole for it;
    # expandable segments grow the segment instead.
    lines = [{"action": "alloc", "id": "a", "size": 60 * MiB}, {"action": "free", "id": "a"},
             {"action": "alloc", "id": "s", "size": 4 * MiB}, {"action": "alloc", "id": "b", "size": 60 * MiB}]
    frag = os.path.join(tmp, "frag.jsonl")
    with open(frag, "w") as f:
        f.write("\n".join(json.dumps(l) for l in lines) + "\n")
    code, out, err = run("replay", frag, "--json", "--device-memory", "100MiB", "--alloc-conf", "",
                         "--alloc-conf", "expandable_segments:True", "--alloc-conf", "max_split_size_mb:20")
    check("what-if", code == 0, err)
    if code == 0:
        check("lower bound of the trace", json.loads(out)["lower_bound_bytes"] == 64 * MiB, out[:200])
        runs = json.loads(out)["runs"]
        check("defaults OOM", runs[0]["oom"] is not None and runs[0]["oom"]["id"] == "b", runs[0]["oom"])
        check("expandable fits", runs[1]["oom"] is None, runs[1]["oom"])
        check("max_split_size fits", runs[2]["oom"] is None, runs[2]["oom"])
        mins = [r["min_device_memory"] for r in runs]
        check("min memory", mins == [None, 80 * MiB, 80 * MiB], mins)
    code, out, err = run("replay", frag, "--device-memory", "1GiB", "--alloc-conf", "")
    check("what-if table", "min memory" in out and "lower bound (peak live bytes)" in out and
          "120.00 MiB" in out.split("min memory")[-1], out)
    code, out, err = run("replay", frag, "--verify")
    check("verify needs a snapshot", code == 2 and "--verify needs a PyTorch snapshot" in err, err)
finally:
    shutil.rmtree(tmp)

finish("cli import")
