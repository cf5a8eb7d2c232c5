#!/usr/bin/env python3
"""End-to-end tests of checkpoints (issue 17 item 4): --save-checkpoint,
--load-checkpoint and --checkpoint-step of `memscope run`.

The model: mlp --width 14336, DDP copy, Adam, 2 steps, 4 ranks, the
checkpoint after step 0. Its 414,898,186 parameters are 256 -> 14336 ->
14336 -> 14336 -> 10: weights [14336, 256], [14336, 14336] twice,
[10, 14336], and biases [14336] three times and [10].

The state dict is the parameters and Adam's exp_avg and exp_avg_sq (its
`step` is a host scalar): 3 x 4 B x 414,898,186 = 4,978,778,232 B.

A copy of it, alone in a process's allocator on a GPU (a rank's torch.load
onto cuda:0 when its own GPU is another), reserves 4750 MiB:
- large pool, per set of tensors (parameters, exp_avg, exp_avg_sq): the
  [14336, 256] weight is 14 MiB (>= 10 MiB: its own segment, rounded to
  2 MiB: 14 MiB), each [14336, 14336] is 784 MiB (same rule): 1582 MiB per
  set, 4746 MiB for three;
- small pool (<= 1 MiB): three biases of 57,344 B, the [10, 14336] weight of
  573,440 B, and the 40 B bias rounded to 512: 745,984 B per set, 2,237,952 B
  for three, more than one 2 MiB small segment: two, 4 MiB.

Rank 0 loads its copy onto its own GPU 0, where its cache serves part of it:
its reserved bytes there are its report's max reserved in the checkpoint
phase."""
import json
import os
import re
import shutil
import tempfile

from clitest import check, finish, run  # noqa: E402

tmp = tempfile.mkdtemp(prefix="memscope-checkpoint-")
MODEL = ["--model", "mlp", "--width", "14336", "--steps", "2", "--world-size", "4"]
PARAMS = 414898186
STATE = 3 * 4 * PARAMS
COPY_RESERVED = 4750 << 20
MiB = 1 << 20


def load(d, name):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def ckpt(d, r):
    return load(d, f"rank-{r}.json")["checkpoint"]


def phase(d, r, name):
    for p in load(d, "report.json")["ranks"][r]["phases"]:
        if p["phase"] == name:
            return p
    return None


try:
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ.pop("LOCAL_RANK", None)

    # Without map_location, on 80 GiB GPUs: every rank's copy lands on cuda:0 at once.
    d = os.path.join(tmp, "none80")
    code, out, err = run("run", *MODEL, "--save-checkpoint", "rank0", "--load-checkpoint", "none", "--out", d)
    check("none, 80 GiB: exit 0", code == 0, (code, err))
    check("none, 80 GiB: the printed line",
          "checkpoint after step 0: 4.64 GiB (parameters, buffers, optimizer state); saved by rank 0: 1 file, 4.64 GiB "
          "written; torch.load(map_location=None) put the copies of ranks 0,1,2,3 on cuda:0\n" in out, out)
    for r in range(4):
        c = ckpt(d, r)
        check(f"none, 80 GiB: rank {r}'s state dict is parameters + exp_avg + exp_avg_sq", c["state_bytes"] == STATE, c)
        check(f"none, 80 GiB: rank {r} loaded onto cuda:0", c["loaded_onto"] == "cuda:0" and c["loaded"], c)
        check(f"none, 80 GiB: only rank 0 saved", c["saved"] == (r == 0), c)
    g = ckpt(d, 1)["load_gpu"]
    check("none, 80 GiB: measured on physical GPU 0", g["physical"] == 0, g)
    check("none, 80 GiB: ranks 1-3 each hold one copy (4750 MiB) on GPU 0",
          g["used_by_rank"][1:] == [COPY_RESERVED] * 3, g)
    check("none, 80 GiB: rank 0 holds its training state and its copy (its max reserved in the checkpoint phase)",
          g["used_by_rank"][0] == phase(d, 0, "checkpoint")["max_reserved_bytes"] == 13384 * MiB, g)
    check("none, 80 GiB: GPU 0's used bytes are the four ranks'", g["used"] == sum(g["used_by_rank"]), g)
    check("none, 80 GiB: every rank measured the same GPU 0", all(ckpt(d, r)["load_gpu"] == g for r in range(4)),
          [ckpt(d, r) for r in range(4)])
    # torch.load onto cuda:0 creates each other rank's CUDA context there first: with --cuda-context-mb 500,
    # ranks 1-3 hold a copy plus a stray context on GPU 0, and the GPU table lists the stray contexts.
    dc = os.path.join(tmp, "none80-ctx")
    code, out, err = run("run", *MODEL, "--save-checkpoint", "rank0", "--load-checkpoint", "none", "--cuda-context-mb",
                         "500", "--out", dc)
    gc = ckpt(dc, 1)["load_gpu"]
    check("context: ranks 1-3 hold a copy and a 500 MiB context on GPU 0",
          code == 0 and gc["used_by_rank"][1:] == [COPY_RESERVED + 500 * MiB] * 3, (code, err, gc))
    for r in (1, 2, 3):
        dev = json.load(open(os.path.join(dc, f"rank-{r}.json")))["device"]
        check(f"context: rank {r}'s stray context on GPU 0 is recorded",
              dev["other_contexts"] == [{"physical": 0, "bytes": 500 * MiB}], dev)
    code, out, err = run("summary", dc)
    check("context: the GPU table lists the three stray contexts on GPU 0",
          [ln.split()[1] for ln in out.splitlines() if re.match(r"0\s+\d+\s+stray\s+500\.00 MiB\s", ln)]
          == ["1", "2", "3"], out)
    # Rank 0's own copy: the state dict more at the load's peak than after del sd; the 40 B bias and its two
    # Adam tensors take 512 B blocks (3 x 472 B more).
    p = phase(d, 0, "checkpoint")
    check("none, 80 GiB: rank 0's load costs it the state dict",
          p["max_allocated_bytes"] - p["allocated_bytes"] == STATE + 3 * 472, p)
    # Rank 1's own GPU gets only Optimizer.load_state_dict's copies of exp_avg and exp_avg_sq from cuda:0
    # (value.to(param.device)), beside the old state until it is replaced; the parameters are copied in place.
    p = phase(d, 1, "checkpoint")
    check("none, 80 GiB: rank 1's own GPU gets the optimizer state",
          p["max_allocated_bytes"] - p["allocated_bytes"] == 2 * 4 * PARAMS + 2 * 472, p)

    # On 16 GiB GPUs: map_location='cpu' fits, no map_location runs out of memory on cuda:0.
    d = os.path.join(tmp, "cpu16")
    code, out, err = run("run", *MODEL, "--device-memory", "16GiB", "--save-checkpoint", "rank0", "--load-checkpoint",
                         "cpu", "--out", d)
    check("cpu, 16 GiB: exit 0", code == 0, (code, err))
    check("cpu, 16 GiB: the printed line", "torch.load(map_location=cpu) put the copies of ranks 0,1,2,3 on cpu" in out, out)
    check("cpu, 16 GiB: no GPU measured", "load_gpu" not in ckpt(d, 2), ckpt(d, 2))
    # The parameters are copied in place; Optimizer.load_state_dict moves exp_avg and exp_avg_sq to the GPU
    # (2 x 1.55 GiB) before the old state is freed.
    p = phase(d, 2, "checkpoint")
    check("cpu, 16 GiB: the new optimizer state beside the old one",
          p["max_allocated_bytes"] - p["allocated_bytes"] == 2 * 4 * PARAMS + 2 * 472, p)

    d = os.path.join(tmp, "none16")
    code, out, err = run("run", *MODEL, "--device-memory", "16GiB", "--save-checkpoint", "rank0", "--load-checkpoint",
                         "none", "--out", d)
    check("none, 16 GiB: exit 3", code == 3, (code, err))
    statuses = [r["status"] for r in load(d, "run.json")["ranks"]]
    check("none, 16 GiB: a rank ran out of memory", "oom" in statuses, statuses)
    check("none, 16 GiB: PyTorch's OOM on GPU 0", "GPU 0 has a total capacity of 16.00 GiB" in err, err)
    named = re.findall(r"memscope: rank ([123]) loaded 4\.64 GiB onto cuda:0: use map_location\n", err)
    check("none, 16 GiB: the diagnosis names a rank that loaded onto cuda:0", len(named) >= 1, err)
    check("none, 16 GiB: and says what to do", 'torch.load(f, map_location="cpu")' in err, err)

    # --save-checkpoint all: four files; without map_location each rank's own file returns to its own GPU.
    d = os.path.join(tmp, "all")
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--world-size", "4", "--save-checkpoint", "all",
                         "--load-checkpoint", "none", "--out", d)
    check("all: exit 0", code == 0, (code, err))
    state = 3 * 4 * 662026
    check("all: the state dict of the default mlp", ckpt(d, 0)["state_bytes"] == state, ckpt(d, 0))
    check("all: four files, four times the bytes",
          "saved by ranks 0,1,2,3: 4 files, 30.31 MiB written (rank 0 alone would write one)" in out, out)
    check("all: each rank's copy on its own GPU",
          [ckpt(d, r)["loaded_onto"] for r in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
          and all(ckpt(d, r)["saved"] for r in range(4)), [ckpt(d, r) for r in range(4)])

    # cuda:R on one rank of a machine of two GPUs: a second allocator on GPU 1; --checkpoint-step.
    d = os.path.join(tmp, "cuda1")
    code, out, err = run("run", "--model", "mlp", "--steps", "3", "--load-checkpoint", "cuda:1", "--checkpoint-step",
                         "1", "--out", d, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    check("cuda:1: exit 0", code == 0, (code, err))
    c = ckpt(d, 0)
    check("cuda:1: after step 1, onto cuda:1", c["step"] == 1 and c["loaded_onto"] == "cuda:1" and not c["saved"], c)
    check("cuda:1: the printed line", "checkpoint after step 1: 7.58 MiB" in out
          and "put the copy of rank 0 on cuda:1" in out, out)

    # Bad input: one line, exit 2.
    for args, message in [
        (["--save-checkpoint", "x"], "--save-checkpoint x: expected rank0 or all"),
        (["--load-checkpoint", "cuda:"], "--load-checkpoint cuda:: expected none (no map_location), cpu or cuda:R (R from 0 to 255)"),
        (["--load-checkpoint", "cuda:256"], "--load-checkpoint cuda:256: expected none (no map_location), cpu or cuda:R (R from 0 to 255)"),
        (["--save-checkpoint", "all", "--checkpoint-step", "2"], "--checkpoint-step 2: the run has 2 steps (0 to 1)"),
        (["--save-checkpoint", "all", "--checkpoint-step", "-1"], "--checkpoint-step -1: must be at least 0"),
        (["--checkpoint-step", "1"], "--checkpoint-step needs --save-checkpoint or --load-checkpoint"),
        (["--exec", "cpu", "--load-checkpoint", "cpu"], "checkpoints need --exec meta (the state dict's values are not modelled)"),
    ]:
        code, out, err = run("run", "--model", "mlp", "--steps", "2", *args, "--out", os.path.join(tmp, "bad"))
        check(f"{args}: exit 2, one line", code == 2 and err == f"memscope run: {message}\n", (code, err))
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--world-size", "2", "--load-checkpoint", "cuda:2",
                         "--out", os.path.join(tmp, "bad"))
    check("2 ranks, cuda:2 without CUDA_VISIBLE_DEVICES: the machine has the ranks' GPUs, exit 2",
          code == 2 and err == "memscope run: CUDA error: invalid device ordinal: --load-checkpoint on cuda:2, but the "
          "run's ranks are on cuda:0 to cuda:1 (CUDA_VISIBLE_DEVICES=0,1,... gives the machine more GPUs)\n",
          (code, err))
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--load-checkpoint", "cuda:1", "--out",
                         os.path.join(tmp, "bad"), env={"CUDA_VISIBLE_DEVICES": "0"})
    check("cuda:1 with one visible GPU: invalid device ordinal, exit 2",
          code == 2 and err == "memscope run: CUDA error: invalid device ordinal: --load-checkpoint on cuda:1, but "
          "CUDA_VISIBLE_DEVICES=0 makes 1 device visible\n", (code, err))
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--world-size", "2", "--load-checkpoint", "cuda:2",
                         "--out", os.path.join(tmp, "bad"), env={"CUDA_VISIBLE_DEVICES": "0,1"})
    check("2 ranks, cuda:2 with two visible GPUs: exit 2 before any rank starts",
          code == 2 and err == "memscope run: CUDA error: invalid device ordinal: --load-checkpoint on cuda:2, but "
          "CUDA_VISIBLE_DEVICES=0,1 makes 2 devices visible\n", (code, err))
finally:
    shutil.rmtree(tmp)
finish("checkpoint")
