"""Hostile input, faults and full disks (issue 13): no crash, no lost or
clobbered file, the right rank named. Each block is one item of the issue."""
import json
import os
import shutil
import struct
import subprocess
import tempfile

from clitest import DATA, MEMSCOPE, MiB, check, data, finish, run

tmp = tempfile.mkdtemp(prefix="memscope-hostile-")


def one_line_error(name, code, err, want_code=2):
    """A refused input: the exit status and exactly one line on stderr."""
    check(f"{name} exit {want_code}", code == want_code, (code, err))
    check(f"{name} one line", err.count("\n") == 1 and err.endswith("\n"), repr(err))


def recorded_run(name):
    """A run directory recorded by `replay --out` from phases.jsonl."""
    out = os.path.join(tmp, name)
    code, _, err = run("replay", data("phases.jsonl"), "--out", out)
    assert code == 0, err
    return out


def patch_strings(path, byte):
    """Sets the first text byte of every string-chunk record (type 40) of a
    timeline to `byte`: every owner, mark and label becomes invalid UTF-8."""
    raw = bytearray(open(path, "rb").read())
    patched = 0
    for off in range(64, len(raw) - 47, 48):
        if raw[off] == 40 and raw[off + 3] > 0:
            raw[off + 8] = byte
            patched += 1
    open(path, "wb").write(raw)
    return patched


# 1. Invalid UTF-8 in a timeline's strings: every JSON output replaces it
# (U+FFFD) instead of aborting (nlohmann's type_error 316, exit 134).
bad = recorded_run("bad-utf8")
check("strings patched", patch_strings(os.path.join(bad, "rank-0.timeline"), 0xFF) > 0)
for args in (["dump", bad], ["summary", bad, "--json"], ["frag", bad, "--json"], ["compare", bad, bad, "--json"],
             ["check", bad, "--max", "peak_allocated=1GiB", "--json"]):
    code, out, err = run(*args)
    check(f"invalid UTF-8: {args[0]} exit 0", code == 0, (code, err[-300:]))
    if args[0] in ("dump", "summary", "frag"):  # the ones that print owners
        check(f"invalid UTF-8: {args[0]} U+FFFD", "\ufffd" in out, out[:300])
    if args[0] == "dump":
        lines = [json.loads(x) for x in out.splitlines()]
        check("invalid UTF-8: dump owner", any(x.get("owner", "").startswith("\ufffd") for x in lines), out[:300])

# 9. Standard output that cannot be written is an error (exit non-zero, one line).
good = recorded_run("good")
for args in (["dump", good], ["summary", good], ["replay", data("phases.jsonl"), "--alloc-conf", ""],
             ["compare", good, good], ["frag", good, "--json"]):
    with open("/dev/full", "w") as full:
        p = subprocess.run([MEMSCOPE, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    one_line_error(f"stdout /dev/full: {args[0]}", p.returncode, p.stderr)
    check(f"stdout /dev/full: {args[0]} says why", "memscope: error: cannot write standard output" in p.stderr,
          p.stderr)

# 2. A --exec cpu run whose loss becomes inf or nan writes everything it
# recorded and says which step diverged (it aborted with no run.json).
div = os.path.join(tmp, "diverged")
code, out, err = run("run", "--model", "mlp", "--exec", "cpu", "--lr", "1e38", "--steps", "3", "--out", div)
check("diverged: exit 0", code == 0, (code, err))
check("diverged: named", err == "memscope run: the training diverged: the loss became nan at step 1 (the memory "
      "profile is complete; a smaller --lr would keep it finite)\n", err)
check("diverged: losses printed", "loss: 2.3066 nan nan" in out, out[-300:])
for name in ("run.json", "rank-0.json", "report.json", "summary.txt", "trace.json", "report.html",
             "snapshot-rank-0.pickle"):
    check(f"diverged: {name} written", os.path.exists(os.path.join(div, name)), os.listdir(div))
run_json = json.load(open(os.path.join(div, "run.json")))
check("diverged: run.json losses", run_json["losses"][1:] == [None, None] and run_json["losses"][0] > 2,
      run_json.get("losses"))
check("diverged: parameters", run_json["parameters"] == 662026, run_json.get("parameters"))

# 4. Timeline header fields are checked against what a real run can hold: a
# GPU index of 2^31-1 made `snapshot` write 2.15 GB; a start time of 2^62 us
# overflowed the snapshot's times.
for offset, fmt, value, field in ((24, "<i", 2**31 - 1, "device_index"), (40, "<q", 2**62, "wall_start_us"),
                                  (20, "<i", 0, "world_size"), (16, "<i", -3, "rank"),
                                  (32, "<Q", 2**62, "device_capacity")):
    raw = bytearray(open(os.path.join(good, "rank-0.timeline"), "rb").read())
    struct.pack_into(fmt, raw, offset, value)
    path = os.path.join(tmp, f"header-{field}.timeline")
    open(path, "wb").write(raw)
    out_file = os.path.join(tmp, f"header-{field}.pickle")
    code, out, err = run("snapshot", path, "-o", out_file)
    one_line_error(f"header {field}", code, err)
    check(f"header {field} named", f"header {field} {value} is out of range" in err, err)
    check(f"header {field}: nothing written", not os.path.exists(out_file))

# 10. A request over 1 TiB is an ordinary OOM (exit 0 for replay, reported),
# not "not a plausible device allocation"; absurd and silently replaced
# options are refused.
big = os.path.join(tmp, "big.jsonl")
open(big, "w").write('{"action":"alloc","id":1,"size":1099511627777}\n')
code, out, err = run("replay", big, "--out", os.path.join(tmp, "big"))
check("over 1 TiB: exit 0", code == 0, (code, err))
check("over 1 TiB: the OOM", "CUDA out of memory. Tried to allocate 1024.00 GiB" in out, out[:400])
check("over 1 TiB: recorded", os.path.exists(os.path.join(tmp, "big", "report.json")), err)
for flag, value, message in (("--lr", "nan", "--lr nan: must be a positive finite float32 number (at most 3.4e+38)"),
                             ("--lr", "-1", "--lr -1: must be a positive finite float32 number (at most 3.4e+38)"),
                             ("--lr", "1e39", "--lr 1e+39: must be a positive finite float32 number (at most 3.4e+38)"),
                             ("--momentum", "nan", "--momentum nan: must be a finite number >= 0"),
                             ("--batch-size", "-8", "--batch-size -8: use 1 to 16777216"),
                             ("--batch-size", "0", "--batch-size 0: use 1 to 16777216"),
                             ("--batch-size", str(2**62), f"--batch-size {2**62}: use 1 to 16777216"),
                             ("--seq-len", "0", "--seq-len 0: use 1 to 16777216"),
                             ("--width", "-1", "--width -1: use 1 to 16777216"),
                             ("--depth", "100000", "--depth 100000: use 1 to 65536"),
                             ("--grad-accum", "0", "--grad-accum 0: use 1 to 16777216"),
                             ("--timeout", "inf", "--timeout inf: use more than 0 and at most 604800 seconds"),
                             ("--timeout", "0", "--timeout 0: use more than 0 and at most 604800 seconds"),
                             ("--bucket-cap-mb", "inf", "--bucket-cap-mb inf: must be greater than 0 and at most 1 PiB"),
                             ("--device-memory", "2048TiB", "--device-memory 2048TiB: at most 1 PiB")):
    out_dir = os.path.join(tmp, "refused")
    code, out, err = run("run", "--model", "mlp", "--steps", "1", flag, value, "--out", out_dir)
    one_line_error(f"run {flag} {value}", code, err)
    check(f"run {flag} {value} says", err == f"memscope run: {message}\n", err)
check("refused runs write nothing", not os.path.exists(os.path.join(tmp, "refused")))
for args in (["summary", good, "--rank", "-5"], ["compare", good, good, "--rank", "-1"]):
    code, out, err = run(*args)
    one_line_error(" ".join(args[:1] + args[2:]), code, err)
    check(f"{args[0]} --rank negative named", "--rank: Value" in err and "not in range 0 to 131071" in err, err)
    check(f"{args[0]} --rank negative: no output", out == "", out[:200])

# 11. Escape sequences from inputs are printed escaped in error messages.
esc_csv = os.path.join(tmp, "esc.csv")
open(esc_csv, "wb").write(b"Thread,Time,Action,Pointer,Size,Stream\n1,2,\x1b[31mevil\x07,0x10,100,0\n")
esc_jsonl = os.path.join(tmp, "esc.jsonl")
open(esc_jsonl, "w").write('{"action":"\\u001b]0;pwned\\u0007\\nsecond line"}\n')
for path, shown in ((esc_csv, "unknown Action '\\x1b[31mevil\\x07'"),
                    (esc_jsonl, 'unknown action "\\x1b]0;pwned\\x07\\nsecond line"')):
    code, out, err = run("replay", path, "--alloc-conf", "")
    one_line_error(f"escaped {os.path.basename(path)}", code, err)
    check(f"escaped {os.path.basename(path)}: shown", shown in err, repr(err))
    check(f"escaped {os.path.basename(path)}: no control bytes",
          not any(ord(c) < 0x20 and c != "\n" for c in err), repr(err))
code, out, err = run("\x1b[2Jbogus")
check("unknown command escaped", "unknown command '\\x1b[2Jbogus'" in err, repr(err))

finish("hostile")
