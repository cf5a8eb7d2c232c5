"""Request traces generated for tests (JSON lines, see docs/replay.md "Request trace format")."""
import json
import random

MiB = 1 << 20


def training_trace(path, steps, layers, temporaries=4, seed=1):
    """A training-like trace with phase marks and categories: parameters, then
    per step forward (activations kept, temporaries freed), backward (gradients
    kept, activations freed), step (optimizer state from step 0 on), zero_grad.
    Returns the number of alloc requests."""
    rng = random.Random(seed)
    lines = []
    n = 0

    def alloc(i, size, category, owner):
        nonlocal n
        n += 1
        lines.append({"action": "alloc", "id": i, "size": size, "category": category, "owner": owner})

    def free(i):
        lines.append({"action": "free", "id": i})

    lines.append({"action": "phase_begin", "phase": "model"})
    for l in range(layers):
        alloc(f"w{l}", (1 + l % 4) * MiB, "PARAMETER", f"layer{l}")
    lines.append({"action": "phase_end", "phase": "model"})
    for s in range(steps):
        batch = 24 + rng.randrange(9)
        lines.append({"action": "phase_begin", "phase": "forward", "step": s})
        for l in range(layers):
            alloc(f"a{l}", batch * (64 << 10) + rng.randrange(4) * 512, "ACTIVATION", f"layer{l}")
            for k in range(temporaries):
                alloc(f"t{k}", rng.randrange(1, 64) * 4096, "TEMPORARY", f"layer{l}.tmp")
            for k in range(temporaries):
                free(f"t{k}")
        lines.append({"action": "phase_end", "phase": "forward", "step": s})
        lines.append({"action": "phase_begin", "phase": "backward", "step": s})
        for l in reversed(range(layers)):
            if s == 0:
                alloc(f"g{l}", (1 + l % 4) * MiB, "GRADIENT", f"layer{l}")
            free(f"a{l}")
        lines.append({"action": "phase_end", "phase": "backward", "step": s})
        lines.append({"action": "phase_begin", "phase": "step", "step": s})
        for l in range(layers):
            if s == 0:
                alloc(f"m{l}", (1 + l % 4) * MiB, "OPTIMIZER_STATE", f"layer{l}")
            alloc(f"u{l}", 4096, "TEMPORARY", "adam")
            free(f"u{l}")
        lines.append({"action": "phase_end", "phase": "step", "step": s})
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    return n


def rank_trace(path, steps=4, extra_optimizer=0, leak_per_step=0):
    """One rank of a data-parallel job, as JSON lines: the same on every rank
    unless told (no randomness): 256 MiB of parameters, per step a forward
    keeping 512 MiB of activations (and a 64 MiB temporary), a backward
    that creates 256 MiB of gradients at step 0 and frees the activations,
    an optimizer step that creates 512 MiB of Adam state at step 0
    (`extra_optimizer` bytes more: a rank holding more optimizer state), and
    with `leak_per_step`, a tensor of that size kept by every forward (a
    leak growing per step)."""
    lines = [{"action": "phase_begin", "phase": "model"},
             {"action": "alloc", "id": "w", "size": 256 * MiB, "category": "PARAMETER", "owner": "model"},
             {"action": "phase_end", "phase": "model"}]
    for s in range(steps):
        lines += [{"action": "phase_begin", "phase": "forward", "step": s},
                  {"action": "alloc", "id": "act", "size": 512 * MiB, "category": "ACTIVATION", "owner": "encoder"},
                  {"action": "alloc", "id": "tmp", "size": 64 * MiB, "category": "TEMPORARY", "owner": "encoder.attn"},
                  {"action": "free", "id": "tmp"}]
        if leak_per_step:
            lines.append({"action": "alloc", "id": f"leak{s}", "size": leak_per_step, "category": "ACTIVATION",
                          "owner": "metrics.history"})
        lines += [{"action": "phase_end", "phase": "forward", "step": s},
                  {"action": "phase_begin", "phase": "backward", "step": s}]
        if s == 0:
            lines.append({"action": "alloc", "id": "g", "size": 256 * MiB, "category": "GRADIENT", "owner": "model"})
        lines += [{"action": "free", "id": "act"},
                  {"action": "phase_end", "phase": "backward", "step": s},
                  {"action": "phase_begin", "phase": "step", "step": s}]
        if s == 0:
            lines.append({"action": "alloc", "id": "adam", "size": 512 * MiB + extra_optimizer,
                          "category": "OPTIMIZER_STATE", "owner": "adam"})
        lines.append({"action": "phase_end", "phase": "step", "step": s})
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
