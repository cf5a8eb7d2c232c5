#!/usr/bin/env python3
"""End-to-end tests of memscope compare: two `memscope run`s of the MLP, SGD
without momentum (no optimizer state) against Adam (exp_avg and exp_avg_sq:
exactly 2x the parameter bytes), as text and --json, from run directories,
report.json and timeline files; ranks; unusable input (exit 2, one line)."""
import copy
import json
import math
import os
import shutil
import tempfile

from clitest import DATA, check, finish, run  # noqa: E402


def block(nbytes):
    """The allocator's block for a tensor of nbytes: a multiple of 512 bytes."""
    return max(512, (nbytes + 511) // 512 * 512)


def lines_with(text, prefix):
    return [l for l in text.splitlines() if l.startswith(prefix)]


tmp = tempfile.mkdtemp(prefix="memscope-compare-")
try:
    sgd, adam = os.path.join(tmp, "sgd"), os.path.join(tmp, "adam")
    for out, opts in [(sgd, ["--optimizer", "sgd", "--momentum", "0"]), (adam, ["--optimizer", "adam"])]:
        code, _, err = run("run", "--model", "mlp", "--steps", "2", *opts, "--out", out)
        check(f"record {os.path.basename(out)}", code == 0, err)

    # The MLP's parameters (256 inputs, 3 hidden layers of 512, 10 classes): weights and biases, as
    # `memscope models` and run.json count them, and the bytes of their blocks.
    shapes = [(512, 256), (512,), (512, 512), (512,), (512, 512), (512,), (10, 512), (10,)]
    counts = [math.prod(shape) for shape in shapes]
    run_json = json.load(open(os.path.join(adam, "run.json")))
    check("parameter count (run.json)", run_json["parameters"] == sum(counts) == 662026, run_json["parameters"])
    code, out, _ = run("models")
    check("parameter count (models)", any(l.split()[:2] == ["mlp", "662,026"] for l in out.splitlines()), out)
    param_bytes = sum(block(4 * n) for n in counts)
    check("parameter bytes", param_bytes == 2648576, param_bytes)
    report_b = json.load(open(os.path.join(adam, "report.json")))["ranks"][0]
    check("PARAMETER bytes in the report", report_b["phases"][0]["by_category"]["PARAMETER"] == param_bytes,
          report_b["phases"][0])

    # --json: the numbers.
    code, out, err = run("compare", sgd, adam, "--json")
    check("json exit", code == 0 and err == "", (code, err))
    j = json.loads(out)
    check("json schema", j["schema"] == "memscope.compare/1" and j["notes"] == [], j.get("schema"))
    check("json runs", j["a"]["path"] == sgd and j["b"]["path"] == adam and j["a"]["ranks"] == [0] and
          j["a"]["config"]["optimizer"] == "sgd" and j["b"]["config"]["optimizer"] == "adam" and
          j["b"]["config"]["model"] == "mlp" and j["b"]["config"]["ddp"] == "off" and
          j["b"]["config"]["alloc_conf"] == "", (j["a"], j["b"]))
    r = j["ranks"][0]
    names = [(p["phase"], p["step"]) for p in r["phases"]]
    check("json rows", names == [("model", None)] + [(ph, s) for s in (0, 1)
                                                     for ph in ("zero_grad", "forward", "loss", "backward", "step")],
          names)
    rows = {(p["phase"], p["step"]): p for p in r["phases"]}
    # Until the first optimizer step the runs are the same.
    for key in [("model", None), ("zero_grad", 0), ("forward", 0), ("loss", 0), ("backward", 0)]:
        check(f"no difference in {key}", rows[key]["delta"] == {"allocated_bytes": 0, "max_allocated_bytes": 0,
                                                                "reserved_bytes": 0}, rows[key])
    # After each step Adam holds its state: 2x the parameter bytes.
    for key in [("step", 0), ("step", 1)]:
        row = rows[key]
        check(f"{key} delta", row["delta"]["allocated_bytes"] == 2 * param_bytes and
              row["b"]["allocated_bytes"] - row["a"]["allocated_bytes"] == 2 * param_bytes, row)
    report_a = json.load(open(os.path.join(sgd, "report.json")))["ranks"][0]
    for key, phase in [("allocated", "step:0"), ("reserved", "step:0")]:
        peak = r["peaks"][key]
        check(f"peak {key}", peak["a_bytes"] == report_a["peak"][key]["bytes"] and
              peak["b_bytes"] == report_b["peak"][key]["bytes"] and
              peak["delta_bytes"] == peak["b_bytes"] - peak["a_bytes"] and peak["a_phase"] == "backward:0" and
              peak["b_phase"] == phase, peak)
    end = r["explain"]["end"]
    check("end moment", end["a_moment"] == "step:1" and end["b_moment"] == "step:1", end)
    check("end: OPTIMIZER_STATE explains it", end["categories"][0] == {
        "category": "OPTIMIZER_STATE", "a_bytes": 0, "b_bytes": 2 * param_bytes, "delta_bytes": 2 * param_bytes},
        end["categories"][:1])
    check("end: nothing else differs", all(c["delta_bytes"] == 0 for c in end["categories"][1:]) and
          end["delta_bytes"] == 2 * param_bytes, end)
    at_peak = r["explain"]["peak"]
    check("peak: OPTIMIZER_STATE first", at_peak["categories"][0]["category"] == "OPTIMIZER_STATE" and
          at_peak["categories"][0]["delta_bytes"] == 2 * param_bytes, at_peak["categories"][:1])
    deltas = [abs(c["delta_bytes"]) for c in at_peak["categories"]]
    check("peak: sorted by |delta|", deltas == sorted(deltas, reverse=True), at_peak["categories"])
    check("peak: deltas add up", sum(c["delta_bytes"] for c in at_peak["categories"]) == at_peak["delta_bytes"] ==
          r["peaks"]["allocated"]["delta_bytes"], at_peak)

    # The text: header, the phase table with B-A, peaks, explanations.
    code, text, err = run("compare", sgd, adam)
    check("text exit", code == 0 and err == "", (code, err))
    out_lines = text.splitlines()
    check("header A", out_lines[0] == f"A: {sgd} (model mlp, optimizer sgd, 2 steps, ddp off, world size 1, "
          "alloc_conf (defaults))", out_lines[:2])
    check("header B", out_lines[1] == f"B: {adam} (model mlp, optimizer adam, 2 steps, ddp off, world size 1, "
          "alloc_conf (defaults))", out_lines[:2])
    check("rank block", "== rank 0" in out_lines, text)
    check("column names", "step  phase                  A        B      B-A         A        B      B-A         A"
          "        B      B-A" in out_lines, text)
    # The table's unit: the largest of G, M, K in which its largest value is at least 100.
    largest = max(v[k] for row in rows.values() for side in ("a", "b") if row.get(side)
                  for v in [row[side]] for k in ["allocated_bytes", "max_allocated_bytes", "reserved_bytes"])
    unit = next(((b, s) for b, s in [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")] if largest // b >= 100), (1, "B"))
    mib = lambda b: f"{b // unit[0]}{unit[1]}"  # noqa: E731
    step0 = rows[("step", 0)]
    expected = "%-5s %-14s" % ("0", "step") + "".join(
        "  %8s %8s %8s" % (mib(step0["a"][k]), mib(step0["b"][k]), "+" + mib(step0["b"][k] - step0["a"][k]))
        for k in ["allocated_bytes", "max_allocated_bytes", "reserved_bytes"])
    check("step:0 row", expected in out_lines, (expected, text))
    backward = [l.split() for l in lines_with(text, "0     backward")]
    check("backward:0 row: no difference", len(backward) == 1 and backward[0][4::3] == ["0" + unit[1]] * 3 and
          backward[0][2] == backward[0][3] == mib(rows[("backward", 0)]["a"]["allocated_bytes"]), backward)
    peak = r["peaks"]["allocated"]
    growth = f"+{peak['delta_bytes'] / (1 << 20):.2f} MiB ({100 * peak['delta_bytes'] / peak['a_bytes']:+.1f}%)"
    peak_line = lines_with(text, "allocated ")
    check("peak line", len(peak_line) == 1 and peak_line[0].split()[:7] == [
        "allocated", f"{peak['a_bytes'] / (1 << 20):.2f}", "MiB", "backward:0", f"{peak['b_bytes'] / (1 << 20):.2f}",
        "MiB", "step:0"] and peak_line[0].endswith(growth), (peak_line, growth))
    opt = lines_with(text, "OPTIMIZER_STATE")
    check("OPTIMIZER_STATE lines", len(opt) == 2 and all(l.split() == ["OPTIMIZER_STATE", "0", "bytes", "5.05", "MiB",
                                                                        "+5.05", "MiB"] for l in opt), opt)
    end_text = text[text.index("at the end of the run"):]
    check("end explanation", "what explains the difference at the end of the run (A step:1, B step:1):" in text and
          end_text.splitlines()[2].startswith("OPTIMIZER_STATE") and
          all(l.split()[-2:] == ["0", "bytes"] for l in end_text.splitlines()[3:-1]) and
          end_text.splitlines()[-1].split()[-2:] == ["+5.05", "MiB"], end_text)

    # report.json and timeline files compare like their run directory (run.json next to them).
    for a_path, b_path in [(os.path.join(sgd, "report.json"), os.path.join(adam, "report.json")),
                           (os.path.join(sgd, "rank-0.timeline"), adam)]:
        code, out, err = run("compare", a_path, b_path, "--json")
        check(f"exit {a_path}", code == 0, (code, err))
        other = json.loads(out) if code == 0 else {}
        check(f"same numbers from {a_path}", other.get("ranks") == j["ranks"] and
              other["a"]["config"] == j["a"]["config"], out[:300])

    # A PyTorch snapshot (the run's, at its peak) is compared through its replay: a note on stderr.
    code, out, err = run("compare", os.path.join(sgd, "snapshot-rank-0.pickle"), adam)
    check("snapshot", code == 0 and "== rank 0" in out and "memscope: note:" in err, (code, err))

    # Ranks: a two-rank report (rank 0 twice) against the one-rank run.
    two = json.load(open(os.path.join(adam, "report.json")))
    rank1 = copy.deepcopy(two["ranks"][0])
    rank1["rank"] = 1
    two["ranks"].append(rank1)
    two["world_size"] = 2
    two_path = os.path.join(tmp, "two-ranks.json")
    json.dump(two, open(two_path, "w"))
    code, out, err = run("compare", two_path, adam)
    check("world sizes exit", code == 0, (code, err))
    check("world sizes note", "note: A has world size 2 (ranks 0, 1) and B world size 1 (ranks 0): comparing the "
          "ranks both have (0)" in out.splitlines() and out.count("== rank") == 1, out)
    code, out, err = run("compare", two_path, two_path)
    check("every rank", code == 0 and lines_with(out, "== rank") == ["== rank 0", "== rank 1"], out)
    code, out, err = run("compare", two_path, two_path, "--rank", "1", "--json")
    check("--rank 1", code == 0 and [x["rank"] for x in json.loads(out)["ranks"]] == [1], out[:300])

    # Unusable input: exit 2 and one line on stderr naming the problem.
    not_run = os.path.join(tmp, "empty")
    os.mkdir(not_run)
    bad_json = os.path.join(tmp, "bad.json")
    open(bad_json, "w").write("{ not json")
    for args, needle in [
        ([sgd, os.path.join(tmp, "missing")], "does not exist"),
        ([os.path.join(tmp, "missing"), adam], "does not exist"),
        ([sgd, not_run], "not a memscope run directory"),
        ([sgd, bad_json], "is not valid JSON"),
        ([sgd, os.path.join(adam, "run.json")], "schema 'memscope.run/1'"),
        ([sgd, os.path.join(DATA, "phases.jsonl")], "is a request trace"),
        ([sgd, adam, "--rank", "1"], "--rank 1: A"),
        ([two_path, adam, "--rank", "1"], "--rank 1: B"),
        ([sgd, adam, "--rank", "-1"], "--rank: Value -1 not in range"),
        ([sgd], "required"),
    ]:
        code, out, err = run("compare", *args)
        check(f"bad input exit {args}", code == 2 and out == "", (code, out, err))
        check(f"bad input message {args}", needle in err and len(err.strip().splitlines()) == 1, err)
finally:
    shutil.rmtree(tmp, ignore_errors=True)

finish("compare_test")
