#!/usr/bin/env python3
"""PyTorch 2.x snapshots in PyTorch's exact shape, written by Python's pickle:
frames lists shared between a block, its alloc entry and its segment (memo
references), empty_cache (segment_free), expandable segments (segment_map /
unmap), an OOM, two devices, protocols 0 to 5. Every subcommand reads each;
reserved bytes at the end are checked against the file's own segment list.

The traces follow PyTorch's allocator: a 1-10 MiB request gets a 20 MiB
segment (kLargeBuffer), a larger one a segment of its own rounded to 2 MiB;
empty_cache() releases the free segments smallest first (release_blocks walks
the pool ordered by size); expandable segments map 20 MiB pages of the large
pool."""
import json
import os
import pickle
import random
import shutil
import tempfile
import time

from clitest import MiB, check, finish, run  # noqa: E402

BASE = 0x7F0000000000


def entry(action, addr, size, t, frames, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames,
         "compile_context": "N/A", "user_metadata": "", "pool_id": (0, 0)}
    e.update(extra)
    return e


# Frame dicts shared between stacks, one list object per traceback (as
# torch/csrc/profiler/python/combined_traceback.cpp hands them out).
FR = [{"filename": "train.py", "line": 10 + k, "name": f"fn{k}"} for k in range(4)]
S1 = [FR[0], FR[1]]
S2 = [FR[0], FR[2], FR[3]]
EMPTY = []


def block(addr, size, requested, state, frames):
    return {"address": addr, "size": size, "requested_size": requested, "state": state, "frames": frames}


def segment(addr, total, blocks, device=0, expandable=False, frames=EMPTY):
    alloc = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {"device": device, "address": addr, "total_size": total, "allocated_size": alloc, "active_size": alloc,
            "requested_size": alloc, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": expandable, "frames": frames, "blocks": blocks}


def snapshot(segments, traces, conf=None, annotations=()):
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf, "max_split_size": -1,
                                   "expandable_segments": bool(conf and "expandable" in conf),
                                   "garbage_collection_threshold": 0.0, "roundup_power2_divisions": {"1": 0}},
            "external_annotations": list(annotations)}


def shared_frames():
    # S1 is one object in the segment, its first block and the alloc entry.
    tr = [entry("segment_alloc", BASE, 20 * MiB, 100, S1), entry("alloc", BASE, 6 * MiB, 100, S1),
          entry("alloc", BASE + 6 * MiB, 4 * MiB, 110, S2),
          entry("free_requested", BASE + 6 * MiB, 4 * MiB, 120, S2),
          entry("free_completed", BASE + 6 * MiB, 4 * MiB, 120, S2)]
    seg = segment(BASE, 20 * MiB, [block(BASE, 6 * MiB, 6 * MiB, "active_allocated", S1),
                                   block(BASE + 6 * MiB, 14 * MiB, 0, "inactive", EMPTY)], frames=S1)
    ann = [{"name": "forward:0", "stage": "START", "device": 0, "time_us": 100},
           {"name": "forward:0", "stage": "END", "device": 0, "time_us": 120}]
    return snapshot([seg], [tr], annotations=ann)


def many_shared_frames():
    # 150 allocations from 20 stacks of 12 frames drawn from 30 frame dicts
    # (one object each, shared as PyTorch's tracebacks share them), a third
    # of them freed.
    rng = random.Random(3)
    fr = [{"filename": f"/usr/lib/python3/dist-packages/torch/nn/modules/mod{k}.py", "line": 100 + k,
           "name": f"forward{k}"} for k in range(30)]
    stacks = [[fr[0], fr[1]] + [fr[rng.randrange(2, 30)] for _ in range(10)] for _ in range(20)]
    tr, blocks, addr = [entry("segment_alloc", BASE, 200 * MiB, 1000, stacks[0])], [], BASE
    for i in range(150):
        st, size, t = stacks[rng.randrange(20)], rng.randrange(1, 8) * 512 * 1024, 1001 + i
        tr.append(entry("alloc", addr, size, t, st))
        if i % 3 == 0:
            tr += [entry("free_requested", addr, size, t, st), entry("free_completed", addr, size, t, st)]
            blocks.append(block(addr, size, size, "inactive", EMPTY))
        else:
            blocks.append(block(addr, size, size, "active_allocated", st))
        addr += size
    blocks.append(block(addr, BASE + 200 * MiB - addr, 0, "inactive", EMPTY))
    return snapshot([segment(BASE, 200 * MiB, blocks, frames=stacks[0])], [tr])


SMALL_LARGE = 1048577  # the smallest large-pool request: a 20 MiB segment, 1,049,088 B blocks
MALLOC_FREES_SPLIT = [{"action": "alloc", "id": "a", "size": 70 * MiB}, {"action": "free", "id": "a"},
                      {"action": "alloc", "id": "b", "size": SMALL_LARGE}, {"action": "free", "id": "b"},
                      {"action": "alloc", "id": "c", "size": 45 * MiB},
                      {"action": "alloc", "id": "d", "size": SMALL_LARGE}]
MALLOC_FREES_RETRY = [{"action": "alloc", "id": "x", "size": 60 * MiB, "stream": 1}, {"action": "free", "id": "x"},
                      {"action": "alloc", "id": "y", "size": 50 * MiB}]


def malloc_frees_split():
    # PyTorch's trace of MALLOC_FREES_SPLIT under max_split_size_mb:40 on 100 MiB.
    s70, s20, s46 = BASE, BASE + 70 * MiB, BASE + 90 * MiB
    tr = [entry("segment_alloc", s70, 70 * MiB, 1, EMPTY), entry("alloc", s70, 70 * MiB, 1, S1),
          entry("free_requested", s70, 70 * MiB, 2, S1), entry("free_completed", s70, 70 * MiB, 2, S1),
          entry("segment_alloc", s20, 20 * MiB, 3, EMPTY), entry("alloc", s20, SMALL_LARGE, 3, S2),
          entry("free_requested", s20, SMALL_LARGE, 4, S2), entry("free_completed", s20, SMALL_LARGE, 4, S2),
          entry("segment_free", s70, 70 * MiB, 5, EMPTY), entry("segment_alloc", s46, 46 * MiB, 5, EMPTY),
          entry("alloc", s46, 45 * MiB, 5, S1), entry("alloc", s20, SMALL_LARGE, 6, S2)]
    segs = [segment(s20, 20 * MiB, [block(s20, 1049088, SMALL_LARGE, "active_allocated", S2),
                                    block(s20 + 1049088, 20 * MiB - 1049088, 0, "inactive", EMPTY)]),
            segment(s46, 46 * MiB, [block(s46, 46 * MiB, 45 * MiB, "active_allocated", S1)])]
    doc = snapshot(segs, [tr], conf="max_split_size_mb:40")
    doc["allocator_settings"]["max_split_size"] = 40 * MiB
    return doc


def malloc_frees_retry():
    # PyTorch's trace of MALLOC_FREES_RETRY with defaults on 100 MiB.
    s60, s50 = BASE, BASE + 60 * MiB
    tr = [entry("segment_alloc", s60, 60 * MiB, 1, EMPTY, stream=1), entry("alloc", s60, 60 * MiB, 1, S1, stream=1),
          entry("free_requested", s60, 60 * MiB, 2, S1, stream=1), entry("free_completed", s60, 60 * MiB, 2, S1, stream=1),
          entry("segment_free", s60, 60 * MiB, 3, EMPTY, stream=1), entry("segment_alloc", s50, 50 * MiB, 3, EMPTY),
          entry("alloc", s50, 50 * MiB, 3, S2)]
    return snapshot([segment(s50, 50 * MiB, [block(s50, 50 * MiB, 50 * MiB, "active_allocated", S2)])], [tr])


def empty_cache():
    a, b, c = BASE, BASE + 32 * MiB, BASE + 64 * MiB
    tr = [entry("segment_alloc", a, 30 * MiB, 1, S1), entry("alloc", a, 30 * MiB, 1, S1),
          entry("segment_alloc", b, 20 * MiB, 2, S2), entry("alloc", b, 6 * MiB, 2, S2),
          entry("free_requested", a, 30 * MiB, 3, S1), entry("free_completed", a, 30 * MiB, 3, S1),
          entry("free_requested", b, 6 * MiB, 4, S2), entry("free_completed", b, 6 * MiB, 4, S2),
          entry("segment_free", b, 20 * MiB, 5, EMPTY), entry("segment_free", a, 30 * MiB, 5, EMPTY),
          entry("segment_alloc", c, 20 * MiB, 6, S1), entry("alloc", c, 6 * MiB, 6, S1)]
    seg = segment(c, 20 * MiB, [block(c, 6 * MiB, 6 * MiB, "active_allocated", S1),
                                block(c + 6 * MiB, 14 * MiB, 0, "inactive", EMPTY)])
    return snapshot([seg], [tr])


def expandable():
    tr = [entry("segment_map", BASE, 20 * MiB, 1, S1), entry("alloc", BASE, 6 * MiB, 1, S1),
          entry("free_requested", BASE, 6 * MiB, 2, S1), entry("free_completed", BASE, 6 * MiB, 2, S1),
          entry("segment_unmap", BASE, 20 * MiB, 3, EMPTY),
          entry("segment_map", BASE, 40 * MiB, 4, S2), entry("alloc", BASE, 30 * MiB, 4, S2)]
    seg = segment(BASE, 40 * MiB, [block(BASE, 30 * MiB, 30 * MiB, "active_allocated", S2),
                                   block(BASE + 30 * MiB, 10 * MiB, 0, "inactive", EMPTY)], expandable=True)
    return snapshot([seg], [tr], conf="expandable_segments:True")


def oom():
    # 60 MiB reserved and 20 MiB free on the device: a 40 MiB request fails.
    tr = [entry("segment_alloc", BASE, 60 * MiB, 1, S1), entry("alloc", BASE, 60 * MiB, 1, S1),
          {"action": "oom", "device_free": 20 * MiB, "size": 40 * MiB, "stream": 0, "time_us": 2, "frames": S2}]
    seg = segment(BASE, 60 * MiB, [block(BASE, 60 * MiB, 60 * MiB, "active_allocated", S1)])
    return snapshot([seg], [tr])


def two_devices():
    b1 = BASE + (1 << 36)
    tr0 = [entry("segment_alloc", BASE, 20 * MiB, 1, S1), entry("alloc", BASE, 2 * MiB, 1, S1)]
    tr1 = [entry("segment_alloc", b1, 40 * MiB, 1, S2), entry("alloc", b1, 40 * MiB, 1, S2)]
    segs = [segment(BASE, 20 * MiB, [block(BASE, 2 * MiB, 2 * MiB, "active_allocated", S1),
                                     block(BASE + 2 * MiB, 18 * MiB, 0, "inactive", EMPTY)]),
            segment(b1, 40 * MiB, [block(b1, 40 * MiB, 40 * MiB, "active_allocated", S2)], device=1)]
    for t in tr1:
        t["device"] = 1
    return snapshot(segs, [tr0, tr1])


def mempool(released=False):
    # A torch.cuda.MemPool (id (0, 1)) beside the default pool. The default
    # pool cannot take the pool's free 20 MiB block: its 6 MiB request gets a
    # segment of its own (a replay that merged the pools would make none).
    # Deleting the MemPool (releasePool, emptyCache(id)) frees its segment.
    a, b, c = BASE, BASE + 32 * MiB, BASE + 64 * MiB
    tr = [entry("segment_alloc", a, 20 * MiB, 1, S1), entry("alloc", a, 8 * MiB, 1, S1),
          entry("alloc", a + 8 * MiB, 8 * MiB, 2, S2),
          entry("segment_alloc", b, 20 * MiB, 3, S2, pool_id=P), entry("alloc", b, 4 * MiB, 3, S2, pool_id=P),
          entry("free_requested", b, 4 * MiB, 4, S2, pool_id=P), entry("free_completed", b, 4 * MiB, 4, S2, pool_id=P),
          entry("segment_alloc", c, 20 * MiB, 5, S1), entry("alloc", c, 6 * MiB, 5, S1),
          entry("alloc", b, 2 * MiB, 6, S2, pool_id=P)]
    segs = [segment(a, 20 * MiB, [block(a, 8 * MiB, 8 * MiB, "active_allocated", S1),
                                  block(a + 8 * MiB, 8 * MiB, 8 * MiB, "active_allocated", S2),
                                  block(a + 16 * MiB, 4 * MiB, 0, "inactive", EMPTY)]),
            segment(c, 20 * MiB, [block(c, 6 * MiB, 6 * MiB, "active_allocated", S1),
                                  block(c + 6 * MiB, 14 * MiB, 0, "inactive", EMPTY)])]
    pool_seg = segment(b, 20 * MiB, [block(b, 2 * MiB, 2 * MiB, "active_allocated", S2),
                                     block(b + 2 * MiB, 18 * MiB, 0, "inactive", EMPTY)])
    pool_seg["segment_pool_id"] = P
    if released:
        tr += [entry("free_requested", b, 2 * MiB, 7, S2, pool_id=P),
               entry("free_completed", b, 2 * MiB, 7, S2, pool_id=P),
               entry("segment_free", b, 20 * MiB, 8, EMPTY, pool_id=P)]
    else:
        segs.insert(1, pool_seg)
    return snapshot(segs, [tr])


P = (0, 1)


def reserved_by_device(doc):
    out = {}
    for s in doc["segments"]:
        out[s["device"]] = out.get(s["device"], 0) + s["total_size"]
    return out


tmp = tempfile.mkdtemp(prefix="memscope-torch-")
try:
    cases = [("shared", shared_frames(), (2, 4, 5)), ("empty_cache", empty_cache(), (4,)),
             ("expandable", expandable(), (5,)), ("oom", oom(), (4,)), ("two_devices", two_devices(), (2,)),
             ("mempool", mempool(), (2, 4, 5)), ("mempool_released", mempool(released=True), (4,))]
    # (peak allocated per device, number of segment actions --verify checks)
    expect = {"shared": ({0: 10 * MiB}, "all 1 segment actions match, in order (1 segment_alloc)"),
              "empty_cache": ({0: 36 * MiB}, "all 5 segment actions match, in order (3 segment_alloc, 2 segment_free)"),
              "expandable": ({0: 30 * MiB}, "all 3 segment actions match, in order (2 segment_map, 1 segment_unmap)"),
              "oom": ({0: 60 * MiB}, "all 1 segment actions match, in order (1 segment_alloc)"),
              "two_devices": ({0: 2 * MiB, 1: 40 * MiB}, "all 1 segment actions match, in order (1 segment_alloc)"),
              "mempool": ({0: 24 * MiB}, "all 3 segment actions match, in order (3 segment_alloc)"),
              "mempool_released": ({0: 24 * MiB},
                                   "all 4 segment actions match, in order (3 segment_alloc, 1 segment_free)")}
    for name, doc, protocols in cases:
        for proto in protocols:
            path = os.path.join(tmp, f"{name}-p{proto}.pickle")
            with open(path, "wb") as f:
                pickle.dump(doc, f, protocol=proto)
            tag = f"{name} p{proto}"
            peaks, verify = expect[name]
            code, out, err = run("summary", path, "--json")
            check(f"{tag} summary", code == 0, err)
            if code == 0:
                ranks = json.loads(out)["ranks"]
                got = {r["rank"]: r["peak"]["allocated"]["bytes"] for r in ranks}
                check(f"{tag} peaks", got == peaks, got)
            code, out, err = run("frag", path, "--json")
            check(f"{tag} frag", code == 0, err)
            if code == 0:
                got = {r["rank"]: r["fragmentation"]["reserved_bytes"] for r in json.loads(out)["ranks"]}
                check(f"{tag} reserved = the file's segment list", got == reserved_by_device(doc),
                      (got, reserved_by_device(doc)))
            code, out, err = run("replay", path, "--verify")
            check(f"{tag} verify", code == 0 and verify in out, (code, out, err))
            code, out, err = run("trace", path, "-o", os.path.join(tmp, f"{name}.json"))
            check(f"{tag} trace", code == 0, err)
            code, out, err = run("report", path, "-o", os.path.join(tmp, f"{name}.html"))
            check(f"{tag} report", code == 0, err)
            code, out, err = run("replay", path, "--json")
            check(f"{tag} replay", code == 0, err)

    path = os.path.join(tmp, "shared-p4.pickle")
    code, out, err = run("summary", path, "--json")
    if code == 0:
        check("annotations as phases", [p["phase"] for p in json.loads(out)["ranks"][0]["phases"]] == ["forward"], out)
    # The OOM snapshot replays on the capacity its oom entry implies (60 MiB
    # reserved + 20 MiB free) and fails there, as PyTorch did.
    code, out, err = run("summary", os.path.join(tmp, "oom-p4.pickle"))
    check("oom capacity note", "the device had 80.00 MiB for this process" in err and
          "simulated GPU of 80.00 MiB" in err, err)
    check("oom replayed", "OOM: request of 40.00 MiB; the device had 20.00 MiB free" in out, out)
    code, out, err = run("summary", os.path.join(tmp, "two_devices-p2.pickle"), "--rank", "1", "--json")
    check("device 1", code == 0 and [r["rank"] for r in json.loads(out)["ranks"]] == [1], (code, out[:200], err))

    # Private pools: bytes by pool at the end, the file's segment_pool_id and
    # pool_id written back by `memscope snapshot`.
    for name, want_pool in (("mempool", {"pool_id": [0, 1], "reserved": 20 * MiB, "allocated": 2 * MiB,
                                         "segments": 1}),
                            ("mempool_released", {"pool_id": [0, 1], "reserved": 0, "allocated": 0, "segments": 0})):
        path = os.path.join(tmp, f"{name}-p4.pickle")
        code, out, err = run("frag", path, "--json")
        pools = json.loads(out)["ranks"][0].get("pools") if code == 0 else None
        want = [{"pool_id": [0, 0], "reserved": 40 * MiB, "allocated": 22 * MiB, "segments": 2}, want_pool]
        check(f"{name}: bytes by pool", pools == want, (pools, err))
        check(f"{name}: pools note", "the replay keeps each pool's blocks and segments apart" in err, err)
        code, out, err = run("frag", path)
        check(f"{name}: frag text by pool", code == 0 and "by pool:\n  default pool (0, 0): reserved 40.00 MiB in 2 "
              "segments, allocated 22.00 MiB\n  private pool (0, 1): " in out, out)
        code, out, err = run("summary", path, "--json")
        pools = json.loads(out)["at"][0].get("pools") if code == 0 else None
        check(f"{name}: summary bytes by pool", pools == want, pools)
        check(f"{name}: report.json's pools_at_end", code == 0 and json.loads(out)["ranks"][0].get("pools_at_end") == want,
              out[:300])
        back = os.path.join(tmp, f"{name}-back.pickle")
        code, out, err = run("snapshot", path, "-o", back)
        check(f"{name}: snapshot", code == 0, err)
        with open(back, "rb") as f:
            again = pickle.load(f)
        doc = mempool(released=name == "mempool_released")
        got = [(s["address"], s["segment_pool_id"]) for s in again["segments"]]
        want = [(s["address"], s["segment_pool_id"]) for s in doc["segments"]]
        check(f"{name}: segment_pool_id written back", got == want, (got, want))
        got = [(e["action"], e["addr"], e.get("pool_id", (0, 0))) for e in again["device_traces"][0]]
        want = [(e["action"], e["addr"], e["pool_id"]) for e in doc["device_traces"][0]]
        check(f"{name}: pool_id written back", got == want, (got, want))

    # A private pool's request runs while captures_underway is not empty: it
    # cannot free the default pool's cache to retry. An OOM entry in pool P
    # (70 MiB, 20 MiB free on the device, 80 MiB cached in the default pool)
    # is an OOM in the replay too.
    d = BASE
    tr = [entry("segment_alloc", d, 80 * MiB, 1, S1), entry("alloc", d, 80 * MiB, 1, S1),
          entry("free_requested", d, 80 * MiB, 2, S1), entry("free_completed", d, 80 * MiB, 2, S1),
          {"action": "oom", "device_free": 20 * MiB, "size": 70 * MiB, "stream": 0, "time_us": 3, "frames": S2,
           "pool_id": P}]
    seg = segment(d, 80 * MiB, [block(d, 80 * MiB, 0, "inactive", EMPTY)])
    path = os.path.join(tmp, "pool-oom.pickle")
    with open(path, "wb") as f:
        pickle.dump(snapshot([seg], [tr]), f, protocol=4)
    code, out, err = run("summary", path, "--json")
    oom = json.loads(out)["ranks"][0]["oom"] if code == 0 else None
    check("pool OOM replayed as an OOM", oom is not None and oom["requested_bytes"] == 70 * MiB, (oom, err))

    # max_split_size set: release_available_cached_blocks frees a live pool's
    # oversize cached block inside its next allocation (a segment_free of the
    # pool that is not its release). The pool stays live: the later
    # empty_cache frees the default pool's segment, not the pool's.
    a, d, b = BASE, BASE + 128 * MiB, BASE + 256 * MiB
    tr = [entry("segment_alloc", a, 60 * MiB, 1, S1, pool_id=P), entry("alloc", a, 60 * MiB, 1, S1, pool_id=P),
          entry("free_requested", a, 60 * MiB, 2, S1, pool_id=P), entry("free_completed", a, 60 * MiB, 2, S1, pool_id=P),
          entry("segment_alloc", d, 30 * MiB, 3, S2), entry("alloc", d, 30 * MiB, 3, S2),
          entry("segment_free", a, 60 * MiB, 4, EMPTY, pool_id=P),
          entry("segment_alloc", b, 22 * MiB, 4, S1, pool_id=P), entry("alloc", b, 22 * MiB, 4, S1, pool_id=P),
          {"action": "oom", "device_free": 48 * MiB, "size": 80 * MiB, "stream": 0, "time_us": 5, "frames": S2,
           "pool_id": (0, 0)},
          entry("free_requested", b, 22 * MiB, 6, S1, pool_id=P), entry("free_completed", b, 22 * MiB, 6, S1, pool_id=P),
          entry("free_requested", d, 30 * MiB, 6, S2), entry("free_completed", d, 30 * MiB, 6, S2),
          entry("segment_free", d, 30 * MiB, 7, EMPTY)]
    seg = segment(b, 22 * MiB, [block(b, 22 * MiB, 0, "inactive", EMPTY)])
    seg["segment_pool_id"] = P
    doc = snapshot([seg], [tr])
    doc["allocator_settings"]["max_split_size"] = 20 * MiB
    path = os.path.join(tmp, "pool-maxsplit.pickle")
    with open(path, "wb") as f:
        pickle.dump(doc, f, protocol=4)
    code, out, err = run("replay", path, "--verify")
    check("max_split_size frees a live pool's block, not its release",
          code == 0 and "all 5 segment actions match, in order (3 segment_alloc, 2 segment_free)" in out, (out, err))
    code, out, err = run("frag", path, "--json")
    pools = json.loads(out)["ranks"][0].get("pools") if code == 0 else None
    check("the live pool keeps its segment", pools == [
        {"pool_id": [0, 0], "reserved": 0, "allocated": 0, "segments": 0},
        {"pool_id": [0, 1], "reserved": 22 * MiB, "allocated": 0, "segments": 1}], (pools, err))

    # A private pool's segment address reused by a default-pool segment: its
    # later segment_free (pool_id (0, 0)) is an empty_cache of the default pool.
    X, Y, Q = BASE, BASE + 64 * MiB, (0, 2)
    tr = [entry("segment_alloc", X, 20 * MiB, 1, S1, pool_id=P), entry("alloc", X, 2 * MiB, 1, S1, pool_id=P),
          entry("free_requested", X, 2 * MiB, 2, S1, pool_id=P), entry("free_completed", X, 2 * MiB, 2, S1, pool_id=P),
          entry("segment_free", X, 20 * MiB, 3, EMPTY, pool_id=P),
          entry("segment_alloc", X, 20 * MiB, 4, S1), entry("alloc", X, 2 * MiB, 4, S1),
          entry("free_requested", X, 2 * MiB, 5, S1), entry("free_completed", X, 2 * MiB, 5, S1),
          entry("segment_alloc", Y, 20 * MiB, 6, S2, pool_id=Q), entry("alloc", Y, 2 * MiB, 6, S2, pool_id=Q),
          entry("free_requested", Y, 2 * MiB, 7, S2, pool_id=Q), entry("free_completed", Y, 2 * MiB, 7, S2, pool_id=Q),
          entry("segment_free", Y, 20 * MiB, 8, EMPTY, pool_id=Q),
          entry("segment_free", X, 20 * MiB, 8, EMPTY)]
    path = os.path.join(tmp, "pool-reused.pickle")
    with open(path, "wb") as f:
        pickle.dump(snapshot([], [tr]), f, protocol=4)
    code, out, err = run("replay", path, "--verify")
    check("reused address: default empty_cache",
          code == 0 and "all 6 segment actions match, in order (3 segment_alloc, 3 segment_free)" in out, (out, err))

    # A snapshot without a trace: its segments' pools are shown and written back.
    seg = segment(BASE, 20 * MiB, [block(BASE, 2 * MiB, 2 * MiB, "active_allocated", S2),
                                   block(BASE + 2 * MiB, 18 * MiB, 0, "inactive", EMPTY)])
    seg["segment_pool_id"] = P
    path = os.path.join(tmp, "pool-state.pickle")
    with open(path, "wb") as f:
        pickle.dump(snapshot([seg], []), f, protocol=4)
    code, out, err = run("frag", path, "--json")
    pools = json.loads(out)["ranks"][0].get("pools") if code == 0 else None
    check("state only: bytes by pool", pools == [
        {"pool_id": [0, 0], "reserved": 0, "allocated": 0, "segments": 0},
        {"pool_id": [0, 1], "reserved": 20 * MiB, "allocated": 2 * MiB, "segments": 1}], (pools, err))
    back = os.path.join(tmp, "pool-state-back.pickle")
    code, out, err = run("snapshot", path, "-o", back)
    with open(back, "rb") as f:
        again = pickle.load(f)
    check("state only: segment_pool_id written back", [s["segment_pool_id"] for s in again["segments"]] == [P],
          again["segments"])

    # The file's own times are kept: exported again, the trace has the same time_us.
    back = os.path.join(tmp, "back.pickle")
    code, out, err = run("snapshot", os.path.join(tmp, "shared-p4.pickle"), "-o", back)
    check("snapshot of a snapshot", code == 0, err)
    with open(back, "rb") as f:
        again = pickle.load(f)
    got = [(e["action"], e["time_us"]) for e in again["device_traces"][0]]
    want = [(e["action"], e["time_us"]) for e in shared_frames()["device_traces"][0]]
    check("time_us kept", got == want, (got, want))
    check("annotation times kept", [(a["name"], a["stage"], a["time_us"]) for a in again["external_annotations"]] ==
          [("forward:0", "START", 100), ("forward:0", "END", 120)], again["external_annotations"])

    # Segment entries and segments carry the frames of the allocation that
    # made them, as PyTorch writes them (the cudaMalloc's context); a
    # segment_free / segment_unmap those of its segment's segment_alloc /
    # segment_map, as release_block writes when the free has no context of
    # its own (`context ? context : block->context_when_segment_allocated`:
    # these files' empty_cache entries carry none).
    for name, proto, doc in [("shared", 4, shared_frames()), ("empty_cache", 4, empty_cache()),
                             ("expandable", 5, expandable())]:
        back = os.path.join(tmp, f"{name}-segment-frames.pickle")
        code, out, err = run("snapshot", os.path.join(tmp, f"{name}-p{proto}.pickle"), "-o", back, "--at", "exit")
        check(f"{name}: snapshot", code == 0, err)
        with open(back, "rb") as f:
            again = pickle.load(f)
        got = [(e["action"], e["frames"]) for e in again["device_traces"][0] if e["action"].startswith("segment")]
        made, want = {}, []
        for e in doc["device_traces"][0]:
            if e["action"] in ("segment_alloc", "segment_map"):
                made[e["addr"]] = e["frames"]
            if e["action"].startswith("segment"):
                want.append((e["action"], e["frames"] or made.get(e["addr"], [])))
        check(f"{name}: segment entries carry their allocation's frames", got == want, (got, want))
        # shared: the segment's own frames in the file; empty_cache: the
        # segment made after empty_cache(), by the S1 allocation; expandable:
        # the range mapped again after its unmap, by the S2 allocation.
        want = {"shared": [S1], "empty_cache": [S1], "expandable": [S2]}[name]
        check(f"{name}: a segment carries the frames of the allocation that made it",
              [s["frames"] for s in again["segments"]] == want, again["segments"])

    # The file's own addresses: segments where its segment_alloc / segment_map
    # entries put them, so the allocator's splits give every block the
    # address of its alloc entry (a base unlike memscope's own 0x7f0000000000,
    # two segments 1 GiB apart, a reused block, an expandable segment).
    A, B = 0x7F3A00000000, 0x7F3A40000000
    tr = [entry("segment_alloc", A, 20 * MiB, 1, S1), entry("alloc", A, 6 * MiB, 1, S1),
          entry("alloc", A + 6 * MiB, 4 * MiB, 2, S2), entry("segment_alloc", B, 30 * MiB, 3, S1),
          entry("alloc", B, 30 * MiB, 3, S1), entry("free_requested", A, 6 * MiB, 4, S1),
          entry("free_completed", A, 6 * MiB, 4, S1), entry("alloc", A, 4 * MiB, 5, S2)]
    segs = [segment(A, 20 * MiB, [block(A, 4 * MiB, 4 * MiB, "active_allocated", S2),
                                  block(A + 4 * MiB, 2 * MiB, 0, "inactive", EMPTY),
                                  block(A + 6 * MiB, 4 * MiB, 4 * MiB, "active_allocated", S2),
                                  block(A + 10 * MiB, 10 * MiB, 0, "inactive", EMPTY)]),
            segment(B, 30 * MiB, [block(B, 30 * MiB, 30 * MiB, "active_allocated", S1)])]
    E = 0x7F3B00000000
    etr = [entry("segment_map", E, 20 * MiB, 1, S1), entry("alloc", E, 6 * MiB, 1, S1),
           entry("alloc", E + 6 * MiB, 20 * MiB, 2, S2), entry("segment_map", E + 20 * MiB, 20 * MiB, 2, S2)]
    etr[2], etr[3] = etr[3], etr[2]  # PyTorch maps the page before it hands out the block
    esegs = [segment(E, 40 * MiB, [block(E, 6 * MiB, 6 * MiB, "active_allocated", S1),
                                   block(E + 6 * MiB, 20 * MiB, 20 * MiB, "active_allocated", S2),
                                   block(E + 26 * MiB, 14 * MiB, 0, "inactive", EMPTY)], expandable=True)]
    for name, doc in (("addresses", snapshot(segs, [tr])),
                      ("expandable addresses", snapshot(esegs, [etr], conf="expandable_segments:True"))):
        path = os.path.join(tmp, "addr.pickle")
        with open(path, "wb") as f:
            pickle.dump(doc, f, protocol=4)
        back = os.path.join(tmp, "addr-back.pickle")
        code, out, err = run("snapshot", path, "-o", back, "--at", "exit")
        check(f"{name}: snapshot", code == 0, err)
        with open(back, "rb") as f:
            again = pickle.load(f)
        got = [(e["action"], e["addr"], e["size"]) for e in again["device_traces"][0]]
        want = [(e["action"], e["addr"], e["size"]) for e in doc["device_traces"][0]]
        check(f"{name}: trace addresses are the file's", got == want, (got, want))
        got = [(s["address"], s["total_size"], [(b["address"], b["size"], b["state"]) for b in s["blocks"]])
               for s in again["segments"]]
        want = [(s["address"], s["total_size"], [(b["address"], b["size"], b["state"]) for b in s["blocks"]])
                for s in doc["segments"]]
        check(f"{name}: segments and blocks at the file's addresses", got == want, (got, want))
        check(f"{name}: no address note", "addresses were not taken" not in err, err)
        code, out, err = run("replay", path, "--verify")
        check(f"{name}: verify", code == 0, (out, err))

    # Categories and owners from stacks (frames innermost first, as PyTorch
    # records them): a parameter made by module.to(), an activation under a
    # module's forward, a gradient from the autograd engine, Adam's state.
    T = "/usr/lib/python3/dist-packages/torch/"
    def fr(file, line, name):
        return {"filename": file, "line": line, "name": name}
    param = [fr(T + "nn/modules/module.py", 1160, "to"), fr("/work/train.py", 12, "main")]
    act = [fr(T + "nn/functional.py", 2000, "linear"), fr(T + "nn/modules/linear.py", 116, "forward"),
           fr(T + "nn/modules/module.py", 1527, "_call_impl"), fr("/work/model.py", 40, "forward"),
           fr("/work/train.py", 20, "main")]
    grad = [fr("torch/csrc/autograd/engine.cpp", 0, "torch::autograd::Engine::evaluate_function"),
            fr(T + "autograd/__init__.py", 251, "backward"), fr(T + "_tensor.py", 492, "backward"),
            fr("/work/train.py", 22, "main")]
    adam = [fr(T + "optim/adam.py", 94, "_init_group"), fr(T + "optim/adam.py", 140, "step"),
            fr("/work/train.py", 23, "main")]
    other = [fr("/work/train.py", 30, "main")]
    addrs = [BASE + k * 2 * MiB for k in range(5)]
    tr = [entry("segment_alloc", BASE, 20 * MiB, 1, EMPTY)]
    for k, (st, t) in enumerate([(param, 1), (act, 2), (grad, 3), (adam, 4), (other, 5)]):
        tr.append(entry("alloc", addrs[k], (k + 1) * 512 * 1024 // 512 * 512, t, st))
    path = os.path.join(tmp, "stacks.pickle")
    with open(path, "wb") as f:
        pickle.dump(snapshot([], [tr]), f, protocol=4)
    code, out, err = run("summary", path, "--json")
    check("stacks summary", code == 0, err)
    if code == 0:
        peak = json.loads(out)["ranks"][0]["peak"]["allocated"]
        cats = {k: v for k, v in peak["by_category"].items() if v}
        KiB = 1024
        check("categories from stacks", cats == {"PARAMETER": 512 * KiB, "ACTIVATION": 1024 * KiB,
                                                 "GRADIENT": 1536 * KiB, "OPTIMIZER_STATE": 2048 * KiB,
                                                 "OTHER": 2560 * KiB}, cats)
        owners = {o["owner"]: o["bytes"] for o in peak["top_owners"]}
        check("owners from stacks", owners.get("/work/model.py:40 forward") == 1024 * KiB and
              owners.get("/work/train.py:23 main") == 2048 * KiB and owners.get("/work/train.py:12 main") == 512 * KiB,
              owners)
        check("stacks note", "5 allocations carry stacks; categories from them for 4" in err, err)
        # The top allocation sites at the peak: bytes by stack, the user's
        # frames innermost first (memray's table).
        sites = [(s["site"], s["bytes"], s["allocations"]) for s in peak["top_sites"]]
        check("top sites from stacks", sites == [("/work/train.py:30 main", 2560 * KiB, 1),
                                                 ("/work/train.py:23 main", 2048 * KiB, 1),
                                                 ("/work/train.py:22 main", 1536 * KiB, 1),
                                                 ("/work/model.py:40 forward <- /work/train.py:20 main", 1024 * KiB, 1),
                                                 ("/work/train.py:12 main", 512 * KiB, 1)], sites)
    code, out, err = run("summary", path)
    check("top sites in summary", code == 0 and
          "  top allocation sites at the peak (bytes, allocations, site):\n"
          "      2.50 MiB       1  /work/train.py:30 main\n"
          "      2.00 MiB       1  /work/train.py:23 main\n"
          "      1.50 MiB       1  /work/train.py:22 main\n"
          "   1024.00 KiB       1  /work/model.py:40 forward <- /work/train.py:20 main\n"
          "    512.00 KiB       1  /work/train.py:12 main\n" in out, out)
    # Exported again, each allocation carries its own frames, unchanged.
    back = os.path.join(tmp, "stacks-back.pickle")
    code, out, err = run("snapshot", path, "-o", back, "--at", "exit")
    check("stacks snapshot", code == 0, err)
    with open(back, "rb") as f:
        again = pickle.load(f)
    got = [(e["size"], e["frames"]) for e in again["device_traces"][0] if e["action"] == "alloc"]
    want = [(e["size"], e["frames"]) for e in tr if e["action"] == "alloc"]
    check("frames written back unchanged", got == want, (got, want))
    blocks = sorted((b["requested_size"], b["frames"]) for s in again["segments"] for b in s["blocks"]
                    if b["state"] != "inactive")
    check("block frames written back", blocks == want, blocks)
    code, out, err = run("summary", back, "--json")
    if code == 0:
        peak2 = json.loads(out)["ranks"][0]["peak"]["allocated"]
        check("stacks round trip", peak2["top_sites"] == peak["top_sites"] and
              peak2["by_category"] == peak["by_category"], (peak2, peak))

    # replay --out records the snapshot into a run directory: its outputs
    # (report.json, summary.txt, the snapshot at the peak) carry the
    # snapshot's stacks as `summary` of the file does (issue 15).
    rundir = os.path.join(tmp, "stacks-run")
    code, out, err = run("replay", path, "--out", rundir, "--no-search")
    check("stacks replay --out", code == 0, err)
    with open(os.path.join(rundir, "report.json")) as f:
        peak3 = json.load(f)["ranks"][0]["peak"]["allocated"]
    check("replay --out: report.json top sites from the stacks", peak3["top_sites"] == peak["top_sites"],
          (peak3["top_sites"], peak["top_sites"]))
    with open(os.path.join(rundir, "summary.txt")) as f:
        summary_text = f.read()
    check("replay --out: summary.txt top sites", "      2.50 MiB       1  /work/train.py:30 main\n" in summary_text,
          summary_text)
    with open(os.path.join(rundir, "snapshot-rank-0.pickle"), "rb") as f:
        at_peak = pickle.load(f)
    got = [(e["size"], e["frames"]) for e in at_peak["device_traces"][0] if e["action"] == "alloc"]
    check("replay --out: the snapshot's allocations carry their frames", len(got) == len(want) and got == want,
          (got, want))

    code, out, err = run("summary", os.path.join(tmp, "oom-p4.pickle"), "--json")
    if code == 0:
        oom_sites = json.loads(out)["ranks"][0]["oom"]["top_sites"]
        check("top sites at the OOM", oom_sites == [{"site": "train.py:10 fn0 <- train.py:11 fn1", "bytes": 60 * MiB,
                                                     "allocations": 1}], oom_sites)
    code, out, err = run("summary", os.path.join(tmp, "oom-p4.pickle"))
    check("top sites at the OOM in summary", "  top allocation sites at the OOM (bytes, allocations, site):\n"
          "     60.00 MiB       1  train.py:10 fn0 <- train.py:11 fn1\n" in out, out)
    code, out, err = run("frag", os.path.join(tmp, "shared-p4.pickle"), "--at", "exit")
    check("frag pinned by stack", "pinned by OTHER train.py:10 fn0 <- train.py:11 fn1 6.00 MiB" in out, out)

    # memscope's own snapshots carry a frame per allocation made of its owner
    # and category, so a run's snapshot reads back with the run's categories
    # and owners at the peak.
    rundir = os.path.join(tmp, "run")
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--out", rundir)
    check("run", code == 0, err)
    code, a, err = run("summary", rundir, "--json")
    code2, b, err2 = run("summary", os.path.join(rundir, "snapshot-rank-0.pickle"), "--json")
    check("own snapshot summary", code == 0 and code2 == 0, (err, err2))
    if code == 0 and code2 == 0:
        pa, pb = json.loads(a)["ranks"][0]["peak"]["allocated"], json.loads(b)["ranks"][0]["peak"]["allocated"]
        check("categories round trip", pa["by_category"] == pb["by_category"], (pa, pb))
        check("owners round trip", pa["top_owners"] == pb["top_owners"], (pa["top_owners"], pb["top_owners"]))
    with open(os.path.join(rundir, "snapshot-rank-0.pickle"), "rb") as f:
        own = pickle.load(f)
    first = next(e for e in own["device_traces"][0] if e["action"] == "alloc")
    check("own frames", len(first["frames"]) == 1 and first["frames"][0]["name"].startswith("memscope ") and
          first["frames"][0]["line"] == 0, first)

    # --max-entries keeps the last N trace entries, like PyTorch's ring
    # buffer; the truncated snapshot reads back, its missing head said.
    ring = os.path.join(tmp, "ring.pickle")
    code, out, err = run("snapshot", rundir, "-o", ring, "--max-entries", "10")
    check("snapshot --max-entries", code == 0, err)
    with open(ring, "rb") as f:
        ring_doc = pickle.load(f)
    code, out, err = run("snapshot", rundir, "-o", os.path.join(tmp, "full.pickle"))
    with open(os.path.join(tmp, "full.pickle"), "rb") as f:
        full = pickle.load(f)
    check("ring buffer keeps the last 10", ring_doc["device_traces"][0] == full["device_traces"][0][-10:],
          (len(ring_doc["device_traces"][0]), len(full["device_traces"][0])))
    check("ring buffer keeps the segments", ring_doc["segments"] == full["segments"])
    code, out, err = run("frag", ring, "--json")
    check("truncated ring frag", code == 0 and "does not start at the beginning" in err, (code, err))

    # Unknown actions and fields are counted and named in a note, never fatal.
    doc = shared_frames()
    doc["device_traces"][0].insert(0, {"action": "teleport", "addr": 0, "size": 0, "stream": 0, "time_us": 1,
                                       "frames": [], "colour": "red"})
    path = os.path.join(tmp, "unknown.pickle")
    with open(path, "wb") as f:
        pickle.dump(doc, f, protocol=4)
    code, out, err = run("summary", path)
    check("unknown action note", code == 0 and "actions memscope does not model were skipped: teleport (1)" in err
          and "fields memscope does not read: colour (1)" in err, (code, err))

    # Re-exporting keeps PyTorch's sharing: each frames list and each frame
    # dict is pickled once and referred to (the memo), so the export stays
    # the size of the file it came from: 18,783 B from 28,287 B (without the
    # memo 486,120 B, 17.2x).
    path = os.path.join(tmp, "many.pickle")
    with open(path, "wb") as f:
        pickle.dump(many_shared_frames(), f, protocol=4)
    again = os.path.join(tmp, "many-again.pickle")
    code, out, err = run("snapshot", path, "-o", again)
    size_in, size_out = os.path.getsize(path), os.path.getsize(again)
    check("re-export within 1.2x of the input", code == 0 and size_out <= 1.2 * size_in, (code, size_in, size_out, err))
    with open(again, "rb") as f:
        back = pickle.load(f)
    entries = back["device_traces"][0]
    live, frees, shared = {}, 0, 0
    for e in entries:
        if e["action"] == "alloc":
            live[e["addr"]] = e["frames"]
        elif e["action"] in ("free_requested", "free_completed"):
            frees += 1
            shared += e["frames"] is live[e["addr"]]
    check("a free's frames list is its allocation's (one object)", frees == 100 and shared == frees, (frees, shared))
    want = [e["frames"] for e in many_shared_frames()["device_traces"][0] if e["action"] == "alloc"]
    got = [e["frames"] for e in entries if e["action"] == "alloc"]
    check("the frames are the file's, allocation by allocation", got == want, (len(got), len(want)))
    frames = [f for fs in got for f in fs]
    check("one dict per distinct frame", len({id(f) for f in frames}) == len({tuple(f.items()) for f in frames}) == 30,
          (len({id(f) for f in frames}), len({tuple(f.items()) for f in frames})))

    # Segment frees inside a malloc (checked cases of issue 33): with
    # max_split_size_mb:40 on a 100 MiB device, a 45 MiB request frees the
    # cached 70 MiB segment only (release_available_cached_blocks) and a
    # later 1 MiB + 1 B request reuses the cached 20 MiB one; with defaults,
    # a segment cached on stream 1 is freed by the free-and-retry of a
    # request on stream 0 (num_alloc_retries 1). Each snapshot replays as the
    # same requests given as JSON lines do.
    def stats(args):
        out_dir = os.path.join(tmp, "mf-" + str(abs(hash(tuple(args)))))
        code, out, err = run("replay", *args, "--device-memory", "100MiB", "--out", out_dir)
        check(f"replay {args[0]}", code == 0, err)
        code, out, err = run("summary", out_dir, "--json")
        m = json.loads(out)["ranks"][0]["memory_stats"]
        return (m["num_alloc_retries"], m["num_device_alloc"], m["num_device_free"], m["segment.all.current"],
                m["reserved_bytes.all.current"])
    for name, doc, requests, conf, want in [
            ("split", malloc_frees_split(), MALLOC_FREES_SPLIT, ["--alloc-conf", "max_split_size_mb:40"],
             (0, 3, 1, 2, 66 * MiB)),
            ("retry", malloc_frees_retry(), MALLOC_FREES_RETRY, [], (1, 2, 1, 1, 50 * MiB))]:
        path, jsonl = os.path.join(tmp, f"{name}.pickle"), os.path.join(tmp, f"{name}.jsonl")
        with open(path, "wb") as f:
            pickle.dump(doc, f, protocol=4)
        with open(jsonl, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in requests))
        check(f"{name}: the JSON-lines requests replay as PyTorch does", stats([jsonl, *conf]) == want,
              stats([jsonl, *conf]))
        check(f"{name}: the snapshot replays the same", stats([path]) == want, stats([path]))
        code, out, err = run("replay", path, "--device-memory", "100MiB", "--verify")
        check(f"{name}: --verify with the device's capacity", code == 0 and
              "1 run of segment frees right before a new segment: 1 could not have fit on the 100.00 MiB device, "
              "so PyTorch freed inside that malloc" in err, (code, out, err))
    code, out, err = run("replay", os.path.join(tmp, "split.pickle"), "--verify")
    check("split: without the capacity, one line says it is ambiguous and the frees stay an empty_cache()",
          code == 1 and [x for x in err.splitlines() if "segment frees" in x] ==
          ["memscope: note: 1 run of segment frees right before a new segment: an empty_cache() or PyTorch's frees "
           "inside that malloc (max_split_size_mb's release of a cached block, or the free-and-retry after a failed "
           "cudaMalloc); without the device's capacity (an oom entry or --device-memory) they are replayed as "
           "empty_cache()"], (code, out, err))

    # Protocols 0 and 1 (no PROTO opcode) are recognised as pickles.
    for proto in (0, 1):
        path = os.path.join(tmp, f"shared-p{proto}.pickle")
        with open(path, "wb") as f:
            pickle.dump(shared_frames(), f, protocol=proto)
        code, out, err = run("summary", path, "--json")
        check(f"protocol {proto}", code == 0 and json.loads(out)["ranks"][0]["peak"]["allocated"]["bytes"] == 10 * MiB,
              (code, err))

    # Hostile pickles are refused cheaply, in one line naming the offset.
    started = time.time()
    lists = os.path.join(tmp, "lists.pickle")
    with open(lists, "wb") as f:
        f.write(b"\x80\x04(" + b"]" * (10 * 1000 * 1000) + b"l.")  # one list of 10^7 empty lists
    code, out, err = run("summary", lists)
    check("10 MB of empty lists", code == 2 and err.count("\n") == 1 and "offset 131074:" in err and
          "values waiting on the pickle stack" in err, (code, err))
    nested = os.path.join(tmp, "nested.pickle")
    with open(nested, "wb") as f:
        f.write(b"\x80\x04" + b"]" * (10 ** 7) + b"N" + b"a" * (10 ** 7) + b".")
    code, out, err = run("summary", nested)
    check("10^7 nested lists", code == 2 and "offset 1002: nesting deeper than max_depth (1000)" in err, (code, err))
    check("refused cheaply", time.time() - started < 20, time.time() - started)
    code, out, err = run("dump", "/dev/zero")
    check("dump /dev/zero", code == 2 and "not a memscope timeline (bad magic)" in err, (code, err))
finally:
    shutil.rmtree(tmp)

finish("cli torch snapshots")
