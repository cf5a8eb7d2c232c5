#!/usr/bin/env python3
"""End-to-end tests of `memscope explain` on hand-built OOM traces whose cause
is known: pure capacity, fragmentation that expandable segments cure by
exactly 40 MiB, a second process holding 40 MiB of the GPU, a memory fraction
of 0.5; and a run without an OOM. Every what-if figure is checked against
`memscope replay` with that setting on the same input: the same number."""
import json
import os
import pickle
import tempfile

from clitest import MiB, check, data, finish, run  # noqa: E402


def explain(*args):
    code, out, err = run("explain", *args, "--json")
    check(f"explain {args}: exit 0", code == 0, err)
    return json.loads(out) if code == 0 else None


def replay_min(path, *args):
    """min_device_memory and the result of `memscope replay` with these flags on a 1 TiB GPU (where the search
    always runs), and the same replay's peak reserved and OOM on the given GPU."""
    code, out, err = run("replay", path, "--device-memory", "1TiB", *args, "--json")
    check(f"replay {args}: exit 0", code == 0, err)
    return json.loads(out)["runs"][0]["min_device_memory"] if code == 0 else None


def replay_on(path, device, *args):
    code, out, err = run("replay", path, "--device-memory", device, "--no-search", *args, "--json")
    check(f"replay {args} on {device}: exit 0", code == 0, err)
    r = json.loads(out)["runs"][0]
    return r["memory_stats"]["reserved_bytes.all.peak"], r["oom"]


def what_if(doc, change):
    found = [w for w in doc["what_ifs"] if w["change"] == change]
    check(f"what-if {change} listed", len(found) == 1, [w["change"] for w in doc["what_ifs"]])
    return found[0] if found else None


def check_against_replay(name, path, device, w, *flags):
    """The what-if's figures are `memscope replay`'s with the same flags."""
    if w is None:
        return
    check(f"{name}: min memory = replay's", w["min_device_memory"] == replay_min(path, *flags), w)
    reserved, oom = replay_on(path, device, *flags)
    check(f"{name}: peak reserved = replay's", w["peak_reserved_bytes"] == reserved, (w, reserved))
    check(f"{name}: outcome = replay's", w["oom_request_index"] == (oom["request_index"] if oom else None), (w, oom))


# Pure capacity: 60 MiB + 50 MiB live on a 100 MiB GPU. No setting runs it there.
cap = data("explain-capacity.jsonl")
d = explain(cap, "--device-memory", "100MiB")
if d:
    check("capacity: cause", d["oom"]["cause"] == "capacity", d["oom"])
    check("capacity: what was asked", (d["oom"]["requested_bytes"], d["oom"]["device_free"]) == (50 * MiB, 40 * MiB),
          d["oom"])
    check("capacity: min memory", d["min_device_memory"] == 110 * MiB == replay_min(cap), d["min_device_memory"])
    check("capacity: nothing runs on 100 MiB", all(w["oom_request_index"] == 1 for w in d["what_ifs"]), d["what_ifs"])
    check("capacity: by category at the OOM", d["moment"]["by_category"]["PARAMETER"] == 60 * MiB, d["moment"])
    check("capacity: top site", d["moment"]["top_sites"][0]["site"] == "PARAMETER model", d["moment"])
    check("capacity: diagnosis", d["diagnosis"][1].startswith("Cause: capacity."), d["diagnosis"])
    for change, flags in [("expandable_segments:True", ["--alloc-conf", "expandable_segments:True"]),
                          ("max_split_size_mb:50", ["--alloc-conf", "max_split_size_mb:50"]),
                          ("max_split_size_mb:60", ["--alloc-conf", "max_split_size_mb:60"])]:
        check_against_replay(f"capacity {change}", cap, "100MiB", what_if(d, change), *flags)

# Fragmentation: expandable segments need 80 MiB where the defaults need 120 MiB: 40 MiB saved, and so do
# max_split_size_mb:60 and an empty_cache() at the end of forward.
split = data("explain-split.jsonl")
d = explain(split, "--device-memory", "100MiB")
if d:
    check("split: cause", d["oom"]["cause"] == "fragmentation", d["oom"])
    check("split: oom", (d["oom"]["request_index"], d["oom"]["cached_free_bytes"], d["oom"]["largest_free_block"]) ==
          (6, 56 * MiB, 56 * MiB), d["oom"])
    check("split: baseline min", d["min_device_memory"] == 120 * MiB == replay_min(split), d["min_device_memory"])
    e = what_if(d, "expandable_segments:True")
    if e:
        check("split: expandable saves exactly 40 MiB", (e["saved_bytes"], e["min_device_memory"], e["oom_request_index"])
              == (40 * MiB, 80 * MiB, None), e)
    check_against_replay("split expandable", split, "100MiB", e, "--alloc-conf", "expandable_segments:True")
    check_against_replay("split max_split", split, "100MiB", what_if(d, "max_split_size_mb:60"),
                         "--alloc-conf", "max_split_size_mb:60")
    w = what_if(d, "empty_cache() after every phase")
    if w:
        check("split: empty_cache saves 40 MiB", w["saved_bytes"] == 40 * MiB, w)
    # The same requests with an empty_cache() after each phase end, replayed by memscope replay.
    with tempfile.TemporaryDirectory() as tmp:
        emptied = os.path.join(tmp, "split-emptied.jsonl")
        with open(split) as src, open(emptied, "w") as out:
            for line in src:
                out.write(line)
                if '"phase_end"' in line:
                    out.write('{"action": "empty_cache"}\n')
        check_against_replay("split empty_cache", emptied, "100MiB", w)
    check("split: ranked, the fixes first", d["what_ifs"][0]["oom_request_index"] is None, d["what_ifs"])
    check("split: diagnosis", d["diagnosis"][1].startswith("Cause: fragmentation.") and
          "expandable_segments:True (needs 80.00 MiB, 40.00 MiB less)" in d["diagnosis"][2], d["diagnosis"])
    check("split: at the OOM", (d["moment"]["name"], d["moment"]["phase"], d["moment"]["allocated_bytes"],
                                d["moment"]["reserved_bytes"]) == ("oom", "backward:0", 4 * MiB, 60 * MiB), d["moment"])

# The memory fraction: 0.5 of a 200 MiB GPU allows 100 MiB; the device had 140 MiB free.
d = explain(cap, "--device-memory", "200MiB", "--memory-fraction", "0.5")
if d:
    check("fraction: cause", d["oom"]["cause"] == "memory_fraction", d["oom"])
    # The smallest GPU under fraction 0.5 is twice the 110 MiB needed (replay's search once stopped at 110 MiB).
    check("fraction: min memory", d["min_device_memory"] == 220 * MiB == replay_min(cap, "--memory-fraction", "0.5"),
          d["min_device_memory"])
    w = what_if(d, "no memory fraction")
    if w:
        check("fraction: without it", (w["oom_request_index"], w["min_device_memory"], w["saved_bytes"]) ==
              (None, 110 * MiB, 110 * MiB), w)
    check_against_replay("fraction none", cap, "200MiB", w)
    check_against_replay("fraction gc", cap, "200MiB", what_if(d, "garbage_collection_threshold:0.8"),
                         "--alloc-conf", "garbage_collection_threshold:0.8", "--memory-fraction", "0.5")
code, out, err = run("replay", cap, "--device-memory", "220MiB", "--memory-fraction", "0.5", "--json")
check("fraction: 220 MiB runs it", code == 0 and json.loads(out)["runs"][0]["oom"] is None, out + err)
code, out, err = run("replay", cap, "--device-memory", "219MiB", "--memory-fraction", "0.5", "--json")
check("fraction: 219 MiB does not", code == 0 and json.loads(out)["runs"][0]["oom"] is not None, out + err)

# Another process: a PyTorch OOM snapshot (60 MiB reserved, 20 MiB free, a 40 MiB request) on a GPU of 120 MiB:
# 40 MiB were held outside the process, and without them the request fits.
with tempfile.TemporaryDirectory() as tmp:
    frames = [{"filename": "train.py", "line": 10, "name": "main"}]
    seg = {"device": 0, "address": 0x7F0000000000, "total_size": 60 * MiB, "allocated_size": 60 * MiB,
           "active_size": 60 * MiB, "requested_size": 60 * MiB, "stream": 0, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
           "blocks": [{"address": 0x7F0000000000, "size": 60 * MiB, "requested_size": 60 * MiB,
                       "state": "active_allocated", "frames": frames}]}
    trace = [{"action": "segment_alloc", "addr": 0x7F0000000000, "size": 60 * MiB, "stream": 0, "time_us": 1,
              "frames": frames},
             {"action": "alloc", "addr": 0x7F0000000000, "size": 60 * MiB, "stream": 0, "time_us": 1,
              "frames": frames},
             {"action": "oom", "device_free": 20 * MiB, "size": 40 * MiB, "stream": 0, "time_us": 2, "frames": frames}]
    snap = os.path.join(tmp, "oom.pickle")
    with open(snap, "wb") as f:
        pickle.dump({"segments": [seg], "device_traces": [trace],
                     "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None}}, f, protocol=4)
    d = explain(snap, "--device-memory", "120MiB")
    if d:
        check("other process: cause", d["oom"]["cause"] == "other_process", d["oom"])
        check("other process: 40 MiB outside", (d["outside_bytes"], d["device_memory"], d["gpu_memory"]) ==
              (40 * MiB, 80 * MiB, 120 * MiB), d)
        w = what_if(d, "the whole GPU (120.00 MiB)")
        if w:
            check("other process: the whole GPU runs it", (w["oom_request_index"], w["min_device_memory"]) ==
                  (None, 100 * MiB), w)
            reserved, oom = replay_on(snap, "120MiB")
            check("other process: = replay on 120 MiB", (oom, reserved) == (None, w["peak_reserved_bytes"]), (oom, w))
            check("other process: min = replay's", w["min_device_memory"] == replay_min(snap), w)
        check("other process: top site is the user's frame", d["moment"]["top_sites"][0]["site"] == "train.py:10 main",
              d["moment"])
    # Without --device-memory the snapshot's own capacity is the GPU: nothing outside, a capacity OOM.
    d = explain(snap)
    if d:
        check("snapshot alone: capacity", (d["oom"]["cause"], d["outside_bytes"]) == ("capacity", 0), d["oom"])

# No OOM: the peak, what made it, the headroom; the what-ifs ranked by memory saved.
d = explain(split, "--device-memory", "1GiB")
if d:
    check("no oom", d["oom"] is None, d["oom"])
    check("no oom: diagnosis", d["diagnosis"][0].startswith("No OOM. Peak reserved 120.00 MiB") and
          "headroom 904.00 MiB" in d["diagnosis"][0], d["diagnosis"])
    saved = [w["saved_bytes"] for w in d["what_ifs"]]
    check("no oom: ranked by saving", saved == sorted(saved, key=lambda s: -(s if s is not None else -2**62)), saved)
code, out, err = run("explain", split, "--device-memory", "100MiB")
check("text exit", code == 0, err)
check("text: cause line", "Cause: fragmentation." in out, out)
check("text: what-if row", "expandable_segments:True" in out and "40.00 MiB less" in out, out)

# A run directory (memscope replay --out) is explained from its recording, under its own GPU.
with tempfile.TemporaryDirectory() as tmp:
    code, out, err = run("replay", split, "--device-memory", "100MiB", "--out", os.path.join(tmp, "run"))
    check("record run", code == 0, err)
    d = explain(os.path.join(tmp, "run"))
    if d:
        check("run: fragmentation OOM", d["oom"] is not None and d["oom"]["cause"] == "fragmentation", d["oom"])
        check("run: its GPU", d["device_memory"] == 100 * MiB, d["device_memory"])
        # A replay's run.json has no training options: the training-side changes are refused in one note.
        check("replay dir: training note", (d["training"], d["training_note"]) ==
              (None, "not listed: a replay directory has no training options to plan with (only memscope run's have)"),
              (d["training"], d["training_note"]))

# A run memscope simulated (mlp, batch 64, adam, on 30 MiB: an OOM): the memscope plan strategies at its batch on its
# memory, each figure `memscope plan`'s with the same options, capped at the run's batch.
with tempfile.TemporaryDirectory() as tmp:
    out_dir = os.path.join(tmp, "mlp")
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--device-memory", "30MiB", "--out", out_dir)
    check("mlp run: the OOM's exit 3", code == 3, (code, err))
    d = explain(out_dir)
    if d:
        t = d["training"]
        check("training: command", t and t["command"] == "memscope plan --model mlp --device-memory 31457280 "
              "--batch-size 64 --max-batch 64", t)
        code, out, err = run("plan", "--model", "mlp", "--device-memory", "31457280", "--batch-size", "64",
                             "--max-batch", "64", "--json")
        check("plan: exit 0", code == 0, err)
        plan_rows = {r["strategy"]: r for r in json.loads(out)["rows"]} if code == 0 else {}
        rows = {r["strategy"]: r for r in t["rows"]} if t else {}
        check("training: every plan row", sorted(rows) == sorted(plan_rows), (sorted(rows), sorted(plan_rows)))
        for name, r in rows.items():
            p = plan_rows.get(name, {})
            check(f"training {name}: plan's max batch", r["max_batch"] == p.get("max_batch"), (r, p))
            check(f"training {name}: plan's peak reserved", r["peak_reserved_bytes"] == p.get("peak_reserved_bytes"),
                  (r, p))
        check("training: the run's own is defaults, OOM", [(r["strategy"], r["fits"], r["max_batch"]) for r in
              t["rows"] if r["own"]] == [("defaults", False, 0)], t["rows"])
        check("training: checkpointing fits in 26 MiB, first",
              [(r["strategy"], r["fits"], r["peak_reserved_bytes"]) for r in t["rows"][:2]] ==
              [("ckpt", True, 26 * MiB), ("ckpt exp", True, 26 * MiB)], t["rows"][:2])
        check("training: the fitting rows first", [r["fits"] for r in t["rows"]] == [True] * 6 + [False] * 6,
              t["rows"])
    # Without the OOM (64 MiB): saved is the own row's peak reserved less each row's.
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--device-memory", "64MiB", "--out", out_dir + "64")
    d = explain(out_dir + "64")
    if d:
        own = [r for r in d["training"]["rows"] if r["own"]]
        check("training 64 MiB: own defaults fits at 36 MiB, the explain baseline's peak",
              [(r["strategy"], r["peak_reserved_bytes"]) for r in own] == [("defaults", 36 * MiB)] and
              d["peak_reserved_bytes"] == 36 * MiB, (own, d["peak_reserved_bytes"]))
        check("training 64 MiB: ckpt saves 10 MiB", d["training"]["rows"][0]["saved_bytes"] == 10 * MiB,
              d["training"]["rows"][0])
    # A run whose option plan cannot reproduce: one note.
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--grad-accum", "2", "--out", out_dir + "ga")
    d = explain(out_dir + "ga")
    if d:
        check("grad accum: note", (d["training"], d["training_note"]) ==
              (None, "not listed: the run used --grad-accum, which memscope plan cannot reproduce"), d["training_note"])

# A private pool: the default pool's segments (a 20 MiB one holding a live 4 MiB block, a 56 MiB one freed) keep
# 72 MiB cached when a 40 MiB request in private pool (1, 2) runs out: its OOM releases only its own pool's cache
# (as PyTorch's release_cached_blocks with a mempool id), and 4 MiB is free on the 80 MiB the snapshot implies.
pool_snap = data("explain-pool.pickle")
with tempfile.TemporaryDirectory() as tmp:
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        MiB = 1 << 20
        A = 0x7F0000000000
        fr = [{"filename": "train.py", "line": 20, "name": "main"}]
        seg = {"device": 0, "address": A, "total_size": 60 * MiB, "allocated_size": 4 * MiB, "active_size": 4 * MiB,
               "requested_size": 4 * MiB, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
               "is_expandable": False, "frames": fr,
               "blocks": [{"address": A, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated", "frames": fr},
                          {"address": A + 4 * MiB, "size": 56 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]}
        trace = [{"action": "segment_alloc", "addr": A, "size": 60 * MiB, "stream": 0, "time_us": 1, "frames": fr},
                 {"action": "alloc", "addr": A, "size": 4 * MiB, "stream": 0, "time_us": 2, "frames": fr},
                 {"action": "alloc", "addr": A + 4 * MiB, "size": 56 * MiB, "stream": 0, "time_us": 3, "frames": fr},
                 {"action": "free_requested", "addr": A + 4 * MiB, "size": 56 * MiB, "stream": 0, "time_us": 4, "frames": fr},
                 {"action": "free_completed", "addr": A + 4 * MiB, "size": 56 * MiB, "stream": 0, "time_us": 4, "frames": fr},
                 {"action": "oom", "device_free": 20 * MiB, "size": 40 * MiB, "stream": 0, "time_us": 5, "frames": fr,
                  "pool_id": (1, 2)}]
        with open("pool.pickle", "wb") as f:
            pickle.dump({"segments": [seg], "device_traces": [trace], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None}},
                        f, protocol=4)
        with open("pool.pickle", "rb") as a, open(pool_snap, "rb") as b:
            check("private pool: explain-pool.pickle is this snapshot", a.read() == b.read())
    finally:
        os.chdir(cwd)
d = explain(pool_snap)
if d:
    o = d["oom"]
    check("private pool: cause and pool", (o["cause"], o["pool"], o["requested_bytes"], o["device_free"]) ==
          ("private_pool", [1, 2], 40 * MiB, 4 * MiB), o)
    check("private pool: the default pool's cache", o["cached_by_pool"] ==
          [{"pool": [0, 0], "cached_free_bytes": 72 * MiB, "largest_free_block": 56 * MiB}], o["cached_by_pool"])
    check("private pool: cause line", d["diagnosis"][1] ==
          "Cause: a private pool. The request was in private pool (1, 2) (a CUDA graph or torch.cuda.MemPool), which "
          "only its own cached blocks (0 bytes free) and new segments serve, and whose OOM releases only its own "
          "cache: 72.00 MiB was free in the other pools' cached blocks (the largest 56.00 MiB), which it cannot use, "
          "and the device had 4.00 MiB free, too little for a new segment of 40.00 MiB.", d["diagnosis"])
code, out, err = run("replay", pool_snap, "--json")
check("private pool: replay's OOM", code == 0 and json.loads(out)["runs"][0]["oom"]["request_index"] == 3, out + err)
code, out, err = run("replay", pool_snap)
check("private pool: replay says 72 MiB reserved but unallocated", "72.00 MiB is reserved by PyTorch but unallocated"
      in out, out)

# Bad input: one line, exit 2.
for args, expect in [(["/nonexistent.jsonl"], "memscope explain: "),
                     ([data("bad_json.jsonl")], "bad_json.jsonl:3: not valid JSON"),
                     ([cap, "--device-memory", "lots"], "memscope explain: --device-memory"),
                     ([cap, "--memory-fraction", "2"], "memscope explain: --memory-fraction 2: use 0 to 1"),
                     ([cap, "--alloc-conf", "max_split_size_mb:1"], "memscope explain: --alloc-conf"),
                     ([cap, "--rank", "-1"], "--rank must be 0 or more")]:
    code, out, err = run("explain", *args)
    check(f"bad {args}: exit 2", code == 2, (code, err))
    check(f"bad {args}: one line", err.count("\n") == 1 and expect in err, err)
    check(f"bad {args}: nothing on stdout", out == "", out)

finish("explain")
