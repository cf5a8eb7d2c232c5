#!/usr/bin/env python3
"""End-to-end tests of memscope check: budgets, baseline regressions, JUnit
XML, --json and the exit codes (0 ok, 1 a check failed, 2 unusable input)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

from clitest import DATA, MiB, check, data, finish, run  # noqa: E402


tmp = tempfile.mkdtemp(prefix="memscope-check-")
try:
    run_dir = os.path.join(tmp, "run")
    code, out, err = run("replay", os.path.join(DATA, "phases.jsonl"), "--out", run_dir)
    check("record exit", code == 0, err)
    report_path = os.path.join(run_dir, "report.json")
    r0 = json.load(open(report_path))["ranks"][0]
    check("recorded peak", r0["peak"]["allocated"]["bytes"] == 120 * MiB and r0["peak_reserved_bytes"] == 120 * MiB,
          r0["peak"])

    # A budget that holds: exit 0, an ok line and the summary.
    code, out, err = run("check", run_dir, "--max", "peak_allocated=200MiB")
    check("pass exit", code == 0, (code, out, err))
    check("pass line", "ok   peak_allocated rank 0: 120.00 MiB <= 200.00 MiB" in out, out)
    check("pass summary", out.rstrip().endswith("memscope check: 1 check, 0 failed"), out)

    # The same from report.json and from the timeline file.
    for path in [report_path, os.path.join(run_dir, "rank-0.timeline")]:
        code, out, err = run("check", path, "--max", "peak_allocated=200MiB")
        check(f"pass exit {os.path.basename(path)}", code == 0, (code, out, err))

    # A budget that fails: exit 1, one FAIL line with by how much and where.
    code, out, err = run("check", run_dir, "--max", "peak_allocated=100MiB", "--max", "rank0.peak_reserved=1GiB")
    check("budget fail exit", code == 1, (code, out, err))
    fail_lines = [l for l in out.splitlines() if l.startswith("FAIL")]
    check("one FAIL line", len(fail_lines) == 1, out)
    line = fail_lines[0] if fail_lines else ""
    check("FAIL line", line.startswith("FAIL peak_allocated rank 0: 120.00 MiB > limit 100.00 MiB (+20.0%)") and
          "forward:0" in line and "TEMPORARY" in line, line)
    check("fail summary", out.rstrip().endswith("memscope check: 2 checks, 1 failed"), out)

    # --json
    code, out, err = run("check", run_dir, "--max", "peak_allocated=100MiB", "--json")
    check("json exit", code == 1, (code, err))
    j = json.loads(out)
    c = j["checks"][0]
    check("json", j["failed"] == 1 and c["metric"] == "peak_allocated" and c["rank"] == 0 and
          c["value"] == 120 * MiB and c["limit"] == 100 * MiB and c["passed"] is False and c["phase"] == "forward:0" and
          c["by_category"]["TEMPORARY"] > 0, j)

    # Baseline: every peak 30% lower, so this run grew by ~43%.
    base = json.load(open(report_path))
    for rank in base["ranks"]:
        rank["peak"]["allocated"]["bytes"] = int(rank["peak"]["allocated"]["bytes"] * 0.7)
        rank["peak"]["reserved"]["bytes"] = int(rank["peak"]["reserved"]["bytes"] * 0.7)
        rank["peak_reserved_bytes"] = int(rank["peak_reserved_bytes"] * 0.7)
        for key in ["allocated_bytes.all.peak", "reserved_bytes.all.peak", "active_bytes.all.peak"]:
            rank["memory_stats"][key] = int(rank["memory_stats"][key] * 0.7)
    edited = os.path.join(tmp, "edited.json")
    json.dump(base, open(edited, "w"))
    code, out, err = run("check", run_dir, "--baseline", edited, "--tolerance", "10")
    check("baseline fail exit", code == 1, (code, out, err))
    fails = [l for l in out.splitlines() if l.startswith("FAIL")]
    check("baseline FAIL lines", len(fails) == 3 and all("vs baseline" in l and "forward:0" in l for l in fails), out)
    check("baseline growth", "+42.9% vs baseline 84.00 MiB, tolerance 10%" in out, out)
    code, out, err = run("check", run_dir, "--baseline", edited, "--tolerance", "50")
    check("baseline pass exit", code == 0, (code, out, err))
    code, out, err = run("check", run_dir, "--baseline", run_dir)
    check("baseline against itself", code == 0 and "3 checks, 0 failed" in out, (code, out, err))

    # --junit
    junit = os.path.join(tmp, "out.xml")
    code, out, err = run("check", run_dir, "--max", "peak_allocated=100MiB", "--max", "peak_active=1GiB",
                         "--baseline", edited, "--tolerance", "10", "--junit", junit)
    check("junit exit", code == 1, (code, err))
    try:
        root = ET.parse(junit).getroot()
        suite = root.find("testsuite")
        cases = suite.findall("testcase")
        failed = [c for c in cases if c.find("failure") is not None]
        check("junit root", root.tag == "testsuites", root.tag)
        check("junit counts", suite.get("name") == "memscope check" and suite.get("tests") == "5" and
              suite.get("failures") == "4" and len(cases) == 5 and len(failed) == 4,
              ET.tostring(root, encoding="unicode"))
        check("junit names", cases[0].get("classname") == "memscope.rank0" and cases[0].get("name") == "peak_allocated",
              cases[0].attrib)
        msg = failed[0].find("failure").get("message")
        check("junit message", msg.startswith("FAIL peak_allocated rank 0: 120.00 MiB > limit") and "forward:0" in msg,
              msg)
    except (ET.ParseError, OSError, AttributeError, IndexError) as e:
        check("junit parses", False, repr(e))

    # A PyTorch snapshot is checked through its replay: the run's snapshot at the peak has the same peak.
    pickle_path = os.path.join(run_dir, "snapshot-rank-0.pickle")
    code, out, err = run("check", pickle_path, "--max", "peak_allocated=200MiB")
    check("snapshot passes", code == 0 and "ok   peak_allocated rank 0: 120.00 MiB <= 200.00 MiB" in out, (code, out, err))
    code, out, err = run("check", pickle_path, "--max", "peak_allocated=100MiB")
    check("snapshot fails", code == 1 and "FAIL peak_allocated rank 0: 120.00 MiB" in out, (code, out, err))

    # Unusable input: exit 2 with one line on stderr.
    bad_schema = os.path.join(tmp, "run.json")
    shutil.copy(os.path.join(run_dir, "run.json"), bad_schema)
    pickle_path = os.path.join(run_dir, "snapshot-rank-0.pickle")
    for args, needle in [
        ([os.path.join(tmp, "missing"), "--max", "peak_allocated=1GiB"], "does not exist"),
        ([run_dir, "--max", "bogus=1GiB"], "unknown metric 'bogus'"),
        ([run_dir, "--max", "peak_allocated=lots"], "invalid size 'lots'"),
        ([run_dir], "nothing to check"),
        ([run_dir, "--max", "rank7.peak_allocated=1GiB"], "rank 7 is not in the report"),
        ([run_dir, "--baseline", os.path.join(tmp, "nope.json")], "does not exist"),
        ([run_dir, "--baseline", edited, "--tolerance", "ten"], "invalid --tolerance 'ten'"),
        ([bad_schema, "--max", "peak_allocated=1GiB"], "schema 'memscope.run/1'"),
    ]:
        code, out, err = run("check", *args)
        check(f"bad input exit {args}", code == 2, (code, out, err))
        check(f"bad input message {args}", needle in err and len(err.strip().splitlines()) == 1, err)
finally:
    shutil.rmtree(tmp, ignore_errors=True)

finish("check_test")
