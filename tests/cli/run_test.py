#!/usr/bin/env python3
"""End-to-end tests of memscope run and memscope models: the run directory,
the phase table, the OOM exit status (3) and one-line errors (exit 2)."""
import json
import os
import shutil
import tempfile

from clitest import MiB, check, finish, run  # noqa: E402

tmp = tempfile.mkdtemp(prefix="memscope-run-")
try:
    code, out, err = run("models")
    check("models exit", code == 0, err)
    check("gpt2 count", any(l.split()[:2] == ["gpt2", "124,439,808"] for l in out.splitlines()), out)
    check("resnet50 count", any(l.split()[:2] == ["resnet50", "25,557,032"] for l in out.splitlines()), out)

    d = os.path.join(tmp, "s2s")
    code, out, err = run("run", "--model", "seq2seq-attn", "--steps", "2", "--zero-grad", "zeros", "--out", d)
    check("run exit", code == 0, (code, err))
    for f in ["run.json", "rank-0.timeline", "report.json", "report.html", "summary.txt", "trace.json",
              "snapshot-rank-0.pickle"]:
        check(f"run wrote {f}", os.path.exists(os.path.join(d, f)), os.listdir(d))
    check("recorded-in line lists every file", f"recorded in {d}/ (run.json, rank-0.timeline, report.json, report.html, "
          "summary.txt, trace.json, snapshot-rank-0.pickle)" in out, out)
    html = open(os.path.join(d, "report.html")).read()
    check("run's report.html names the training phases", '"forward"' in html and '"backward"' in html, html[:200])
    rows = [l.split() for l in out.splitlines() if l[:1] in "01" and len(l.split()) == 7]
    check("phase rows", [r[:2] for r in rows][:5] == [["0", "zero_grad"], ["0", "forward"], ["0", "loss"],
                                                      ["0", "backward"], ["0", "step"]], out)
    loss = {(r[0], r[1]): int(r[2][:-1]) for r in rows}
    check("loss adds the user's 458M", loss[("0", "loss")] - loss[("0", "forward")] == 458, loss)
    run_json = json.load(open(os.path.join(d, "run.json")))
    check("run.json", run_json["model"] == "seq2seq-attn" and run_json["parameters"] == 73308501
          and run_json["ranks"][0]["status"] == "ok", run_json)
    report = json.load(open(os.path.join(d, "report.json")))
    check("report phases", len(report["ranks"][0]["phases"]) == 11, len(report["ranks"][0]["phases"]))
    code, out, err = run("summary", d)
    check("summary reads the run", code == 0 and "backward" in out, err)

    # A directory with the user's own files is refused (one line naming a
    # file a run would write); with --force the run keeps them: only
    # memscope's per-rank files of an earlier run are replaced.
    d = os.path.join(tmp, "mine")
    os.makedirs(os.path.join(d, "store"))
    for name in ["store/data.txt", "rank-notes.md", "rank-7.timeline.bak"]:
        with open(os.path.join(d, name), "w") as f:
            f.write("keep")
    with open(os.path.join(d, "rank-3.timeline"), "w") as f:
        f.write("the user's, not memscope's")  # memscope did not write it: it stays, and is not read
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", d)
    check("a user's directory refused", code == 2 and err == f"memscope run: --out '{d}' is not empty and was not "
          "written by memscope (it holds rank-3.timeline and 3 others): choose a new or empty directory, or --force "
          "to write into it\n", (code, err))
    check("a user's directory: nothing written", sorted(os.listdir(d)) ==
          ["rank-3.timeline", "rank-7.timeline.bak", "rank-notes.md", "store"], os.listdir(d))
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", d, "--force")
    check("run into a user's directory with --force", code == 0, err)
    for name in ["store/data.txt", "rank-notes.md", "rank-7.timeline.bak", "rank-3.timeline"]:
        check(f"kept {name}", os.path.exists(os.path.join(d, name)), os.listdir(d))
    code, out, err = run("summary", d)
    check("the run's rank only", code == 0 and "rank 3" not in out and "rank 0" in out, (code, err))

    # An OOM: recorded, reported with its diagnosis, exit 3.
    d = os.path.join(tmp, "oom")
    code, out, err = run("run", "--model", "gpt2", "--steps", "1", "--device-memory", "2GiB", "--out", d)
    check("oom exit 3", code == 3, (code, out, err))
    check("oom message", "CUDA out of memory" in err, err)
    check("oom in report", json.load(open(os.path.join(d, "report.json")))["ranks"][0]["oom"] is not None)
    check("oom status", json.load(open(os.path.join(d, "run.json")))["ranks"][0]["status"] == "oom")

    # cuBLAS workspaces (tensor/blas_workspace.h): PyTorch's 8519680 B + 1 MiB from the first forward
    # on, category OTHER; --cublas-workspace off removes exactly them; hopper's cuBLAS one is 32 MiB.
    peaks = {}
    for mode in ["default", "off", "hopper"]:
        d = os.path.join(tmp, "ws-" + mode)
        code, out, err = run("run", "--model", "mlp", "--steps", "1", "--cublas-workspace", mode, "--out", d)
        check(f"--cublas-workspace {mode}", code == 0, err)
        peak = json.load(open(os.path.join(d, "report.json")))["ranks"][0]["peak"]["allocated"]
        peaks[mode] = (peak["bytes"], peak["by_category"]["OTHER"], peak["top_owners"][0])
    check("workspaces at the peak", peaks["default"][1] == 8519680 + 1048576
          and peaks["default"][2] == {"bytes": 8519680, "owner": "cublas_workspace"}, peaks)
    check("off removes exactly them", peaks["default"][0] - peaks["off"][0] == 8519680 + 1048576
          and peaks["off"][1] == 0, peaks)
    check("hopper: 32 MiB", peaks["hopper"][1] == 32 * MiB + 1048576, peaks)
    # --torch-version (docs/run.md): 1.13's defaults reach the ranks and run.json/report.json record it;
    # 2.9 (the default) equals a run without the option; 2.7 has the cuBLAS workspace only.
    tv = {}
    for version in ["1.13", "2.7", "2.9", None]:
        d = os.path.join(tmp, "tv-" + str(version))
        args = ["--torch-version", version] if version else []
        code, out, err = run("run", "--model", "mlp", "--steps", "2", "--world-size", "2", *args, "--out", d)
        check(f"--torch-version {version}", code == 0, err)
        rj = json.load(open(os.path.join(d, "run.json")))
        rep = json.load(open(os.path.join(d, "report.json")))
        tv[version] = (rj, rep)
        check(f"--torch-version {version} recorded", rj["torch_version"] == (version or "2.9")
              and rep["torch_version"] == (version or "2.9"), (rj.get("torch_version"), rep.get("torch_version")))
    old = tv["1.13"][0]
    check("1.13: zeros, for-loop", old["zero_grad"] == "zeros" and old["optimizer_impl"] == "for-loop", old)
    check("2.9: none, foreach", tv["2.9"][0]["zero_grad"] == "none" and tv["2.9"][0]["optimizer_impl"] == "foreach")
    other = {v: r[1]["ranks"][0]["peak"]["allocated"]["by_category"]["OTHER"] for v, r in tv.items()}
    check("cuBLAS workspaces by release", other == {"1.13": 0, "2.7": 8519680, "2.9": 8519680 + 1048576,
                                                     None: 8519680 + 1048576}, other)
    strip = lambda rep: [{k: v for k, v in p.items() if k != "time_us"} for p in rep["ranks"][0]["phases"]]
    check("2.9 is the default", strip(tv["2.9"][1]) == strip(tv[None][1]))
    d = os.path.join(tmp, "tv-given")
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--torch-version", "1.13", "--zero-grad", "none",
                         "--optimizer-impl", "foreach", "--out", d)
    given = json.load(open(os.path.join(d, "run.json")))
    check("given flags win over 1.13", code == 0 and given["zero_grad"] == "none"
          and given["optimizer_impl"] == "foreach", (err, given))
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--torch-version", "1.13", "--out", d,
                         env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    check("PYTORCH_CUDA_ALLOC_CONF refused under 1.13", code == 2 and err.strip() ==
          'memscope run: PYTORCH_CUDA_ALLOC_CONF "expandable_segments:True": expandable_segments needs PyTorch 2.1 '
          'or later (pytorch/pytorch#100184); this run is --torch-version 1.13', (code, err))
    d = os.path.join(tmp, "ws-env")
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", d,
                         env={"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "64"})
    other = json.load(open(os.path.join(d, "report.json")))["ranks"][0]["peak"]["allocated"]["by_category"]["OTHER"]
    check("CUBLAS_WORKSPACE_CONFIG and CUBLASLT_WORKSPACE_SIZE", code == 0 and other == 131072 + 65536, (other, err))
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", d, env={"CUBLAS_WORKSPACE_CONFIG": "big"})
    check("an unreadable CUBLAS_WORKSPACE_CONFIG: PyTorch's warning", code == 0 and
          "memscope: note: Could not parse CUBLAS_WORKSPACE_CONFIG, using default workspace size of 8519680 bytes."
          in err, err)

    # --memory-fraction: the OOM names what is allowed (0.001 of 80 GiB = 85899345 B = 81.92 MiB).
    d = os.path.join(tmp, "fraction")
    code, out, err = run("run", "--model", "gpt2", "--steps", "1", "--memory-fraction", "0.001", "--out", d)
    check("--memory-fraction OOM exit 3", code == 3, (code, err))
    check("--memory-fraction OOM message", "81.92 MiB allowed; " in err and
          "The per-process memory fraction, not the device, is the limit." in err, err)
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--alloc-conf", "garbage_collection_threshold:0.6",
                         "--out", d)
    check("GC without a fraction: the note", code == 0 and "memscope: note: garbage_collection_threshold has no "
          "effect without a per-process memory fraction" in err, err)
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--alloc-conf", "garbage_collection_threshold:0.6",
                         "--memory-fraction", "0.5", "--out", d)
    check("GC with a fraction: no note", code == 0 and "garbage_collection_threshold" not in err, err)

    # PEFT LoRA (--lora adapter_config.json): the count PEFT prints; errors name the field.
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    llama = "hf:" + os.path.join(root, "examples", "hf", "Llama-2-7b-hf", "config.json")
    adapter = os.path.join(root, "examples", "lora", "adapter_config.json")
    code, out, err = run("run", "--model", llama, "--lora", adapter, "--seq-len", "64", "--steps", "1",
                         "--out", os.path.join(tmp, "lora"))
    check("lora run exit 0", code == 0, (code, err))
    check("lora run: PEFT's all params", "(6742609920 parameters)" in out, out)
    bad_adapter = os.path.join(tmp, "bad_adapter.json")
    with open(bad_adapter, "w") as f:
        f.write('{"r": 8, "target_modules": ["q_proj"], "bias": "all"}')
    for args, msg in [(["--model", llama, "--lora", bad_adapter], 'field "bias": "all" is not modelled'),
                      (["--model", "mlp", "--lora", adapter], "--lora applies to a model file or a Hugging Face config"),
                      (["--model", llama, "--lora", os.path.join(tmp, "none.json")], "cannot be read")]:
        code, out, err = run("run", *args, "--out", os.path.join(tmp, "bad-lora"))
        check(f"bad {args} exit 2", code == 2, (code, err))
        check(f"bad {args} one line", len(err.strip().splitlines()) == 1 and msg in err, err)

    # Bad input: one line naming the problem, exit 2, nothing written.
    for args, msg in [(["--model", "nope"], "unknown model 'nope'"),
                      (["--optimizer", "lion"], "unknown optimizer 'lion'"),
                      (["--exec", "cpu", "--model", "gpt2"], "needs --exec meta"),
                      (["--amp", "fp8"], "--amp 'fp8'"),
                      (["--world-size", "0"], "--world-size must be at least 1"),
                      (["--ddp", "both"], "--ddp 'both'"),
                      (["--bucket-cap-mb", "5"], "need --ddp copy or view"),
                      (["--ddp", "copy", "--comm-hook", "fp8"], "--comm-hook 'fp8'"),
                      (["--world-size", "2", "--timeout", "0"], "--timeout 0: use more than 0 and at most 604800 seconds"),
                      (["--device-memory", "lots"], "--device-memory"),
                      (["--memory-fraction", "1.5"], "--memory-fraction 1.5: use 0 to 1"),
                      (["--cublas-workspace", "huge"], "--cublas-workspace 'huge': use default, hopper or off"),
                      (["--torch-version", "2.10"],
                       "memscope run: --torch-version '2.10': use 1.10 to 1.13 or 2.0 to 2.9 (the PyTorch releases memscope "
                       "models)"),
                      (["--torch-version", "1.13", "--alloc-conf", "roundup_power2_divisions:[>:2]"],
                       "roundup_power2_divisions as a per-interval list needs PyTorch 2.0 or later"),
                      (["--model", "mlp", "--exec", "cpu", "--amp", "fp16"], "--amp needs --exec meta")]:
        bad = os.path.join(tmp, "bad")
        code, out, err = run("run", *args, "--out", bad)
        check(f"bad {args} exit 2", code == 2, (code, err))
        check(f"bad {args} one line", len(err.strip().splitlines()) == 1 and msg in err, err)
finally:
    shutil.rmtree(tmp)
finish("memscope run")
