"""allocator/ska_map.h against PyTorch's own ska::flat_hash_map.

  ska_oracle_test.py SKA_MAP_DRIVER

Compiles ska_oracle.cpp against Debian's libtorch-dev (c10/util/flat_hash_map.h
keyed by c10::Stream, linked with libc10), then feeds it and memscope's
driver the same seeded command sequences: streams inserted (pool streams
3, 35, 67, ... of both priorities, the default stream, external stream
handles), walks that erase as process_events does, clears. Every line
(an iteration order) must be equal. Fails, never skips, without the
headers; scripts/test installs libtorch-dev.
"""

import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def commands(rng):
    pool = [slot << 5 | (pri + 1) << 1 | 1 for slot in range(32) for pri in range(2)]
    external = [0x7F0000000000 + rng.randrange(1 << 20) * 16 for _ in range(16)]
    keys = pool + external + [0]
    lines = []
    for _ in range(rng.randrange(10, 120)):
        r = rng.random()
        if r < 0.6:
            lines.append(f"i {rng.choice(keys[:rng.choice([4, 8, 16, len(keys)])])}")
        elif r < 0.8:
            lines.append(f"w {rng.choice([1, 2, 3, 5, 7, 1 << 40])}")
        elif r < 0.83:
            lines.append("c")
        else:
            lines.append("o")
    lines.append("o")
    return "\n".join(lines) + "\n"


def main():
    driver = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        oracle = os.path.join(tmp, "ska_oracle")
        subprocess.run(["c++", "-std=c++17", "-O1", os.path.join(HERE, "ska_oracle.cpp"), "-lc10", "-o", oracle],
                       check=True)
        rng = random.Random(33)
        lines = 0
        for case in range(400):
            device = rng.choice([0, 0, 1, 3, 7])
            text = commands(rng)
            theirs = subprocess.run([oracle, str(device)], input=text, capture_output=True, text=True, check=True).stdout
            ours = subprocess.run([driver, str(device)], input=text, capture_output=True, text=True, check=True).stdout
            if theirs != ours:
                print(f"case {case} (device {device}) differs:\n{text}\nPyTorch:\n{theirs}\nmemscope:\n{ours}")
                return 1
            lines += theirs.count("\n")
    print(f"ska_map: 400 sequences, {lines} iteration orders equal to PyTorch's ska::flat_hash_map")
    return 0


if __name__ == "__main__":
    sys.exit(main())
