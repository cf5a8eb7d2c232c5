"""Hostile input, faults and full disks (issue 13): no crash, no lost or
clobbered file, the right rank named. Each block is one item of the issue."""
import json
import os
import pickle
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time

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


def read(path):
    """The text of `path`, or None when it is missing."""
    try:
        return open(path, errors="replace").read()
    except OSError:
        return None


def varint(raw, off):
    """(value, offset after it) of the LEB128 varint at raw[off]."""
    value = shift = 0
    while True:
        b = raw[off]
        off += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, off


def patch_strings(path, byte):
    """Sets the first text byte of every string record (type 40) of a version
    4 timeline (recording/timeline.h) to `byte`: every owner, mark and label
    becomes invalid UTF-8."""
    raw = bytearray(open(path, "rb").read())
    assert raw[8] == 4, "a version 4 timeline"
    patched = 0
    off = 64
    while off < len(raw):
        tag = raw[off]
        off += 1
        kind = tag & 63
        if tag & 0x80:  # lean free: one more byte of its slot
            off += 1
        elif tag & 0x40:  # compact alloc: 8 + 3 bytes
            off += 11
        elif kind == 40:  # string: id, length, text
            _, off = varint(raw, off)
            n, off = varint(raw, off)
            if n > 0:
                raw[off] = byte
                patched += 1
            off += n
        elif kind == 41:  # config: three varints
            for _ in range(3):
                _, off = varint(raw, off)
        elif kind == 42:  # time: one varint
            _, off = varint(raw, off)
        else:  # event: a uint32 of 4-bit field lengths (and flags in bits 28-29), then the fields
            lengths = struct.unpack_from("<I", raw, off)[0]
            off += 4 + sum((lengths >> (4 * i)) & 15 for i in range(7))
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
run_json = json.loads(read(os.path.join(div, "run.json")) or "{}")
check("diverged: run.json losses", run_json.get("losses", [0])[1:] == [None, None] and run_json["losses"][0] > 2,
      run_json.get("losses"))
check("diverged: parameters", run_json.get("parameters") == 662026, run_json.get("parameters"))

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
for path, shown in ((esc_csv, "unknown Action '\\u001b[31mevil\\u0007'"),
                    (esc_jsonl, 'unknown action "\\u001b]0;pwned\\u0007\\nsecond line"')):
    code, out, err = run("replay", path, "--alloc-conf", "")
    one_line_error(f"escaped {os.path.basename(path)}", code, err)
    check(f"escaped {os.path.basename(path)}: shown", shown in err, repr(err))
    check(f"escaped {os.path.basename(path)}: no control bytes",
          not any(ord(c) < 0x20 and c != "\n" for c in err), repr(err))
code, out, err = run("\x1b[2Jbogus")
check("unknown command escaped", "unknown command '\\u001b[2Jbogus'" in err, repr(err))

# Issue 34, 1. Text from input files reaches the terminal escaped, in every
# command, text and JSON alike: owners, labels and marks of a JSON-lines trace,
# a timeline's strings as raw bytes (0x9b: CSI to an 8-bit terminal; NUL),
# a PyTorch snapshot's frame names and annotations. Nothing but printable
# UTF-8, line breaks and tabs comes out; JSON stays JSON with the same values.
EVIL = "\x1b[31mRED\x1b]0;title\x07\x9b\x00\x01\x7f\u0085\r"  # ESC, OSC, BEL, C1 (UTF-8), NUL, SOH, DEL, NEL, CR


def run_bytes(*args):
    p = subprocess.run([MEMSCOPE, *args], capture_output=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def terminal_unsafe(raw):
    """The characters of `raw` a terminal could obey: C0 but line break and tab, DEL, C1, bytes not UTF-8."""
    text = raw.decode("utf-8", errors="surrogateescape")
    return [hex(ord(c)) for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 or
            0xDC80 <= ord(c) <= 0xDCFF]


evil_jsonl = os.path.join(tmp, "evil.jsonl")
with open(evil_jsonl, "w") as f:
    for line in ({"action": "phase_begin", "phase": "user", "label": "lab" + EVIL},
                 {"action": "alloc", "id": 1, "size": 2 * MiB, "owner": "own" + EVIL, "category": "ACTIVATION"},
                 {"action": "alloc", "id": 2, "size": 2 * MiB, "owner": "pin" + EVIL},
                 {"action": "free", "id": 1}, {"action": "mark", "text": "mark" + EVIL},
                 {"action": "phase_end", "phase": "user", "label": "lab" + EVIL}):
        f.write(json.dumps(line) + "\n")
evil_run = os.path.join(tmp, "evil-run")
code, out, err = run_bytes("replay", evil_jsonl, "--out", evil_run)
check("escapes: evil trace recorded", code == 0, err[-300:])
raw_run = os.path.join(tmp, "evil-raw")
shutil.copytree(evil_run, raw_run)
check("escapes: raw CSI bytes patched in", patch_strings(os.path.join(raw_run, "rank-0.timeline"), 0x9B) > 0)
nul_run = os.path.join(tmp, "evil-nul")
shutil.copytree(evil_run, nul_run)
check("escapes: NUL bytes patched in", patch_strings(os.path.join(nul_run, "rank-0.timeline"), 0x00) > 0)
evil_pickle = os.path.join(tmp, "evil-snapshot.pickle")
BASE = 0x7F0000000000
frames = [{"filename": "train" + EVIL + ".py", "line": 10, "name": "fn" + EVIL}]
trace = [{"action": a, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames,
          "compile_context": "N/A", "user_metadata": "", "pool_id": (0, 0)}
         for a, addr, size, t in (("segment_alloc", BASE, 20 * MiB, 100), ("alloc", BASE, 6 * MiB, 100),
                                  ("alloc", BASE + 6 * MiB, 4 * MiB, 110), ("free_requested", BASE, 6 * MiB, 120),
                                  ("free_completed", BASE, 6 * MiB, 120))]
blocks = [{"address": BASE, "size": 6 * MiB, "requested_size": 0, "state": "inactive", "frames": []},
          {"address": BASE + 6 * MiB, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated",
           "frames": frames},
          {"address": BASE + 10 * MiB, "size": 10 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]
pickle.dump({"segments": [{"device": 0, "address": BASE, "total_size": 20 * MiB, "allocated_size": 4 * MiB,
                           "active_size": 4 * MiB, "requested_size": 4 * MiB, "stream": 0, "segment_type": "large",
                           "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames, "blocks": blocks}],
             "device_traces": [trace],
             "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                                    "expandable_segments": False, "garbage_collection_threshold": 0.0,
                                    "roundup_power2_divisions": {"1": 0}},
             "external_annotations": [{"name": "lab" + EVIL, "stage": "START", "device": 0, "time_us": 100},
                                      {"name": "lab" + EVIL, "stage": "END", "device": 0, "time_us": 120}]},
            open(evil_pickle, "wb"))
moment = "lab" + EVIL.replace("\x00", "")  # a moment named by the user (argv has no NUL): echoed in messages
for source in (evil_run, raw_run, nul_run, evil_pickle):
    name = os.path.basename(source)
    commands = [["summary", source], ["summary", source, "--by-category"], ["summary", source, "--json"],
                ["summary", source, "--at", "peak"], ["frag", source], ["frag", source, "--json"],
                ["frag", source, "--at", "peak"], ["compare", source, source], ["compare", source, source, "--json"],
                ["dump", source], ["replay", source, "--no-search"], ["replay", source, "--json", "--no-search"],
                ["check", source, "--max", "peak_allocated=1MiB"], ["check", source, "--max", "peak_allocated=1MiB",
                                                                   "--json"],
                ["summary", source, "--at", moment], ["trace", source, "-o", os.path.join(tmp, "evil-trace.json")]]
    for args in commands:
        what = f"escapes: {name}: {' '.join(a for a in args[2:] if a != source)} {args[0]}"
        code, out, err = run_bytes(*args)
        check(f"{what}: no signal", code >= 0, code)
        check(f"{what}: stdout escaped", not terminal_unsafe(out), (terminal_unsafe(out)[:8], out[:300]))
        check(f"{what}: stderr escaped", not terminal_unsafe(err), (terminal_unsafe(err)[:8], err[:300]))
        if "--json" in args and code in (0, 1):
            try:
                json.loads(out)
            except ValueError as e:
                check(f"{what}: JSON", False, (e, out[:300]))
        if args[0] == "dump" and code == 0:
            lines = [json.loads(x) for x in out.splitlines()]
            if source == evil_run:
                check(f"{what}: the owner's value kept", any(x.get("owner") == "own" + EVIL for x in lines),
                      out[:300])
code, out, err = run_bytes("summary", evil_run)
check("escapes: owners shown escaped", b"own\\u001b[31mRED\\u001b]0;title\\u0007\\u009b\\u0000\\u0001\\u007f"
      b"\\u0085\\r" in out, out[-1500:])
code, out, err = run_bytes("summary", raw_run)
check("escapes: raw bytes shown as \\xNN", b"\\x9bwn" in out, out[-1500:])
code, out, err = run_bytes("replay", evil_jsonl, "--no-search")
check("escapes: replay of the trace", code == 0 and not terminal_unsafe(out + err), (code, err[-300:]))

# 5. Two runs on one --out: the second is refused at once, naming the first.
locked = os.path.join(tmp, "locked")
first = subprocess.Popen([MEMSCOPE, "run", "--model", "gpt2", "--steps", "3", "--world-size", "2", "--out", locked],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
lock_file = os.path.join(locked, ".memscope-lock")
for _ in range(200):  # the first run has taken the lock when the file names it
    if os.path.exists(lock_file) and open(lock_file).read().startswith(f"pid {first.pid}:"):
        break
    subprocess.run(["sleep", "0.02"])
# The first run is held (SIGSTOP) while the others try, so that it cannot end
# before them on a loaded machine or under a sanitizer; its ranks run on.
os.kill(first.pid, signal.SIGSTOP)
code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", locked)
replay_code, _, replay_err = run("replay", os.path.join(DATA, "phases.jsonl"), "--out", locked)
os.kill(first.pid, signal.SIGCONT)
first_err = first.communicate(timeout=120)[1]
one_line_error("second run", code, err)
one_line_error("replay --out into a run in progress", replay_code, replay_err)
check("replay --out names the run in progress", f"'{locked}' is in use by another memscope run (pid {first.pid}:"
      in replay_err, replay_err)
check("second run names the first",
      err == f"memscope run: '{locked}' is in use by another memscope run (pid {first.pid}: memscope run --model gpt2 "
      f"--steps 3 --world-size 2 --out {locked}); wait for it or choose another --out\n", err)
check("first run unharmed", first.returncode == 0, (first.returncode, first_err))
run_json = json.loads(read(os.path.join(locked, "run.json")) or "{}")
check("first run's run.json", run_json.get("model") == "gpt2" and run_json.get("world_size") == 2, run_json.get("model"))
code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", locked)
check("after the first: the lock is free", code == 0, (code, err))

# 6. The cleanup removes only files memscope wrote; no output is written
# through a symlink.
mixed = os.path.join(tmp, "mixed")
code, out, err = run("run", "--model", "mlp", "--steps", "1", "--world-size", "2", "--out", mixed)
check("mixed: 2 ranks", code == 0, err)
open(os.path.join(mixed, "rank-5.log"), "w").write("the user's\n")
open(os.path.join(mixed, "snapshot-rank-9.pickle"), "w").write("the user's\n")
os.mkdir(os.path.join(mixed, "rank-3.json"))
open(os.path.join(mixed, "rank-3.json", "inside"), "w").write("the user's\n")
victim = os.path.join(tmp, "victim.txt")
open(victim, "w").write("victim\n")
for name in ("summary.txt", "report.json", "trace.json", "rank-0.timeline", "rank-0.log", "snapshot-rank-0.pickle",
             "run.json"):
    os.remove(os.path.join(mixed, name))
    os.symlink(victim, os.path.join(mixed, name))
code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", mixed)  # one rank now
check("mixed: rerun", code == 0, err)
check("mixed: victim untouched", read(victim) == "victim\n", (read(victim) or "")[:100])
for name in ("summary.txt", "report.json", "trace.json", "rank-0.timeline", "snapshot-rank-0.pickle", "run.json"):
    check(f"mixed: {name} replaced the symlink", not os.path.islink(os.path.join(mixed, name)) and
          os.path.getsize(os.path.join(mixed, name)) > 0)
check("mixed: the user's files stay", read(os.path.join(mixed, "rank-5.log")) == "the user's\n" and
      read(os.path.join(mixed, "snapshot-rank-9.pickle")) == "the user's\n" and
      read(os.path.join(mixed, "rank-3.json", "inside")) == "the user's\n", os.listdir(mixed))
for name in ("rank-1.timeline", "rank-1.json", "rank-1.log", "snapshot-rank-1.pickle"):
    check(f"mixed: the earlier run's {name} is removed", not os.path.exists(os.path.join(mixed, name)),
          os.listdir(mixed))
check("mixed: the earlier run's rank-0.log (a symlink now) is not followed", os.path.islink(os.path.join(mixed, "rank-0.log")))
code, out, err = run("summary", mixed)
check("mixed: one rank read back", code == 0 and "rank 1" not in out, (code, err))

# 8. Full disks: every output that fits is written, each one that does not is
# named with the system's reason, nothing half-written is left, and a rank's
# failure reaches the launcher even when its log cannot be written.
def on_tiny_disk(size, *args, full=False):
    """memscope ARGS with --out on a tmpfs of SIZE (a private mount namespace: unshare -rm); `full`: filled
    before the run (its directory exists, not one byte more fits)."""
    mnt = tempfile.mkdtemp(prefix="tinyfs-", dir=tmp)
    fill = 'mkdir "$1/r" && { cat /dev/zero > "$1/fill" 2>/dev/null; true; } && ' if full else ""
    script = f'mount -t tmpfs -o size={size} tmpfs "$1" && {fill}shift && "$@"; code=$?; ls -A "$MNT/r"; exit $code'
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", mnt, MEMSCOPE, *args, "--out", f"{mnt}/r"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, MNT=mnt))
    return p.returncode, p.stdout, p.stderr, f"{mnt}/r"

code, out, err, r = on_tiny_disk("40k", "run", "--model", "mlp", "--steps", "1")
listing = out.split()
check("full disk: exit 2", code == 2, (code, err))
for name in ("run.json", "rank-0.timeline", "rank-0.json"):
    check(f"full disk: {name} written", name in listing, listing)
# Which of the outputs fit depends on their sizes; each is either written whole or named.
outputs = ("snapshot-rank-0.pickle", "trace.json", "report.json", "summary.txt", "report.html")
named = [n for n in outputs if f"memscope run: cannot write '{r}/{n}': No space left on device\n" in err]
for name in outputs:
    check(f"full disk: {name} written or named, not both", (name in listing) != (name in named), (listing, err))
check("full disk: some outputs fit, some did not", 0 < len(named) < len(outputs), (listing, err))
check("full disk: no temporary left", not any(".tmp" in name for name in listing), listing)
code, out, err, r = on_tiny_disk("20k", "run", "--model", "mlp", "--steps", "1", "--world-size", "2", "--timeout", "2")
check("full disk, 2 ranks: exit 4", code == 4, (code, err))
check("full disk, 2 ranks: the rank's reason",
      re.search(r"^memscope run: rank \d exited with status 4: cannot write .*: No space left on device", err, re.M),
      err)
code, out, err, r = on_tiny_disk("64k", "run", "--model", "mlp", "--steps", "1", "--world-size", "2", "--timeout",
                                 "2", full=True)
check("disk full from the start, 2 ranks: exit 4", code == 4, (code, err))
check("disk full from the start, 2 ranks: the rank's reason (its log is empty)",
      re.search(r"^memscope run: rank \d exited with status 4: cannot write timeline '.*': No space left on device$",
                err, re.M), err)
check("full disk, 2 ranks: no empty line", "\n\n" not in err and not err.startswith("\n"), err)

# Issue 34, 5. Absurd sizes: every input file has a limit that fits its kind,
# checked before it is read (a 5 GiB sparse file is refused by its size; the
# endless /dev/zero is read no further than the limit); out-of-range numbers
# are refused, never saturated to INT64_MAX. Each is one line, exit 2, under a
# 4 GiB address-space limit (std::bad_alloc and exit 134 before).
import resource  # noqa: E402


# ASan reserves terabytes of shadow address space at start, so an ASan build
# cannot run under the limit; there ASan itself reports an oversized allocation.
with open(MEMSCOPE, "rb") as f:
    UNDER_ASAN = b"__asan_init" in f.read()


def run_limited(*args):
    def limits():
        if not UNDER_ASAN:
            resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        p = subprocess.run([MEMSCOPE, *args], capture_output=True, text=True, timeout=60, preexec_fn=limits,
                           errors="replace")
    except subprocess.TimeoutExpired:
        return None, "", "timed out"
    return p.returncode, p.stdout, p.stderr


sparse = {}
for name, head in (("model.json", b"{"), ("config.json", b"{"), ("adapter_config.json", b"{"),
                   ("report.json", b'{"schema": "memscope.report/1"'), ("trace.jsonl", b'{"action":"alloc"')):
    sparse[name] = os.path.join(tmp, "sparse-" + name)
    with open(sparse[name], "wb") as f:
        f.write(head)
        f.truncate(5 << 30)
out_dir = os.path.join(tmp, "absurd")
for args, message in (
        (["run", "--model", "hf:/dev/zero"], "Hugging Face config /dev/zero: more than the Hugging Face config limit "
                                             "(16 MiB)"),
        (["run", "--model", "file:/dev/zero"], "model file /dev/zero: more than the model file limit (64 MiB)"),
        (["run", "--model-file", "/dev/zero"], "model file /dev/zero: more than the model file limit (64 MiB)"),
        (["plan", "--model", "hf:/dev/zero", "--device-memory", "1GiB"],
         "Hugging Face config /dev/zero: more than the Hugging Face config limit (16 MiB)"),
        (["run", "--model", "mlp", "--lora", "/dev/zero"],
         "--lora: adapter config /dev/zero: more than the adapter config limit (16 MiB)"),
        (["run", "--model-file", sparse["model.json"]],
         f"model file {sparse['model.json']}: 5368709120 bytes, over the model file limit (64 MiB)"),
        (["run", "--model", "hf:" + sparse["config.json"]],
         f"Hugging Face config {sparse['config.json']}: 5368709120 bytes, over the Hugging Face config limit (16 MiB)"),
        (["plan", "--model", "file:" + sparse["model.json"], "--device-memory", "1GiB"],
         f"model file {sparse['model.json']}: 5368709120 bytes, over the model file limit (64 MiB)"),
        (["run", "--model", "mlp", "--lora", sparse["adapter_config.json"]],
         f"--lora: adapter config {sparse['adapter_config.json']}: 5368709120 bytes, over the adapter config limit "
         "(16 MiB)"),
        (["check", sparse["report.json"], "--max", "peak_allocated=1GiB"],
         f"report.json {sparse['report.json']}: 5368709120 bytes, over the report.json limit (1 GiB)"),
        (["compare", sparse["report.json"], sparse["report.json"]],
         f"report.json {sparse['report.json']}: 5368709120 bytes, over the report.json limit (1 GiB)"),
        (["check", sparse["report.json"], "--baseline", sparse["report.json"]],
         f"report.json {sparse['report.json']}: 5368709120 bytes, over the report.json limit (1 GiB)"),
        (["replay", "/dev/zero", "--alloc-conf", ""],
         "/dev/zero:1: a line of more than 1 MiB (the request trace line limit)"),
        (["run", "--steps", "9223372036854775808"], None), (["run", "--steps", "99999999999999999999999"], None),
        (["run", "--steps", "9223372036854775807"], "--steps 9223372036854775807: use 1 to 1000000"),
        (["run", "--steps", "1000001"], "--steps 1000001: use 1 to 1000000"),
        (["plan", "--steps", str(2**63), "--device-memory", "1GiB"], None),
        (["plan", "--steps", str(2**63 - 1), "--device-memory", "1GiB"], None),
        (["plan", "--batch-size", str(2**63), "--device-memory", "1GiB"], None),
        (["plan", "--batch-size", str(2**62), "--device-memory", "1GiB"], None),
        (["plan", "--global-batch", str(2**63), "--device-memory", "1GiB"], None),
        (["plan", "--global-batch", str(2**62), "--device-memory", "1GiB"], None),
        (["plan", "--global-batch", str(2**30), "--device-memory", "1GiB"],
         "--global-batch 1073741824: at most 16777216 per rank (16777216 for --world-size 1)"),
        (["snapshot", good, "-o", os.path.join(tmp, "s.pickle"), "--max-entries", str(2**64)], None),
        (["replay", data("phases.jsonl"), "--rank", str(2**63)], None)):
    name = "absurd: " + " ".join(a.replace(tmp + "/", "") for a in args)
    code, out, err = run_limited(*args, *(["--out", out_dir] if args[0] == "run" else []))
    one_line_error(name, code, err)
    command = args[0]
    if message is not None:
        check(f"{name}: says", err == f"memscope {command}: {message}\n", err)
    else:
        check(f"{name}: refused as out of range", "out of range" in err or "not in range" in err, err)
check("absurd: nothing recorded", not os.path.exists(out_dir))
for path in sparse.values():
    os.remove(path)

# Issue 34, 6. Empty and impossible values: each a one-line refusal (rc 0, or
# '' read as 0, before).
for args, says in ((["run", "--momentum", ""], "--momentum: the value is empty"),
                   (["run", "--cuda-context-mb", ""], "--cuda-context-mb: the value is empty"),
                   (["run", "--devices", ""], "--devices: the value is empty"),
                   (["run", "--memory-fraction", ""], "--memory-fraction: the value is empty"),
                   (["run", "--steps", ""], "--steps: the value is empty"),
                   (["run", "--model", ""], "--model: the value is empty"),
                   (["replay", data("phases.jsonl"), "--device-memory", ""], "--device-memory: the value is empty"),
                   (["replay", data("phases.jsonl"), "--rank", ""], "--rank: the value is empty"),
                   (["replay", data("phases.jsonl"), "--memory-fraction", ""], "--memory-fraction: the value is empty"),
                   (["plan", "--batch-size", "", "--device-memory", "1GiB"], "--batch-size: the value is empty"),
                   (["plan", "--global-batch", "", "--device-memory", "1GiB"], "--global-batch: the value is empty"),
                   (["summary", ""], "run: the value is empty"),
                   (["run", "--touch-device", "-1", "--cuda-context-mb", "500"], "--touch-device: Value -1 not in range"),
                   (["snapshot", good, "-o", os.path.join(tmp, "s.pickle"), "--max-entries", "-1"],
                    "--max-entries: -1 is negative"),
                   (["run", "--world-size", "4", "--load-checkpoint", "cuda:99"],
                    "memscope run: CUDA error: invalid device ordinal: --load-checkpoint on cuda:99, but the run's "
                    "ranks are on cuda:0 to cuda:3"),
                   (["run", "--touch-device", "1", "--cuda-context-mb", "500"],
                    "memscope run: CUDA error: invalid device ordinal: --touch-device on cuda:1, but the run's ranks "
                    "are on cuda:0")):
    name = "impossible: " + " ".join(repr(a) if a == "" else a.replace(tmp + "/", "") for a in args)
    extra = ["--model", "mlp", "--steps", "1", "--out", out_dir] if args[0] == "run" and "--model" not in args else []
    code, out, err = run(*args, *extra)
    one_line_error(name, code, err)
    check(f"{name}: says", says in err, err)
check("impossible: nothing recorded", not os.path.exists(out_dir))
code, out, err = run("replay", data("phases.jsonl"), "--alloc-conf", "", "--no-search")
check("--alloc-conf '' still means the defaults", code == 0 and "alloc_conf (defaults)" in out, (code, err))

# 8 (and 6) for the commands' -o: written whole, never through a symlink; a
# device is written in place, never replaced, and its error is named.
for args in (["trace", good], ["snapshot", good], ["report", good]):
    code, out, err = run(*args, "-o", "/dev/full")
    one_line_error(f"{args[0]} -o /dev/full", code, err)
    check(f"{args[0]} -o /dev/full: the reason", err == f"memscope {args[0]}: cannot write '/dev/full': No space left on "
          "device\n", err)
    check(f"{args[0]} -o /dev/full: still a device", os.path.exists("/dev/full") and not os.path.isfile("/dev/full"))
    link = os.path.join(tmp, f"{args[0]}-link.out")
    os.symlink(victim, link)
    code, out, err = run(*args, "-o", link)
    check(f"{args[0]} -o symlink: written", code == 0 and not os.path.islink(link) and os.path.getsize(link) > 0,
          (code, err))
    check(f"{args[0]} -o symlink: victim untouched", read(victim) == "victim\n")
    open(victim, "w").write("victim\n")

# 7. A rank that stops making progress (SIGSTOP) is named, within about one
# timeout: the launcher kills it after half the timeout, its peers fail at once.
def rank_pids(parent):
    """{rank: pid} of the launcher's children."""
    pids = {}
    for task in os.listdir(f"/proc/{parent}/task"):
        try:
            children = open(f"/proc/{parent}/task/{task}/children").read().split()
        except OSError:
            continue
        for pid in children:
            try:
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            for e in env:
                if e.startswith(b"RANK="):
                    pids[int(e[5:])] = int(pid)
    return pids

hung = os.path.join(tmp, "hung")
launcher = subprocess.Popen([MEMSCOPE, "run", "--model", "gpt2", "--steps", "100000", "--world-size", "2",
                             "--timeout", "4", "--out", hung], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
pids = {}
for _ in range(1200):
    pids = rank_pids(launcher.pid)
    if len(pids) == 2 and os.path.exists(os.path.join(hung, "rank-1.timeline")) and \
            os.path.getsize(os.path.join(hung, "rank-1.timeline")) > 64 * 1024:  # training has begun
        break
    subprocess.run(["sleep", "0.05"])
check("hung: two ranks found", len(pids) == 2, pids)
stopped_at = time.monotonic()
os.kill(pids.get(1, launcher.pid), signal.SIGSTOP if 1 in pids else signal.SIGKILL)
err = launcher.communicate(timeout=120)[1]
took = time.monotonic() - stopped_at
check("hung: exit 4", launcher.returncode == 4, (launcher.returncode, err))
# The launcher measured the stop (2 s: half the timeout); the whole run,
# analysis included, ends long before the 3 x timeout it took before.
check("hung: within about one timeout", took < 30, took)
first_line = err.splitlines()[0] if err else ""
check("hung: rank 1 named first", first_line.startswith("memscope run: rank 1 was stopped by signal 19 (SIGSTOP) and "
                                                       "made no progress for 2 s; killed"), err)
run_json = json.loads(read(os.path.join(hung, "run.json")) or "{}")
check("hung: run.json's failure", run_json.get("failure", {}).get("rank") == 1, run_json.get("failure"))

finish("hostile")
