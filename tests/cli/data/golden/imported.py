#!/usr/bin/env python3
"""Writes imported.pickle: a snapshot in the shape torch.cuda.memory._snapshot()
returns in PyTorch 2.x (dict with segments, device_traces, allocator_settings,
external_annotations), with a training-like trace of 3 steps on two streams.
The trace's addresses only name allocations (memscope replays the requests);
fixed seed, so the file is the same every time. Run from this folder."""
import pickle
import random

MiB = 1 << 20
rng = random.Random(7)
base = 0x7F0000000000
next_addr = base
t = 1000
trace, notes = [], []


def now():
    global t
    t += rng.randrange(1, 40)
    return t


def entry(action, addr, size, stream=0):
    trace.append({"action": action, "addr": addr, "size": size, "stream": stream, "time_us": now(), "frames": []})


def alloc(size, stream=0):
    global next_addr
    addr = next_addr
    next_addr += (size + 511) // 512 * 512 + 4096
    entry("alloc", addr, size, stream)
    return (addr, size, stream)


def free(block):
    addr, size, stream = block
    entry("free_requested", addr, size, stream)
    entry("free_completed", addr, size, stream)


def annotate(name, stage):
    notes.append({"name": name, "stage": stage, "device": 0, "time_us": now()})


params = [alloc(rng.choice([1, 2, 3, 4]) * MiB + rng.randrange(0, 4096)) for _ in range(12)]
state = []
for step in range(3):
    annotate(f"forward:{step}", "START")
    acts = []
    for layer in range(12):
        acts.append(alloc(rng.randrange(20, 40) * 65536 + rng.randrange(0, 512) * 8))
        tmp = [alloc(rng.randrange(1, 200) * 4096, stream=rng.choice([0, 0, 0, 1])) for _ in range(3)]
        for b in tmp:
            free(b)
    annotate(f"forward:{step}", "END")
    annotate(f"backward:{step}", "START")
    grads = [alloc(p[1]) for p in params]
    for a in reversed(acts):
        free(a)
    annotate(f"backward:{step}", "END")
    annotate(f"step:{step}", "START")
    if step == 0:
        state = [alloc(p[1]) for p in params for _ in range(2)]
    for g in grads:
        free(g)
    annotate(f"step:{step}", "END")

doc = {"segments": [], "device_traces": [trace],
       "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "expandable_segments": False},
       "external_annotations": notes}
with open("imported.pickle", "wb") as f:
    pickle.dump(doc, f, protocol=4)
