#!/usr/bin/env python3
"""End-to-end tests of recording a replay into a run directory and of the
commands that read it: summary, trace, snapshot, frag, dump."""
import json
import os
import pickle
import pickletools
import shutil
import subprocess
import sys
import tempfile

from clitest import DATA, MiB, check, data, finish, run  # noqa: E402


tmp = tempfile.mkdtemp(prefix="memscope-cli-")
try:
    out_dir = os.path.join(tmp, "run")
    code, out, err = run("replay", os.path.join(DATA, "phases.jsonl"), "--out", out_dir)
    check("record exit", code == 0, err)
    for name in ["run.json", "rank-0.timeline", "report.json", "summary.txt", "trace.json", "snapshot-rank-0.pickle"]:
        check(f"run dir has {name}", os.path.exists(os.path.join(out_dir, name)), os.listdir(out_dir))
    run_json = json.load(open(os.path.join(out_dir, "run.json")))
    check("run.json", run_json["schema"] == "memscope.run/1" and run_json["ranks"][0]["status"] == "ok", run_json)

    # report.json: schema and the numbers of the trace.
    report = json.load(open(os.path.join(out_dir, "report.json")))
    check("schema", report["schema"] == "memscope.report/1", report.get("schema"))
    r0 = report["ranks"][0]
    phases = [(p["step"], p["phase"], p["allocated_bytes"] // MiB, p["max_allocated_bytes"] // MiB,
               p["reserved_bytes"] // MiB, p["peak_allocated_bytes_in_phase"] // MiB) for p in r0["phases"]]
    check("phases", phases == [(None, "model", 30, 30, 30, 30), (0, "forward", 70, 120, 120, 120),
                               (0, "backward", 60, 120, 120, 100)], phases)
    check("by_category", r0["phases"][1]["by_category"]["ACTIVATION"] == 40 * MiB, r0["phases"][1]["by_category"])
    check("peak", r0["peak"]["allocated"]["bytes"] == 120 * MiB and r0["peak"]["allocated"]["phase"] == "forward:0",
          r0["peak"]["allocated"])
    check("owners", r0["peak"]["allocated"]["top_owners"][0] == {"owner": "fc", "bytes": 70 * MiB},
          r0["peak"]["allocated"]["top_owners"])
    check("lower bound", r0["lower_bound_bytes"] == 120 * MiB, r0["lower_bound_bytes"])
    # g (30 MiB) reused the cached 50 MiB block of tmp, so empty_cache frees only act's 40 MiB segment.
    check("stats", r0["memory_stats"]["allocated_bytes.all.current"] == 60 * MiB and
          r0["memory_stats"]["reserved_bytes.all.current"] == 80 * MiB, "")
    check("no oom", r0["oom"] is None, r0["oom"])

    # summary: the phase table in MiB.
    code, out, err = run("summary", out_dir)
    check("summary exit", code == 0, err)
    check("summary table", "0     forward               70M           120M       120M          120M           120M" in out, out)
    check("summary peak", "peak allocated 120.00 MiB in forward:0" in out, out)
    check("summary memory_summary", "PyTorch CUDA memory summary, device ID 0" in out, out)
    code, out, err = run("summary", out_dir, "--at", "forward:0", "--json")
    at = json.loads(out)["at"][0]
    check("summary --at", at["memory_stats"]["allocated_bytes.all.current"] == 70 * MiB, at)
    code, out, err = run("summary", os.path.join(out_dir, "rank-0.timeline"), "--at", "peak")
    check("summary of a timeline file", code == 0 and "memory_summary() at peak" in out, err)

    # trace: Chrome trace JSON with the process, counters and phase slices.
    trace_path = os.path.join(tmp, "trace.json")
    code, out, err = run("trace", out_dir, "-o", trace_path)
    check("trace exit", code == 0, err)
    events = json.load(open(trace_path))["traceEvents"]
    names = {e.get("args", {}).get("name") for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    check("trace process", "rank 0" in names, names)
    allocated = [e["args"]["bytes"] for e in events if e.get("ph") == "C" and e.get("name") == "allocated"]
    check("trace peak", max(allocated) == 120 * MiB, max(allocated) if allocated else None)
    check("trace phases", any(e.get("name") == "forward:0" for e in events), "")
    check("trace empty_cache", any(e.get("name") == "empty_cache" and e.get("ph") == "i" for e in events), "")

    # snapshot: a pickle Python loads, with PyTorch's keys, using MemoryViz's opcodes only.
    snap_path = os.path.join(tmp, "snap.pickle")
    code, out, err = run("snapshot", out_dir, "--at", "forward:0", "-o", snap_path)
    check("snapshot exit", code == 0, err)
    raw = open(snap_path, "rb").read()
    snap = pickle.loads(raw)
    check("snapshot keys", list(snap) == ["segments", "device_traces", "allocator_settings", "external_annotations"],
          list(snap))
    sizes = sorted(s["total_size"] for s in snap["segments"])
    check("snapshot segments", sizes == [30 * MiB, 40 * MiB, 50 * MiB], sizes)
    allowed = {"PROTO", "FRAME", "MARK", "STOP", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT", "LIST", "TUPLE",
               "TUPLE1", "TUPLE2", "TUPLE3", "SETITEM", "SETITEMS", "APPEND", "APPENDS", "BININT", "BININT1",
               "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "NONE", "NEWTRUE", "NEWFALSE",
               "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT", "MEMOIZE"}
    used = {op.name for op, _, _ in pickletools.genops(raw)}
    check("snapshot opcodes", used <= allowed, used - allowed)
    # A free carries its allocation's frames (owner and category), not OTHER;
    # a segment_free those of the allocation that made the segment.
    live, frees = {}, []
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            live[e["addr"]] = e["frames"]
        elif e["action"] in ("free_requested", "free_completed"):
            frees.append((e["frames"], live.get(e["addr"])))
    check("snapshot: each free has its allocation's frames",
          frees and all(f == a and f and f[0]["name"] != "memscope OTHER" for f, a in frees), frees)
    annotations = [(a["name"], a["stage"]) for a in snap["external_annotations"]]
    check("snapshot annotations", ("forward:0", "END") in annotations, annotations)
    code, out, err = run("snapshot", out_dir, "-o", os.path.join(tmp, "snap.json"), "--format", "json")
    check("snapshot json", json.load(open(os.path.join(tmp, "snap.json")))["segments"][0]["total_size"] > 0, err)

    # frag: the numbers at exit (after the empty_cache that follows the last step), and who pins what.
    code, out, err = run("frag", out_dir, "--at", "exit", "--json")
    f = json.loads(out)["ranks"][0]["fragmentation"]
    check("frag", (f["reserved_bytes"], f["allocated_bytes"], f["segments"], f["inactive_split_bytes"]) ==
          (80 * MiB, 60 * MiB, 2, 20 * MiB), f)
    # ... and at end (the default): after backward:0, before the empty_cache.
    code, out, err = run("frag", out_dir, "--json")
    f = json.loads(out)["ranks"][0]["fragmentation"]
    check("frag at end", (f["reserved_bytes"], f["allocated_bytes"], f["segments"]) == (120 * MiB, 60 * MiB, 3), f)
    code, out, err = run("frag", out_dir, "--at", "forward:0")
    check("frag text", "free in segments 50.00 MiB in 1 block," in out, out)

    # dump: JSON lines, header first.
    code, out, err = run("dump", os.path.join(out_dir, "rank-0.timeline"))
    lines = [json.loads(l) for l in out.splitlines()]
    check("dump header", lines[0]["type"] == "header" and lines[0]["events"] == len(lines) - 1, lines[0])
    types = [l["type"] for l in lines[1:]]
    check("dump types", types[:3] == ["phase_begin", "segment_alloc", "alloc"], types[:3])
    check("dump owner", lines[3].get("owner") == "fc" and lines[3].get("category") == "PARAMETER", lines[3])
    check("dump mark", any(l.get("text") == "step 0 done" for l in lines), "")

    # A torn timeline still reads; bad input is one line and exit 2.
    torn = os.path.join(tmp, "torn.timeline")
    data = open(os.path.join(out_dir, "rank-0.timeline"), "rb").read()
    open(torn, "wb").write(data[:-1])  # the last record (variable length, at least 2 bytes) loses its last byte
    code, out, err = run("dump", torn)
    torn_header = json.loads(out.splitlines()[0]) if code == 0 else {}
    check("torn", code == 0 and 1 <= torn_header["torn_bytes"] < 80 and torn_header["events"] < lines[0]["events"],
          (code, err, torn_header))
    garbage = os.path.join(tmp, "garbage.timeline")
    open(garbage, "wb").write(b"not a timeline at all, really not")
    for args, expect in [(["summary", garbage], "not a memscope timeline"),
                         (["summary", tmp], "not a memscope run directory"),
                         (["summary", os.path.join(tmp, "missing")], "does not exist"),
                         (["summary", out_dir, "--at", "oom"], "has no OOM"),
                         (["summary", out_dir, "--at", "sideways"], "--at 'sideways'"),
                         (["summary", out_dir, "--rank", "3"], "has no rank 3"),
                         (["snapshot", out_dir, "-o", os.path.join(tmp, "x"), "--format", "xml"], "--format")]:
        code, out, err = run(*args)
        check(f"{args} exit", code == 2, (code, err))
        check(f"{args} message", expect in err and err.count("\n") == 1, err)
finally:
    shutil.rmtree(tmp)

finish("cli profile commands")
