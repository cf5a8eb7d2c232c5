#!/usr/bin/env python3
"""memscope capture --all-device-memory, without a GPU: the flag's plumbing
and the merge, against the stand-in torch (tests/cli/data/fake_torch, NOT
PyTorch) and a job that writes the device timeline CUPTI would have made
(tests/cli/data/fake_device_job.py). CUPTI, NVML and CUDA are untested here.

- The job's environment gets CUDA_INJECTION64_PATH = the injection library
  next to memscope (build/libmemscope-cupti.so, when memscope was built with
  CUPTI and no sanitizer: argument 3 is 1); its output and exit status pass
  through.
- A missing library is one note; the job still runs, without the variable.
- The device timeline becomes RUN/device-rank-0.gpu-0.timeline, and
  summary (text and --json), trace and report show the measured row: the snapshot's 2
  segments (32 MiB) matched by address as PyTorch's reserved, NCCL 64 MiB,
  cuBLAS 8 MiB, context 604 - 104 = 500 MiB.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from clitest import MEMSCOPE, MiB, check, finish, run  # noqa: E402
from clitest import data as relative_data  # noqa: E402

PY = sys.executable
HAVE_CUPTI = len(sys.argv) > 3 and sys.argv[3] == "1"  # the injection library is built
LIBRARY = os.path.join(os.path.dirname(MEMSCOPE), "libmemscope-cupti.so")
work = tempfile.mkdtemp(prefix="memscope-device-capture-")


def data(name):
    return os.path.abspath(relative_data(name))


def capture(run_dir, *flags_and_job, env=None):
    e = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_INJECTION64_PATH",
                      "MEMSCOPE_CUPTI_LIBRARY")}
    e["PYTHONPATH"] = data("fake_torch")
    e.update(env or {})
    p = subprocess.run([MEMSCOPE, "capture", "--out", run_dir, *flags_and_job], capture_output=True, text=True,
                       env=e, timeout=120, cwd=work)
    return p.returncode, p.stdout, p.stderr


job = [PY, data("fake_device_job.py"), "3"]
run_dir = os.path.join(work, "cap")
rc, out, err = capture(run_dir, "--all-device-memory", "--", *job)
check("the job's exit status passes through", rc == 3, (rc, err))
if HAVE_CUPTI:
    check("the job gets CUDA_INJECTION64_PATH: the library next to memscope",
          out == f"CUDA_INJECTION64_PATH={LIBRARY}\n", (out, err))
    check("no note about the library", "--all-device-memory" not in err, err)
else:
    check("built without CUPTI: the job runs without the variable", out == "CUDA_INJECTION64_PATH=<unset>\n", out)
    check("built without CUPTI: one note",
          f"memscope: note: --all-device-memory: no CUPTI injection library at '{LIBRARY}' (memscope was built "
          "without CUPTI, or with a sanitizer); only PyTorch's allocator was recorded" in err.splitlines(), err)
check("the device timeline is the rank's", os.path.isfile(os.path.join(run_dir, "device-rank-0.gpu-0.timeline")),
      os.listdir(run_dir))
left = [n for n in os.listdir(os.path.join(run_dir, ".memscope-capture")) if n.startswith("device-pid-")]
check("nothing left under its process's name", left == [], left)

rc, out, err = run("summary", run_dir)
check("summary of the capture: exit 0", rc == 0, err)
lines = out.splitlines()
header = ("GPU   rank   source        context    reserved        NCCL      cuBLAS       cuDNN       other        "
          "used")
row = ("0     0      measured   500.00 MiB   32.00 MiB   64.00 MiB    8.00 MiB     0 bytes     0 bytes  "
       "604.00 MiB")
check("summary: the measured table's columns", header in lines, out)
check("summary: context 500 MiB, PyTorch's 32 MiB, NCCL 64 MiB, cuBLAS 8 MiB", row in lines, out)
check("summary: the snapshot's segments matched by address",
      "      rank 0: 2 of the snapshot's 2 segments matched to their cudaMalloc by address" in lines, out)
check("summary: the total against the GPU",
      "0     total                                                                                     604.00 MiB of 80.00 GiB"
      in lines, out)

rc, out, err = run("summary", run_dir, "--json")
check("summary --json: exit 0", rc == 0, err)
if rc == 0:
    gpus = json.loads(out).get("gpus")
    want = [{"physical": 0, "capacity_bytes": 80 << 30, "used_bytes": 604 * MiB, "shared_by_ranks": [],
             "processes": [{"rank": 0, "cuda": 0, "context_bytes": 500 * MiB, "reserved_bytes": 32 * MiB,
                            "nccl_bytes": 64 * MiB, "used_bytes": 604 * MiB, "source": "measured",
                            "context_measured": True, "cublas_bytes": 8 * MiB, "cudnn_bytes": 0, "other_bytes": 0,
                            "pytorch_segments": 2, "pytorch_segments_matched": 2}]}]
    check("summary --json: the measured GPU row", gpus == want, gpus)
rc, out, err = run("trace", run_dir, "-o", os.path.join(work, "t.json"))
check("trace of the capture: exit 0", rc == 0, err)
if rc == 0:
    counters = [e["args"] for e in json.load(open(os.path.join(work, "t.json")))["traceEvents"]
                if e.get("ph") == "C" and e.get("name") == "GPU 0"]
    want = {"context": 500 * MiB, "reserved": 32 * MiB, "nccl": 64 * MiB, "cublas": 8 * MiB, "cudnn": 0, "other": 0}
    check("trace: the GPU's counters, every library apart", counters == [want, want], counters)
rc, out, err = run("report", run_dir, "-o", os.path.join(work, "r.html"))
check("report of the capture: exit 0", rc == 0, err)
if rc == 0:
    page = open(os.path.join(work, "r.html")).read()
    check("report: the page holds the measured row", '"source":"measured"' in page and '"cublas_bytes":8388608' in page)

# A missing library: one note, the job runs as it would without the flag.
rc, out, err = capture(os.path.join(work, "missing"), "--all-device-memory", "--", *job,
                       env={"MEMSCOPE_CUPTI_LIBRARY": "/nonexistent/libmemscope-cupti.so"})
check("missing library: the job's status and output", (rc, out) == (3, "CUDA_INJECTION64_PATH=<unset>\n"), (rc, out))
check("missing library: one note",
      "memscope: note: --all-device-memory: no CUPTI injection library at '/nonexistent/libmemscope-cupti.so' "
      "($MEMSCOPE_CUPTI_LIBRARY); only PyTorch's allocator was recorded" in err.splitlines(), err)

# A file that is no shared library: one note naming it, the job runs.
not_library = data("fake_device_job.py")
rc, out, err = capture(os.path.join(work, "bad"), "--all-device-memory", "--", *job,
                       env={"MEMSCOPE_CUPTI_LIBRARY": not_library})
notes = [line for line in err.splitlines() if "--all-device-memory" in line]
check("not a library: the job's status and output", (rc, out) == (3, "CUDA_INJECTION64_PATH=<unset>\n"), (rc, out))
check("not a library: one note saying it cannot load",
      len(notes) == 1 and notes[0].startswith(f"memscope: note: --all-device-memory: cannot load '{not_library}': ")
      and notes[0].endswith("; only PyTorch's allocator was recorded"), notes)

# Without the flag, memscope sets no injection.
rc, out, err = capture(os.path.join(work, "plain"), "--", *job)
check("without the flag: no CUDA_INJECTION64_PATH", (rc, out) == (3, "CUDA_INJECTION64_PATH=<unset>\n"), (rc, out))

shutil.rmtree(work, ignore_errors=True)
finish("cli device capture")
