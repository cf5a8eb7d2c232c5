#!/usr/bin/env python3
"""End-to-end tests of multi-rank runs: memscope run --world-size N starts N
rank processes over Gloo; DDP buckets in report.json; --ddp copy,view
compared; a killed rank and a skipped barrier end the run with the
failed rank named, within the timeout; ranks started by an external launcher
(torchrun's RANK / WORLD_SIZE)."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from clitest import MEMSCOPE, check, finish, run  # noqa: E402

tmp = tempfile.mkdtemp(prefix="memscope-ddp-")


def timed_run(*args):
    """run() and its wall time in seconds."""
    start = time.monotonic()
    code, out, err = run(*args)
    return code, out, err, time.monotonic() - start


def load(d, name):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


try:
    # Two ranks, copy mode (the default with --world-size > 1).
    d = os.path.join(tmp, "two")
    code, out, err = run("run", "--model", "mlp", "--world-size", "2", "--steps", "3", "--out", d)
    check("2 ranks exit 0", code == 0, (code, out, err))
    run_json = load(d, "run.json")
    check("run.json world size", run_json["world_size"] == 2 and run_json["ddp"] == "copy", run_json)
    check("run.json ranks ok", [r["status"] for r in run_json["ranks"]] == ["ok", "ok"], run_json["ranks"])
    for f in ["rank-0.timeline", "rank-1.timeline", "snapshot-rank-0.pickle", "snapshot-rank-1.pickle",
              "report.json", "report.html", "trace.json", "summary.txt"]:
        check(f"2 ranks wrote {f}", os.path.exists(os.path.join(d, f)), os.listdir(d))
    check("recorded-in names both ranks", "rank-{0..1}.timeline" in out, out)
    report = load(d, "report.json")
    check("report has 2 ranks", [r["rank"] for r in report["ranks"]] == [0, 1], len(report["ranks"]))
    mlp_bytes = ((256 * 512 + 512) + 2 * (512 * 512 + 512) + (512 * 10 + 10)) * 4
    for r in report["ranks"]:
        ddp = r.get("ddp", {})
        buckets, rebuilt = ddp.get("buckets", []), ddp.get("rebuilt_buckets", [])
        check(f"rank {r['rank']}: one first-iteration bucket of every parameter",
              len(buckets) == 1 and buckets[0]["bytes"] == mlp_bytes and len(buckets[0]["params"]) == 8, buckets)
        # Rebuilt in gradient-ready order: the head's bias first; limits 1 MiB then 25 MiB.
        check(f"rank {r['rank']}: rebuilt buckets", len(rebuilt) == 2 and rebuilt[0]["params"][:2] == ["head.bias", "head.weight"]
              and sum(b["bytes"] for b in rebuilt) == mlp_bytes and rebuilt[0]["bytes"] >= 1 << 20, rebuilt)
        phases = [p["phase"] for p in r["phases"]]
        check(f"rank {r['rank']}: phase ddp after model", phases[:2] == ["model", "ddp"], phases)
    code, out2, err2 = run("summary", d, "--rank", "1")
    check("summary --rank 1", code == 0 and "ddp" in out2, (code, err2))
    check("meta run: no loss printed (nothing computed)", not any(l.startswith("loss") for l in out.splitlines()) and "losses" not in report["ranks"][0], out)

    # --exec cpu: every rank's loss on its own shard, labeled, and their mean;
    # report.json has each rank's losses, as the ranks recorded them.
    d = os.path.join(tmp, "cpu-losses")
    code, out, err = run("run", "--model", "mlp", "--world-size", "2", "--steps", "3", "--exec", "cpu", "--out", d)
    check("cpu 2 ranks exit 0", code == 0, (code, err))
    lines = {l.split(":")[0]: [float(x) for x in l.split(":")[1].split()] for l in out.splitlines()
             if l.startswith("loss (")}
    check("cpu: a loss line per rank and the mean", sorted(lines) == ["loss (mean)", "loss (rank 0)", "loss (rank 1)"]
          and all(len(v) == 3 for v in lines.values()), out)
    report = load(d, "report.json")
    for r in (0, 1):
        own = load(d, f"rank-{r}.json")["losses"]
        check(f"cpu: report.json rank {r} losses are its own", report["ranks"][r]["losses"] == own, (report["ranks"][r].get("losses"), own))
        check(f"cpu: rank {r}'s printed losses", lines[f"loss (rank {r})"] == [round(x, 4) for x in own], lines)
    mean = [(a + b) / 2 for a, b in zip(report["ranks"][0]["losses"], report["ranks"][1]["losses"])]
    check("cpu: the printed mean is the mean of the ranks' losses", lines["loss (mean)"] == [round(x, 4) for x in mean],
          (lines, mean))
    check("cpu: the ranks' shards differ", report["ranks"][0]["losses"][0] != report["ranks"][1]["losses"][0], report)

    # --ddp copy,view: both runs, then the comparison. The view run's steady
    # state has no GRADIENT of its own: one model size less.
    d = os.path.join(tmp, "both")
    code, out, err = run("run", "--model", "mlp", "--world-size", "2", "--steps", "2", "--ddp", "copy,view", "--out", d)
    check("copy,view exit 0", code == 0, (code, err))
    check("copy,view dirs", os.path.exists(os.path.join(d, "copy", "report.json"))
          and os.path.exists(os.path.join(d, "view", "report.json")), os.listdir(d))
    check("copy,view compared", "== --ddp copy (A) vs --ddp view (B)" in out, out[-2000:])
    view_json = load(os.path.join(d, "view"), "run.json")
    check("view run.json", view_json["ddp"] == "view", view_json["ddp"])
    rc = load(os.path.join(d, "copy"), "report.json")["ranks"][0]["phases"]
    rv = load(os.path.join(d, "view"), "report.json")["ranks"][0]["phases"]
    end_c = [p for p in rc if p["phase"] == "step" and p["step"] == 1][0]
    end_v = [p for p in rv if p["phase"] == "step" and p["step"] == 1][0]
    grads = end_c["by_category"]["GRADIENT"]
    check("view has no gradients of its own", end_v["by_category"]["GRADIENT"] == 0, end_v["by_category"])
    check("copy's gradients are one model size", abs(grads - mlp_bytes) < 8 * 512, (grads, mlp_bytes))

    # A rank killed mid-run: the others stop within the timeout, the report
    # names the dead rank, every timeline reads up to the failure.
    d = os.path.join(tmp, "kill")
    code, out, err, elapsed = timed_run("run", "--model", "mlp", "--world-size", "4", "--steps", "3", "--timeout", "20",
                                        "--scenario", "kill:1:1", "--out", d)
    check("killed rank: exit 4", code == 4, (code, err))
    check("killed rank: well within the timeout", elapsed < 20, elapsed)
    check("killed rank named", "rank 1 was killed by signal 9 (SIGKILL)" in err, err)
    run_json = load(d, "run.json")
    check("run.json failure", run_json.get("failure", {}).get("rank") == 1, run_json.get("failure"))
    check("run.json rank 1 killed", run_json["ranks"][1]["status"] == "killed" and run_json["ranks"][1]["signal"] == 9,
          run_json["ranks"][1])
    check("others failed on their own (a lost peer), not stopped by the launcher",
          all(r["status"] == "comm_error" for i, r in enumerate(run_json["ranks"]) if i != 1), run_json["ranks"])
    report = load(d, "report.json")
    check("report names the failure", report.get("failure", {}).get("rank") == 1, report.get("failure"))
    check("report has every rank", len(report["ranks"]) == 4, len(report["ranks"]))
    dead = [p["phase"] + ":" + str(p["step"]) for p in report["ranks"][1]["phases"]]
    check("the dead rank's timeline reads up to step 1's loss", dead[-1] in ("loss:1", "backward:1") and "step:0" in dead, dead)
    code, out2, err2 = run("summary", d, "--rank", "1")
    check("summary of the dead rank", code == 0, err2)

    # The same with SIGCHLD ignored by whoever started memscope: the exit
    # statuses are still collected.
    d = os.path.join(tmp, "kill-sigign")
    p = subprocess.run([MEMSCOPE, "run", "--model", "mlp", "--world-size", "2", "--steps", "2", "--timeout", "20",
                        "--scenario", "kill:1:0", "--out", d], capture_output=True, text=True, timeout=120,
                       preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
    check("SIGCHLD ignored: exit 4, rank 1 named", p.returncode == 4 and "rank 1 was killed by signal 9" in p.stderr,
          (p.returncode, p.stderr))

    # One rank skips a barrier. An error naming the ranks and the
    # collectives, not a hang.
    d = os.path.join(tmp, "mismatch")
    code, out, err, elapsed = timed_run("run", "--model", "mlp", "--world-size", "2", "--steps", "3", "--timeout", "20",
                                        "--scenario", "skip-barrier:1:1", "--out", d)
    check("mismatch: exit 4", code == 4, (code, err))
    check("mismatch: well within the timeout", elapsed < 20, elapsed)
    check("mismatch named", "collective mismatch" in err and "rank 0 called barrier" in err
          and "rank 1 called allreduce" in err, err)
    # Both ranks notice it; one line names them both, whichever noticed first.
    mismatch = ("memscope run: ranks 0 and 1 exited with status 4: collective mismatch at collective #7: "
                "rank 0 called barrier, rank 1 called allreduce(float32, 267786 elements, meta)")
    check("mismatch: one line for both ranks, then the hint", err.splitlines()[:1] == [mismatch]
          and err.splitlines()[1].startswith("memscope run: in PyTorch this hangs"), err)

    # The other scenarios of users' reports, with 4 ranks: a barrier only
    # rank 0 reaches (inside `if rank == 0:`), and a rank with one batch more.
    d = os.path.join(tmp, "only-barrier")
    code, out, err = run("run", "--model", "mlp", "--world-size", "4", "--steps", "3", "--timeout", "20",
                         "--scenario", "only-barrier:0:1", "--out", d)
    check("only-barrier: exit 4, named", code == 4 and err.splitlines()[0] ==
          "memscope run: ranks 0, 1, 2 and 3 exited with status 4: collective mismatch at collective #7: "
          "rank 0 called barrier, ranks 1-3 called allreduce(float32, 267786 elements, meta)", (code, err))
    d = os.path.join(tmp, "extra-step")
    code, out, err = run("run", "--model", "mlp", "--world-size", "4", "--steps", "2", "--timeout", "20",
                         "--exec", "cpu", "--scenario", "extra-step:2", "--out", d)
    check("extra-step: exit 4, named", code == 4 and err.splitlines()[0] ==
          "memscope run: ranks 0, 1, 2 and 3 exited with status 4: collective mismatch at collective #7: "
          "ranks 0, 1, 3 called barrier, rank 2 called allreduce(float32, 267786 elements)", (code, err))
    for bad, message in [("kill:1", "--scenario 'kill:1': use kill:RANK:STEP, skip-barrier:RANK:STEP, "
                                    "only-barrier:RANK:STEP or extra-step:RANK"),
                         ("kill:2:0", "--scenario 'kill:2:0': rank 2 is not a rank of --world-size 2"),
                         ("skip-barrier:1:3", "--scenario 'skip-barrier:1:3': step 3 is not a step of --steps 3 (0 to 2)")]:
        code, out, err = run("run", "--model", "mlp", "--world-size", "2", "--steps", "3", "--scenario", bad,
                             "--out", os.path.join(tmp, "bad-scenario"))
        check(f"--scenario {bad}: one line, exit 2", code == 2 and err == f"memscope run: {message}\n", (code, err))

    # Ranks started by an external launcher (torchrun's variables).
    d = os.path.join(tmp, "torchrun")
    os.makedirs(d)
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT="29500", MEMSCOPE_STORE=os.path.join(d, "store"))
        env.pop("MEMSCOPE_SUPERVISED", None)
        procs.append(subprocess.Popen([MEMSCOPE, "run", "--model", "mlp", "--steps", "2", "--ddp", "view", "--out", d],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    check("external launcher: both ranks exit 0", [p.returncode for p in procs] == [0, 0], outs)
    run_json = load(d, "run.json")
    check("external launcher: rank 0 wrote the run", run_json["world_size"] == 2 and run_json["ddp"] == "view"
          and [r["status"] for r in run_json["ranks"]] == ["ok", "ok"], run_json)

    # Bad input in a multi-rank run: one line, exit 2.
    code, out, err = run("run", "--model", "gpt2", "--exec", "cpu", "--world-size", "2", "--out", os.path.join(tmp, "bad"))
    check("bad multi-rank input exit 2", code == 2 and len(err.strip().splitlines()) == 1 and "needs --exec meta" in err,
          (code, err))
    code, out, err = run("run", "--model", "mlp", "--world-size", "3", "--out", os.path.join(tmp, "bad2"),
                         env={"RANK": "0", "WORLD_SIZE": "2"})
    check("--world-size vs WORLD_SIZE", code == 2 and "disagrees with WORLD_SIZE=2" in err, (code, err))
finally:
    shutil.rmtree(tmp)
finish("memscope run (multi-rank)")
