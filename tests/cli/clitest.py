"""Shared by the end-to-end CLI tests: run memscope, collect failed checks.

Each test script is run as `script.py MEMSCOPE DATA_DIR`; it imports this
module (its own directory is on sys.path), calls check() for every assertion
and finish(name) at the end, which exits non-zero with every failure listed.
"""
import os
import subprocess
import sys

MEMSCOPE, DATA = os.path.abspath(sys.argv[1]), sys.argv[2]
MiB = 1 << 20
failures = []


def run(*args, env=None):
    """Runs memscope without the allocator-settings variables (unless given in env)."""
    e = dict(os.environ)
    e.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    e.pop("PYTORCH_ALLOC_CONF", None)
    if env:
        e.update(env)
    p = subprocess.run([MEMSCOPE, *args], capture_output=True, text=True, env=e, timeout=300)
    return p.returncode, p.stdout, p.stderr


def check(name, cond, detail=""):
    if not cond:
        failures.append(f"{name}: {detail}")


def data(name):
    return os.path.join(DATA, name)


def finish(what):
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print(f"{what}: all checks passed")
