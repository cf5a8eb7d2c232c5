#!/usr/bin/env python3
"""Outputs that must not move: a fixed set of runs writes the same report.json,
summary.txt and peak snapshot (snapshot-rank-R.pickle) as the goldens in
data/golden/, times aside.

The goldens were written by memscope before the restructuring of its upper
half (profiler/ split into recording/, analysis/, importers/, exporters/,
viewer/, check/, compare/ and run/) so that the restructuring provably changes
no number. Regenerate them only for an intended change of output:

    golden_test.py MEMSCOPE DATA_DIR --update

Times are what may differ between two runs of the same command: "time_us"
(wall-clock microseconds) and "seconds" are removed from the JSON documents
before comparing, and timestamps never appear in summary.txt.
"""
import gzip
import json
import os
import pickle
import shutil
import sys
import tempfile

from clitest import DATA, check, finish, run  # noqa: E402

UPDATE = "--update" in sys.argv
GOLDEN = os.path.join(DATA, "golden")
TIME_KEYS = {"time_us", "seconds", "wall_start_us"}

# name -> (memscope arguments with OUT for the run directory, expected exit status)
RUNS = {
    "gpt2": (["run", "--model", "gpt2", "--steps", "3", "--out", "OUT"], 0),
    "ddp2": (["run", "--model", "mlp", "--world-size", "2", "--ddp", "copy", "--steps", "2",
              "--exec", "cpu", "--out", "OUT"], 0),
    "oom": (["run", "--model", "gpt2", "--device-memory", "3GiB", "--steps", "2", "--out", "OUT"], 3),
    "imported": (["replay", os.path.join(DATA, "golden", "imported.pickle"), "--out", "OUT"], 0),
}


def strip_times(x):
    """The document without wall-clock values (keys in TIME_KEYS), tuples as lists."""
    if isinstance(x, dict):
        return {str(k): strip_times(v) for k, v in x.items() if k not in TIME_KEYS}
    if isinstance(x, (list, tuple)):
        return [strip_times(v) for v in x]
    return x


def normalized(rundir):
    """{file name: normalized text} of the outputs the goldens cover."""
    out = {}
    with open(os.path.join(rundir, "report.json")) as f:
        out["report.json"] = json.dumps(strip_times(json.load(f)), indent=1, sort_keys=True)
    with open(os.path.join(rundir, "summary.txt")) as f:
        out["summary.txt"] = f.read()
    for name in sorted(os.listdir(rundir)):
        if name.startswith("snapshot-rank-") and name.endswith(".pickle"):
            with open(os.path.join(rundir, name), "rb") as f:
                doc = pickle.load(f)
            out[name + ".json"] = json.dumps(strip_times(doc), indent=1, sort_keys=True)
    return out


def first_difference(a, b):
    la, lb = a.splitlines(), b.splitlines()
    for i in range(max(len(la), len(lb))):
        x = la[i] if i < len(la) else "<end>"
        y = lb[i] if i < len(lb) else "<end>"
        if x != y:
            return f"line {i + 1}: golden {x!r}, now {y!r}"
    return "equal"


tmp = tempfile.mkdtemp(prefix="memscope-golden-")
try:
    for name, (args, want_code) in RUNS.items():
        rundir = os.path.join(tmp, name)
        code, out, err = run(*[rundir if a == "OUT" else a for a in args])
        check(f"{name}: exit status", code == want_code, (code, err[-2000:]))
        files = normalized(rundir)
        path = os.path.join(GOLDEN, f"{name}.json.gz")
        if UPDATE:
            with gzip.open(path, "wt") as f:
                json.dump(files, f, indent=0, sort_keys=True)
            continue
        with gzip.open(path, "rt") as f:
            golden = json.load(f)
        check(f"{name}: the same files", sorted(golden) == sorted(files), (sorted(golden), sorted(files)))
        for fname in sorted(set(golden) & set(files)):
            check(f"{name}: {fname}", golden[fname] == files[fname], first_difference(golden[fname], files[fname]))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
finish("golden outputs" + (" (updated)" if UPDATE else ""))
