"""A run's life when things go wrong around it (issue 34, items 2-4): a
nearly full disk, Ctrl-C and a killed launcher, an --out that holds the
user's own files. Each block is one item of the issue."""
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import time

from clitest import DATA, MEMSCOPE, check, data, finish, run

tmp = tempfile.mkdtemp(prefix="memscope-lifecycle-")


def read(path):
    """The text of `path`, or None when it is missing."""
    try:
        return open(path, errors="replace").read()
    except OSError:
        return None


def one_line_error(name, code, err, want_code=2):
    """A refused input: the exit status and exactly one line on stderr."""
    check(f"{name} exit {want_code}", code == want_code, (code, err))
    check(f"{name} one line", err.count("\n") == 1 and err.endswith("\n"), repr(err))


# 2. A nearly full disk. A rank that cannot write says so at once and the
# run ends within a second, naming the path and the reason; nothing is
# mapped that a full disk turns into SIGBUS. On a tmpfs of 12 to 84 KiB (a
# private mount namespace: unshare -rm) each size fails somewhere else (the
# timeline, the rendezvous store, the device ledger, rank-R.json); before,
# some sizes waited 60 s for the rendezvous ("rank 1 never joined") and
# some died of SIGBUS.
def timed(args, env=None, preexec_fn=None, timeout=30):
    """(exit status, stderr, seconds) of memscope ARGS; (None, "timed out", timeout) after `timeout`."""
    start = time.monotonic()
    try:
        p = subprocess.run([MEMSCOPE, *args], capture_output=True, text=True, timeout=timeout, env=env,
                           preexec_fn=preexec_fn)
    except subprocess.TimeoutExpired:
        return None, "timed out", timeout
    return p.returncode, p.stderr, time.monotonic() - start


for kb in range(12, 88, 4):
    mnt = tempfile.mkdtemp(prefix=f"tinyfs-{kb}k-", dir=tmp)
    script = f'mount -t tmpfs -o size={kb}k tmpfs "$1" && shift && exec "$@"'
    start = time.monotonic()
    try:
        p = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", mnt, MEMSCOPE, "run", "--model", "mlp",
                            "--steps", "1", "--world-size", "2", "--out", f"{mnt}/r"], capture_output=True, text=True,
                           timeout=20)
        code, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        code, err = None, "timed out after 20 s"
    took = time.monotonic() - start
    name = f"{kb} KiB free, 2 ranks"
    check(f"{name}: ends within seconds", took < 10, (took, err))
    check(f"{name}: no signal", code is not None and code >= 0 and "signal 7" not in err and "SIGBUS" not in err,
          (code, err))
    first = err.splitlines()[0] if err else ""
    check(f"{name}: the first line names a rank, a path and the reason",
          re.match(r"memscope run: ranks? [0-9, and]+ (exited with status 4|failed): cannot write .*'.*': No space "
                   r"left on device", first) is not None, err)
    check(f"{name}: not blamed on the rendezvous", "never joined" not in err and "rendezvous timed out" not in err,
          err)


def file_size_limit(limit):
    """For preexec_fn: files may grow to `limit` bytes (RLIMIT_FSIZE, SIGXFSZ ignored: a write past it fails
    with EFBIG, "File too large"), as on a disk with that much free; works without root."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


# A timeline that stops fitting in the middle of training: the rank stops at
# the next phase and says so (it trained on, unrecorded, to its last step).
for ranks in ("1", "2"):
    out = os.path.join(tmp, f"fsize-{ranks}")
    code, err, took = timed(["run", "--model", "gpt2", "--steps", "100000", "--world-size", ranks, "--out", out],
                            preexec_fn=file_size_limit(1 << 20))
    name = f"a 1 MiB file size limit, {ranks} rank(s)"
    check(f"{name}: exit 4", code == 4, (code, err))
    check(f"{name}: ends within seconds", took < 10, took)
    first = err.splitlines()[0] if err else ""
    check(f"{name}: the first line names the timeline and the reason",
          re.match(r"memscope run: rank [01] (exited with status 4|failed): cannot write timeline '.*rank-[01]"
                   r"\.timeline': File too large$", first) is not None, err)
    check(f"{name}: what was recorded is reported", os.path.exists(os.path.join(out, "run.json")) and
          os.path.exists(os.path.join(out, "summary.txt")), os.listdir(out))

# The device ledger of a multi-rank run is written whole before it is
# mapped: a disk without room for it is an error, never a SIGBUS.
out = os.path.join(tmp, "fsize-ledger")
code, err, took = timed(["run", "--model", "mlp", "--steps", "1", "--world-size", "2", "--out", out],
                        preexec_fn=file_size_limit(64 << 10))
check("no room for the device ledger: exit 4", code == 4, (code, err))
check("no room for the device ledger: named", f"cannot write device ledger '{out}/.memscope-store/device-ledger': "
      "File too large" in err, err)


# 3. Ctrl-C, SIGTERM and a killed launcher. The first SIGINT or SIGTERM (to
# the launcher, or to its process group as Ctrl-C sends it) stops the
# ranks; what they recorded is written (run.json saying "interrupted",
# report.json, summary.txt) and one line says so; the exit status is 130 or
# 143, as shells expect. A second one ends the launcher at once. After
# SIGKILL of the launcher, `memscope summary` still reads the timelines and
# says the run did not finish.
def default_stop_signals():
    """For preexec_fn: SIGINT and SIGTERM as a terminal's foreground job has them. This test may itself run
    with SIGINT ignored (a background job of a shell), which memscope, as a shell would, keeps ignoring."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def started(out, ranks, group=False, preexec_fn=default_stop_signals):
    """`memscope run` of gpt2 for 100000 steps on `ranks` ranks into `out`, once training has begun."""
    p = subprocess.Popen([MEMSCOPE, "run", "--model", "gpt2", "--steps", "100000", "--world-size", ranks, "--out", out],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=group,
                         preexec_fn=preexec_fn)
    timelines = [os.path.join(out, f"rank-{r}.timeline") for r in range(int(ranks))]
    for _ in range(1200):
        if all(os.path.exists(t) and os.path.getsize(t) > 64 * 1024 for t in timelines):
            break
        time.sleep(0.05)
    return p


def rank_pids(parent):
    """The pids of the launcher's children (its ranks)."""
    pids = []
    for task in os.listdir(f"/proc/{parent}/task"):
        try:
            pids += [int(pid) for pid in open(f"/proc/{parent}/task/{task}/children").read().split()]
        except OSError:
            pass
    return pids


for sig, ranks, group in ((signal.SIGINT, "2", True), (signal.SIGINT, "2", False), (signal.SIGTERM, "2", False),
                          (signal.SIGTERM, "2", True), (signal.SIGINT, "1", False)):
    name = f"{sig.name} to the {'process group' if group else 'launcher'}, {ranks} rank(s)"
    out = os.path.join(tmp, f"{sig.name}-{ranks}-{group}")
    p = started(out, ranks, group)
    start = time.monotonic()
    os.killpg(p.pid, sig) if group else os.kill(p.pid, sig)
    try:
        stdout, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, err = p.communicate()
    took = time.monotonic() - start
    check(f"{name}: exit {128 + sig}", p.returncode == 128 + sig, (p.returncode, err[-500:]))
    listing = "rank-{0..1}.timeline" if ranks == "2" else "rank-0.timeline"
    snapshots = "snapshot-rank-{0..1}.pickle" if ranks == "2" else "snapshot-rank-0.pickle"
    check(f"{name}: one line", re.fullmatch(
        rf"memscope run: interrupted by {sig.name} after \d+ of 100000 steps; what was recorded is in {re.escape(out)}/ "
        rf"\(run\.json, {re.escape(listing)}, report\.json, report\.html, summary\.txt, trace\.json, "
        rf"{re.escape(snapshots)}\)\n", err) is not None, err)
    check(f"{name}: no tables", stdout == "", stdout[:300])
    check(f"{name}: ends within seconds", took < 60, took)
    manifest = json.loads(read(os.path.join(out, "run.json")) or "{}")
    check(f"{name}: run.json says interrupted", manifest.get("interrupted") == sig.name, manifest.get("interrupted"))
    check(f"{name}: every rank interrupted", [r.get("status") for r in manifest.get("ranks", [])] ==
          ["interrupted"] * int(ranks), manifest.get("ranks"))
    report = json.loads(read(os.path.join(out, "report.json")) or "{}")
    check(f"{name}: report.json of the partial run", report.get("schema") == "memscope.report/1" and
          len(report.get("ranks", [])) == int(ranks), (read(os.path.join(out, "report.json")) or "")[:200])
    check(f"{name}: summary.txt", os.path.exists(os.path.join(out, "summary.txt")))
    code, summary, err = run("summary", out)
    check(f"{name}: summary reads it", code == 0 and "backward" in summary, (code, err))
    check(f"{name}: summary says it was interrupted",
          re.search(rf"memscope: note: the run in '{re.escape(out)}' was interrupted by {sig.name} after \d+ of 100000 "
                    r"steps: what it recorded until then is shown", err) is not None, err)

# A second Ctrl-C while the first waits for a rank (stopped here, so it
# cannot end on its own): the launcher ends at once, and its ranks with it.
out = os.path.join(tmp, "twice")
p = started(out, "2")
pids = rank_pids(p.pid)
check("twice: two ranks", len(pids) == 2, pids)
for pid in pids[1:]:
    os.kill(pid, signal.SIGSTOP)
os.kill(p.pid, signal.SIGINT)
time.sleep(1)
check("twice: the first waits for the stopped rank", p.poll() is None, p.returncode)
start = time.monotonic()
if p.poll() is None:
    os.kill(p.pid, signal.SIGINT)
try:
    _, err = p.communicate(timeout=30)
except subprocess.TimeoutExpired:
    p.kill()
    _, err = p.communicate()
check("twice: ends at once", time.monotonic() - start < 2, time.monotonic() - start)
check("twice: exit 130", p.returncode == 130, (p.returncode, err))
check("twice: says so", err == "memscope run: interrupted again: stopped at once\n", err)
time.sleep(0.5)
check("twice: no rank left", not any(os.path.exists(f"/proc/{pid}") and
                                     open(f"/proc/{pid}/stat").read().split()[2] != "Z" for pid in pids), pids)

# SIGINT ignored on entry (nohup, a background job) stays ignored, by the
# launcher and its ranks; SIGTERM still stops the run.
out = os.path.join(tmp, "nohup")
p = started(out, "2", group=True, preexec_fn=lambda: (default_stop_signals(), signal.signal(signal.SIGINT,
                                                                                          signal.SIG_IGN)))
os.killpg(p.pid, signal.SIGINT)
time.sleep(1)
check("SIGINT ignored on entry: still running", p.poll() is None, p.returncode)
os.killpg(p.pid, signal.SIGTERM)
try:
    _, err = p.communicate(timeout=120)
except subprocess.TimeoutExpired:
    p.kill()
    _, err = p.communicate()
check("SIGINT ignored on entry: SIGTERM stops it", p.returncode == 143 and "interrupted by SIGTERM" in err,
      (p.returncode, err))

# SIGKILL of the launcher: its ranks die with it; the timelines are read.
out = os.path.join(tmp, "killed")
p = started(out, "2")
p.kill()
p.communicate()
time.sleep(0.5)
code, summary, err = run("summary", out)
check("killed: summary reads the timelines", code == 0 and "rank 1" in summary and "backward" in summary, (code, err))
check("killed: summary says the run did not finish", err == f"memscope: note: '{out}' has no run.json: its run did not "
      "finish (it was killed, or is still running); what its timelines recorded is shown\n", err)


# 4. The user's own files: an --out that is not empty and was not written by
# memscope is refused (one line naming a file a run would write) by every
# command that writes a run directory; --force writes into it; / and the
# home directory are always refused; memscope's own directory is rewritten.
def users_directory(name):
    """A directory of the user's: rank-0.json, report.json, trace.json of
    their own, and symlinks named summary.txt and rank-1.log to a victim."""
    d = os.path.join(tmp, name)
    os.makedirs(d)
    for f in ("rank-0.json", "report.json", "trace.json"):
        open(os.path.join(d, f), "w").write(f"the user's {f}\n")
    victim = os.path.join(tmp, f"{name}-victim.txt")
    open(victim, "w").write("victim\n")
    for f in ("summary.txt", "rank-1.log"):
        os.symlink(victim, os.path.join(d, f))
    return d, victim


def untouched(name, d, victim):
    for f in ("rank-0.json", "report.json", "trace.json"):
        check(f"{name}: {f} kept", read(os.path.join(d, f)) == f"the user's {f}\n", read(os.path.join(d, f)))
    for f in ("summary.txt", "rank-1.log"):
        check(f"{name}: {f} still the user's symlink", os.path.islink(os.path.join(d, f)))
    check(f"{name}: victim untouched", read(victim) == "victim\n", read(victim))
    check(f"{name}: nothing added", sorted(os.listdir(d)) == ["rank-0.json", "rank-1.log", "report.json",
                                                             "summary.txt", "trace.json"], os.listdir(d))


mine, victim = users_directory("mine")
refusal = (f"--out '{mine}' is not empty and was not written by memscope (it holds rank-0.json and 4 others): choose "
           "a new or empty directory, or --force to write into it\n")
for args in (["run", "--model", "mlp", "--steps", "1"], ["run", "--model", "mlp", "--steps", "1", "--world-size", "2"],
             ["run", "--model", "mlp", "--steps", "1", "--dp", "2"],
             ["run", "--model", "mlp", "--steps", "1", "--world-size", "2", "--ddp", "copy,view"],
             ["replay", data("phases.jsonl")], ["capture"]):
    name = " ".join(args[:1] + args[5:]) or args[0]
    code, out, err = run(*args, "--out", mine, *(["--", "true"] if args[0] == "capture" else []))
    one_line_error(f"user's files: {name}", code, err)
    check(f"user's files: {name} names a file", err == f"memscope {args[0]}: {refusal}", err)
    untouched(f"user's files: {name}", mine, victim)

# --force: written, the user's files of the same names replaced, the
# symlinks replaced and never followed; the directory is memscope's from then on.
code, out, err = run("run", "--model", "mlp", "--steps", "1", "--world-size", "2", "--out", mine, "--force")
check("--force: the run", code == 0, (code, err))
check("--force: report.json is the run's", json.loads(read(os.path.join(mine, "report.json")) or "{}").get("schema")
      == "memscope.report/1", (read(os.path.join(mine, "report.json")) or "")[:100])
for f in ("summary.txt", "rank-1.log"):
    check(f"--force: {f} replaced, not followed", not os.path.islink(os.path.join(mine, f)))
check("--force: victim untouched", read(victim) == "victim\n", read(victim))
code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", mine)
check("--force: then memscope's own", code == 0, (code, err))

# A symlink where the rendezvous directory goes is removed, not written through.
elsewhere = os.path.join(tmp, "elsewhere")
os.makedirs(elsewhere)
os.symlink(elsewhere, os.path.join(mine, ".memscope-store"))
code, out, err = run("run", "--model", "mlp", "--steps", "1", "--world-size", "2", "--out", mine)
check("store symlink: the run", code == 0, (code, err))
check("store symlink: nothing written through it", os.listdir(elsewhere) == [], os.listdir(elsewhere))

# Rerunning into memscope's own directories, and into an empty one, works.
own = os.path.join(tmp, "own")
for i in range(2):
    for args in (["run", "--model", "mlp", "--steps", "1"], ["replay", data("phases.jsonl")]):
        code, out, err = run(*args, "--out", own)
        check(f"rerun {i} {args[0]} into its own directory", code == 0, (code, err))
    code, out, err = run("run", "--model", "mlp", "--steps", "1", "--world-size", "2", "--ddp", "copy,view", "--out",
                         os.path.join(tmp, "both"))
    check(f"rerun {i} --ddp copy,view", code == 0, (code, err))
empty = os.path.join(tmp, "empty")
os.makedirs(empty)
code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", empty)
check("an empty directory", code == 0, (code, err))

# / and the home directory itself: refused, --force or not.
home = os.path.join(tmp, "home")
os.makedirs(home)
root_before = set(os.listdir("/"))
for out_dir, env, what in (("/", None, "the root directory"), (home, {"HOME": home}, "your home directory"),
                           (os.path.join(home, "."), {"HOME": home}, "your home directory")):
    for force in ([], ["--force"]):
        code, out, err = run("run", "--model", "mlp", "--steps", "1", "--out", out_dir, *force, env=env)
        one_line_error(f"--out {out_dir} {force}", code, err)
        check(f"--out {out_dir} {force} named", err == f"memscope run: --out '{out_dir}' is {what}: choose a new "
              "directory for the run\n", err)
added = set(os.listdir("/")) - root_before
for name in added:  # a regression must not leave its files in /
    if name.startswith(("rank-", "snapshot-rank-", ".memscope")) or name in ("run.json", "report.json", "summary.txt",
                                                                           "trace.json", "report.html"):
        path = os.path.join("/", name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
check("--out /: nothing written into /", not added, added)
check("--out HOME: nothing written", os.listdir(home) == [], os.listdir(home))

shutil.rmtree(tmp, ignore_errors=True)
finish("lifecycle")
