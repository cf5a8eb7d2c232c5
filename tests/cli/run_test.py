#!/usr/bin/env python3
"""End-to-end tests of memscope run and memscope models: the run directory,
the phase table, the OOM exit status (3) and one-line errors (exit 2)."""
import json
import os
import shutil
import tempfile

from clitest import check, finish, run  # noqa: E402

tmp = tempfile.mkdtemp(prefix="memscope-run-")
try:
    code, out, err = run("models")
    check("models exit", code == 0, err)
    check("gpt2 count", any(l.split()[:2] == ["gpt2", "124,439,808"] for l in out.splitlines()), out)
    check("resnet50 count", any(l.split()[:2] == ["resnet50", "25,557,032"] for l in out.splitlines()), out)

    d = os.path.join(tmp, "s2s")
    code, out, err = run("run", "--model", "seq2seq-attn", "--steps", "2", "--zero-grad", "zeros", "--out", d)
    check("run exit", code == 0, (code, err))
    for f in ["run.json", "rank-0.timeline", "report.json", "report.html", "summary.txt", "trace.json",
              "snapshot-rank-0.pickle"]:
        check(f"run wrote {f}", os.path.exists(os.path.join(d, f)), os.listdir(d))
    check("recorded-in line lists every file", f"recorded in {d}/ (run.json, rank-0.timeline, report.json, report.html, "
          "summary.txt, trace.json, snapshot-rank-0.pickle)" in out, out)
    html = open(os.path.join(d, "report.html")).read()
    check("run's report.html names the training phases", '"forward"' in html and '"backward"' in html, html[:200])
    rows = [l.split() for l in out.splitlines() if l[:1] in "01" and len(l.split()) == 7]
    check("phase rows", [r[:2] for r in rows][:5] == [["0", "zero_grad"], ["0", "forward"], ["0", "loss"],
                                                      ["0", "backward"], ["0", "step"]], out)
    loss = {(r[0], r[1]): int(r[2][:-1]) for r in rows}
    check("loss adds the user's 458M", loss[("0", "loss")] - loss[("0", "forward")] == 458, loss)
    run_json = json.load(open(os.path.join(d, "run.json")))
    check("run.json", run_json["model"] == "seq2seq-attn" and run_json["parameters"] == 73308501
          and run_json["ranks"][0]["status"] == "ok", run_json)
    report = json.load(open(os.path.join(d, "report.json")))
    check("report phases", len(report["ranks"][0]["phases"]) == 11, len(report["ranks"][0]["phases"]))
    code, out, err = run("summary", d)
    check("summary reads the run", code == 0 and "backward" in out, err)

    # A run into a directory with the user's own files keeps them; only
    # memscope's per-rank files of an earlier run are replaced.
    d = os.path.join(tmp, "mine")
    os.makedirs(os.path.join(d, "store"))
    for name in ["store/data.txt", "rank-notes.md", "rank-7.timeline.bak"]:
        with open(os.path.join(d, name), "w") as f:
            f.write("keep")
    with open(os.path.join(d, "rank-3.timeline"), "w") as f:
        f.write("the user's, not memscope's")  # memscope did not write it: it stays, and is not read
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", d)
    check("run into a user's directory", code == 0, err)
    for name in ["store/data.txt", "rank-notes.md", "rank-7.timeline.bak", "rank-3.timeline"]:
        check(f"kept {name}", os.path.exists(os.path.join(d, name)), os.listdir(d))
    code, out, err = run("summary", d)
    check("the run's rank only", code == 0 and "rank 3" not in out and "rank 0" in out, (code, err))

    # An OOM: recorded, reported with its diagnosis, exit 3.
    d = os.path.join(tmp, "oom")
    code, out, err = run("run", "--model", "gpt2", "--steps", "1", "--device-memory", "2GiB", "--out", d)
    check("oom exit 3", code == 3, (code, out, err))
    check("oom message", "CUDA out of memory" in err, err)
    check("oom in report", json.load(open(os.path.join(d, "report.json")))["ranks"][0]["oom"] is not None)
    check("oom status", json.load(open(os.path.join(d, "run.json")))["ranks"][0]["status"] == "oom")

    # Bad input: one line naming the problem, exit 2, nothing written.
    for args, msg in [(["--model", "nope"], "unknown model 'nope'"),
                      (["--optimizer", "lion"], "unknown optimizer 'lion'"),
                      (["--exec", "cpu", "--model", "gpt2"], "needs --exec meta"),
                      (["--amp", "fp8"], "--amp 'fp8'"),
                      (["--world-size", "0"], "--world-size must be at least 1"),
                      (["--ddp", "both"], "--ddp 'both'"),
                      (["--bucket-cap-mb", "5"], "need --ddp copy or view"),
                      (["--ddp", "copy", "--comm-hook", "fp8"], "--comm-hook 'fp8'"),
                      (["--world-size", "2", "--timeout", "0"], "--timeout 0: use more than 0 and at most 604800 seconds"),
                      (["--device-memory", "lots"], "--device-memory"),
                      (["--model", "mlp", "--exec", "cpu", "--amp", "fp16"], "--amp needs --exec meta")]:
        bad = os.path.join(tmp, "bad")
        code, out, err = run("run", *args, "--out", bad)
        check(f"bad {args} exit 2", code == 2, (code, err))
        check(f"bad {args} one line", len(err.strip().splitlines()) == 1 and msg in err, err)
finally:
    shutil.rmtree(tmp)
finish("memscope run")
