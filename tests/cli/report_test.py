#!/usr/bin/env python3
"""End-to-end tests of `memscope report` (the HTML report) and of report.html in
a run directory: the page is self-contained (nothing fetched), its data holds
the numbers of report.json, long runs stay small, bad input is exit 2."""
import json
import os
import re
import shutil
import tempfile
import time

from clitest import MiB, check, data, finish, run  # noqa: E402
import traces


def page_data(path):
    """The JSON data blob of a report page."""
    html = open(path, encoding="utf-8").read()
    m = re.search(r'<script type="application/json" id="memscope-data">(.*?)</script>', html, re.S)
    return html, json.loads(m.group(1)) if m else None


def check_offline(name, html):
    """Nothing in the page may reach the network."""
    check(f"{name}: no http(s) address", re.search(r"https?://", html) is None,
          re.findall(r".{40}https?://.{40}", html)[:3])
    check(f"{name}: no external script", re.search(r"<script[^>]*\ssrc\s*=", html, re.I) is None, "")
    check(f"{name}: no <link>", re.search(r"<link\b", html, re.I) is None, "")
    for api in ["fetch(", "XMLHttpRequest", "import(", "WebSocket", "EventSource", "sendBeacon", "@import"]:
        check(f"{name}: no {api}", api not in html, "")
    check(f"{name}: CSP default-src 'none'", "default-src 'none'" in html, "")
    check(f"{name}: two inline scripts", len(re.findall(r"<script\b", html)) == 2, re.findall(r"<script[^>]*>", html))


tmp = tempfile.mkdtemp(prefix="memscope-report-")
try:
    run_dir = os.path.join(tmp, "run")
    code, out, err = run("replay", data("phases.jsonl"), "--out", run_dir)
    check("record exit", code == 0, err)
    check("run dir has report.html", os.path.exists(os.path.join(run_dir, "report.html")), os.listdir(run_dir))
    report = json.load(open(os.path.join(run_dir, "report.json")))

    page = os.path.join(tmp, "r.html")
    code, out, err = run("report", run_dir, "-o", page)
    check("report exit", code == 0, err)
    check("report says", out.startswith(f"wrote {page} (1 run, 1 rank,"), out)
    html, d = page_data(page)
    check_offline("one run", html)
    check("schema", d and d["schema"] == "memscope.viewer/1", d and d.get("schema"))
    rk = d["runs"][0]["ranks"][0]
    # The page's tables come from report.json's own numbers.
    check("report section", rk["report"]["phases"] ==
          [{k: v for k, v in p.items() if k != "by_category"} for p in report["ranks"][0]["phases"]], "")
    check("peak", rk["report"]["peak"] == report["ranks"][0]["peak"], "")
    s = rk["samples"]
    check("samples peak", max(s["allocated"]) == 120 * MiB and max(s["reserved"]) == 120 * MiB, "")
    check("stack = allocated", all(sum(s["by_category"][c][i] for c in s["by_category"]) == s["allocated"][i]
                                   for i in range(len(s["t"]))), "")
    check("categories drawn", sorted(s["by_category"]) == ["ACTIVATION", "GRADIENT", "PARAMETER", "TEMPORARY"],
          sorted(s["by_category"]))
    check("not thinned", not rk["thinned"] and len(s["t"]) == rk["samples_total"], rk["samples_total"])
    check("bands", [(b["name"], b["depth"]) for b in rk["bands"]] ==
          [("model", 0), ("forward:0", 0), ("backward:0", 0)], rk["bands"])
    check("steps", [st["step"] for st in rk["steps"]] == [0], rk["steps"])
    check("marks", [m["text"] for m in rk["marks"]] == ["step 0 done"], rk["marks"])
    keys = [m["key"] for m in rk["moments"]]
    check("moments", keys == ["model", "peak", "forward:0", "backward:0", "end", "exit"], keys)
    # Segment maps: the same segments `memscope frag --at` reports.
    for m in rk["moments"]:
        at = m["key"]
        code, out, err = run("frag", run_dir, "--at", at, "--json")
        f = json.loads(out)["ranks"][0]
        check(f"moment {at} fragmentation", m["fragmentation"] == f["fragmentation"], (m["fragmentation"], f))
        check(f"moment {at} segments", sorted((sg["addr"], sg["size"]) for sg in m["segments"]) ==
              sorted((sg["address"], sg["size"]) for sg in f["segments"]), "")
        for sg in m["segments"]:
            check(f"moment {at} blocks tile the segment",
                  sum(b[1] for b in sg["blocks"]) == sg["size"] and sg["blocks"][0][0] == 0, sg)
    peak = rk["moments"][1]
    kinds = sorted((sg["size"] // MiB, [(b[1] // MiB, d["categories"][b[2]] if b[2] < 10 else b[2])
                                        for b in sg["blocks"]]) for sg in peak["segments"])
    check("peak segment map", kinds == [(30, [(30, "PARAMETER")]), (40, [(40, "ACTIVATION")]),
                                        (50, [(50, "TEMPORARY")])], kinds)
    end = rk["moments"][-1]
    kinds = sorted((sg["size"] // MiB, [(b[1] // MiB, b[2]) for b in sg["blocks"]]) for sg in end["segments"])
    # At the end, g (30 MiB GRADIENT) sits in tmp's 50 MiB segment: 20 MiB inactive split (kind 10).
    check("end segment map", kinds == [(30, [(30, 0)]), (50, [(30, 4), (20, 10)])], kinds)
    check("owners", "fc" in rk["owners"], rk["owners"])

    # `memscope report` of one run starts with memscope explain's section (its --json); report.html in the
    # run directory is the same page without it (--no-explain).
    x = d["runs"][0].get("explain")
    code, out, err = run("explain", run_dir, "--json")
    check("explain section", x is not None and code == 0 and x == json.loads(out), (x, err))
    plain = os.path.join(tmp, "plain.html")
    code, out, err = run("report", run_dir, "-o", plain, "--no-explain")
    check("report --no-explain", code == 0 and "explain" not in page_data(plain)[1]["runs"][0], err)
    check("run dir page", open(os.path.join(run_dir, "report.html")).read() ==
          open(plain).read().replace(plain, run_dir), "")

    # A timeline file and a PyTorch snapshot are inputs too.
    code, out, err = run("report", os.path.join(run_dir, "rank-0.timeline"), "-o", os.path.join(tmp, "t.html"))
    check("report of a timeline", code == 0, err)
    code, out, err = run("report", os.path.join(run_dir, "snapshot-rank-0.pickle"), "-o", os.path.join(tmp, "s.html"))
    check("report of a snapshot", code == 0 and "note:" in err, err)
    _, ds = page_data(os.path.join(tmp, "s.html"))
    check("snapshot page", ds["runs"][0]["ranks"][0]["report"]["peak"]["allocated"]["bytes"] == 120 * MiB, "")

    # Default output name: report.html in the working directory.
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        code, out, err = run("report", run_dir)
        check("default -o", code == 0 and os.path.exists(os.path.join(tmp, "report.html")), err)
    finally:
        os.chdir(cwd)

    # Two runs: the comparison page.
    run_b = os.path.join(tmp, "run-b")
    code, out, err = run("replay", data("phases.jsonl"), "--alloc-conf", "expandable_segments:True", "--out", run_b)
    check("record b", code == 0, err)
    code, out, err = run("report", run_dir, run_b, "-o", os.path.join(tmp, "cmp.html"))
    check("compare exit", code == 0 and "2 runs compared" in out, (out, err))
    html, dc = page_data(os.path.join(tmp, "cmp.html"))
    check_offline("compare", html)
    check("compare runs", [r["label"] for r in dc["runs"]] == [run_dir, run_b], [r["label"] for r in dc["runs"]])
    check("compare b conf", dc["runs"][1]["ranks"][0]["report"]["alloc_conf"] == "expandable_segments:True", "")

    # A long run: thinned without losing the peaks; a bounded page.
    long_trace = os.path.join(tmp, "long.jsonl")
    allocs = traces.training_trace(long_trace, steps=150, layers=24, temporaries=6)
    long_run = os.path.join(tmp, "long")
    code, out, err = run("replay", long_trace, "--out", long_run, "--no-search")
    check("long record", code == 0, err)
    t0 = time.time()
    code, out, err = run("report", long_run, "-o", os.path.join(tmp, "long.html"), "--max-samples", "2000")
    seconds = time.time() - t0
    check("long report", code == 0, err)
    html, dl = page_data(os.path.join(tmp, "long.html"))
    lr = dl["runs"][0]["ranks"][0]
    rep = json.load(open(os.path.join(long_run, "report.json")))["ranks"][0]
    check("long thinned", lr["thinned"] and len(lr["samples"]["t"]) <= 2000 and lr["samples_total"] >= 2 * allocs,
          (len(lr["samples"]["t"]), lr["samples_total"]))
    check("long peaks kept", max(lr["samples"]["allocated"]) == rep["peak"]["allocated"]["bytes"] and
          max(lr["samples"]["reserved"]) == rep["peak"]["reserved"]["bytes"], "")
    check("long times ordered", lr["samples"]["t"] == sorted(lr["samples"]["t"]), "")
    phase_moments = [m for m in lr["moments"] if m["key"] not in ("peak", "oom", "end", "exit")]
    check("long moments bounded", 2 <= len(phase_moments) <= 48 + 3, len(phase_moments))
    kept_steps = sorted({int(m["key"].split(":")[1]) for m in phase_moments if ":" in m["key"]})
    check("long first and last step", kept_steps[0] == 0 and kept_steps[-1] == 149, kept_steps)
    check("long bands", len(lr["bands"]) == len(rep["phases"]) == 1 + 3 * 150, len(lr["bands"]))
    check("long moment index", all(lr["moments"][b["moment"]]["key"] == b["name"]
                                   for b in lr["bands"] if b["moment"] >= 0), "")
    check("long page size", len(html) < 3_000_000, len(html))
    print(f"long run: {lr['samples_total']} samples, {len(lr['samples']['t'])} drawn, {len(phase_moments)} "
          f"phase-end maps, page {len(html) / 1e6:.2f} MB, report in {seconds:.2f} s")

    # Bad input: one line, exit 2.
    for args, expect in [(["report", os.path.join(tmp, "missing")], "does not exist"),
                         (["report", data("phases.jsonl")], "is a request trace"),
                         (["report", tmp + "/long.jsonl", "-o", os.path.join(tmp, "x.html")], "is a request trace"),
                         (["report", run_dir, "-o", os.path.join(tmp, "no", "such", "dir.html")], "cannot write"),
                         (["report", run_dir, run_b, run_dir], "At Most 2"),
                         (["report"], "runs is required")]:
        code, out, err = run(*args)
        check(f"{args} exit", code == 2, (code, err))
        check(f"{args} message", expect in err and err.count("\n") == 1, err)
finally:
    shutil.rmtree(tmp)

finish("cli report")
