#!/usr/bin/env python3
"""End-to-end tests of devices (issue 17): which simulated GPU each rank runs
on (LOCAL_RANK, CUDA_VISIBLE_DEVICES, --devices) and ranks on one GPU sharing
its capacity across processes.

The model: mlp --width 14336 (414,898,186 parameters, 1.55 GiB), DDP copy,
Adam, 2 steps, cuBLAS workspaces included. One rank alone peaks at 9.28 GiB
allocated, 10246 MiB reserved, and fits a 16 GiB GPU; after its first step
it holds at least 6340 MiB allocated until the run's last barrier. Two ranks
on one 16 GiB GPU cannot both reach their peak, whatever the order the two
processes run in: one of them runs out of memory."""
import json
import os
import shutil
import subprocess
import tempfile

from clitest import MEMSCOPE, check, finish, run  # noqa: E402

tmp = tempfile.mkdtemp(prefix="memscope-devices-")
MODEL = ["--model", "mlp", "--width", "14336", "--steps", "2", "--device-memory", "16GiB"]


def load(d, name):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def devices(d, world_size=2):
    """(ordinal, physical, how) of each rank, from rank-R.json."""
    out = []
    for r in range(world_size):
        dev = load(d, f"rank-{r}.json").get("device", {})
        out.append((dev.get("ordinal"), dev.get("physical"), dev.get("how")))
    return out


def no_gpu_env():
    """The environment without the variables that choose devices."""
    e = dict(os.environ)
    for k in ["CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK", "WORLD_SIZE", "MEMSCOPE_SUPERVISED", "MEMSCOPE_STORE"]:
        e.pop(k, None)
    return e


def external(d, ranks):
    """Starts one process per entry of `ranks` (its extra environment) as an
    external launcher would; returns [(code, out, err)]."""
    os.makedirs(d)
    procs = []
    for r, extra in enumerate(ranks):
        env = no_gpu_env()
        env.update(RANK=str(r), WORLD_SIZE=str(len(ranks)), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                   MEMSCOPE_STORE=os.path.join(d, "store"))
        env.update(extra)
        procs.append(subprocess.Popen([MEMSCOPE, "run", *MODEL, "--out", d], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return [(p.wait(timeout=120),) + p.communicate() for p in procs]


try:
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ.pop("LOCAL_RANK", None)

    # Each rank on its own GPU (LOCAL_RANK, which our launcher sets): both fit.
    d = os.path.join(tmp, "own")
    code, out, err = run("run", *MODEL, "--world-size", "2", "--out", d)
    check("own GPUs: exit 0", code == 0, (code, out, err))
    check("own GPUs: rank r on cuda:r", devices(d) == [(0, 0, "LOCAL_RANK=0"), (1, 1, "LOCAL_RANK=1")], devices(d))
    report = load(d, "report.json")
    check("own GPUs: report device_index", [r["device_index"] for r in report["ranks"]] == [0, 1], report["ranks"])
    check("own GPUs: the peak the docstring says", "10246M" in out and "9.28 GiB" in out, out)

    # Both on GPU 0 (--devices same): they share its 16 GiB, and one runs out of memory.
    d = os.path.join(tmp, "same")
    code, out, err = run("run", *MODEL, "--world-size", "2", "--devices", "same", "--out", d)
    check("same GPU: exit 3 (out of memory)", code == 3, (code, err))
    check("same GPU: PyTorch's OOM names GPU 0 and its capacity",
          "CUDA out of memory. Tried to allocate 784.00 MiB. GPU 0 has a total capacity of 16.00 GiB of which" in err, err)
    check("same GPU: the diagnosis says the GPU is shared",
          "memscope: GPU 0 (physical GPU 0, chosen by --devices same) is shared: rank 0" in err
          and 'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))' in err, err)
    statuses = [r["status"] for r in load(d, "run.json")["ranks"]]
    check("same GPU: a rank ran out of memory", "oom" in statuses, statuses)
    check("same GPU: both on cuda:0", devices(d) == [(0, 0, "--devices same")] * 2, devices(d))
    report = load(d, "report.json")
    check("same GPU: report device_index", [r["device_index"] for r in report["ranks"]] == [0, 0], report["ranks"])

    # An explicit map: ranks swapped, then both on 1.
    d = os.path.join(tmp, "map")
    code, out, err = run("run", *MODEL, "--world-size", "2", "--devices", "1,0", "--out", d)
    check("--devices 1,0: exit 0", code == 0, (code, err))
    check("--devices 1,0: devices", devices(d) == [(1, 1, "--devices 1,0"), (0, 0, "--devices 1,0")], devices(d))
    d = os.path.join(tmp, "map11")
    code, out, err = run("run", *MODEL, "--world-size", "2", "--devices", "1,1", "--out", d)
    check("--devices 1,1: exit 3 on GPU 1", code == 3 and "GPU 1 has a total capacity of 16.00 GiB" in err, (code, err))

    # CUDA_VISIBLE_DEVICES renumbers: cuda:0 and cuda:1 are physical GPUs 3 and 5.
    d = os.path.join(tmp, "cvd")
    code, out, err = run("run", *MODEL, "--world-size", "2", "--out", d, env={"CUDA_VISIBLE_DEVICES": "3,5"})
    check("CUDA_VISIBLE_DEVICES=3,5: exit 0", code == 0, (code, err))
    check("CUDA_VISIBLE_DEVICES=3,5: physical GPUs",
          devices(d) == [(0, 3, "LOCAL_RANK=0, CUDA_VISIBLE_DEVICES=3,5"), (1, 5, "LOCAL_RANK=1, CUDA_VISIBLE_DEVICES=3,5")],
          devices(d))
    # cuda:0 and cuda:1 are one physical GPU? Not possible: a repeated index ends the list.
    code, out, err = run("run", *MODEL, "--world-size", "2", "--out", os.path.join(tmp, "cvd1"),
                         env={"CUDA_VISIBLE_DEVICES": "2"})
    check("CUDA_VISIBLE_DEVICES=2 for 2 ranks: invalid device ordinal, exit 2",
          code == 2 and err.strip() == "memscope run: CUDA error: invalid device ordinal: rank 1 on cuda:1 "
          "(LOCAL_RANK=1), but CUDA_VISIBLE_DEVICES=2 makes 1 device visible", (code, err))
    code, out, err = run("run", *MODEL, "--world-size", "2", "--out", os.path.join(tmp, "cvd-dup"),
                         env={"CUDA_VISIBLE_DEVICES": "4,4"})
    check("CUDA_VISIBLE_DEVICES=4,4: the repeat ends the list", code == 2 and "makes 1 device visible" in err, (code, err))
    code, out, err = run("run", *MODEL, "--out", os.path.join(tmp, "cvd-none"), env={"CUDA_VISIBLE_DEVICES": ""})
    check("CUDA_VISIBLE_DEVICES='': no GPU, exit 2",
          code == 2 and err.strip() == "memscope run: CUDA_VISIBLE_DEVICES='' makes no GPU visible "
          "(RuntimeError: No CUDA GPUs are available)", (code, err))

    # Bad --devices: one line, exit 2.
    for value, message in [("0,1,2", "--devices '0,1,2': 3 devices for 2 ranks; give one per rank"),
                           ("x", "--devices 'x': 'x' is not a device (0 to 255); use local_rank, same, or one device "
                                 "per rank (e.g. 0,0,1,1)"),
                           ("0,256", "--devices '0,256': '256' is not a device (0 to 255)")]:
        code, out, err = run("run", *MODEL, "--world-size", "2", "--devices", value, "--out", os.path.join(tmp, "bad"))
        check(f"--devices {value}: exit 2, one line", code == 2 and err.startswith("memscope run: " + message)
              and len(err.strip().splitlines()) == 1, (code, err))

    # An external launcher whose ranks all have LOCAL_RANK=0 (a script that
    # touches cuda:0 on every rank): they share GPU 0.
    results = external(os.path.join(tmp, "ext-same"), [{"LOCAL_RANK": "0"}, {"LOCAL_RANK": "0"}])
    check("external, LOCAL_RANK=0 twice: a rank exits 3", 3 in [r[0] for r in results], results)
    check("external, LOCAL_RANK=0 twice: both on cuda:0",
          devices(os.path.join(tmp, "ext-same")) == [(0, 0, "LOCAL_RANK=0")] * 2, devices(os.path.join(tmp, "ext-same")))
    # The ledger is keyed by the physical GPU: rank 0 sees only GPU 1 (as cuda:0),
    # rank 1 sees GPUs 0 and 1 and takes cuda:1, the same GPU.
    results = external(os.path.join(tmp, "ext-cvd"), [{"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "1"},
                                                      {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1"}])
    check("external, one physical GPU under two numberings: a rank exits 3", 3 in [r[0] for r in results], results)
    check("external, one physical GPU under two numberings: devices",
          devices(os.path.join(tmp, "ext-cvd")) == [(0, 1, "LOCAL_RANK=0, CUDA_VISIBLE_DEVICES=1"),
                                                    (1, 1, "LOCAL_RANK=1, CUDA_VISIBLE_DEVICES=0,1")],
          devices(os.path.join(tmp, "ext-cvd")))
    results = external(os.path.join(tmp, "ext-own"), [{"LOCAL_RANK": "0"}, {"LOCAL_RANK": "1"}])
    check("external, LOCAL_RANK 0 and 1: both exit 0", [r[0] for r in results] == [0, 0], results)

    # --backend nccl: NCCL's duplicate-GPU check at communicator creation, exit 5.
    d = os.path.join(tmp, "nccl-same")
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--world-size", "2", "--backend", "nccl",
                         "--devices", "same", "--out", d)
    check("nccl, same GPU: exit 5", code == 5, (code, err))
    for r, other in [(0, 1), (1, 0)]:
        check(f"nccl, same GPU: rank {r} says NCCL's words",
              f"memscope run: rank {r} exited with status 5: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for "
              "details)\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
              f"Duplicate GPU detected : rank {r} and rank {other} both on CUDA device 1000\n"
              f"memscope: with NCCL every rank needs its own GPU; rank {r} is on cuda:0 (physical GPU 0, chosen by "
              "--devices same). Call torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"])) before "
              "init_process_group, or run these ranks with the Gloo backend." in err, err)
    check("nccl, same GPU: run.json status", [r["status"] for r in load(d, "run.json")["ranks"]] ==
          ["nccl_error", "nccl_error"], load(d, "run.json")["ranks"])
    # The bus id follows the physical GPU: CUDA_VISIBLE_DEVICES=3 puts both on GPU 3, bus 4000.
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--world-size", "2", "--backend", "nccl",
                         "--devices", "0,0", "--out", os.path.join(tmp, "nccl-cvd"), env={"CUDA_VISIBLE_DEVICES": "3"})
    check("nccl, GPU 3: bus id 4000", code == 5 and "both on CUDA device 4000" in err, (code, err))

    # With Gloo two ranks on one GPU are allowed, and flagged.
    d = os.path.join(tmp, "gloo-same")
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--world-size", "2", "--devices", "same", "--out", d)
    check("gloo, same GPU: exit 0", code == 0, (code, err))
    gpus = load(d, "report.json").get("gpus", [])
    check("gloo, same GPU: report.json gpus", len(gpus) == 1 and gpus[0]["shared_by_ranks"] == [0, 1], gpus)
    with open(os.path.join(d, "summary.txt")) as f:
        summary = f.read()
    check("gloo, same GPU: summary note", "note: GPU 0 is shared by ranks 0, 1: they share its memory (allowed with "
          "Gloo; NCCL refuses two ranks on one GPU)" in summary, summary[-600:])

    # The whole GPU: contexts (and a stray one on GPU 0), NCCL buffers; used = context + reserved + NCCL.
    d = os.path.join(tmp, "whole")
    code, out, err = run("run", "--model", "mlp", "--steps", "2", "--world-size", "3", "--backend", "nccl",
                         "--cuda-context-mb", "500", "--touch-device", "0", "--device-memory", "16GiB", "--out", d)
    check("whole GPU: exit 0", code == 0, (code, err))
    report = load(d, "report.json")
    peaks = {r["rank"]: r["peak"]["reserved"]["bytes"] for r in report["ranks"]}
    gpus = report.get("gpus", [])
    MiB = 1 << 20
    expected = [(0, [(0, 0, 500 * MiB, peaks[0], 688 * MiB), (1, None, 500 * MiB, 0, 0), (2, None, 500 * MiB, 0, 0)]),
                (1, [(1, 1, 500 * MiB, peaks[1], 688 * MiB)]), (2, [(2, 2, 500 * MiB, peaks[2], 688 * MiB)])]
    got = [(g["physical"], [(p["rank"], p["cuda"], p["context_bytes"], p["reserved_bytes"], p["nccl_bytes"])
                            for p in g["processes"]]) for g in gpus]
    check("whole GPU: the table's rows", got == expected, got)
    for g in gpus:
        for p in g["processes"]:
            check(f"whole GPU {g['physical']} rank {p['rank']}: used = context + reserved + NCCL",
                  p["used_bytes"] == p["context_bytes"] + p["reserved_bytes"] + p["nccl_bytes"], p)
        check(f"whole GPU {g['physical']}: total", g["used_bytes"] == sum(p["used_bytes"] for p in g["processes"])
              and g["capacity_bytes"] == 16 << 30, g)
    check("whole GPU 0: 3 contexts + rank 0's reserved + NCCL", gpus[0]["used_bytes"] == 1500 * MiB + peaks[0] + 688 * MiB,
          gpus[0])
    with open(os.path.join(d, "summary.txt")) as f:
        summary = f.read()
    check("whole GPU: summary table", "GPUs (as nvidia-smi lists processes; reserved is each rank's peak)" in summary
          and "0     1      stray      500.00 MiB      0 bytes      0 bytes   500.00 MiB" in summary, summary[-900:])

    # The same table in report.html (the page's data, one run's "gpus") and in trace.json (process "GPUs").
    with open(os.path.join(d, "report.html")) as f:
        html = f.read()
    start = html.index('<script type="application/json" id="memscope-data">') + len(
        '<script type="application/json" id="memscope-data">')
    page = json.loads(html[start:html.index("</script>", start)])
    check("report.html: the run's gpus are report.json's", page["runs"][0].get("gpus") == gpus, page["runs"][0].get("gpus"))
    trace = load(d, "trace.json")["traceEvents"]
    gpu_events = [e for e in trace if e["pid"] == 1000000]
    names = [e["args"]["name"] for e in gpu_events if e["ph"] == "M" and e["name"] == "process_name"]
    check("trace.json: one process named GPUs", names == ["GPUs"], names)
    end_us = max(e["ts"] + e.get("dur", 0) for e in trace if e["pid"] != 1000000 and e["ph"] != "M")
    # The end: the ranks' last event (a slice's end is ts + dur, so to the nanosecond, not bit-exact).
    end_ts = [e["ts"] for e in gpu_events if e["ph"] != "M" and e["ts"] != 0]
    check("trace.json: the GPU events' end is the run's last event", end_ts and all(abs(t - end_us) < 5e-4 for t in end_ts),
          (end_ts, end_us))
    end_us = end_ts[0] if end_ts else end_us
    counters = [(e["name"], e["ts"], e["args"]) for e in gpu_events if e["ph"] == "C"]
    expected_counters = []
    for name, context, reserved in [("GPU 0", 1500 * MiB, peaks[0]), ("GPU 1", 500 * MiB, peaks[1]),
                                    ("GPU 2", 500 * MiB, peaks[2])]:
        for ts in (0, end_us):
            expected_counters.append((name, ts, {"context": context, "reserved": reserved, "nccl": 688 * MiB}))
    check("trace.json: a counter per GPU, context + reserved + NCCL at the start and the end",
          counters == expected_counters, (counters, expected_counters))
    check("trace.json: GPU 0's counters add up to the table's used bytes",
          bool(counters) and sum(counters[0][2].values()) == gpus[0]["used_bytes"] == 1500 * MiB + peaks[0] + 688 * MiB, counters[:1])
    rows = [(e["name"], e["ts"], e["s"], e["args"]) for e in gpu_events if e["ph"] == "i"]
    check("trace.json: each GPU's row at the end", rows == [(f"GPU {g['physical']} processes", end_us, "p", g)
                                                          for g in gpus], rows)

    # `memscope report RUN` and `memscope trace RUN` re-read the run and show its table as the run's own outputs do.
    code, out, err = run("report", d, "-o", os.path.join(tmp, "again.html"))
    with open(os.path.join(tmp, "again.html")) as f:
        again = f.read()
    start = again.index('<script type="application/json" id="memscope-data">') + len(
        '<script type="application/json" id="memscope-data">')
    page_again = json.loads(again[start:again.index("</script>", start)])
    check("memscope report RUN: the page's gpus are report.json's", code == 0 and page_again["runs"][0].get("gpus") == gpus,
          (code, err, page_again["runs"][0].get("gpus")))
    code, out, err = run("trace", d, "-o", os.path.join(tmp, "again.json"))
    with open(os.path.join(tmp, "again.json")) as f:
        trace_again = json.load(f)["traceEvents"]
    again_gpu = [e for e in trace_again if e["pid"] == 1000000]
    check("memscope trace RUN: the same GPU counters and rows as the run's trace.json",
          code == 0 and [(e["name"], e["ph"], e["args"]) for e in again_gpu] == [(e["name"], e["ph"], e["args"]) for e in gpu_events],
          (code, err, again_gpu[:3]))

    # A run without a table: neither the page nor the trace gets one.
    plain = os.path.join(tmp, "plain")
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", plain)
    with open(os.path.join(plain, "report.html")) as f:
        html = f.read()
    check("no table: exit 0, no gpus in report.json, report.html or trace.json",
          code == 0 and "gpus" not in load(plain, "report.json") and '"gpus":' not in html
          and all(e["pid"] != 1000000 for e in load(plain, "trace.json")["traceEvents"]), (code, err))

    code, out, err = run("summary", d)
    check("memscope summary RUN: the table", code == 0 and out.endswith(summary[summary.index("GPUs (as nvidia-smi"):]),
          (code, out[-900:], err))
    code, out, err = run("summary", d, "--json")
    check("memscope summary --json: gpus", code == 0 and json.loads(out).get("gpus") == gpus, (code, err))
    code, out, err = run("check", os.path.join(d, "report.json"), "--max", "peak_reserved=80GiB")
    check("report.json with gpus still reads (check)", code == 0, (code, out, err))

    # A context counts against the GPU: alone the model fits 16 GiB, beside a 9000 MiB context it does not.
    code, out, err = run("run", *MODEL, "--cuda-context-mb", "9000", "--out", os.path.join(tmp, "ctx-oom"))
    check("context: the OOM comes earlier", code == 3 and "GPU 0 has a total capacity of 16.00 GiB of which 226.00 MiB "
          "is free" in err, (code, err))
    code, out, err = run("run", *MODEL, "--cuda-context-mb", "17000", "--out", os.path.join(tmp, "ctx-none"))
    check("context larger than the GPU: exit 3 at context creation", code == 3 and "CUDA error: out of memory "
          "(creating the CUDA context of rank 0 on cuda:0, physical GPU 0: 16.60 GiB needed" in err, (code, err))
    for args, message in [(["--backend", "mpi"], "--backend 'mpi': use gloo or nccl"),
                          (["--touch-device", "0"], "--touch-device needs --cuda-context-mb"),
                          (["--nccl-buffers-mb", "100"], "--nccl-buffers-mb needs --backend nccl"),
                          (["--cuda-context-mb", "-1"], "--cuda-context-mb -1: use 0 to 1 PiB")]:
        code, out, err = run("run", "--model", "mlp", *args, "--out", os.path.join(tmp, "bad2"))
        check(f"{args}: exit 2", code == 2 and err.startswith("memscope run: " + message), (code, err))

    # --gpu KIND (run/gpu_kinds.h): the kind's memory, context and cuBLAS workspace as defaults.
    A100_80 = 81152 * MiB  # 79.25 GiB, PyTorch's "total capacity" on an A100 80GB (run/gpu_kinds.md)
    d = os.path.join(tmp, "gpu-a100")
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--world-size", "2", "--gpu", "a100-80gb",
                         "--out", d)
    check("--gpu a100-80gb: exit 0", code == 0, (code, err))
    check("--gpu a100-80gb: run.json device_memory", load(d, "run.json")["device_memory"] == A100_80 == 85094039552,
          load(d, "run.json")["device_memory"])
    check("--gpu a100-80gb: every rank's context is 400 MiB (rank-R.json)",
          [load(d, f"rank-{r}.json")["device"]["context_bytes"] for r in range(2)] == [400 * MiB] * 2, d)
    gpus = load(d, "report.json").get("gpus", [])
    check("--gpu a100-80gb: the GPU table", [(g["capacity_bytes"], [p["context_bytes"] for p in g["processes"]])
                                             for g in gpus] == [(A100_80, [400 * MiB])] * 2, gpus)
    with open(os.path.join(d, "summary.txt")) as f:
        summary = f.read()
    check("--gpu a100-80gb: summary", "0     0      cuda:0     400.00 MiB" in summary and "of 79.25 GiB" in summary,
          summary[-600:])
    other = load(d, "report.json")["ranks"][0]["peak"]["allocated"]["by_category"]["OTHER"]
    check("--gpu a100-80gb: the default cuBLAS workspaces", other == 8519680 + MiB, other)

    # Explicit options override the kind's.
    d = os.path.join(tmp, "gpu-override")
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--gpu", "a100-80gb", "--cuda-context-mb", "100",
                         "--device-memory", "16GiB", "--cublas-workspace", "off", "--out", d)
    report = load(d, "report.json")
    check("--gpu with explicit options: they win", code == 0 and load(d, "rank-0.json")["device"]["context_bytes"] ==
          100 * MiB and load(d, "run.json")["device_memory"] == 16 << 30 and
          report["gpus"][0]["capacity_bytes"] == 16 << 30 and
          report["ranks"][0]["peak"]["allocated"]["by_category"]["OTHER"] == 0, (code, err))

    # Hopper: PyTorch's 32 MiB cuBLAS workspace + 1 MiB cuBLASLt, OTHER 33 MiB at the peak.
    for kind, memory in [("h100-80gb", 85520809984), ("h200", 141 << 30)]:
        d = os.path.join(tmp, "gpu-" + kind)
        code, out, err = run("run", "--model", "mlp", "--steps", "1", "--gpu", kind, "--out", d)
        report = load(d, "report.json")
        check(f"--gpu {kind}: hopper workspace and memory", code == 0 and
              report["ranks"][0]["peak"]["allocated"]["by_category"]["OTHER"] == 33 * MiB and
              load(d, "run.json")["device_memory"] == memory, (code, err))

    # The list, and an unknown kind: one line naming the kinds, exit 2.
    code, out, err = run("gpus")
    check("memscope gpus", code == 0 and len(out.splitlines()) == 10 and
          "a100-80gb  NVIDIA A100-SXM4-80GB       85094039552  OOM message    400 MiB  default" in out and
          "h100-80gb  NVIDIA H100 80GB HBM3       85520809984  total_memory   400 MiB  hopper" in out, (code, out))
    code, out, err = run("run", "--model", "mlp", "--gpu", "a100", "--out", os.path.join(tmp, "bad3"))
    check("--gpu a100: exit 2, one line", code == 2 and err == "memscope run: --gpu 'a100': unknown GPU kind; use "
          "v100-16gb, v100-32gb, t4, a10, l4, a100-40gb, a100-80gb, h100-80gb, h200 (memscope gpus lists them)\n",
          (code, err))
    code, out, err = run("run", "--model", "mlp", "--gpu", "", "--out", os.path.join(tmp, "bad3"))
    check("--gpu '': exit 2, not the default GPU", code == 2 and err.startswith("memscope: error: --gpu: the value is "
          "empty"), (code, err))
finally:
    shutil.rmtree(tmp)
finish("devices")
