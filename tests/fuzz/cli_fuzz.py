#!/usr/bin/env python3
"""A black-box fuzzer of the memscope command line (issue 13).

Where the libFuzzer targets (tests/fuzz/*_fuzz.cpp) cover the readers in
process, this runs the real binary: every subcommand, on every kind of input
(timelines and run directories, PyTorch snapshot pickles, JSON-lines and RMM
CSV request traces, report.json, `run` options), mutated, each run under a
time limit and a memory limit (RLIMIT_AS; under ASan, which reserves
terabytes of address space, ASan's hard_rss_limit_mb instead).

What counts as a finding:
  - a signal (a crash, an abort: an uncaught exception is SIGABRT);
  - a time-out;
  - an exit status outside 0-4 (0 ok, 1 a check failed, 2 unusable input,
    3 OOM, 4 a rank failed);
  - exit status 2 without exactly one line on stderr (notes included: a
    failing command says its error alone), or stderr holding a sanitizer
    report or "terminate called";
  - a character a terminal obeys on stdout or stderr (base/terminal_text.h:
    C0 but the line break and the tab, DEL, C1, bytes that are not UTF-8):
    an escape sequence echoed from the input.

  cli_fuzz.py MEMSCOPE --seconds 60 [--seed N] [--save DIR]
      fuzz; findings are written to DIR (default cli-fuzz-findings/) as
      regression cases: NAME.json = {"args": [...], "files": {name: base64}}
      (and "sparse": {name: bytes}: files of that size made of holes, the
      absurd sizes of issue 34 without storing them)
  cli_fuzz.py MEMSCOPE --replay DIR
      run every saved case of DIR once (ctest cli_fuzz_regressions does, in
      the normal and the ASan+UBSan build); exit 1 if any is a finding.
"""
import argparse
import base64
import json
import os
import random
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "cli", "data")
CORPUS = os.path.join(HERE, "corpus")
TIMEOUT_S = 20
MEMORY_LIMIT = 4 << 30

INTERESTING_INTS = [0, 1, -1, 2**31 - 1, -2**31, 2**32 - 1, 2**40, 2**40 + 1, 2**53, 2**62, 2**63 - 1, -2**63,
                    2**64 - 1, 512, 1 << 20]
INTERESTING_TEXT = ["\x1b[31m", "\x1b]0;t\x07", "\n", "\r", "\t", "\x00", "\u202e", "\ufffd", "nan", "inf", "-inf",
                    "-1", "0", "1e309", "18446744073709551616", "9" * 40, "\"", "\\", "{", "[", ",", "'"]


def is_asan(binary):
    """An ASan build links libasan dynamically: its binary names __asan_init (the
    string "AddressSanitizer" is in libasan, not in the binary)."""
    with open(binary, "rb") as f:
        return b"__asan_init" in f.read()


def terminal_unsafe(raw):
    """The characters of `raw` a terminal could obey (base/terminal_text.h's rule)."""
    text = raw.decode("utf-8", errors="surrogateescape")
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 or 0xDC80 <= ord(c) <= 0xDCFF]


def run_case(memscope, args, files, workdir, limit_memory, sparse=None):
    """Runs one case in a fresh `workdir`: returns (finding or None, exit code, stderr)."""
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    for name, content in files.items():
        path = os.path.join(workdir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content)
    for name, size in (sparse or {}).items():
        path = os.path.join(workdir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(size)

    def limits():
        if limit_memory:
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))  # 1 GiB per file written

    env = dict(os.environ)
    if not limit_memory:  # under ASan its own limit takes RLIMIT_AS's place
        env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), f"hard_rss_limit_mb={MEMORY_LIMIT >> 20}"]))
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "RANK", "WORLD_SIZE", "MEMSCOPE_STORE"):
        env.pop(k, None)
    try:
        p = subprocess.run([memscope, *args], cwd=workdir, capture_output=True, timeout=TIMEOUT_S,
                           preexec_fn=limits, env=env)
    except subprocess.TimeoutExpired:
        return f"timed out after {TIMEOUT_S} s", None, ""
    except OSError as e:  # the binary being relinked: not memscope's finding
        return None, None, str(e)
    err = p.stderr.decode("utf-8", "replace")
    code = p.returncode
    if code < 0:
        return f"killed by signal {-code}", code, err
    if code not in (0, 1, 2, 3, 4):
        return f"exit status {code}", code, err
    for marker in ("AddressSanitizer", "runtime error:", "LeakSanitizer", "terminate called", "Assertion"):
        if marker in err:
            return f"stderr has {marker!r}", code, err
    for stream, raw in (("stderr", p.stderr), ("stdout", p.stdout)):
        if terminal_unsafe(raw):
            return f"raw control character on {stream}", code, err
    lines = err.splitlines()
    if code == 2 and len(lines) != 1:
        return f"exit 2 with {len(lines)} lines on stderr", code, err
    return None, code, err


# ---------------------------------------------------------------- seeds


def make_seeds(memscope, tmp):
    """{kind: [bytes]}: inputs memscope itself wrote, the test data and the libFuzzer corpora."""
    seeds = {"timeline": [], "pickle": [], "jsonl": [], "csv": [], "report": []}
    run_dir = os.path.join(tmp, "seed-run")
    subprocess.run([memscope, "replay", os.path.join(DATA, "phases.jsonl"), "--out", run_dir], capture_output=True,
                   check=True)
    seeds["timeline"].append(open(os.path.join(run_dir, "rank-0.timeline"), "rb").read())
    seeds["pickle"].append(open(os.path.join(run_dir, "snapshot-rank-0.pickle"), "rb").read())
    seeds["report"].append(open(os.path.join(run_dir, "report.json"), "rb").read())
    for kind, folder in (("timeline", "timeline"), ("pickle", "pickle"), ("jsonl", "jsonl"), ("report", "report")):
        d = os.path.join(CORPUS, folder)
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            if len(data) < 200_000:
                seeds[kind].append(data)
    for name in sorted(os.listdir(DATA)):
        path = os.path.join(DATA, name)
        if name.endswith(".jsonl"):
            seeds["jsonl"].append(open(path, "rb").read())
        elif name.endswith(".csv"):
            seeds["csv"].append(open(path, "rb").read())
    return seeds


# ---------------------------------------------------------------- mutations


def mutate_bytes(rng, data):
    data = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 4, 8])):
        op = rng.randrange(8)
        if not data:
            data += bytes([rng.randrange(256)])
            continue
        i = rng.randrange(len(data))
        if op == 0:
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[i] = rng.choice([0, 0xff, 0x7f, 0x80, 0x1b, 0xc0, 0xed, 0xf4, ord("\n")])
        elif op == 2 and i + 8 <= len(data):
            v = rng.choice(INTERESTING_INTS)
            width, fmt = rng.choice([(4, "<I"), (8, "<Q")])
            if i + width <= len(data):
                data[i:i + width] = struct.pack(fmt, v % (1 << (8 * width)))
        elif op == 3:
            del data[i:i + rng.randrange(1, 64)]
        elif op == 4:
            j = rng.randrange(len(data))
            chunk = data[j:j + rng.randrange(1, 256)]
            data[i:i] = chunk * rng.choice([1, 2, 16])
        elif op == 5:
            del data[i:]
        elif op == 6:
            data[i:i] = rng.choice(INTERESTING_TEXT).encode("utf-8", "surrogatepass")
        else:
            data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
    return bytes(data)


def mutate_timeline(rng, data):
    """The header's fields and the string chunks get special attention."""
    data = bytearray(data)
    if len(data) >= 64 and rng.random() < 0.5:
        offset, fmt = rng.choice([(8, "<I"), (12, "<I"), (16, "<i"), (20, "<i"), (24, "<i"), (32, "<Q"),
                                  (40, "<q")])
        v = rng.choice(INTERESTING_INTS)
        bits = 8 * struct.calcsize(fmt)
        v = v % (1 << bits)
        if fmt[1].islower() and v >= 1 << (bits - 1):
            v -= 1 << bits
        struct.pack_into(fmt, data, offset, v)
    if rng.random() < 0.3:  # invalid UTF-8 or an escape sequence in a string chunk
        for off in range(64, len(data) - 47, 48):
            if data[off] == 40 and rng.random() < 0.5:
                text = rng.choice([b"\xff", b"\x1b[2J", b"\xc0\x80", b"\xed\xa0\x80", b"\n"])
                data[off + 8:off + 8 + len(text)] = text
    if rng.random() < 0.3:  # a record's size, address or time
        records = (len(data) - 64) // 48
        if records > 0:
            off = 64 + 48 * rng.randrange(records)
            field = rng.choice([8, 16, 24, 32, 40])
            struct.pack_into("<Q", data, off + field, rng.choice(INTERESTING_INTS) % (1 << 64))
    return mutate_bytes(rng, data) if rng.random() < 0.5 else bytes(data)


def mutate_json_text(rng, data):
    """JSON lines and report.json: numbers and strings replaced by hostile ones, then bytes."""
    text = data.decode("utf-8", "replace")
    for _ in range(rng.randrange(1, 4)):
        if not text:
            break
        i = rng.randrange(len(text))
        if rng.random() < 0.5:
            j = i
            while j < len(text) and text[j].isdigit():
                j += 1
            text = text[:i] + str(rng.choice(INTERESTING_INTS)) + text[j:]
        else:
            text = text[:i] + json.dumps(rng.choice(INTERESTING_TEXT))[1:-1] + text[i:]
    data = text.encode("utf-8", "surrogatepass")
    return mutate_bytes(rng, data) if rng.random() < 0.3 else data


# ---------------------------------------------------------------- cases


def make_case(rng, seeds):
    """(args, files): one command on one mutated input. {name} in args is a file in the case's directory."""
    kind = rng.choice(["timeline", "timeline", "rundir", "pickle", "jsonl", "csv", "report", "run"])
    at = rng.choice(["end", "peak", "oom", "forward:0", "backward:99", "step:-1", "x:y", "forward:99999999999999999999"])
    if kind == "run":
        options = [("--batch-size", ["1", "0", "-8", str(2**62), "16777216", "x"]),
                   ("--lr", ["1e-3", "nan", "-1", "1e38", "inf"]), ("--timeout", ["1", "inf", "0", "1e300"]),
                   ("--device-memory", ["1MiB", "0", "1TiB", "18446744073709551615", "1e3GiB", "-1"]),
                   ("--alloc-conf", ["max_split_size_mb:20", "garbage:\x1b[31m", "expandable_segments:True",
                                     "roundup_power2_divisions:[>:8]", "max_split_size_mb:" + "9" * 30]),
                   ("--steps", ["1", "0", "-1", "", "9223372036854775808", "9" * 23]), ("--seq-len", ["1", "0", "99999999"]),
                   ("--world-size", ["1", "0", "65"]), ("--bucket-cap-mb", ["0", "nan", "1e300", "1"]),
                   ("--momentum", ["", "0.9", "nan"]), ("--memory-fraction", ["", "0.5", "2"]),
                   ("--devices", ["", "same", "0,0", "x"]), ("--cuda-context-mb", ["", "500", "-1"]),
                   ("--touch-device", ["-1", "0", "256"]), ("--load-checkpoint", ["cuda:99", "cpu", ""])]
        model = rng.choice(["mlp", "cifar-net", "nosuchmodel", "hf:/dev/zero", "file:/dev/zero", ""])
        args = ["run", "--model", model, "--steps", "1", "--out", "out"]
        for flag, values in rng.sample(options, rng.randrange(1, 4)):
            args += [flag, rng.choice(values)]
        return args, {}
    if kind in ("timeline", "rundir"):
        data = mutate_timeline(rng, rng.choice(seeds["timeline"]))
        name = "in.timeline" if kind == "timeline" else "rundir/rank-0.timeline"
        files = {name: data}
        target = name if kind == "timeline" else "rundir"
    elif kind == "pickle":
        files = {"in.pickle": mutate_bytes(rng, rng.choice(seeds["pickle"]))}
        target = "in.pickle"
    elif kind == "jsonl":
        files = {"in.jsonl": mutate_json_text(rng, rng.choice(seeds["jsonl"]))}
        target = "in.jsonl"
    elif kind == "csv":
        files = {"in.csv": mutate_bytes(rng, rng.choice(seeds["csv"]))}
        target = "in.csv"
    else:
        files = {"report.json": mutate_json_text(rng, rng.choice(seeds["report"]))}
        target = "report.json"
    if kind in ("jsonl", "csv"):
        command = rng.choice([["replay", target, "--alloc-conf", rng.choice(["", "expandable_segments:True",
                                                                               "max_split_size_mb:20"])],
                              ["replay", target, "--out", "out"], ["replay", target, "--verify"],
                              ["replay", target, "--json", "--device-memory", rng.choice(["1GiB", "1TiB", "0"])],
                              ["summary", target], ["fleet", target],
                              ["explain", target, "--device-memory", rng.choice(["100MiB", "1TiB", "0"])],
                              ["explain", target, "--json", "--memory-fraction", rng.choice(["0", "0.5", "1"])]])
    elif kind == "report":
        command = rng.choice([["check", target, "--max", "peak_allocated=1GiB"], ["compare", target, target],
                              ["check", target, "--baseline", target, "--tolerance", "10"], ["summary", target],
                              ["compare", target, target, "--json"], ["fleet", target, "--max", "peak_reserved=1GiB"],
                              ["fleet", target, target, "--json"]])
    else:
        command = rng.choice([["summary", target, "--at", at], ["summary", target, "--json"],
                              ["frag", target, "--at", at], ["frag", target, "--json"], ["dump", target],
                              ["trace", target, "-o", "t.json"], ["snapshot", target, "-o", "s.pickle", "--at", at],
                              ["snapshot", target, "-o", "s.json", "--format", "json"], ["report", target, "-o", "r.html"],
                              ["replay", target, "--alloc-conf", "expandable_segments:True"],
                              ["compare", target, target], ["check", target, "--max", "peak_allocated=1MiB"],
                              ["fleet", target, "--html", "f.html"], ["fleet", target, "--json", "--jobs", "2"],
                              ["explain", target], ["explain", target, "--json", "--device-memory", "1GiB"]])
    return command, files


def save_case(save_dir, args, files, finding, err):
    os.makedirs(save_dir, exist_ok=True)
    name = f"{args[0]}-{abs(hash((tuple(args), tuple(sorted(files.items()))))) % 10**10:010d}.json"
    with open(os.path.join(save_dir, name), "w") as f:
        json.dump({"finding": finding, "stderr": err[-2000:], "args": args,
                   "files": {k: base64.b64encode(v).decode() for k, v in files.items()}}, f, indent=1)
    return name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("memscope")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--save", default="cli-fuzz-findings")
    ap.add_argument("--replay", default=None, help="a directory of saved cases to run once each")
    a = ap.parse_args()
    memscope = os.path.abspath(a.memscope)
    limit_memory = not is_asan(memscope)
    tmp = tempfile.mkdtemp(prefix="memscope-cli-fuzz-")
    try:
        if a.replay:
            failed = 0
            cases = sorted(n for n in os.listdir(a.replay) if n.endswith(".json"))
            for n in cases:
                case = json.load(open(os.path.join(a.replay, n)))
                files = {k: base64.b64decode(v) for k, v in case["files"].items()}
                finding, code, err = run_case(memscope, case["args"], files, os.path.join(tmp, "case"), limit_memory,
                                              case.get("sparse"))
                if finding:
                    failed += 1
                    print(f"{n}: {finding}: memscope {' '.join(case['args'])}\n{err[-1500:]}")
            print(f"cli fuzz regressions: {len(cases)} cases, {failed} failing")
            return 1 if failed else 0
        seed = a.seed if a.seed is not None else int(time.time())
        rng = random.Random(seed)
        seeds = make_seeds(memscope, tmp)
        deadline = time.monotonic() + a.seconds
        runs = findings = 0
        by_command = {}
        while time.monotonic() < deadline:
            args, files = make_case(rng, seeds)
            finding, code, err = run_case(memscope, args, files, os.path.join(tmp, "case"), limit_memory)
            runs += 1
            by_command[args[0]] = by_command.get(args[0], 0) + 1
            if finding:
                findings += 1
                name = save_case(a.save, args, files, finding, err)
                print(f"finding: {finding}: memscope {' '.join(args)} -> {a.save}/{name}\n{err[-600:]}", flush=True)
        print(f"cli fuzz: seed {seed}, {runs} runs in {a.seconds:.0f} s ({runs / a.seconds:.1f}/s), {findings} findings; "
              f"by command: {', '.join(f'{k} {v}' for k, v in sorted(by_command.items()))}")
        return 1 if findings else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
