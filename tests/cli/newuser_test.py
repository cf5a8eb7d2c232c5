#!/usr/bin/env python3
"""What a new user tripped over (issue 14): each check failed before its fix.

- min memory: independent of --device-memory; a GPU of exactly the peak live
  bytes may work (12, 14, 16 MiB allocated one after the other need 16 MiB);
- `replay RUN`: a run directory's whole request stream, under its own settings;
- the moments `end` (after the last step) and `exit` (after teardown);
- a failed rendezvous prints only what is true and names the duplicate rank;
- a request no device has (2^64 - 1 bytes) is an OOM: exit 0, as docs/replay.md says;
- wording: `trace` without -o points at `memscope trace --help`, "1 block",
  the OOM verdict in MiB;
- tables in a unit that shows a small run's differences, micro-batch labels
  with --grad-accum, `summary --by-category`.
"""
import json
import os
import subprocess
import tempfile
import time

from clitest import DATA, MEMSCOPE, MiB, check, data, finish, run  # noqa: E402

tmp = tempfile.mkdtemp(prefix="memscope-newuser-")


def write(name, lines):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def table_rows(out):
    """The what-if table's setting rows: {alloc_conf: [columns...]}."""
    rows = {}
    for line in out.splitlines():
        if line.startswith("(defaults)") or line.startswith('"'):
            rows[line.split("  ")[0].strip()] = line
    return rows


# ---- min memory: the same answer on every --device-memory, and exactly the peak live size works.
steps = write("steps.jsonl", [
    '{"action":"alloc","id":"a","size":%d}' % (12 * MiB), '{"action":"free","id":"a"}',
    '{"action":"alloc","id":"b","size":%d}' % (14 * MiB), '{"action":"free","id":"b"}',
    '{"action":"alloc","id":"c","size":%d}' % (16 * MiB)])
for memory in ["16MiB", "17MiB", "20MiB", "40MiB", "80GiB"]:
    code, out, err = run("replay", steps, "--device-memory", memory, "--json")
    check(f"min memory exit on {memory}", code == 0, err)
    r = json.loads(out)["runs"][0] if code == 0 else {}
    check(f"min memory on {memory}", r.get("min_device_memory") == 16 * MiB, r.get("min_device_memory"))
code, out, err = run("replay", steps, "--device-memory", "40MiB")
check("min memory column", table_rows(out).get("(defaults)", "").endswith("16.00 MiB  ok"), out)

# ---- replay RUN: the run's whole request stream, under the run's settings and device.
run_dir = os.path.join(tmp, "mlp")
code, out, err = run("run", "--model", "mlp", "--steps", "2", "--out", run_dir)
check("mlp run", code == 0, err)
report = json.load(open(os.path.join(run_dir, "report.json")))["ranks"][0]
code, out, err = run("replay", run_dir, "--json", "--no-search")
check("replay RUN exit", code == 0, err)
if code == 0:
    doc = json.loads(out)
    r = doc["runs"][0]
    check("replay RUN lower bound", doc["lower_bound_bytes"] == report["lower_bound_bytes"],
          (doc["lower_bound_bytes"], report["lower_bound_bytes"]))
    # The same requests under the same settings: the allocator makes the same decisions.
    check("replay RUN peaks", (r["memory_stats"]["allocated_bytes.all.peak"], r["memory_stats"]["reserved_bytes.all.peak"])
          == (report["peak"]["allocated"]["bytes"], report["peak"]["reserved"]["bytes"]), r["memory_stats"])
    check("replay RUN device", r["device_memory"] == report["device_capacity"], r["device_memory"])
    check("replay RUN whole stream", r["requests_done"] == r["requests"] and r["oom"] is None, r)
# A run that hit OOM: its failed request is replayed too, so a larger device gets past it.
oom_dir = os.path.join(tmp, "oom")
code, out, err = run("run", "--model", "mlp", "--steps", "1", "--device-memory", "3MiB", "--out", oom_dir)
check("oom run exit 3", code == 3, (code, err))
code, out, err = run("replay", oom_dir, "--json", "--no-search")
check("replay oom RUN stops at the OOM", code == 0 and json.loads(out)["runs"][0]["oom"] is not None, (out, err))
code, out, err = run("replay", oom_dir, "--json", "--device-memory", "1GiB")
if code == 0:
    r = json.loads(out)["runs"][0]
    check("replay oom RUN on 1 GiB finishes", r["oom"] is None and r["requests_done"] == r["requests"], r)
    check("replay oom RUN min memory above 3 MiB", r["min_device_memory"] is not None and
          r["min_device_memory"] > 3 * MiB, r["min_device_memory"])
else:
    check("replay oom RUN on 1 GiB", False, err)
code, out, err = run("replay", run_dir, "--rank", "3")
check("replay RUN missing rank", code == 2 and "has no rank 3" in err, (code, err))

# ---- end = after the last step, exit = after teardown (phases.jsonl ends with a free and empty_cache).
phases_run = os.path.join(tmp, "phases")
run("replay", data("phases.jsonl"), "--out", phases_run)
code, out, err = run("summary", phases_run, "--json")
j = json.loads(out) if code == 0 else {}
at_end = j.get("at", [{}])[0]
end_frag = j.get("ranks", [{}])[0].get("fragmentation", {})
code, out, err = run("summary", phases_run, "--at", "backward:0", "--json")
at_backward = json.loads(out)["at"][0]
check("end is after the last step", at_end.get("events") == at_backward["events"] and
      at_end.get("fragmentation") == at_backward["fragmentation"], (at_end, at_backward))
check("report.json end = after the last step", end_frag.get("end") == at_backward["fragmentation"], end_frag)
code, out, err = run("summary", phases_run, "--at", "exit", "--json")
at_exit = json.loads(out)["at"][0] if code == 0 else {}
check("exit is after the last event", at_exit.get("events") == j.get("ranks", [{}])[0].get("events"),
      (at_exit.get("events"), code, err))
check("report.json exit", end_frag.get("exit") == at_exit.get("fragmentation"), end_frag)
code, out, err = run("frag", phases_run, "--at", "exit")
check("frag --at exit", code == 0 and out.startswith("rank 0 at exit:\n"), (out, err))

# ---- a failed rendezvous: two processes both RANK=0 of WORLD_SIZE=2.
dup = os.path.join(tmp, "dup")
env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
cmd = [MEMSCOPE, "run", "--model", "mlp", "--out", dup, "--timeout", "2"]
first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
time.sleep(0.5)
second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
out1, err1 = first.communicate(timeout=120)
check("rendezvous exit", first.returncode == 4, (first.returncode, err1))
check("rendezvous: no parameter count of a model never built", "parameters)" not in out1, out1)
check("rendezvous: no empty peak", "peak allocated 0 bytes in :" not in out1, out1)
check("rendezvous: lists only files that exist", "rank-{0..1}" not in out1 and "rank-0.timeline" in out1 and
      "rank-1" not in out1, out1)
# Whichever process took rank 0 first names the duplicate when rank 1 never comes; the other says
# rank 0 is taken (on a slow machine the second may be the first to take it).
both = err1 + second.stderr
check("rendezvous: the holder names the duplicate rank", "rank 0 was started twice" in both, both)
check("rendezvous: the other says the rank is taken", "rank 0 is already taken by another process" in both, both)
check("rendezvous: second exit", second.returncode == 4, (second.returncode, second.stderr))

# ---- a size beyond any device is an OOM: exit 0 (docs/replay.md: the OOM is the answer), with PyTorch's message.
huge = write("huge.jsonl", ['{"action":"alloc","id":"a","size":18446744073709551615}'])
code, out, err = run("replay", huge)
check("huge alloc exit 0", code == 0, (code, err))
check("huge alloc OOM message", "OOM at request 1 (line 1" in out and
      "CUDA out of memory. Tried to allocate more than 1EB memory." in out and "OOM at request 1 of 1" in out, out)
code, out, err = run("replay", huge, "--json")
check("huge alloc json", code == 0 and json.loads(out)["runs"][0]["oom"]["requested_bytes"] == 2**64 - 1, out)

# ---- wording.
code, out, err = run("trace", phases_run)
check("trace without -o", code == 2 and "(see memscope trace --help)" in err, err)
code, out, err = run("frag", phases_run, "--at", "exit")
check("1 block", "in 1 block," in out and "in 1 blocks" not in out, out)
oom_rec = os.path.join(tmp, "oomrec")
run("replay", data("fragmentation.jsonl"), "--device-memory", "30MiB", "--out", oom_rec)
code, out, err = run("summary", oom_rec)
oom_line = [l for l in out.splitlines() if l.startswith("OOM")]
check("OOM verdict in MiB", oom_line == ["OOM: request of 12.00 MiB; 14.00 MiB free in segments but the largest "
                                         "free block is 8.00 MiB: fragmentation, not capacity, caused this OOM"],
      oom_line)

# ---- tables: a small run in KiB; micro-batches; categories per phase.
code, out, err = run("summary", run_dir)
rows = [l for l in out.splitlines() if l.startswith(("-     model", "0     forward"))]
check("small table in KiB", len(rows) == 2 and all(l.split()[2].endswith("K") for l in rows), rows)
check("small table differs", len({l.split()[2] for l in rows}) == 2, rows)
ga = os.path.join(tmp, "ga")
code, out, err = run("run", "--model", "mlp", "--steps", "1", "--grad-accum", "2", "--out", ga)
labels = [tuple(l.split()[:2]) for l in out.splitlines()[3:] if l[:1].isdigit()]
check("micro-batch rows", labels == [("0", "zero_grad"), ("0.0", "forward"), ("0.0", "loss"), ("0.0", "backward"),
                                     ("0.1", "forward"), ("0.1", "loss"), ("0.1", "backward"), ("0", "step")],
      labels)
code, out0, err = run("summary", ga, "--at", "backward:0.0", "--json")
code1, out1, err1 = run("summary", ga, "--at", "backward:0.1", "--json")
check("--at backward:0.1", code == 0 and code1 == 0 and
      json.loads(out0)["at"][0]["events"] < json.loads(out1)["at"][0]["events"], (err, err1))
rep = json.load(open(os.path.join(ga, "report.json")))["ranks"][0]
check("report.json micro_batch", [p.get("micro_batch") for p in rep["phases"] if p["phase"] == "backward"] == [0, 1],
      rep["phases"])
code, out, err = run("summary", run_dir, "--by-category")
cat_lines = out.split("allocated by category at each phase end:\n")
check("--by-category table", code == 0 and len(cat_lines) == 2 and
      cat_lines[1].splitlines()[0].split()[:4] == ["step", "phase", "PARAMETER", "OPTIMIZER_STATE"], out[:2000])
if len(cat_lines) == 2:
    model_row = cat_lines[1].splitlines()[1].split()
    params = report["phases"][0]["by_category"]["PARAMETER"]
    check("--by-category model row", model_row[:3] == ["-", "model", f"{params // 1024}K"], model_row)

# ---- Chrome trace: collectives as slices on each rank's "communication" thread.
ddp = os.path.join(tmp, "ddp")
code, out, err = run("run", "--model", "mlp", "--world-size", "2", "--steps", "1", "--out", ddp)
check("ddp run", code == 0, err)
if code == 0:
    events = json.load(open(os.path.join(ddp, "trace.json")))["traceEvents"]
    for rank in (0, 1):
        threads = {e["tid"]: e["args"]["name"] for e in events
                   if e.get("ph") == "M" and e["name"] == "thread_name" and e["pid"] == rank}
        check(f"rank {rank} communication thread", threads.get(2) == "communication", threads)
        slices = [e for e in events if e["pid"] == rank and e.get("tid") == 2 and e.get("ph") == "X"]
        names = {e["name"] for e in slices}
        check(f"rank {rank} collectives", {"allreduce", "broadcast"} <= names, names)
        # DDP's one allreduce of step 0 carries every gradient: 662,026 float32 (mlp).
        check(f"rank {rank} allreduce bytes", [e["args"]["bytes"] for e in slices if e["name"] == "allreduce"]
              == [662026 * 4], [e["args"] for e in slices if e["name"] == "allreduce"])
        check(f"rank {rank} slices have durations", all(e["dur"] >= 0 for e in slices), slices[:2])

# ---- One line on failure (issue 34, 7): a failing command says its error
# alone (its notes were printed before it: 3 notes, then "rank 0 has no end
# of phase backward:1"); a command that succeeds prints its notes after its
# output.
snap = os.path.join(DATA, "..", "..", "fuzz", "corpus", "pickle", "torch_oom_p4.pickle")
for args in (["summary", snap, "--at", "backward:1"], ["frag", snap, "--at", "backward:1"],
             ["snapshot", snap, "-o", os.path.join(tmp, "s.pickle"), "--at", "backward:1"],
             ["compare", snap, os.path.join(tmp, "missing")], ["replay", snap, "--out", "/proc/no/such/dir"],
             ["check", snap, "--max", "peak_allocated=1MiB", "--baseline", os.path.join(tmp, "missing")]):
    code, out, err = run(*args)
    check(f"failing {args[0]}: exit 2", code == 2, (code, err))
    check(f"failing {args[0]}: one line, no note", err.count("\n") == 1 and "note:" not in err, err)
p = subprocess.run([MEMSCOPE, "frag", snap], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
lines = p.stdout.splitlines()
notes = [i for i, line in enumerate(lines) if line.startswith("memscope: note:")]
check("succeeding frag: its notes", p.returncode == 0 and len(notes) == 3, p.stdout)
check("succeeding frag: the notes after the output", notes == list(range(len(lines) - 3, len(lines))), p.stdout)

finish("new-user checks")
