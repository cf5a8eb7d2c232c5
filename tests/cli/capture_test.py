#!/usr/bin/env python3
"""memscope capture: a real job, unchanged, under memscope's start-up module.

- Phases, observed with PyTorch's own CPU profiler inside a real training job
  (Debian's python3-torch, run by the Python running this test: the system
  one; scripts/test installs it): each of the 3 steps has exactly one
  zero_grad:N, forward:N, loss:N, backward:N and step:N scope, and the ops
  land in the right one (aten::addmm in forward:N, aten::mse_loss in loss:N,
  the backward functions in backward:N, SGD's aten::add_ in step:N, the
  gradients' aten::zero_ in zero_grad:N).
- The job's standard streams and exit status pass through (3 -> 3, a signal
  -> 128 + N, a missing command -> 127); the one no-GPU line; one run at a
  time per directory (the lock); the user's own sitecustomize still runs; a
  job that never imports torch does not import it; under torchrun only the
  workers capture.
- The GPU path against tests/cli/data/fake_torch (a stand-in with PyTorch
  2.4's names, NOT PyTorch): history turned on as CUDA initialises, with the
  --max-entries ring; snapshot-rank-R.pickle per rank at exit and at an OOM;
  run.json; and every command reading the directory as a 2-rank run whose
  reserved bytes are the pickles' own segment lists. Real CUDA is untested.
"""
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile

from clitest import MEMSCOPE, MiB, check, finish, run  # noqa: E402
from clitest import data as relative_data  # noqa: E402

PY = sys.executable


def data(name):
    return os.path.abspath(relative_data(name))  # the jobs run in a scratch directory


NO_GPU = ("memscope capture: no CUDA device (torch.cuda.is_available() is False): no memory snapshot is written; "
          "the phases are still marked")
work = tempfile.mkdtemp(prefix="memscope-capture-")


def capture(run_dir, *command, env=None, stdin=None):
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    e.update(env or {})
    p = subprocess.run([MEMSCOPE, "capture", "--out", run_dir, "--", *command], input=stdin, capture_output=True,
                       text=True, env=e, timeout=300, cwd=work)
    return p.returncode, p.stdout, p.stderr


try:
    import torch  # noqa: F401
except ImportError:
    print(f"capture_test needs PyTorch in {PY} (Debian: apt-get install python3-torch)")
    sys.exit(1)

# ---- Phases of a real training job, seen by PyTorch's CPU profiler.
events_file = os.path.join(work, "events.jsonl")
run_dir = os.path.join(work, "real")
rc, out, err = capture(run_dir, PY, data("capture_train.py"), env={"PROFILE_OUT": events_file})
check("training job: exit 0", rc == 0, (rc, err))
check("training job: its stdout passes through", out == "trained 3 steps\n", out)
err_lines = err.splitlines()
check("no GPU: said once, in one line", err_lines.count(NO_GPU) == 1, err)
check("memscope's last line says where it recorded",
      err_lines[-1] == f"memscope capture: the job exited with status 0; recorded in {run_dir}/ (run.json)", err)
check("the note says why there is no snapshot",
      "memscope: note: no snapshot from rank(s) 0: no CUDA device (the phases were marked, no memory was recorded)"
      in err_lines, err)

events = [json.loads(line) for line in open(events_file)]
SCOPE = re.compile(r"^(zero_grad|forward|loss|backward|step):(\d+)$")
scopes = [e for e in events if SCOPE.match(e["name"])]
names = sorted(e["name"] for e in scopes)
want = sorted(f"{p}:{n}" for p in ("zero_grad", "forward", "loss", "backward", "step") for n in range(3))
check("exactly one scope per phase and step", names == want, names)


def scope_of(e):
    """The names of memscope's scopes that contain event e (same thread)."""
    return [s["name"] for s in scopes
            if s is not e and s["thread"] == e["thread"] and s["start"] <= e["start"] and e["end"] <= s["end"]]


check("memscope's scopes are never nested", all(scope_of(s) == [] for s in scopes),
      [(s["name"], scope_of(s)) for s in scopes if scope_of(s)])


def where(name):
    return sorted(tuple(scope_of(e)) for e in events if e["name"] == name)


check("aten::addmm: once in each forward:N, nowhere else", where("aten::addmm") == [(f"forward:{n}",) for n in range(3)],
      where("aten::addmm"))
check("aten::mse_loss: once in each loss:N", where("aten::mse_loss") == [(f"loss:{n}",) for n in range(3)],
      where("aten::mse_loss"))
for fn in ("MseLossBackward0", "AddmmBackward0"):
    name = f"autograd::engine::evaluate_function: {fn}"
    check(f"{fn}: once in each backward:N", where(name) == [(f"backward:{n}",) for n in range(3)], where(name))
check("SGD's step: in step:N", where("Optimizer.step#SGD.step") == [(f"step:{n}",) for n in range(3)],
      where("Optimizer.step#SGD.step"))
# aten::add_: SGD's update of weight and bias, twice in each step:N, and
# AccumulateGrad adding into the zeroed (not None) gradients in backward:1 and :2.
check("aten::add_: 2 in each step:N, 2 in backward:1 and backward:2",
      where("aten::add_") == sorted([(f"step:{n}",) for n in range(3)] * 2 + [("backward:1",), ("backward:2",)] * 2),
      where("aten::add_"))
check("zero_grad: in zero_grad:N", where("Optimizer.zero_grad#SGD.zero_grad") == [(f"zero_grad:{n}",) for n in range(3)],
      where("Optimizer.zero_grad#SGD.zero_grad"))
# The gradients are zeroed from step 1 on (step 0 has none yet): two zero_
# (weight, bias) inside the optimizer's own zero_grad scope, in zero_grad:1 and :2.
zero_grad_ops = [e for e in events if e["name"] == "Optimizer.zero_grad#SGD.zero_grad"]
zeroed = sorted(scope_of(z)[0] for z in zero_grad_ops for e in events
                if e["name"] == "aten::zero_" and z["start"] <= e["start"] and e["end"] <= z["end"])
check("aten::zero_ of the gradients: 2 in zero_grad:1, 2 in zero_grad:2", zeroed == ["zero_grad:1"] * 2 + ["zero_grad:2"] * 2,
      zeroed)

status = json.load(open(os.path.join(run_dir, ".memscope-capture", "rank-0.json")))
check("rank-0.json: no CUDA, 15 scopes, 3 steps, no snapshot",
      (status["cuda"], status["phases"], status["steps"], status["snapshot"]) == (False, 15, 3, None), status)
manifest = json.load(open(os.path.join(run_dir, "run.json")))
check("run.json: a capture of this command, exit 0, one rank without snapshot",
      (manifest["command"], manifest["world_size"], manifest["capture"]["argv"], manifest["capture"]["exit_status"],
       manifest["capture"]["signal"], manifest["capture"]["max_entries"],
       [(r["rank"], r["status"], r["timeline"]) for r in manifest["ranks"]]) ==
      ("capture", 1, [PY, data("capture_train.py")], 0, None, 1000000, [(0, "no_snapshot", "")]), manifest)
rc, out, err = run("summary", run_dir)
check("summary of a capture without snapshot: one line, exit 2",
      rc == 2 and err == f"memscope summary: '{run_dir}' is a capture whose job wrote no snapshot (no CUDA device, "
                         "or it never imported torch): there is no memory to show\n", (rc, err))

# ---- A directory that held a memscope run: its outputs go, its ranks are not this run's.
old = os.path.join(work, "old")
rc, out, err = run("replay", data("phases.jsonl"), "--out", old)
check("an earlier run wrote its outputs", rc == 0 and os.path.exists(os.path.join(old, "report.json")), err)
rc, out, err = capture(old, "true")
left = sorted(n for n in os.listdir(old) if not n.startswith("."))
# (replay --out does not list its rank-0.timeline among the files a later run removes; it is not read here.)
check("capturing into it removes the earlier outputs", left == ["rank-0.timeline", "run.json"], left)
rc, out, err = run("summary", old)
check("... and the directory reads as the capture, not the earlier run", rc == 2 and "is a capture" in err, (rc, err))

# ---- Exit status, streams, signals, a missing command.
rc, out, err = capture(os.path.join(work, "exit3"), PY, data("capture_train.py"), "3")
check("exit 3 -> 3, stdout passes", (rc, out) == (3, "trained 3 steps\n"), (rc, out, err))
check("run.json records exit status 3",
      json.load(open(os.path.join(work, "exit3", "run.json")))["capture"]["exit_status"] == 3)
rc, out, err = capture(os.path.join(work, "stdin"), "sh", "-c", "read x; echo got $x; echo to-stderr >&2",
                       stdin="hello\n")
check("stdin, stdout and stderr pass through", (rc, out, err.splitlines()[0]) == (0, "got hello\n", "to-stderr"),
      (rc, out, err))
check("a job that is not Python: nothing recorded, said in a note",
      "memscope: note: the job recorded nothing: it never imported torch, or its Python did not read PYTHONPATH "
      "(python -E, -I or -S)" in err.splitlines(), err)
rc, out, err = capture(os.path.join(work, "signal"), "sh", "-c", "kill -TERM $$")
check("killed by SIGTERM -> 143, as a shell says", rc == 143, (rc, err))
check("... and said", "memscope capture: the job was killed by signal 15" in err, err)
# SIGTERM to memscope reaches the job (the job's trap answers it).
term = subprocess.Popen([MEMSCOPE, "capture", "--out", os.path.join(work, "term"), "--", "sh", "-c",
                         'trap "echo got TERM; exit 7" TERM; echo ready; while :; do sleep 0.1; done'],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
check("job started", term.stdout.readline() == "ready\n")
term.terminate()
out, err = term.communicate(timeout=60)
check("SIGTERM is passed on to the job; its status is memscope's", (term.returncode, out) == (7, "got TERM\n"),
      (term.returncode, out, err))
rc, out, err = capture(os.path.join(work, "missing"), "no-such-command-memscope")
check("a missing command: 127 and one line",
      (rc, err) == (127, "memscope capture: 'no-such-command-memscope': command not found\n"), (rc, err))
rc, out, err = run("capture", "--out", os.path.join(work, "none"))
check("no command: one line, exit 2", rc == 2 and len(err.splitlines()) == 1 and "command" in err, (rc, err))
rc, out, err = run("capture", "--out", os.path.join(work, "none"), "--max-entries", "0", "--", "true")
check("--max-entries 0: one line, exit 2", rc == 2 and len(err.splitlines()) == 1, (rc, err))

# ---- Torch is not imported for the job; the user's sitecustomize still runs.
rc, out, err = capture(os.path.join(work, "notorch"), PY, "-c",
                       "import sys; print('torch' in sys.modules, any('.memscope-capture' in p for p in sys.path))")
check("a job that never imports torch: torch not imported, sys.path as without memscope", out == "False False\n",
      (out, err))
user = os.path.join(work, "user-site")
os.makedirs(user)
with open(os.path.join(user, "sitecustomize.py"), "w") as f:
    f.write("import os\nMARK = 'user sitecustomize ran'\nprint(MARK)\n")
rc, out, err = capture(os.path.join(work, "usersite"), PY, "-c", "import sitecustomize; print(sitecustomize.MARK)",
                       env={"PYTHONPATH": user})
check("the user's sitecustomize runs and is `sitecustomize`", out == "user sitecustomize ran\nuser sitecustomize ran\n",
      (out, err))

# ---- The lock: one run at a time per directory.
locked = os.path.join(work, "locked")
first = subprocess.Popen([MEMSCOPE, "capture", "--out", locked, "--", "sh", "-c", "echo started; read x"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
check("first capture started", first.stdout.readline() == "started\n")
rc, out, err = capture(locked, "true")
check("a second capture into the same directory: refused, exit 2",
      rc == 2 and err.startswith(f"memscope capture: '{locked}' is in use by another memscope run (pid {first.pid}:")
      and len(err.splitlines()) == 1, (rc, err))
first.communicate("go\n", timeout=60)
check("the first one ends normally", first.returncode == 0, first.returncode)

# ---- torchrun: its agent does not capture; each worker does, as its RANK.
# Debian's torchrun (PyTorch 1.13) fails at start on Python 3.11, before any
# worker (Std.from_str returns None: "'NoneType' object has no attribute
# 'get'"), so a stand-in agent named torchrun does what it does: imports
# torch, then starts the workers with RANK, LOCAL_RANK and WORLD_SIZE.
agent = os.path.join(work, "bin", "torchrun")
os.makedirs(os.path.dirname(agent))
with open(agent, "w") as f:
    f.write(f"""#!{PY}
import os, subprocess, sys
import torch
workers = [subprocess.Popen([sys.executable] + sys.argv[1:],
                            env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2")) for r in range(2)]
sys.exit(max(w.wait() for w in workers))
""")
os.chmod(agent, 0o755)
rc, out, err = capture(os.path.join(work, "torchrun"), agent, data("capture_train.py"))
# The two workers share the pipe: their lines may interleave ("trained 3 stepstrained 3 steps\n\n").
check("torchrun: exit 0, both workers trained", rc == 0 and out.count("trained 3 steps") == 2, (rc, out, err))
check("torchrun: the no-GPU line once (rank 0)", err.splitlines().count(NO_GPU) == 1, err)
statuses = sorted(os.listdir(os.path.join(work, "torchrun", ".memscope-capture")))
check("torchrun: one capture status per worker, none for the agent",
      statuses == ["claim-no-gpu-line", "claim-rank-0", "claim-rank-1", "rank-0.json", "rank-1.json", "sitecustomize.py"],
      statuses)
manifest = json.load(open(os.path.join(work, "torchrun", "run.json")))
check("torchrun: run.json has world size 2, ranks 0 and 1",
      (manifest["world_size"], [r["rank"] for r in manifest["ranks"]]) == (2, [0, 1]), manifest)

# ---- torch.multiprocessing.spawn: no $RANK; each worker is the rank its
# process group says (init_process_group), the parent is no rank.
def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


spawned = os.path.join(work, "spawn")
rc, out, err = capture(spawned, PY, data("capture_spawn.py"), str(free_port()))
check("spawn: exit 0, both workers trained",
      rc == 0 and sorted(out.splitlines()) == ["rank 0: trained 2 steps", "rank 1: trained 2 steps"], (rc, out, err))
check("spawn: the no-GPU line once, for the job", err.splitlines().count(NO_GPU) == 1, err)
statuses = sorted(n for n in os.listdir(os.path.join(spawned, ".memscope-capture")) if n.endswith(".json"))
check("spawn: one capture status per worker", statuses == ["rank-0.json", "rank-1.json"], statuses)
for r in (0, 1):
    path = os.path.join(spawned, ".memscope-capture", f"rank-{r}.json")
    st = json.load(open(path)) if os.path.exists(path) else {}
    check(f"spawn: rank {r}'s status is its own (rank, world size, 2 steps)",
          (st.get("rank"), st.get("world_size"), st.get("steps")) == (r, 2, 2), st)
manifest = json.load(open(os.path.join(spawned, "run.json")))
check("spawn: run.json has world size 2, ranks 0 and 1",
      (manifest["world_size"], [r["rank"] for r in manifest["ranks"]]) == (2, [0, 1]), manifest)

# ---- Two processes that both say rank 0 (no $RANK, no process group): the
# second one's files are kept apart, never over the first one's.
twice = os.path.join(work, "twice")
rc, out, err = capture(twice, "sh", "-c", f"{PY} {data('capture_train.py')}; {PY} {data('capture_train.py')}")
check("twice: exit 0, both trained", (rc, out) == (0, "trained 3 steps\ntrained 3 steps\n"), (rc, out, err))
check("twice: the no-GPU line once", err.splitlines().count(NO_GPU) == 1, err)
left = sorted(os.listdir(os.path.join(twice, ".memscope-capture")))
second = [n for n in left if n.startswith("rank-0.pid-")]
check("twice: the second process wrote rank-0.pid-P.json beside rank-0.json",
      len(second) == 1 and "rank-0.json" in left, left)
pid = second[0][len("rank-0.pid-"):-len(".json")] if second else "?"
check("twice: the second process said so in one line",
      [x for x in err.splitlines() if "is also process" in x] ==
      [f"memscope capture: rank 0 is also process {json.load(open(os.path.join(twice, '.memscope-capture', 'rank-0.json')))['pid']}'s: "
       f"this process ({pid}) writes rank-0.pid-{pid}.json, not over its files"], err)
check("twice: memscope's note names the kept file",
      f"memscope: note: rank 0 was reported by more than one process: process {pid}'s capture is kept as "
      f".memscope-capture/rank-0.pid-{pid}.json, not read (set RANK, or call init_process_group)" in err.splitlines(), err)
manifest = json.load(open(os.path.join(twice, "run.json")))
check("twice: run.json has one rank 0", (manifest["world_size"], [r["rank"] for r in manifest["ranks"]]) == (1, [0]),
      manifest)

# ---- The GPU path against the stand-in torch (tests/cli/data/fake_torch).
fake = os.path.join(work, "fake")
ranks = "; ".join(f"RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 {PY} {data('fake_torch_job.py')} --oom" for r in (0, 1))
rc, out, err = capture(fake, "sh", "-c", ranks, env={"PYTHONPATH": data("fake_torch")})
check("fake 2-rank job: both ran, the last one's OOM is the exit status",
      (rc, out) == (1, "rank 0: 2 steps\nrank 1: 2 steps\n"), (rc, out, err))
check("no no-GPU line with a GPU", NO_GPU not in err, err)
check("memscope names the snapshots",
      f"memscope capture: the job exited with status 1; recorded in {fake}/ (run.json, snapshot-rank-{{0..1}}.pickle): "
      f"memscope summary {fake}" in err.splitlines(), err)
for r in (0, 1):
    st = json.load(open(os.path.join(fake, ".memscope-capture", f"rank-{r}.json")))
    check(f"rank {r}: history on, OOM dump, snapshot",
          (st["cuda"], st["oom_dumps"], st["snapshot"], st["world_size"]) == (True, 1, f"snapshot-rank-{r}.pickle", 2), st)
    snap = pickle.load(open(os.path.join(fake, f"snapshot-rank-{r}.pickle"), "rb"))
    check(f"rank {r}: its device's trace (device {r})", [len(t) > 0 for t in snap["device_traces"]] == [False] * r + [True],
          [len(t) for t in snap["device_traces"]])
    # Parameter, gradient (10 MiB each) and the cached activation segment ((R + 2) * 10 MiB).
    reserved = sum(s["total_size"] for s in snap["segments"])
    check(f"rank {r}: the pickle's segments hold {(r + 4) * 10} MiB", reserved == (r + 4) * 10 * MiB, reserved)
    check(f"rank {r}: the OOM is the trace's last entry", snap["device_traces"][r][-1]["action"] == "oom")
manifest = json.load(open(os.path.join(fake, "run.json")))
check("run.json: 2 ranks with their snapshots",
      [(x["rank"], x["status"], x["timeline"]) for x in manifest["ranks"]] ==
      [(0, "ok", "snapshot-rank-0.pickle"), (1, "ok", "snapshot-rank-1.pickle")] and manifest["world_size"] == 2,
      manifest)
rc, out, err = run("summary", fake, "--json")
check("summary reads the capture: exit 0", rc == 0, err)
if rc == 0:
    doc = json.loads(out)
    ranks_doc = doc["ranks"]
    check("summary: 2 ranks, 0 and 1", [x["rank"] for x in ranks_doc] == [0, 1], [x.get("rank") for x in ranks_doc])
    # Peak allocated: parameter + gradient + activation of step 1: (R + 2) * 10 + 20 MiB.
    check("summary: each rank's peak is its own job's",
          [x["peak"]["allocated"]["bytes"] for x in ranks_doc] == [40 * MiB, 50 * MiB],
          [x["peak"]["allocated"]["bytes"] for x in ranks_doc])
    check("summary: owners are the job's files",
          [o["owner"] for o in ranks_doc[1]["peak"]["allocated"]["top_owners"]] == ["model.py:1 alloc",
                                                                                 "backward.py:1 alloc"],
          ranks_doc[1]["peak"]["allocated"]["top_owners"])
    phases = [p["phase"] for p in ranks_doc[0]["phases"]]
    check("summary: the module's scopes are memscope's phases",
          phases == ["zero_grad", "forward", "loss", "backward", "step"] * 2, phases)
for command in (["frag", fake], ["trace", fake, "-o", os.path.join(work, "t.json")],
                ["snapshot", fake, "--rank", "1", "-o", os.path.join(work, "s.pickle")],
                ["report", fake, "-o", os.path.join(work, "r.html")], ["check", fake, "--max", "peak_reserved=1GiB"],
                ["compare", fake, fake]):
    rc, out, err = run(*command)
    check(f"memscope {command[0]} reads the capture", rc == 0, (rc, err))
rc, out, err = run("frag", fake, "--rank", "1")
check("frag of rank 1 at end: reserved as the pickle's segment list says",
      "reserved 50.00 MiB, allocated 20.00 MiB, reserved - allocated 30.00 MiB" in out.splitlines(), out)

# --max-entries is the history's ring: the stand-in keeps the last N entries, as PyTorch does.
ring = os.path.join(work, "ring")
rc, out, err = run("capture", "--out", ring, "--max-entries", "5", "--", PY, data("fake_torch_job.py"),
                   env={"PYTHONPATH": data("fake_torch")})
snap = pickle.load(open(os.path.join(ring, "snapshot-rank-0.pickle"), "rb"))
check("--max-entries 5: max_entries=5 reaches _record_memory_history, the trace keeps 5 entries",
      (rc, len(snap["device_traces"][0]), json.load(open(os.path.join(ring, "run.json")))["capture"]["max_entries"])
      == (0, 5, 5), (rc, err))

shutil.rmtree(work, ignore_errors=True)
finish("cli capture")
