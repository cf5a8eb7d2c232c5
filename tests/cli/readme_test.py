#!/usr/bin/env python3
"""The examples of README.md and docs/*.md are what the binary prints today.

Every fenced block of README.md and of every docs/*.md whose first line
starts with `$ memscope` is an example session: each `$ COMMAND` line is run
with bash (memscope on PATH, in a scratch directory where the files of
tests/cli/data are at hand and `tests/` and `examples/` point at the
repository's; one bash per block, so `echo $?` works), and the lines after
it, up to the next `$ ` line, must be what it prints (stdout and stderr). A
line `...` skips output: to the end, or up to the line that follows it.

The pages run in one order and share the scratch directory, so a later block
(or page) may read what an earlier one wrote: README.md first, then the
docs/*.md pages in the order README.md links them, then any other docs/*.md
sorted by name. Prefer self-contained pages (a page that needs a run makes it
in its first block). A failure names the file and the line of the command.

Masked on both sides, because they change from run to run: durations ("0.02
s"), an HTML page's size ("50.2 KB"), wall-clock and event times in `dump`
("wall_start_us", "time_ns"). Trailing blanks are ignored. Blocks that do not
start with `$ memscope` (usage lines, excerpts, JSON schemas) are not run.

With README_UPDATE=1 in the environment, a session whose expected output has
no `...` line and differs is rewritten in its file (README.md or the docs
page) with what memscope printed (for an intended change of output; read the
diff before committing it); sessions with `...` are only reported.
"""
import os
import re
import shutil
import subprocess
import tempfile

from clitest import DATA, MEMSCOPE, check, finish  # noqa: E402

REPO = os.path.abspath(os.path.join(DATA, "..", "..", ".."))
README = os.path.join(REPO, "README.md")
DOCS = os.path.join(REPO, "docs")

MASKS = [
    (re.compile(r"\b\d+\.\d+ s\b"), "<seconds> s"),
    (re.compile(r"\b\d+(\.\d+)? KB\b"), "<size> KB"),
    (re.compile(r'"(wall_start_us|time_ns)":\d+'), r'"\1":<time>'),
]


def normalize(line):
    for pattern, replacement in MASKS:
        line = pattern.sub(replacement, line)
    return line.rstrip()


def blocks(text):
    """(line number, lines) of every fenced block whose first line starts with `$ memscope`."""
    out, inside, start, lines = [], False, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if inside and lines and lines[0].startswith("$ memscope"):
                out.append((start, lines))
            inside, start, lines = not inside, number + 1, []
        elif inside:
            lines.append(line)
    return out


def sessions(lines):
    """[(command, expected output lines)] of one block."""
    out = []
    for line in lines:
        if line.startswith("$ "):
            out.append((line[2:], []))
        else:
            out[-1][1].append(line)
    return out


def matches(expected, actual):
    """None when `actual` (lines) matches `expected` (lines, with `...`), else the first difference."""
    i = j = 0
    while i < len(expected):
        want = normalize(expected[i])
        if want == "...":
            if i + 1 == len(expected):
                return None
            following = normalize(expected[i + 1])
            while j < len(actual) and normalize(actual[j]) != following:
                j += 1
            if j == len(actual):
                return f"the line after '...': {following!r} never printed"
            i += 1
            continue
        got = normalize(actual[j]) if j < len(actual) else None
        if got != want:
            return f"expected {want!r}, memscope printed {got!r} (output line {j + 1})"
        i += 1
        j += 1
    if j < len(actual):
        return f"memscope printed more: {actual[j]!r} (output line {j + 1})"
    return None


work = tempfile.mkdtemp(prefix="memscope-readme-")
bin_dir = os.path.join(work, ".bin")
os.makedirs(bin_dir)
os.symlink(MEMSCOPE, os.path.join(bin_dir, "memscope"))
scratch = os.path.join(work, "scratch")
os.makedirs(scratch)
for name in os.listdir(DATA):
    os.symlink(os.path.join(DATA, name), os.path.join(scratch, name))
for name in ("tests", "examples"):
    os.symlink(os.path.join(REPO, name), os.path.join(scratch, name))
env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")


def pages():
    """README.md, then docs/*.md in the order README.md links them, then the other docs/*.md sorted."""
    order = [README]
    readme = open(README, encoding="utf-8").read()
    for name in re.findall(r"\(docs/([A-Za-z0-9_.-]+\.md)(?:#[^)]*)?\)", readme):
        path = os.path.join(DOCS, name)
        if os.path.isfile(path) and path not in order:
            order.append(path)
    for name in sorted(os.listdir(DOCS)):
        path = os.path.join(DOCS, name)
        if name.endswith(".md") and path not in order:
            order.append(path)
    return order


UPDATE = os.environ.get("README_UPDATE") == "1"
MARK = "@@memscope-readme-test@@"
order = pages()
total, ran = 0, set()
for path in order:
    rel = os.path.relpath(path, REPO)
    text = open(path, encoding="utf-8").read()
    found = blocks(text)
    if path == README:
        check("README.md has example sessions", len(found) >= 3, len(found))
    replacements = []  # (first line number of the expected output, its length, the new lines)
    for start, lines in found:
        # One bash per block, so that `echo $?` sees the command before it.
        steps = sessions(lines)
        script = "".join(f"{command}\n__rc=$?; echo {MARK}; (exit $__rc)\n" for command, _ in steps)
        p = subprocess.run(["bash", "-c", script], cwd=scratch, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
        outputs = p.stdout.split(MARK + "\n")
        line = start
        for k, (command, expected) in enumerate(steps):
            printed = outputs[k] if k < len(outputs) else ""
            difference = matches(expected, printed.splitlines())
            if UPDATE and difference is not None and "..." not in expected:
                replacements.append((line + 1, len(expected), [x.rstrip() for x in printed.splitlines()]))
                difference = None
            check(f"{rel}:{line}: $ {command}", difference is None,
                  f"{difference}\n--- memscope printed:\n{printed}")
            line += 1 + len(expected)
    total += len(found)
    if found:
        ran.add(path)
    if replacements:
        text_lines = text.splitlines()
        for first, count, new in sorted(replacements, reverse=True):
            text_lines[first - 1:first - 1 + count] = new
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(text_lines) + "\n")
        print(f"README_UPDATE: rewrote {len(replacements)} session(s) in {rel}")
# Every docs page with examples was run (none left out of the order).
for name in sorted(os.listdir(DOCS)):
    path = os.path.join(DOCS, name)
    if name.endswith(".md") and blocks(open(path, encoding="utf-8").read()):
        check(f"docs/{name}'s examples were run", path in ran)
shutil.rmtree(work, ignore_errors=True)
finish(f"README and docs examples ({total} blocks in {len(ran)} files)")
