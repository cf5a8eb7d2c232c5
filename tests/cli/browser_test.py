#!/usr/bin/env python3
"""The HTML report in a real browser: Debian's headless Chromium driven by
Selenium (Debian packages chromium, chromium-driver, python3-selenium; scripts/test
installs them). Opens generated reports from file:// (no server), checks that
the timeline, the phase table and the segment map render with the numbers
`memscope summary --json` and `memscope frag --json` give, hovers, zooms,
clicks phases, and saves screenshots into OUTPUT_DIR.

    browser_test.py MEMSCOPE DATA_DIR OUTPUT_DIR

A missing browser is a failure, never a skip."""
import json
import re
import os
import shutil
import sys
import tempfile
import time

from clitest import DATA, MiB, check, data, finish, run  # noqa: E402
import traces

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
OUT = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else os.getcwd()
HOW = "install them with: apt-get install -y chromium chromium-driver python3-selenium (scripts/test does)"
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.wheel_input import ScrollOrigin
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError as e:
    print(f"FAIL: the browser test needs Python's selenium ({e}); {HOW}")
    sys.exit(1)
for path in (CHROMIUM, CHROMEDRIVER):
    if not os.access(path, os.X_OK):
        print(f"FAIL: the browser test needs {path}; {HOW}")
        sys.exit(1)


def format_size(b):
    """memscope's FormatSize (allocator/sizes.cpp)."""
    if b <= 1024:
        return f"{b} bytes"
    if b <= 1048576:
        return "%.2f KiB" % (b / 1024)
    if b <= 1073741824:
        return "%.2f MiB" % (b / 1048576)
    return "%.2f GiB" % (b / 1073741824)


def mib(b):
    return f"{b // MiB}M"


UNITS = [(1, "bytes"), (1024, "KiB"), (MiB, "MiB"), (1 << 30, "GiB")]


def column_unit(values):
    """The unit report.js gives a column: FormatSize's for its largest value."""
    m = max([abs(v) for v in values] + [0])
    return UNITS[0 if m <= 1024 else 1 if m <= MiB else 2 if m <= 1 << 30 else 3]


def in_unit(b, unit):
    """A byte value in its column's unit, as report.js writes it."""
    if unit[0] == 1:
        return f"{b} bytes"
    x = b / unit[0]
    return (repr(float("%.2g" % x)) if x and abs(x) < 0.005 else "%.2f" % x) + " " + unit[1]


def unit_word(text):
    """The unit a cell is written in: bytes, KiB, MiB, GiB, or M (the phase table's whole MiB); None: no size."""
    parts = text.split()
    if len(parts) == 2 and parts[1] in ("bytes", "KiB", "MiB", "GiB"):
        return parts[1]
    if text.endswith("M") and text.lstrip("+-").rstrip("M").replace(".", "").isdigit():
        return "M"
    return None


def mixed_columns(d, root):
    """The columns of the tables under root whose cells are written in more than one unit."""
    bad = []
    for table in root.find_elements(By.TAG_NAME, "table"):
        rows = d.execute_script("""
          return [...arguments[0].querySelectorAll('tbody tr')].map((tr) => [...tr.cells].map((c) => c.textContent));""",
                                table)
        for col in range(max((len(r) for r in rows), default=0)):
            units = {unit_word(r[col]) for r in rows if col < len(r)} - {None}
            if len(units) > 1:
                bad.append((table.get_attribute("class"), col, sorted(units), [r[col] for r in rows if col < len(r)]))
    return bad


def json_of(*args):
    code, out, err = run(*args)
    check(f"{args} exit", code == 0, err)
    return json.loads(out)


def start_browser(profile):
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    # The flags that keep Chromium off the (closed) network, as root, headless.
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-quic", "--disable-extensions", f"--user-data-dir={profile}", "--window-size=1400,1250",
              "--force-device-scale-factor=1"]:
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=o)


def open_page(d, path, name):
    t0 = time.time()
    d.get("file://" + path)
    WebDriverWait(d, 30).until(lambda x: x.execute_script("return document.body.dataset.ready === 'true'"))
    seconds = time.time() - t0
    errors = [l for l in d.get_log("browser") if l["level"] == "SEVERE"]
    check(f"{name}: no errors in the console", not errors, errors)
    # Nothing fetched: no resource was requested by the page.
    check(f"{name}: no resource requests", d.execute_script(
        "return performance.getEntriesByType('resource').length") == 0, "")
    return seconds


def pixels(d, canvas):
    """Count of pixels of each colour on a canvas (alpha > 0), as 'r,g,b' keys."""
    return d.execute_script("""
      const c = arguments[0], ctx = c.getContext('2d');
      const img = ctx.getImageData(0, 0, c.width, c.height).data, n = {};
      for (let i = 0; i < img.length; i += 4) {
        if (img[i + 3] < 250) continue;
        const k = img[i] + ',' + img[i + 1] + ',' + img[i + 2];
        n[k] = (n[k] || 0) + 1;
      }
      return n;""", canvas)


def plot_x(d, canvas, t):
    """The canvas x (CSS px) of time t in the timeline's current view (margins of report.js)."""
    a = float(canvas.get_attribute("data-view-start"))
    b = float(canvas.get_attribute("data-view-end"))
    w = d.execute_script("return arguments[0].getBoundingClientRect().width", canvas)
    return 70 + (t - a) / (b - a) * (w - 70 - 14), w


def at_canvas(d, canvas, x, y):
    """ActionChains to (x, y) of a canvas (Selenium's offsets are from the centre)."""
    r = d.execute_script("const r = arguments[0].getBoundingClientRect(); return [r.width, r.height]", canvas)
    return ActionChains(d).move_to_element_with_offset(canvas, int(round(x - r[0] / 2)), int(round(y - r[1] / 2)))


def segmap_state(d, panel):
    frag = {e.get_attribute("data-key"): e.text for e in panel.find_elements(By.CSS_SELECTOR, "dl.frag dd")}
    return panel.get_attribute("data-moment"), int(panel.get_attribute("data-segments")), frag


def expected_frag(f):
    """The numbers beside the segment map: the bytes in one unit (the largest's, reserved's)."""
    keys = ["reserved_bytes", "allocated_bytes", "reserved_minus_allocated_bytes", "free_in_segments_bytes",
            "largest_free_block_bytes", "inactive_split_bytes"]
    unit = column_unit([f[k] for k in keys])
    want = {k: in_unit(f[k], unit) for k in keys}
    want.update({"fragmentation": "%.3f" % f["fragmentation"], "segments": str(f["segments"]),
                 "free_blocks": str(f["free_blocks"])})
    return want


def check_frag(name, shown, f):
    want = expected_frag(f)
    got = {k: shown.get(k) for k in want}
    check(f"{name}: fragmentation numbers", got == want, (got, want))


tmp = tempfile.mkdtemp(prefix="memscope-browser-")
os.makedirs(OUT, exist_ok=True)
d = None
try:
    run_a = os.path.join(tmp, "run-a")
    run_b = os.path.join(tmp, "run-b")
    check("record a", run("replay", data("phases.jsonl"), "--out", run_a)[0] == 0, "")
    check("record b", run("replay", data("phases.jsonl"), "--alloc-conf", "expandable_segments:True",
                          "--out", run_b)[0] == 0, "")
    summary = json_of("summary", run_a, "--json")["ranks"][0]
    d = start_browser(os.path.join(tmp, "profile"))

    # ---- one run: report.html of the run directory
    page = os.path.join(run_a, "report.html")
    open_page(d, page, "one run")
    rank = d.find_element(By.ID, "run0-rank0")
    facts = rank.find_element(By.CSS_SELECTOR, ".facts").text
    check("facts", "peak allocated 120.00 MiB in forward:0" in facts and "peak reserved 120.00 MiB" in facts, facts)

    # Timeline: drawn, with the categories' colours and the reserved line.
    canvas = rank.find_element(By.CSS_SELECTOR, "canvas.timeline-canvas")
    px = pixels(d, canvas)
    for name, rgb in [("PARAMETER", "78,121,167"), ("ACTIVATION", "89,161,79"), ("TEMPORARY", "237,201,72"),
                      ("GRADIENT", "225,87,89"), ("reserved", "29,36,48")]:
        check(f"timeline draws {name}", px.get(rgb, 0) > 50, px.get(rgb, 0))
    legend = rank.find_element(By.CSS_SELECTOR, ".timeline .legend").text.split()
    check("timeline legend", legend == ["reserved", "PARAMETER", "ACTIVATION", "GRADIENT", "TEMPORARY"], legend)
    page_data = d.execute_script("return JSON.parse(document.getElementById('memscope-data').textContent)")
    rk = page_data["runs"][0]["ranks"][0]
    check("timeline samples", int(canvas.get_attribute("data-drawn-samples")) == len(rk["samples"]["t"]),
          canvas.get_attribute("data-drawn-samples"))

    # Hover just after the peak: the tooltip names the phase and the bytes per category.
    x, w = plot_x(d, canvas, rk["peak_allocated_t"])
    at_canvas(d, canvas, x + 3, 150).perform()
    tip = d.find_element(By.ID, "tooltip")
    text = tip.text
    check("hover tooltip", tip.is_displayed() and "forward:0" in text and "allocated 120.00 MiB" in text and
          "TEMPORARY 50.00 MiB" in text and "ACTIVATION 40.00 MiB" in text and "PARAMETER 30.00 MiB" in text, text)

    # Phase table: the numbers of `memscope summary --json`.
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in rank.find_elements(By.CSS_SELECTOR, "table.phases tbody tr")]
    want = [["-" if p["step"] is None else str(p["step"]), p["phase"], mib(p["allocated_bytes"]),
             mib(p["max_allocated_bytes"]), mib(p["reserved_bytes"]), mib(p["max_reserved_bytes"]),
             mib(p["peak_allocated_bytes_in_phase"])] for p in summary["phases"]]
    check("phase table", [r[:7] for r in rows] == want, (rows, want))
    check("phase table values", want[1] == ["0", "forward", "70M", "120M", "120M", "120M", "120M"], want)
    check("phase deltas", [r[7] for r in rows] == ["+30M", "+40M", "-10M"], [r[7] for r in rows])

    # Segment map: at the peak by default, as `memscope frag --at peak` has it.
    panel = rank.find_element(By.CSS_SELECTOR, ".segpanel")
    seg_canvas = panel.find_element(By.CSS_SELECTOR, "canvas.segmap-canvas")
    moment, segments, frag = segmap_state(d, panel)
    f_peak = json_of("frag", run_a, "--at", "peak", "--json")["ranks"][0]
    check("segment map at peak", moment == "peak" and segments == len(f_peak["segments"]) == 3,
          (moment, segments))
    check_frag("peak", frag, f_peak["fragmentation"])
    check("segment map drawn", pixels(d, seg_canvas).get("78,121,167", 0) > 50, "")
    before = canvas.screenshot_as_png

    # Click a phase in the table: the segment map moves to that phase's end.
    for phase in ["model", "backward:0"]:
        tr = rank.find_element(By.CSS_SELECTOR, f'table.phases tr[data-phase="{phase}"]')
        tr.click()
        moment, segments, frag = segmap_state(d, panel)
        f_at = json_of("frag", run_a, "--at", phase, "--json")["ranks"][0]
        check(f"click {phase}: moment", moment == phase, moment)
        check(f"click {phase}: segments", segments == len(f_at["segments"]), (segments, len(f_at["segments"])))
        check_frag(f"click {phase}", frag, f_at["fragmentation"])
        check(f"click {phase}: segment count", segments == {"model": 1, "backward:0": 3}[phase], segments)
        check(f"click {phase}: row selected", "selected" in tr.get_attribute("class"), tr.get_attribute("class"))
    check("timeline redrawn for the moment", canvas.screenshot_as_png != before, "")
    # The inactive split of backward:0 (20 MiB free beside g in tmp's segment) is drawn in its colour.
    check("inactive split drawn", pixels(d, seg_canvas).get("247,198,198", 0) > 20, "")

    # Click a phase band in the timeline: forward:0.
    band = next(b for b in rk["bands"] if b["name"] == "forward:0")
    xa, _ = plot_x(d, canvas, band["begin"])
    xb, _ = plot_x(d, canvas, band["end"])
    at_canvas(d, canvas, (xa + xb) / 2, 10).click().perform()
    moment, segments, frag = segmap_state(d, panel)
    f_fwd = json_of("frag", run_a, "--at", "forward:0", "--json")["ranks"][0]
    check("click band forward:0", moment == "forward:0" and segments == len(f_fwd["segments"]), (moment, segments))
    check_frag("band forward:0", frag, f_fwd["fragmentation"])
    # Zoom with the wheel, then double-click resets.
    full = float(canvas.get_attribute("data-view-end")) - float(canvas.get_attribute("data-view-start"))
    ActionChains(d).scroll_from_origin(ScrollOrigin.from_element(canvas), 0, -300).perform()
    zoomed = float(canvas.get_attribute("data-view-end")) - float(canvas.get_attribute("data-view-start"))
    check("wheel zooms in", 0 < zoomed < full * 0.9, (zoomed, full))
    at_canvas(d, canvas, w / 2, 150).double_click().perform()
    reset = float(canvas.get_attribute("data-view-end")) - float(canvas.get_attribute("data-view-start"))
    check("double-click resets", abs(reset - full) < 1e-6 * full, (reset, full))

    # Back to the peak with the moment selector.
    panel.find_element(By.CSS_SELECTOR, "select option[value='1']").click()
    check("select peak", segmap_state(d, panel)[0] == "peak", segmap_state(d, panel)[0])
    at_canvas(d, canvas, (xa + xb) / 2, 10).perform()
    d.save_screenshot(os.path.join(OUT, "report-one-run.png"))

    # ---- an OOM: marked on the timeline, said above it, its segment map on request
    oom_run = os.path.join(tmp, "oom")
    check("record oom", run("replay", data("fragmentation.jsonl"), "--device-memory", "30MiB",
                            "--out", oom_run)[0] == 0, "")
    open_page(d, os.path.join(oom_run, "report.html"), "oom")
    rank = d.find_element(By.ID, "run0-rank0")
    note = rank.find_element(By.CSS_SELECTOR, ".oom-note").text
    check("oom note", "OOM: requested 12.00 MiB" in note and "fragmentation, not capacity" in note, note)
    check("oom marked", pixels(d, rank.find_element(By.CSS_SELECTOR, "canvas.timeline-canvas"))
          .get("200,16,46", 0) > 50, "")
    panel = rank.find_element(By.CSS_SELECTOR, ".segpanel")
    option = next(o for o in panel.find_elements(By.TAG_NAME, "option") if o.text == "OOM")
    option.click()
    moment, segments, frag = segmap_state(d, panel)
    f_oom = json_of("frag", oom_run, "--at", "oom", "--json")["ranks"][0]
    check("oom segment map", moment == "oom" and segments == len(f_oom["segments"]) == 1, (moment, segments))
    check_frag("oom", frag, f_oom["fragmentation"])
    check("oom: no phase table", "no phase marks" in rank.text, "")

    # ---- memscope report: the explain section at the top, `memscope explain --json`'s lines and what-ifs
    explained = os.path.join(tmp, "explained.html")
    check("report oom run", run("report", oom_run, "-o", explained)[0] == 0, "")
    open_page(d, explained, "explained")
    x = json_of("explain", oom_run, "--json")
    section = d.find_element(By.CSS_SELECTOR, "#run0 .explain")
    check("explain above the rank", section.rect["y"] < d.find_element(By.ID, "run0-rank0").rect["y"], "")
    lines = [p.text for p in section.find_elements(By.CSS_SELECTOR, "p.diagnosis")]
    check("explain diagnosis", lines == x["diagnosis"], (lines, x["diagnosis"]))
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in section.find_elements(By.CSS_SELECTOR, "table.explain tbody tr")]
    check("explain what-ifs", [r[0] for r in rows[1:]] == [w["change"] for w in x["what_ifs"]], rows)
    check("explain min memory", [r[3] for r in rows[1:]] ==
          [format_size(w["min_device_memory"]) for w in x["what_ifs"]], rows)
    notes = [p.text for p in section.find_elements(By.CSS_SELECTOR, "p.training-note")]
    check("explain: a replay's training-side note", notes == ["training-side changes: " + x["training_note"]], notes)

    # ---- the training-side changes of a run memscope simulated, as `memscope explain --json` lists them
    trained = os.path.join(tmp, "trained")
    check("record mlp run", run("run", "--model", "mlp", "--steps", "2", "--device-memory", "64MiB",
                                "--out", trained)[0] == 0, "")
    trained_page = os.path.join(tmp, "trained.html")
    check("report mlp run", run("report", trained, "-o", trained_page)[0] == 0, "")
    open_page(d, trained_page, "trained")
    t = json_of("explain", trained, "--json")["training"]
    section = d.find_element(By.CSS_SELECTOR, "#run0 .explain")
    got = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
           for tr in section.find_elements(By.CSS_SELECTOR, "table.training tbody tr")]
    want = [[c["strategy"] + (" (the run's)" if c["own"] else ""),
             f"{c['max_batch']} fits" if c["fits"] else (f"only {c['max_batch']}" if c["max_batch"] > 0 else "OOM"),
             "-" if c["peak_reserved_bytes"] is None else format_size(c["peak_reserved_bytes"]),
             "-" if c["saved_bytes"] is None else
             (format_size(c["saved_bytes"]) + " less" if c["saved_bytes"] >= 0 else format_size(-c["saved_bytes"]) + " more")]
            for c in t["rows"]]
    check("explain: the training-side table is explain's", len(want) > 1 and got == want, (got, want))
    check("explain: the run's own strategy marked once", sum(r[0].endswith("(the run's)") for r in got) == 1, got)

    # ---- two runs side by side, with the differences
    cmp_page = os.path.join(tmp, "compare.html")
    check("report compare", run("report", run_a, run_b, "-o", cmp_page)[0] == 0, "")
    open_page(d, cmp_page, "compare")
    summary_b = json_of("summary", run_b, "--json")["ranks"][0]
    diff = {tr.get_attribute("data-metric"): [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in d.find_elements(By.CSS_SELECTOR, "#diff tr[data-metric]")}
    for metric, key in [("peak allocated", "allocated"), ("peak reserved", "reserved")]:
        a, b = summary["peak"][key]["bytes"], summary_b["peak"][key]["bytes"]
        check(f"diff {metric}", diff.get(metric, [])[1:3] == [format_size(a), format_size(b)], (diff.get(metric), a, b))
    check("diff lower bound", diff.get("lower bound (peak live requested)", [])[1:3] ==
          [format_size(summary["lower_bound_bytes"]), format_size(summary_b["lower_bound_bytes"])], diff)
    r0 = d.find_element(By.ID, "run0").rect
    r1 = d.find_element(By.ID, "run1").rect
    check("side by side", r1["x"] >= r0["x"] + r0["width"] - 1 and abs(r1["y"] - r0["y"]) < 2, (r0, r1))
    for ri in (0, 1):
        c = d.find_element(By.CSS_SELECTOR, f"#run{ri}-rank0 canvas.timeline-canvas")
        check(f"compare timeline {ri} drawn", pixels(d, c).get("78,121,167", 0) > 50, "")
    check("compare: one unit per column", mixed_columns(d, d.find_element(By.ID, "app")) == [],
          mixed_columns(d, d.find_element(By.ID, "app")))
    d.save_screenshot(os.path.join(OUT, "report-compare.png"))

    # ---- a long run: thinned timeline, a subset of segment maps
    long_trace = os.path.join(tmp, "long.jsonl")
    traces.training_trace(long_trace, steps=120, layers=16, temporaries=4)
    long_run = os.path.join(tmp, "long")
    check("record long", run("replay", long_trace, "--out", long_run, "--no-search")[0] == 0, "")
    seconds = open_page(d, os.path.join(long_run, "report.html"), "long run")
    check("long run renders in seconds", seconds < 10, seconds)
    report = json.load(open(os.path.join(long_run, "report.json")))["ranks"][0]
    rank = d.find_element(By.ID, "run0-rank0")
    rows = rank.find_elements(By.CSS_SELECTOR, "table.phases tbody tr")
    check("long phase rows", len(rows) == len(report["phases"]), (len(rows), len(report["phases"])))
    allocated = [p["allocated_bytes"] for p in report["phases"]]
    deltas = [a - (allocated[i - 1] if i else 0) for i, a in enumerate(allocated)]
    top = sorted([(abs(x), i) for i, x in enumerate(deltas) if x], key=lambda p: (-p[0], p[1]))[:3]
    jumps = [int(tr.get_attribute("data-row")) for tr in rank.find_elements(By.CSS_SELECTOR, "table.phases tr.jump")]
    check("largest jumps highlighted", jumps == sorted(i for _, i in top), (jumps, top))
    # A phase whose map was not kept: the nearest kept moment, said in a note.
    page_data = d.execute_script("return JSON.parse(document.getElementById('memscope-data').textContent)")
    lr = page_data["runs"][0]["ranks"][0]
    missing = next(i for i, b in enumerate(lr["bands"]) if b["moment"] < 0)
    tr = rows[missing]
    d.execute_script("arguments[0].scrollIntoView({block: 'center'})", tr)
    tr.click()
    panel = rank.find_element(By.CSS_SELECTOR, ".segpanel")
    check("unkept phase: note", "no segment map was kept" in panel.find_element(By.CSS_SELECTOR, ".note").text, "")
    canvas = rank.find_element(By.CSS_SELECTOR, "canvas.timeline-canvas")
    check("long: thinned samples drawn", int(canvas.get_attribute("data-drawn-samples")) == len(lr["samples"]["t"])
          <= 8000 and lr["thinned"], canvas.get_attribute("data-drawn-samples"))
    t0 = time.time()
    for _ in range(10):
        ActionChains(d).scroll_from_origin(ScrollOrigin.from_element(canvas), 0, -200).perform()
    zoom_s = time.time() - t0
    check("long: zoom responsive", zoom_s < 5, zoom_s)
    d.execute_script("window.scrollTo(0, 0)")
    d.save_screenshot(os.path.join(OUT, "report-long-run.png"))
    print(f"long run: page ready in {seconds:.2f} s, 10 zoom steps in {zoom_s:.2f} s; "
          f"screenshots in {OUT}")

    # ---- the whole GPU: report.json's "gpus" as a table under the run's heading (none in a run without one)
    check("no GPU table in a run without one", d.find_elements(By.CSS_SELECTOR, "table.gpus") == [], "")
    whole = os.path.join(tmp, "whole")
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--world-size", "2", "--backend", "nccl",
                         "--cuda-context-mb", "500", "--touch-device", "0", "--device-memory", "16GiB", "--out", whole)
    check("whole GPU run", code == 0, err)
    gpus = json.load(open(os.path.join(whole, "report.json")))["gpus"]
    open_page(d, os.path.join(whole, "report.html"), "whole GPU")
    expected = []
    unit = {k: column_unit([p[k + "_bytes"] for g in gpus for p in g["processes"]])
            for k in ("context", "reserved", "nccl")}
    unit["used"] = column_unit([p["used_bytes"] for g in gpus for p in g["processes"]] + [g["used_bytes"] for g in gpus])
    unit["capacity"] = column_unit([g["capacity_bytes"] for g in gpus])
    for g in gpus:
        for p in g["processes"]:
            expected.append([str(g["physical"]), str(p["rank"]), "stray" if p["cuda"] is None else f"cuda:{p['cuda']}",
                             in_unit(p["context_bytes"], unit["context"]), in_unit(p["reserved_bytes"], unit["reserved"]),
                             in_unit(p["nccl_bytes"], unit["nccl"]), in_unit(p["used_bytes"], unit["used"]), ""])
        expected.append([str(g["physical"]), "total", "", "", "", "", in_unit(g["used_bytes"], unit["used"]),
                         in_unit(g["capacity_bytes"], unit["capacity"])])
    table = d.find_element(By.CSS_SELECTOR, "#run0 table.gpus")
    shown = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
             for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")]
    check("GPU table: report.json's rows", shown == expected, (shown, expected))
    used = [int(td.get_attribute("data-bytes")) for td in table.find_elements(By.CSS_SELECTOR, "td[data-key=used]")]
    check("GPU table: exact used bytes", used == [x for g in gpus for x in
                                                 [p["used_bytes"] for p in g["processes"]] + [g["used_bytes"]]], used)
    check("GPU table: 2 contexts + rank 0's reserved + NCCL on GPU 0",
          gpus[0]["used_bytes"] == 1000 * MiB + gpus[0]["processes"][0]["reserved_bytes"] + 544 * MiB, gpus[0])
    d.save_screenshot(os.path.join(OUT, "report-gpu-table.png"))

    # ---- private pools: a MemPool snapshot's bytes by pool at the end, under the rank's facts
    mempool = os.path.join(DATA, "..", "..", "fuzz", "corpus", "pickle", "torch_mempool_p4.pickle")
    pool_page = os.path.join(tmp, "mempool.html")
    code, out, err = run("report", mempool, "-o", pool_page)
    check("mempool report", code == 0, err)
    pools = json_of("summary", mempool, "--json")["ranks"][0]["pools_at_end"]
    open_page(d, pool_page, "mempool")
    shown = d.find_element(By.CSS_SELECTOR, "p.pools[data-key=pools_at_end]").text
    want = "by pool at end: " + " · ".join(
        ("default pool" if p["pool_id"] == [0, 0] else "private pool") + f" ({p['pool_id'][0]}, {p['pool_id'][1]}) "
        f"reserved {format_size(p['reserved'])} in {p['segments']} segment{'' if p['segments'] == 1 else 's'}, "
        f"allocated {format_size(p['allocated'])}" for p in pools)
    check("pools at end shown", shown == want, (shown, want))
    check("pools at end: the MemPool's 20 MiB", "private pool (0, 1) reserved 20.00 MiB in 1 segment, allocated "
          "2.00 MiB" in shown, shown)

    # ---- issue 33 item 7: the page as a user reads it (two ranks of a model run)
    ranks_run = os.path.join(tmp, "ranks")
    code, out, err = run("run", "--model", "mlp", "--steps", "3", "--world-size", "2", "--out", ranks_run)
    check("two-rank run", code == 0, err)
    open_page(d, os.path.join(ranks_run, "report.html"), "two ranks")
    page_data = d.execute_script("return JSON.parse(document.getElementById('memscope-data').textContent)")
    rks = page_data["runs"][0]["ranks"]
    canvases = [d.find_element(By.CSS_SELECTOR, f"#run0-rank{rk['rank']} canvas.timeline-canvas") for rk in rks]
    # One x axis for all ranks: the same range (the earliest first to the latest last event), the same view.
    axes = [(float(c.get_attribute("data-axis-start") or "nan"), float(c.get_attribute("data-axis-end") or "nan"))
            for c in canvases]
    want_axis = (float(min(rk["t0"] for rk in rks)), float(max(rk["t1"] for rk in rks)))
    check("ranks share one x axis", len(rks) == 2 and all(a == want_axis for a in axes), (axes, want_axis))
    views = lambda: [(c.get_attribute("data-view-start"), c.get_attribute("data-view-end")) for c in canvases]
    check("ranks share one view", len(set(views())) == 1, views())
    d.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvases[0])
    ActionChains(d).scroll_from_origin(ScrollOrigin.from_element(canvases[0]), 0, -300).perform()
    zoomed = views()
    check("zooming rank 0 zooms rank 1", len(set(zoomed)) == 1 and float(zoomed[0][1]) - float(zoomed[0][0]) < 0.9 * (want_axis[1] - want_axis[0]), zoomed)
    at_canvas(d, canvases[0], 400, 150).double_click().perform()
    check("double-click resets every rank", len(set(views())) == 1 and float(views()[1][0]) == want_axis[0], views())

    # Every phase band has a label or, narrow, a hover naming it; the phase and the iteration are named apart.
    narrow_hovered = 0
    for rk, c in zip(rks, canvases):
        d.execute_script("arguments[0].scrollIntoView({block: 'center'})", c)
        labels = {i: text for i, text in json.loads(c.get_attribute("data-band-labels") or "[]")}
        for i, b in enumerate(rk["bands"]):
            if b["depth"] >= 3:
                continue
            base = b["name"].split(":")[0]
            if i in labels:
                check(f"rank {rk['rank']} band {b['name']}: labelled with its phase",
                      labels[i] in (base, base[0]), labels[i])
            xa, _ = plot_x(d, c, b["begin"])
            xb, _ = plot_x(d, c, b["end"])
            at_canvas(d, c, (xa + xb) / 2, 4 + b["depth"] * 14 + 6).perform()
            tip = d.find_element(By.ID, "tooltip")
            # The phase under the pointer, or, crowded into a few pixels, among those named "also within 4 px".
            named = re.findall(r"(?:^phase |also within 4 px: )([^\n(·]*)", tip.text, re.M)
            names = [n.strip() for part in named for n in part.split(",")]
            check(f"rank {rk['rank']} band {b['name']} ({xb - xa:.1f} px): hover names it",
                  tip.is_displayed() and b["name"] in names, tip.text)
            if labels.get(i) != base:
                narrow_hovered += 1
        iterations = json.loads(c.get_attribute("data-iteration-labels") or "[]")
        bases = {b["name"].split(":")[0] for b in rk["bands"]}
        check(f"rank {rk['rank']}: iteration markers", iterations and all(
            t.startswith("iteration ") and t.split()[0] not in bases for t in iterations) and
              not set(iterations) & set(labels.values()), (iterations, labels))
    check("narrow phases (loss, step) were hovered", narrow_hovered > 0, narrow_hovered)
    headers = [th.text for th in d.find_elements(By.CSS_SELECTOR, "#run0-rank0 table.phases th")]
    check("phase table: iteration and phase columns", headers[:2] == ["iteration", "phase"], headers)
    check("two ranks: one unit per column", mixed_columns(d, d.find_element(By.ID, "app")) == [],
          mixed_columns(d, d.find_element(By.ID, "app")))
    d.execute_script("window.scrollTo(0, 0)")
    d.save_screenshot(os.path.join(OUT, "report-two-ranks.png"))

    # ---- a change under 1 MiB in the phase table: "+0.06M" among the M, never "+64.00 KiB"
    small = os.path.join(tmp, "small-delta.jsonl")
    with open(small, "w") as f:
        for line in [{"action": "phase_begin", "phase": "model"},
                     {"action": "alloc", "id": "w", "size": 10 * MiB, "category": "PARAMETER", "owner": "fc"},
                     {"action": "phase_end", "phase": "model"},
                     {"action": "phase_begin", "phase": "forward", "step": 0},
                     {"action": "alloc", "id": "a", "size": 64 << 10, "category": "ACTIVATION", "owner": "fc"},
                     {"action": "phase_end", "phase": "forward", "step": 0}]:
            f.write(json.dumps(line) + "\n")
    small_run = os.path.join(tmp, "small-delta")
    check("record small delta", run("replay", small, "--out", small_run)[0] == 0, "")
    open_page(d, os.path.join(small_run, "report.html"), "small delta")
    deltas = [td.text for td in d.find_elements(By.CSS_SELECTOR, "table.phases tbody td.delta")]
    check("phase deltas in one unit", deltas == ["+10M", "+0.06M"], deltas)
    check("small delta: one unit per column", mixed_columns(d, d.find_element(By.ID, "app")) == [],
          mixed_columns(d, d.find_element(By.ID, "app")))

    # ---- 200+ segments: the map aggregates the small ones, zooms into them, never scrolls
    many = os.path.join(tmp, "many-segments.jsonl")
    with open(many, "w") as f:
        lines = [{"action": "phase_begin", "phase": "model"}]
        for i in range(200):  # 4 of 1 GiB, then 196 of 12-40 MiB: each its own segment
            size = (1 << 30) if i < 4 else (12 + (i * 7) % 29) * MiB
            lines.append({"action": "alloc", "id": f"w{i}", "size": size, "category": "PARAMETER", "owner": f"l{i}"})
        for i in range(30):  # small-pool tensors: 2 MiB segments
            lines.append({"action": "alloc", "id": f"s{i}", "size": 600 << 10, "category": "ACTIVATION",
                          "owner": f"s{i}"})
        lines.append({"action": "phase_end", "phase": "model"})
        for line in lines:
            f.write(json.dumps(line) + "\n")
    many_run = os.path.join(tmp, "many")
    code, out, err = run("replay", many, "--device-memory", "80GiB", "--out", many_run, "--no-search")
    check("record 200+ segments", code == 0, err)
    open_page(d, os.path.join(many_run, "report.html"), "200+ segments")
    panel = d.find_element(By.CSS_SELECTOR, "#run0-rank0 .segpanel")
    d.execute_script("arguments[0].scrollIntoView({block: 'center'})", panel)
    seg_canvas = panel.find_element(By.CSS_SELECTOR, "canvas.segmap-canvas")
    box = panel.find_element(By.CSS_SELECTOR, ".segscroll")
    moment, segments, frag = segmap_state(d, panel)
    f_peak = json_of("frag", many_run, "--at", "peak", "--json")["ranks"][0]
    check("200+ segments at the peak", moment == "peak" and segments == len(f_peak["segments"]) >= 180,
          (moment, segments))
    check_frag("200+ segments", frag, f_peak["fragmentation"])

    def no_scrolling(name):
        sw, cw, sh, ch = d.execute_script(
            "const b = arguments[0]; return [b.scrollWidth, b.clientWidth, b.scrollHeight, b.clientHeight]", box)
        check(f"{name}: the map needs no scrolling", sw <= cw and sh <= ch, (sw, cw, sh, ch))

    def map_rows(name, count):
        rows = json.loads(seg_canvas.get_attribute("data-rows") or "[]")
        check(f"{name}: at most 24 rows", 0 < len(rows) <= 24, len(rows))
        check(f"{name}: every segment in a row", sum(r["segments"] for r in rows) == count, (rows, count))
        check(f"{name}: no sliver", all(r["width"] >= 4 for r in rows), rows)
        return rows

    no_scrolling("200+ segments")
    rows = map_rows("200+ segments", segments)
    groups = [i for i, r in enumerate(rows) if r["group"]]
    check("small segments aggregated", groups and rows[groups[0]]["segments"] > 1, rows)
    if not groups:
        finish("browser report")  # nothing to zoom into: the failures so far
    at_canvas(d, seg_canvas, 300, 2 + groups[0] * 16 + 8).perform()
    tip = d.find_element(By.ID, "tooltip").text
    check("aggregate row hover", f"{rows[groups[0]]['segments']} segments" in tip and "zoom" in tip, tip)
    at_canvas(d, seg_canvas, 300, 2 + groups[0] * 16 + 8).click().perform()
    check("click zooms in", panel.get_attribute("data-zoom") == "1", panel.get_attribute("data-zoom"))
    no_scrolling("zoomed")
    map_rows("zoomed", rows[groups[0]]["segments"])
    panel.find_element(By.CSS_SELECTOR, "button.segback").click()
    check("back to the whole map", panel.get_attribute("data-zoom") == "0" and
          len(json.loads(seg_canvas.get_attribute("data-rows"))) == len(rows), panel.get_attribute("data-zoom"))
    d.save_screenshot(os.path.join(OUT, "report-many-segments.png"))
finally:
    if d is not None:
        d.quit()
    shutil.rmtree(tmp, ignore_errors=True)

finish("browser report")
