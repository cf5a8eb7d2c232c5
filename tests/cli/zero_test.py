#!/usr/bin/env python3
"""memscope run --zero (ZeroRedundancyOptimizer with DDP) against real PyTorch:
Debian's torch 1.13 on CPU with gloo (tests/oracle/zero_oracle.py) gives the
partition, each rank's optimizer-state bytes and the flat buckets for mlp
and cifar-net on 3 ranks; memscope's runs of the same models must record the
same (memscope counts blocks: each tensor's bytes rounded up to 512, as the
CUDA caching allocator holds them; the oracle reports both). Then the memory a rank saves, by hand, and --exec cpu: ZeRO's losses
and DDP's are equal on the same data. Needs the system python with torch
(scripts/test installs python3-torch)."""
import json
import os
import subprocess
import sys
import tempfile

from clitest import check, finish, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
tmp = tempfile.mkdtemp(prefix="memscope-zero-")
CASES = ["mlp:on", "mlp:bucket-view", "cifar-net:on", "cifar-net:bucket-view"]


def load(d, name):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def block(nbytes):
    """The bytes the CUDA caching allocator gives a tensor of `nbytes` (round_size)."""
    return max(512, -(-nbytes // 512) * 512)


def phase(rank, name, step):
    return next(p for p in rank["phases"] if p["phase"] == name and p.get("step") == step)


oracle = subprocess.run([sys.executable, os.path.join(HERE, "..", "oracle", "zero_oracle.py"), "3", *CASES],
                        capture_output=True, text=True, timeout=600)
check("the torch oracle ran", oracle.returncode == 0, oracle.stderr[-2000:])
torch = json.loads(oracle.stdout) if oracle.returncode == 0 else {}

for case in CASES if torch else []:
    model, mode = case.split(":")
    d = os.path.join(tmp, case.replace(":", "-"))
    code, out, err = run("run", "--model", model, "--world-size", "3", "--zero", mode, "--steps", "2", "--out", d)
    check(f"{case}: exit 0", code == 0, (code, out, err))
    if code != 0:
        continue
    report = load(d, "report.json")
    want = torch[case]
    for r, rank in enumerate(report["ranks"]):
        zero = rank["ddp"]["zero"]
        check(f"{case}: rank {r}'s partition is PyTorch's", zero["partition"] == want["partition"],
              (zero["partition"], want["partition"]))
        state = phase(rank, "step", 0)["by_category"].get("OPTIMIZER_STATE", 0)
        check(f"{case}: rank {r}'s optimizer state is PyTorch's", state == want["state_blocks"][r],
              (state, want["state_blocks"][r], want["state_bytes"][r]))
        if mode == "bucket-view":
            check(f"{case}: rank {r}'s flat buckets are PyTorch's",
                  zero["bucket_bytes"] == [4 * n for n in want["bucket_numels"]],
                  (zero["bucket_bytes"], want["bucket_numels"]))
            # The parameters live in the buckets: PARAMETER is their sum, from
            # the ddp phase on.
            params = phase(rank, "step", 0)["by_category"].get("PARAMETER", 0)
            check(f"{case}: rank {r}'s parameters are the buckets",
                  params == sum(block(b) for b in zero["bucket_bytes"]),
                  (params, zero["bucket_bytes"]))
    check(f"{case}: run.json says zero", load(d, "run.json")["zero"] == mode, load(d, "run.json"))
    check(f"{case}: the run prints rank 0's share",
          f"ZeroRedundancyOptimizer: this rank steps {len(want['partition'][0])} of "
          f"{sum(len(p) for p in want['partition'])} parameters" in out, out)

# By hand, mlp on 2 ranks (Adam: exp_avg and exp_avg_sq per parameter).
# Largest first: layers.1.weight (262,144 elements) to rank 0,
# layers.2.weight (262,144) to rank 1, layers.0.weight (131,072) to rank 0,
# head.weight (5,120) to rank 1, and the biases (512, 512, 512, 10) each to
# the rank with fewer elements: rank 1 (267,264 < 393,216) takes all four.
# Rank 0's state: 2 x 4 x 393,216 = 3,145,728 B. Rank 1's: 2 x (1,048,576 +
# 20,480 + 3 x 2,048 + 512) = 2,151,424 B (head.bias's 40 B take a 512 B
# block). Without ZeRO each rank holds 2 x (2,648,104 + 472) = 5,297,152 B.
for zero, want in [("on", [3145728, 2151424]), ("off", [5297152, 5297152])]:
    d = os.path.join(tmp, f"mlp2-{zero}")
    code, out, err = run("run", "--model", "mlp", "--world-size", "2", "--zero", zero, "--steps", "1", "--out", d)
    check(f"mlp on 2 ranks, --zero {zero}: exit 0", code == 0, (code, out, err))
    if code == 0:
        got = [phase(r, "step", 0)["by_category"].get("OPTIMIZER_STATE", 0) for r in load(d, "report.json")["ranks"]]
        check(f"mlp on 2 ranks, --zero {zero}: optimizer state by hand", got == want, got)

# --exec cpu: the parameters each rank steps are broadcast to the others, so
# ZeRO trains exactly as DDP does.
losses = {}
for zero in ["off", "on", "bucket-view"]:
    d = os.path.join(tmp, f"cpu-{zero}")
    code, out, err = run("run", "--model", "mlp", "--world-size", "2", "--exec", "cpu", "--zero", zero, "--steps",
                         "4", "--out", d)
    check(f"--exec cpu --zero {zero}: exit 0", code == 0, (code, out, err))
    if code == 0:
        losses[zero] = [r["losses"] for r in load(d, "report.json")["ranks"]]
check("--exec cpu: ZeRO's losses are DDP's", len(losses) == 3 and losses["on"] == losses["off"] ==
      losses["bucket-view"], losses)
check("--exec cpu: the loss moves", "off" in losses and len(set(losses["off"][0])) == 4, losses)

# Refusals: one line, exit 2.
for args, msg in [(["--zero", "on"], "--zero needs DDP"),
                  (["--zero", "yes", "--world-size", "2"], "--zero 'yes': use off, on or bucket-view"),
                  (["--zero", "bogus"], "--zero 'bogus': use off, on or bucket-view"),
                  (["--zero", "on", "--world-size", "2", "--ddp", "off"], "--zero needs DDP"),
                  (["--zero", "on", "--world-size", "2", "--save-checkpoint", "rank0"],
                   "checkpoints with --zero: ZeroRedundancyOptimizer.consolidate_state_dict() is not modelled")]:
    code, out, err = run("run", "--model", "mlp", *args, "--out", os.path.join(tmp, "refused"))
    check(f"{args}: refused", code == 2 and msg in err and len(err.strip().splitlines()) == 1, (code, err))

finish("zero")
