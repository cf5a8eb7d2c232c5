#!/usr/bin/env python3
"""End-to-end tests of memscope run --dp N (torch.nn.DataParallel over N
simulated GPUs in one process): run.json's data_parallel, the devices as
ranks, the imbalance table, device 0's OOM where DDP at the same global
batch fits, compare of DP against DDP, and refused options."""
import json
import os
import shutil
import tempfile

from clitest import check, finish, run  # noqa: E402

tmp = tempfile.mkdtemp(prefix="memscope-dp-")


def load(d, name):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


try:
    d = os.path.join(tmp, "mlp")
    code, out, err = run("run", "--model", "mlp", "--dp", "2", "--steps", "2", "--out", d)
    check("--dp 2 exit 0", code == 0, (code, out, err))
    check("header says DataParallel", "DataParallel over 2 GPUs (batch 64 scattered 32+32)" in out, out)
    rj = load(d, "run.json")
    check("run.json ddp dp, world size 2", rj["ddp"] == "dp" and rj["world_size"] == 2, rj)
    dp = rj.get("data_parallel", {})
    check("run.json data_parallel", dp.get("module") == "torch.nn.DataParallel" and dp.get("device_ids") == [0, 1]
          and dp.get("output_device") == 0 and dp.get("global_batch") == 64 and dp.get("chunk_sizes") == [32, 32], dp)
    check("run.json ranks are the devices", [(r["rank"], r["timeline"], r["status"]) for r in rj["ranks"]] ==
          [(0, "rank-0.timeline", "ok"), (1, "rank-1.timeline", "ok")], rj["ranks"])
    report = load(d, "report.json")
    check("report has both devices", [r["rank"] for r in report["ranks"]] == [0, 1], report["ranks"])
    # The imbalance table: device 0 above the mean by exactly what device 1 is below it.
    lines = out.splitlines()
    head = [i for i, l in enumerate(lines) if l.startswith("DataParallel imbalance")]
    check("imbalance table printed", len(head) == 1, out)
    if head:
        rows = lines[head[0] + 1:head[0] + 5]
        check("imbalance columns", rows[0].split() == ["device", "peak", "allocated", "vs", "mean", "peak", "reserved",
                                                       "vs", "mean"], rows)
        c0, c1 = rows[1].split(), rows[2].split()
        check("cuda:0 above the mean, cuda:1 below by as much",
              c0[0] == "cuda:0" and c1[0] == "cuda:1" and c0[3].startswith("+") and c1[3].startswith("-")
              and c0[3][1:] == c1[3][1:], rows)
        check("mean row", rows[3].startswith("mean"), rows)
    code, out2, err2 = run("summary", d, "--rank", "1")
    check("summary --rank 1 reads device 1", code == 0 and "rank 1" in out2, (code, out2[:300], err2))

    # --exec cpu: the same losses as one device on the same batch.
    one = os.path.join(tmp, "cpu1")
    two = os.path.join(tmp, "cpu2")
    code, _, err = run("run", "--model", "mlp", "--exec", "cpu", "--steps", "3", "--out", one)
    check("cpu single exit 0", code == 0, err)
    code, _, err = run("run", "--model", "mlp", "--exec", "cpu", "--steps", "3", "--dp", "3", "--out", two)
    check("cpu --dp 3 exit 0", code == 0, err)
    l1, l2 = load(one, "run.json")["losses"], load(two, "run.json")["losses"]
    check("DataParallel losses equal one device's", len(l1) == 3 and all(abs(a - b) < 1e-5 for a, b in zip(l1, l2)),
          (l1, l2))
    code, out, err = run("run", "--model", "mlp", "--dp", "6", "--batch-size", "64", "--steps", "1", "--out",
                         os.path.join(tmp, "six"))
    check("6 chunks of torch.chunk in the header", code == 0 and "DataParallel over 6 GPUs (batch 64 scattered 5 x 11 + 9)"
          in out, (code, out[:300], err))
    check("chunks 22+22+20", load(two, "run.json")["data_parallel"]["chunk_sizes"] == [22, 22, 20],
          load(two, "run.json")["data_parallel"])

    # GPT-2 at a global batch of 8 on 16 GiB GPUs: DataParallel's device 0
    # runs out of memory; DDP, each rank taking 4 of the 8, fits.
    dpd = os.path.join(tmp, "gpt2-dp")
    code, out, err = run("run", "--model", "gpt2", "--dp", "2", "--batch-size", "8", "--steps", "2",
                         "--device-memory", "16GiB", "--out", dpd)
    check("DP gpt2 on 16 GiB: OOM, exit 3", code == 3, (code, err))
    check("the OOM names device 0", "memscope run: DataParallel device cuda:0 out of memory in step 0:" in err, err)
    check("PyTorch's message names GPU 0", "GPU 0 has a total capacity of 16.00 GiB" in err, err)
    rj = load(dpd, "run.json")
    check("run.json: device 0 oom, device 1 ok", [r["status"] for r in rj["ranks"]] == ["oom", "ok"], rj["ranks"])
    ddpd = os.path.join(tmp, "gpt2-ddp")
    code, out, err = run("run", "--model", "gpt2", "--world-size", "2", "--batch-size", "4", "--steps", "2",
                         "--device-memory", "16GiB", "--out", ddpd)
    check("DDP gpt2 at the same global batch fits", code == 0, (code, err))

    # compare DP against DDP on the same model.
    code, out, err = run("compare", dpd, ddpd)
    check("compare DP vs DDP exit 0", code == 0, (code, err))
    check("compare headers", "DataParallel, world size 2" in out and "ddp copy, world size 2" in out, out[:400])
    check("compare: both devices/ranks", "== rank 0" in out and "== rank 1" in out, out[:200])

    # The process's CUDA context on every device it uses (--gpu's 400 MiB,
    # or --cuda-context-mb): the GPU table's used = context + reserved on
    # each device, as a single process that touched both GPUs.
    ctx = os.path.join(tmp, "ctx")
    code, out, err = run("run", "--model", "mlp", "--dp", "2", "--steps", "1", "--gpu", "a100-40gb", "--out", ctx)
    check("--dp 2 --gpu exit 0", code == 0, (code, err))
    gpus = load(ctx, "report.json")["gpus"]
    check("a GPU row per device", [g["physical"] for g in gpus] == [0, 1], gpus)
    for g in gpus:
        p = g["processes"][0]
        check(f"GPU {g['physical']}: one process with a 400 MiB context", len(g["processes"]) == 1
              and p["context_bytes"] == 400 << 20 and p["cuda"] == g["physical"], g)
        check(f"GPU {g['physical']}: used = context + reserved",
              p["used_bytes"] == p["context_bytes"] + p["reserved_bytes"] and g["used_bytes"] == p["used_bytes"], g)
    check("cuda:0 reserves 32 MiB, cuda:1 24 MiB (the run's reserved peaks)",
          [g["processes"][0]["reserved_bytes"] for g in gpus] == [32 << 20, 24 << 20], gpus)
    with open(os.path.join(ctx, "summary.txt")) as f:
        summary = f.read()
    check("summary's GPU table lists both contexts",
          "0     0      cuda:0     400.00 MiB    32.00 MiB      0 bytes   432.00 MiB" in summary
          and "1     1      cuda:1     400.00 MiB    24.00 MiB      0 bytes   424.00 MiB" in summary, summary[-800:])
    # A context larger than the device: the process stops at cuda:0, nothing trains.
    oom = os.path.join(tmp, "ctx-oom")
    code, out, err = run("run", "--model", "mlp", "--dp", "2", "--steps", "1", "--device-memory", "300MiB",
                         "--cuda-context-mb", "400", "--out", oom)
    check("context OOM exit 3", code == 3, (code, err))
    check("context OOM names the device and sizes",
          "CUDA error: out of memory (creating the CUDA context on cuda:0, physical GPU 0: 400.00 MiB needed, "
          "0 bytes of its 300.00 MiB in use)" in err, err)
    st = load(oom, "rank-0.json")
    check("context OOM: device 0's status oom at step 0", st["status"] == "oom" and st["steps_done"] == 0, st)

    # Refused: one line, exit 2, nothing written.
    for args, text in [
        (["--dp", "1"], "--dp 1: use 2 to 64 devices"),
        (["--dp", "2", "--world-size", "2"], "does not combine with --world-size 2"),
        (["--dp", "2", "--ddp", "view"], "--dp does not combine with --ddp view"),
        (["--dp", "2", "--grad-accum", "2"], "--dp with --grad-accum is not modelled"),
        (["--dp", "2", "--checkpoint-activations"], "--dp with --checkpoint-activations is not modelled"),
        (["--dp", "2", "--model", "bilstm"], "bilstm has cuDNN RNN layers"),
    ]:
        bad = os.path.join(tmp, "bad")
        code, out, err = run("run", "--model", "mlp", *args, "--out", bad) if "--model" not in args else \
            run("run", *args, "--out", bad)
        check(f"refused {args}", code == 2 and text in err and len(err.strip().splitlines()) == 1, (code, err))
        check(f"refused {args} wrote nothing", not os.path.exists(bad), bad)
    code, out, err = run("run", "--model", "mlp", "--dp", "2", "--out", os.path.join(tmp, "env"),
                         env={"RANK": "0", "WORLD_SIZE": "2"})
    check("--dp under a launcher refused", code == 2 and "cannot be a rank of a launcher" in err, (code, err))
finally:
    shutil.rmtree(tmp)
finish("memscope run --dp (DataParallel)")
