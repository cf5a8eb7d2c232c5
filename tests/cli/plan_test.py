"""End to end: memscope run --model-file / --model hf:, and memscope plan (table, --json, errors)."""
import json
import os
import tempfile

from clitest import MiB, check, finish, run

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "examples", "models")
HF = os.path.join(ROOT, "examples", "hf")

with tempfile.TemporaryDirectory() as tmp:
    # A zoo model and its example file: the same report (the phase tables and peaks agree to the byte).
    reports = []
    for args in (["--model", "cifar-net"], ["--model-file", os.path.join(MODELS, "cifar-net.json")]):
        out = os.path.join(tmp, "r%d" % len(reports))
        code, stdout, stderr = run("run", *args, "--steps", "2", "--out", out)
        check("run " + " ".join(args), code == 0, stderr)
        with open(os.path.join(out, "report.json")) as f:
            reports.append(json.load(f)["ranks"][0])
    for key in ("phases", "lower_bound_bytes", "peak_reserved_bytes"):
        a, b = reports[0][key], reports[1][key]
        if key == "phases":
            a = [{k: v for k, v in p.items() if k != "time_us"} for p in a]
            b = [{k: v for k, v in p.items() if k != "time_us"} for p in b]
        check("cifar-net file = zoo: " + key, a == b, f"{a} != {b}")

    # Two ranks under DDP from a model file (the ranks are processes started with --model file:...).
    code, stdout, stderr = run("run", "--model-file", os.path.join(MODELS, "mlp.json"), "--world-size", "2",
                               "--steps", "2", "--out", os.path.join(tmp, "ddp"))
    check("model file under DDP", code == 0 and "DDP buckets: 1 bucket" in stdout, stdout + stderr)

    # A Hugging Face config.
    code, stdout, stderr = run("run", "--model", "hf:" + os.path.join(HF, "Qwen2-0.5B", "config.json"),
                               "--seq-len", "32", "--batch-size", "2", "--steps", "1", "--out", os.path.join(tmp, "hf"))
    check("hf run", code == 0 and "(494032768 parameters)" in stdout, stdout + stderr)

    # Errors: one line, exit 2, naming the layer and the field.
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        json.dump({"format": "memscope.model/1", "input": {"shape": [8]},
                   "layers": [{"type": "linear", "name": "a", "out": 4}, {"type": "conv2d", "name": "b", "out": 3,
                                                                          "kernel": 3}]}, f)
    code, stdout, stderr = run("run", "--model-file", bad, "--out", os.path.join(tmp, "bad"))
    check("bad model file", code == 2 and stderr ==
          f"memscope run: model file {bad}: layers[1] (conv2d \"b\"): needs a 4-d input (N, C, H, W), got [1, 4]\n",
          stderr)
    code, stdout, stderr = run("run", "--model", "gpt2", "--model-file", bad)
    check("both --model and --model-file", code == 2 and stderr ==
          "memscope run: give --model or --model-file, not both\n", stderr)

# plan: the table and --json agree; the rows' batches are positive; checkpointing fits at least as much.
code, stdout, stderr = run("plan", "--model", "gpt2", "--seq-len", "64", "--device-memory", "3GiB", "--json")
check("plan --json", code == 0, stderr)
plan = json.loads(stdout)
check("plan schema", plan["schema"] == "memscope.plan/1" and plan["parameters"] == 124439808, stdout[:200])
check("plan model state", plan["model_state_bytes"] == 124439808 * 16, plan["model_state_bytes"])
rows = {r["strategy"]: r for r in plan["rows"]}
check("plan rows", len(rows) == 12 and "bf16 ckpt exp" in rows, list(rows))
check("plan monotonic", rows["ckpt"]["max_batch"] >= rows["defaults"]["max_batch"] > 0, rows["defaults"])
check("plan fits the GPU", all(r["peak_reserved_bytes"] <= 3 << 30 for r in plan["rows"]), "")
code, table, stderr = run("plan", "--model", "gpt2", "--seq-len", "64", "--device-memory", "3GiB")
line = [l for l in table.splitlines() if l.startswith("defaults ")]
check("plan table", code == 0 and len(line) == 1 and line[0].split()[1] == str(rows["defaults"]["max_batch"]), table)
check("plan table header", "model state (parameters + gradients + adam state, the usual estimate): 1.85 GiB" in table,
      table)

code, stdout, stderr = run("plan", "--model", "gpt2")
check("plan needs a GPU size", code == 2 and stderr ==
      "memscope plan: --device-memory or --gpu is required (the GPU to plan for, e.g. 24GiB)\n", stderr)
code, stdout, stderr = run("plan", "--model", "mlp", "--device-memory", "1GiB", "--world-size", "3",
                           "--global-batch", "100")
check("plan global batch", code == 2 and stderr ==
      "memscope plan: --global-batch 100 is not a multiple of --world-size 3\n", stderr)

# --gpu KIND: the kind's memory less its 400 MiB CUDA context, and its cuBLAS workspace.
code, table, stderr = run("plan", "--model", "mlp", "--gpu", "t4")
check("plan --gpu t4: header", code == 0 and table.startswith("memscope plan: mlp (662,026 parameters), adam, GPU of "
      "14.36 GiB (t4: 14.76 GiB less a 400.00 MiB CUDA context), world size 1\n"), (code, table[:300], stderr))
code, out, stderr = run("plan", "--model", "mlp", "--gpu", "h100-80gb", "--json")
h100 = json.loads(out) if code == 0 else {}
code, out, stderr = run("plan", "--model", "mlp", "--device-memory", str(85520809984 - 400 * MiB), "--json")
same = json.loads(out) if code == 0 else {}
check("plan --gpu h100-80gb: 85520809984 B less 400 MiB", h100.get("device_memory") == 85520809984 - 400 * MiB
      == same.get("device_memory"), h100.get("device_memory"))
rows = [(a["strategy"], a["max_batch"], b["max_batch"], a["peak_allocated_bytes"] - b["peak_allocated_bytes"])
        for a, b in zip(h100.get("rows", []), same.get("rows", []))]
check("plan --gpu h100-80gb: the hopper workspace (32 MiB, not 8519680 B) in every row", len(rows) == 12 and
      all(r[1] == r[2] == 65536 and r[3] == 32 * MiB - 8519680 for r in rows), rows)
code, out, stderr = run("plan", "--model", "mlp", "--gpu", "t4", "--device-memory", "100MiB")
check("plan --gpu with a GPU below the context", code == 2 and stderr ==
      "memscope plan: --device-memory 100MiB: not more than --gpu t4's 400.00 MiB CUDA context\n", stderr)
code, out, stderr = run("plan", "--model", "mlp", "--gpu", "k80")
check("plan --gpu k80: unknown", code == 2 and stderr.startswith("memscope plan: --gpu 'k80': unknown GPU kind; use "
      "v100-16gb,"), stderr)

finish("plan")
