#!/usr/bin/env python3
"""End-to-end tests of `memscope replay`: exact outputs from the spec's numbers."""
import json
import os
import subprocess
import sys

from clitest import DATA, MiB, check, data, finish, run  # noqa: E402


# One 1 MiB tensor: PyTorch's memory_summary text, character for character.
code, out, err = run("replay", data("one_mib.jsonl"))
golden = open(data("one_mib.summary.txt")).read()
check("one_mib exit", code == 0, err)
check("one_mib summary", golden in out, out)

code, out, err = run("replay", data("one_mib.jsonl"), "--json")
check("json exit", code == 0, err)
doc = json.loads(out)
run0 = doc["runs"][0]
stats = run0["memory_stats"]
check("json keys", len(stats) == 122, len(stats))
check("json allocated", stats["allocated_bytes.all.current"] == 1048576, stats["allocated_bytes.all.current"])
check("json reserved", stats["reserved_bytes.all.current"] == 2097152, stats["reserved_bytes.all.current"])
check("json non-releasable", stats["inactive_split_bytes.all.current"] == 1048576, "")
check("json max_split_size", stats["max_split_size"] == -1, "")
check("json oom", run0["oom"] is None, run0["oom"])
check("json conf", run0["alloc_conf"] == "" and run0["device_memory"] == 80 * 2**30, run0)
check("json sorted keys", list(stats) == sorted(stats), "")

# Settings come from the environment unless --alloc-conf is given; several compare side by side.
code, out, err = run("replay", data("one_mib.jsonl"), "--json", env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
check("env conf", json.loads(out)["runs"][0]["memory_stats"]["max_split_size"] == 64 * 2**20, out)
code, out, err = run("replay", data("one_mib.jsonl"), "--json", "--alloc-conf", "", "--alloc-conf",
                     "expandable_segments:True")
runs = json.loads(out)["runs"]
check("two runs", [r["alloc_conf"] for r in runs] == ["", "expandable_segments:True"], runs)
check("expandable segment stat", runs[1]["memory_stats"]["segment.all.current"] == 0, "")
check("expandable reserved", runs[1]["memory_stats"]["reserved_bytes.all.current"] == 2097152, "")

# A fragmentation OOM stops the replay; it is the answer, so exit 0.
code, out, err = run("replay", data("fragmentation.jsonl"), "--device-memory", "30MiB", "--json")
check("oom exit", code == 0, err)
r = json.loads(out)["runs"][0]
oom = r["oom"]
check("oom present", oom is not None, r)
if oom:
    check("oom where", (oom["line"], oom["id"], oom["request_index"]) == (5, "z", 3), oom)
    check("oom sizes", (oom["alloc_size"], oom["largest_free_block"], oom["cached_free_bytes"]) ==
          (12582912, 8388608, 14680064), oom)
    check("oom message", oom["message"].startswith("CUDA out of memory. Tried to allocate 12.00 MiB. GPU 0 has a "
                                                   "total capacity of 30.00 MiB of which 10.00 MiB is free."), oom)
    check("oom diagnosis", "Fragmentation, not capacity" in oom["diagnosis"], oom)
check("oom requests_done", r["requests_done"] == 3, r["requests_done"])
check("oom stats", r["memory_stats"]["num_ooms"] == 1 and r["memory_stats"]["num_alloc_retries"] == 1, "")
# Expandable segments map 20 MiB pages: on a 30 MiB GPU the second page does
# not fit either, and their free blocks never count as inactive split.
code, out, err = run("replay", data("fragmentation.jsonl"), "--device-memory", "30MiB",
                     "--alloc-conf", "expandable_segments:True", "--json")
e = json.loads(out)["runs"][0]["oom"]
check("expandable oom", e is not None and e["request_index"] == 3 and e["inactive_split_bytes"] == 0 and
      e["cached_free_bytes"] == 14680064, e)
code, out, err = run("replay", data("fragmentation.jsonl"), "--device-memory", "30MiB")
check("oom text", "OOM at request 4 (line 5, alloc \"z\" of 12582912 B); replay stopped:" in out, out)

# Streams: record_stream keeps a block until sync; empty_cache then frees it.
code, out, err = run("replay", data("streams.jsonl"), "--json")
s = json.loads(out)["runs"][0]["memory_stats"]
check("streams exit", code == 0, err)
check("streams reserved", s["reserved_bytes.all.current"] == 2097152, s["reserved_bytes.all.current"])
check("streams allocated", s["allocated_bytes.all.current"] == 2097152, s["allocated_bytes.all.current"])
check("streams sync", s["num_sync_all_streams"] == 1, s["num_sync_all_streams"])

# Bad input: one line naming the problem, exit status 2, nothing on stdout.
for name, expect in [("bad_json.jsonl", "bad_json.jsonl:3: not valid JSON"),
                     ("unknown_id.jsonl", "unknown_id.jsonl:2: free of unknown id \"b\""),
                     ("negative_size.jsonl", "negative_size.jsonl:1: \"size\" must be a non-negative integer"),
                     ("duplicate_id.jsonl", "duplicate_id.jsonl:2: id \"a\" is already allocated"),
                     ("unknown_action.jsonl", "unknown_action.jsonl:1: unknown action \"malloc\"")]:
    code, out, err = run("replay", data(name))
    check(f"{name} exit", code == 2, code)
    check(f"{name} message", expect in err and err.count("\n") == 1 and out == "", err)
for args, expect in [(["replay", data("missing.jsonl")], "does not exist"),
                     (["replay", data("one_mib.jsonl"), "--alloc-conf", "max_split_size_mb:5"], "max_split_size_mb"),
                     (["replay", data("one_mib.jsonl"), "--alloc-conf", "nope:1"], "unknown key 'nope'"),
                     (["replay", data("one_mib.jsonl"), "--device-memory", "lots"], "--device-memory"),
                     (["replay", data("one_mib.jsonl"), "--device-memory", "0"], "--device-memory"),
                     (["replay", "--bogus"], "bogus"),
                     (["frobnicate"], "frobnicate")]:
    code, out, err = run(*args)
    check(f"{args} exit", code == 2, (code, err))
    check(f"{args} message", expect in err and err.count("\n") == 1, err)
code, out, err = run("replay", data("one_mib.jsonl"), env={"PYTORCH_CUDA_ALLOC_CONF": "bad:1"})
check("bad env exit", code == 2 and "PYTORCH_CUDA_ALLOC_CONF" in err, err)

# The embedded demo (the README's first command): two settings side by side.
code, out, err = run("replay")
check("demo exit", code == 0, err)
table = out.split("alloc_conf")[-1]
check("demo rows", "(defaults)" in table and "\"expandable_segments:True\"" in table and "lower bound" in table, out)
code, out, err = run("replay", "--json")
demo = json.loads(out)["runs"]
check("demo device", demo[0]["device_memory"] == 2**30, "")
check("demo peaks", demo[0]["peak_live_bytes"] == demo[1]["peak_live_bytes"] > 0, "")
check("demo reserved", demo[1]["memory_stats"]["reserved_bytes.all.peak"] <
      demo[0]["memory_stats"]["reserved_bytes.all.peak"], "")

finish("cli replay")
