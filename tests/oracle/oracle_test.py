"""The oracle test: every case of torch_oracle.py measured in PyTorch (Debian's
torch 1.13, CPU) and in memscope (oracle_memscope), figure by figure.

  oracle_test.py ORACLE_MEMSCOPE [--table FILE]

A case passes when every figure is equal, or, for a case that declares
known differences, when exactly the declared figures differ (a fixed gap
fails the test until its declaration goes). --table writes the comparison
as the Markdown table of docs/fidelity.md; without it, the test also checks
that docs/fidelity.md holds today's table (scripts/fidelity rewrites it).
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(HERE, "..", "..", "docs", "fidelity.md")
BEGIN, END = "<!-- oracle table: scripts/fidelity writes it -->", "<!-- end of oracle table -->"
FIGURES = ("parameters", "trainable", "forward_peak", "forward_end", "saved", "loss_peak", "loss_end", "backward_peak",
           "backward_end")


def run_oracle(binary, workdir):
    cases = os.path.join(workdir, "cases.json")
    ours = os.path.join(workdir, "memscope.json")
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    subprocess.run([python, os.path.join(HERE, "torch_oracle.py"), cases], check=True)
    subprocess.run([binary, cases, ours], check=True)
    with open(cases) as f:
        torch_side = json.load(f)
    with open(ours) as f:
        memscope_side = json.load(f)
    return torch_side, memscope_side


SHORT = {"parameters": "parameters", "trainable": "trainable", "forward_peak": "forward peak", "forward_end": "after forward", "saved": "saved",
         "loss_peak": "loss peak", "loss_end": "after loss", "backward_peak": "backward peak",
         "backward_end": "after backward"}


def table(torch_side, memscope_side):
    """One row per case: the figures PyTorch and memscope agree on, in bytes,
    and each figure they do not agree on with its cause."""
    lines = ["| case | PyTorch (parameters: a count; the rest: bytes) | memscope | CPU only, not counted (bytes) |",
             "|---|---|---|---|"]
    for case, ours in zip(torch_side["cases"], memscope_side):
        theirs, mine = case["pytorch"], ours.get("memscope", {})
        same = [f for f in FIGURES if theirs[f] == mine.get(f)]
        shown = [f for f in ("parameters", "trainable", "forward_peak", "saved", "backward_peak") if f in same
                 and (f != "trainable" or theirs[f] != theirs["parameters"])]
        summary = " · ".join(f"{SHORT[f]} {theirs[f]:,}" for f in shown)
        verdict = [f"{len(same)} of {len(FIGURES)} figures equal"]
        for f in FIGURES:
            if f in same:
                continue
            pct = (mine[f] - theirs[f]) / theirs[f] * 100 if theirs[f] else 0
            why = case.get("known", {}).get(f, "not declared")
            verdict.append(f"{SHORT[f]}: {theirs[f]:,} vs {mine[f]:,} ({pct:+.1f}%): {why}")
        by_key = {}  # several rules may share a name: one sum each
        for c in case.get("cpu_only", []):
            by_key[c["key"]] = by_key.get(c["key"], 0) + c["bytes"]
        cpu = " · ".join(f"{k} {n:,}" for k, n in by_key.items())
        name = case["name"] + (f" ({case['note']})" if case.get("note") else "")
        lines.append(f"| {name} | {summary} | {'<br>'.join(verdict)} | {cpu} |")
    return "\n".join(lines) + "\n"


def check(torch_side, memscope_side):
    failures = []
    for case, ours in zip(torch_side["cases"], memscope_side):
        if "error" in ours:
            failures.append(f"{case['name']}: memscope: {ours['error']}")
            continue
        differing = {f for f in FIGURES if case["pytorch"][f] != ours["memscope"][f]}
        declared = set(case.get("known", {}))
        if differing != declared:
            detail = ", ".join(f"{f} PyTorch {case['pytorch'][f]} memscope {ours['memscope'][f]}"
                               for f in sorted(differing | declared, key=FIGURES.index))
            failures.append(f"{case['name']}: differs in {sorted(differing) or 'nothing'}, "
                            f"declared {sorted(declared) or 'nothing'}: {detail}")
    return failures


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--table"):
        print("usage: oracle_test.py ORACLE_MEMSCOPE [--table FILE]", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="memscope-oracle-") as workdir:
        torch_side, memscope_side = run_oracle(argv[1], workdir)
    text = table(torch_side, memscope_side)
    failures = check(torch_side, memscope_side)
    if len(argv) == 4:
        with open(argv[3], "w") as f:
            f.write(text)
    else:
        with open(DOCS) as f:
            doc = f.read()
        start, end = doc.find(BEGIN), doc.find(END)
        if start < 0 or end < 0 or doc[start + len(BEGIN):end].strip() != text.strip():
            failures.append("docs/fidelity.md does not hold today's table: run scripts/fidelity")
    print(text)
    for f in failures:
        print("FAIL:", f)
    cases = len(torch_side["cases"])
    print(f"oracle: {cases} cases, {cases - len(failures)} as expected, torch {torch_side['torch']}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
