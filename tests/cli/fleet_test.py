#!/usr/bin/env python3
"""memscope fleet end to end: rank sets generated here (traces.rank_trace,
recorded with `memscope replay --out` and written as PyTorch snapshots with
`memscope snapshot`, one per rank as a capture writes them), with planted
outliers found and explained, none in a uniform set, the summary --json
route giving the same result as the snapshots, budgets as memscope check,
the HTML page, and the refusals."""
import json
import os
import shutil
import tempfile

import traces
from clitest import MiB, check, finish, run

GiB = 1 << 30
tmp = tempfile.mkdtemp(prefix="memscope-fleet-test-")


def path(*parts):
    return os.path.join(tmp, *parts)


def snapshot_of(name, **kwargs):
    """A one-rank recording of traces.rank_trace(**kwargs), as a PyTorch snapshot."""
    traces.rank_trace(path(name + ".jsonl"), **kwargs)
    rc, _, err = run("replay", path(name + ".jsonl"), "--out", path("run-" + name))
    check(f"replay {name}", rc == 0, err)
    rc, _, err = run("snapshot", path("run-" + name), "-o", path(name + ".pickle"))
    check(f"snapshot {name}", rc == 0, err)
    return path(name + ".pickle")


base = snapshot_of("base")
extra = snapshot_of("extra", extra_optimizer=2 * GiB)  # rank 37: 2 GiB more optimizer state
leak = snapshot_of("leak", leak_per_step=128 * MiB)  # rank 3: 128 MiB more every step

# 40 ranks, one snapshot each, named as a capture names them.
os.mkdir(path("snaps"))
for r in range(40):
    shutil.copy({3: leak, 37: extra}.get(r, base), path("snaps", f"snapshot-rank-{r}.pickle"))


def fleet_json(*args):
    rc, out, err = run("fleet", *args, "--json")
    check(f"fleet {args} exit", rc == 0, err)
    return json.loads(out) if rc == 0 else {"ranks": [], "outliers": [], "spread": {}}


# --- planted outliers, found and explained -------------------------------------
snaps = fleet_json(path("snaps"))
check("40 ranks", [r["rank"] for r in snaps["ranks"]] == list(range(40)), snaps["ranks"][:2])
check("outliers are ranks 3 and 37", [o["rank"] for o in snaps["outliers"]] == [3, 37], snaps["outliers"])
by_rank = {r["rank"]: r for r in snaps["ranks"]}
# A rank's peak: at forward of step 1 and later, 256 MiB parameters + 256 MiB gradients + 512 MiB Adam state
# + 512 MiB activations + a 64 MiB temporary = 1600 MiB. Rank 37 holds 2 GiB more Adam state throughout;
# rank 3's peak is at the end of its last forward: 1536 MiB + 4 x 128 MiB of leak (its temporary freed).
check("median rank's peak", by_rank[0]["peak_allocated_bytes"] == 1600 * MiB, by_rank[0])
check("rank 37's peak", by_rank[37]["peak_allocated_bytes"] == 1600 * MiB + 2 * GiB, by_rank[37])
check("rank 3's peak", by_rank[3]["peak_allocated_bytes"] == 1536 * MiB + 4 * 128 * MiB, by_rank[3])
check("rank 3 grows 128 MiB a step", by_rank[3]["growth_per_step_bytes"] == 128 * MiB, by_rank[3])
check("other ranks do not grow", all(by_rank[r]["growth_per_step_bytes"] == 0 for r in by_rank if r != 3))
spread = snaps["spread"]["peak_allocated"]
check("spread", (spread["min"], spread["median"], spread["max"], spread["max_rank"]) ==
      (1600 * MiB, 1600 * MiB, 1600 * MiB + 2 * GiB, 37), spread)
outliers = {o["rank"]: o for o in snaps["outliers"]}
o37 = outliers.get(37, {"flagged": [], "categories": [{}], "sites": [{}], "phases": []})
check("rank 37 flagged by its peaks", o37["flagged"] == ["peak_allocated", "peak_reserved"], o37)
check("rank 37: 2 GiB more OPTIMIZER_STATE",
      o37["categories"] == [{"what": "OPTIMIZER_STATE", "bytes": 2 * GiB + 512 * MiB, "median_bytes": 512 * MiB,
                             "delta": 2 * GiB}], o37["categories"])
check("rank 37: the site is Adam's state", o37["sites"][0]["what"].startswith("OPTIMIZER_STATE")
      and "adam" in o37["sites"][0]["what"] and o37["sites"][0]["delta"] == 2 * GiB, o37["sites"])
check("rank 37: every phase 2 GiB higher", sorted(p["what"] for p in o37["phases"]) == ["backward", "forward", "step"]
      and all(p["delta"] == 2 * GiB for p in o37["phases"]), o37["phases"])
o3 = outliers.get(3, {"flagged": [], "categories": [{}], "sites": [{}]})
check("rank 3 flagged for growth", "growth_per_step" in o3["flagged"], o3)
check("rank 3: the leak's ACTIVATION", o3["categories"][0] == {"what": "ACTIVATION", "bytes": 1024 * MiB,
                                                              "median_bytes": 512 * MiB, "delta": 512 * MiB},
      o3["categories"])
check("rank 3: the leaking site", "metrics.history" in o3["sites"][0]["what"] and o3["sites"][0]["delta"] == 512 * MiB,
      o3["sites"])

rc, out, err = run("fleet", path("snaps"))
check("text exit", rc == 0, err)
check("text names both outliers", "2 outlier ranks" in out and "\nrank 3: " in out and "\nrank 37: " in out, out)
check("text explains rank 37",
      "  categories at the peak: OPTIMIZER_STATE +2.00 GiB (2.50 GiB against 512.00 MiB)\n" in out, out)
check("notes said once for all ranks", "memscope: note: 40 ranks: device 0 of FILE: its trace was replayed" in err, err)

# --- a uniform set: no outlier ----------------------------------------------------
os.mkdir(path("uniform"))
for r in range(16):
    shutil.copy(base, path("uniform", f"snapshot-rank-{r}.pickle"))
uniform = fleet_json(path("uniform"))
check("uniform: no outlier", uniform["outliers"] == [] and len(uniform["ranks"]) == 16, uniform["outliers"])
rc, out, _ = run("fleet", path("uniform"))
check("uniform text", "no outlier rank (modified z-score above 3.5)\n" in out, out)

# --- the summary --json route gives the same fleet ---------------------------------
os.mkdir(path("sums"))
for r in range(40):
    rc, out, err = run("summary", path("snaps", f"snapshot-rank-{r}.pickle"), "--json")
    check(f"summary rank {r}", rc == 0, err)
    with open(path("sums", f"rank-{r}.json"), "w") as f:
        f.write(out)
sums = fleet_json(path("sums"))


def without_origin(result):
    """The fleet's result without where each rank was read from."""
    result = json.loads(json.dumps(result))
    for r in result["ranks"]:
        for key in ("source", "kind", "notes"):
            r.pop(key)
    return result


check("summaries == snapshots", without_origin(sums) == without_origin(snaps),
      json.dumps(without_origin(sums))[:400])
check("summaries are report.json files", {r["kind"] for r in sums["ranks"]} == {"report.json"}, sums["ranks"][:1])
# ... and as files named on the command line, in any order, with one worker.
files = [path("sums", f"rank-{r}.json") for r in reversed(range(40))]
check("files, --jobs 1", without_origin(fleet_json(*files, "--jobs", "1")) == without_origin(snaps))

# --- run directories: timelines and the GPU table ------------------------------------
rc, _, err = run("run", "--model", "mlp", "--steps", "2", "--world-size", "2", "--gpu", "h100-80gb",
                 "--out", path("kinds"))
check("run", rc == 0, err)
kinds = fleet_json(path("kinds"))
check("a run's ranks from its timelines", [(r["rank"], os.path.basename(r["source"])) for r in kinds["ranks"]] ==
      [(0, "rank-0.timeline"), (1, "rank-1.timeline")], kinds["ranks"])
gpu = kinds["ranks"][1]["gpus"][0] if kinds["ranks"] else {}
check("a run's GPU table, rank 1's row", gpu.get("physical") == 1 and
      [p["rank"] for p in gpu.get("processes", [])] == [1] and gpu["processes"][0]["context_bytes"] == 400 * MiB, gpu)
# rank-R in a file's name wins over the rank recorded in it (each replay recorded rank 0).
shutil.copy(path("run-base", "rank-0.timeline"), path("rank-5.timeline"))
named = fleet_json(path("run-base"), path("rank-5.timeline"))
check("named rank", [r["rank"] for r in named["ranks"]] == [0, 5], named["ranks"])

# --- budgets, as memscope check -------------------------------------------------------
rc, out, _ = run("fleet", path("snaps"), "--max", "peak_allocated=3GiB")
check("budget fails: exit 1", rc == 1, rc)
check("budget line as check's", "FAIL peak_allocated rank 37: 3.56 GiB > limit 3.00 GiB (+18.8%) at forward:1; "
      "OPTIMIZER_STATE 2.50 GiB (70%), ACTIVATION 512.00 MiB (14%), GRADIENT 256.00 MiB (7%)\n" in out
      and "memscope check: 40 checks, 1 failed\n" in out, out)
rc, out, _ = run("fleet", path("snaps"), "--max", "peak_allocated=4GiB", "--max", "rank3.peak_reserved=2.5GiB")
check("budgets hold: exit 0", rc == 0 and "memscope check: 41 checks, 0 failed\n" in out, out)
rc, out, _ = run("fleet", path("snaps"), "--max", "peak_reserved=3GiB", "--json")
check("budgets in --json", rc == 1 and json.loads(out)["checks"]["failed"] == 1, out[-300:])

# --- the HTML page, its outliers linked to their own reports ---------------------------
os.mkdir(path("page"))
rc, out, err = run("fleet", path("snaps"), "--html", path("page", "fleet.html"))
check("html exit", rc == 0, err)
check("html wrote", out.endswith(f"wrote {path('page', 'fleet.html')} (and the own report of 2 outlier ranks beside it)\n"),
      out[-200:])
page = open(path("page", "fleet.html")).read() if rc == 0 else ""
check("heat map", "<table class=heat>" in page and page.count("<tr") == 41, page[:200])
check("outliers linked", '<a href="fleet-rank-3.html">' in page and '<a href="fleet-rank-37.html">' in page)
for r in (3, 37):
    own = path("page", f"fleet-rank-{r}.html")
    check(f"rank {r}'s own report", os.path.exists(own) and 'id="memscope-data"' in open(own).read())

# --- refusals: one line, exit 2 -----------------------------------------------------------
os.mkdir(path("empty"))
with open(path("no-ranks.json"), "w") as f:
    json.dump({"schema": "memscope.report/1", "world_size": 0, "ranks": []}, f)
with open(path("bad.pickle"), "wb") as f:
    f.write(open(base, "rb").read()[:100])
for args, message in [
    ((path("nowhere"),), f"memscope fleet: '{path('nowhere')}' does not exist\n"),
    ((path("empty"),), f"memscope fleet: '{path('empty')}' holds no ranks: no snapshot, timeline or report.json / "
                       "summary --json file\n"),
    ((path("base.jsonl"),), None),
    ((path("no-ranks.json"), path("no-ranks.json")), f"memscope fleet: '{path('no-ranks.json')}' holds no rank\n"),
    ((path("bad.pickle"),), None),
    ((path("run-base"), path("run-leak")), f"memscope fleet: rank 0 is in both '{path('run-base', 'rank-0.timeline')}' "
                                           f"and '{path('run-leak', 'rank-0.timeline')}' (name the files rank-R)\n"),
    ((path("snaps"), "--max", "peak_allocated"), None),
    ((path("snaps"), "--max", "rank99.peak_allocated=1GiB"), None),
    ((path("snaps"), "--jobs", "0"), None),
    ((path("snaps"), "--device-memory", "lots"), None),
]:
    rc, out, err = run("fleet", *args)
    check(f"refused {args}: exit 2", rc == 2, (rc, err))
    check(f"refused {args}: one line", err.count("\n") == 1 and out == "", err)
    if message:
        check(f"refused {args}: message", err == message, err)

shutil.rmtree(tmp)
finish("fleet")
