#!/usr/bin/python3
"""Regenerates bucket_expected.inc, the expected DDP bucket assignments of
bucket_test.cpp, with PyTorch's own C++ compute_bucket_assignment_by_size:

    /usr/bin/python3 tests/reducer/bucket_expected.py > tests/reducer/bucket_expected.inc

Needs Debian's python3-torch (PyTorch 1.13) and python3-torchvision; the C++
tests do not. PyTorch 1.13's DDP chooses limits as 1.x did, so the limits
here are PyTorch 2.x's (torch/nn/parallel/distributed.py, _ddp_init_helper),
passed explicitly:
  construction: [sys.maxsize] unless find_unused_parameters and not
    static_graph; then [_DEFAULT_FIRST_BUCKET_BYTES, cap] when bucket_cap_mb
    is None, else [cap]; the bucket list is then reversed;
  rebuild: [first_bucket_bytes_cap, cap], where DDP passes the Reducer
    _DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap; tensors in
    gradient-ready order with tensor_indices, no sort.
The real gradient-ready orders come from DDP itself (gloo, world size 1, two
iterations): prev_iteration_grad_ready_order_indices and, for the rebuilt
buckets, rebuilt_per_bucket_param_indices of _get_ddp_logging_data().
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP

MIB = 1024 * 1024
FIRST = dist._DEFAULT_FIRST_BUCKET_BYTES  # 1 MiB
assign = dist._compute_bucket_assignment_by_size


def initial_limits(find_unused, cap_mb, static_graph=False):
    if static_graph or not find_unused:
        return [sys.maxsize]
    if cap_mb is None:
        return [FIRST, 25 * MIB]
    return [int(cap_mb * MIB)]


def rebuild_limits(cap_mb):
    cap = int((25 if cap_mb is None else cap_mb) * MIB)
    return [FIRST if cap_mb is None else cap, cap]


def initial(tensors, find_unused, cap_mb):
    idx, lim = assign(tensors, initial_limits(find_unused, cap_mb), [False] * len(tensors))
    return list(reversed(idx)), list(reversed(lim))


def rebuilt(tensors, ready, cap_mb):
    ordered = [tensors[i] for i in ready]
    return assign(ordered, rebuild_limits(cap_mb), [False] * len(tensors), ready)


# ---------------------------------------------------------------- models

def resnet50():
    """torchvision's ResNet-50: (name, shape, kept_float32) in named_parameters order."""
    m = torchvision.models.resnet50()
    kept = {id(p) for mod in m.modules() if isinstance(mod, nn.BatchNorm2d) for p in mod.parameters()}
    return m, [(n, tuple(p.shape), id(p) in kept) for n, p in m.named_parameters()]


def gpt2():
    """Hugging Face GPT2LMHeadModel (124M): named_parameters order; lm_head.weight is
    tied to transformer.wte.weight and so not listed again. LayerNorms kept float32."""
    d, ff, vocab, ctx, layers = 768, 3072, 50257, 1024, 12
    out = [("transformer.wte.weight", (vocab, d), False), ("transformer.wpe.weight", (ctx, d), False)]
    for i in range(layers):
        h = f"transformer.h.{i}."
        out += [
            (h + "ln_1.weight", (d,), True), (h + "ln_1.bias", (d,), True),
            (h + "attn.c_attn.weight", (d, 3 * d), False), (h + "attn.c_attn.bias", (3 * d,), False),
            (h + "attn.c_proj.weight", (d, d), False), (h + "attn.c_proj.bias", (d,), False),
            (h + "ln_2.weight", (d,), True), (h + "ln_2.bias", (d,), True),
            (h + "mlp.c_fc.weight", (d, ff), False), (h + "mlp.c_fc.bias", (ff,), False),
            (h + "mlp.c_proj.weight", (ff, d), False), (h + "mlp.c_proj.bias", (d,), False),
        ]
    out += [("transformer.ln_f.weight", (d,), True), ("transformer.ln_f.bias", (d,), True)]
    return out


class CifarNet(nn.Module):
    """The PyTorch CIFAR-10 tutorial Net."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def tensors(params, mixed=False):
    return [torch.empty(shape, dtype=torch.float16 if mixed and not kept else torch.float32)
            for _, shape, kept in params]


def ddp_two_iterations(module, input_shape, classes, cap_mb):
    """DDP on gloo (world size 1), two iterations, then a forward (the logger
    records the rebuild at the next forward). Returns the gradient-ready order
    and the rebuilt buckets DDP reports."""
    if cap_mb is not None:
        # What PyTorch 2.x passes the Reducer as first_bucket_bytes_cap for a given cap.
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(cap_mb * MIB)
    ddp = DDP(module, bucket_cap_mb=25 if cap_mb is None else cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.001, momentum=0.9)
    for _ in range(2):
        opt.zero_grad()
        loss = nn.CrossEntropyLoss()(ddp(torch.randn(*input_shape)), torch.randint(0, classes, (input_shape[0],)))
        loss.backward()
        opt.step()
    ddp(torch.randn(*input_shape))
    data = ddp._get_ddp_logging_data()
    dist._DEFAULT_FIRST_BUCKET_BYTES = FIRST
    assert data["has_rebuilt_buckets"] == 1
    ready = [int(i) for i in data["prev_iteration_grad_ready_order_indices"].split(", ")]
    buckets = [[int(i) for i in b.split()] for b in data["rebuilt_per_bucket_param_indices"].split(", ")]
    return ready, buckets


# ---------------------------------------------------------------- output

def line_wrap(items, indent, width=118):
    lines, cur = [], indent
    for i, item in enumerate(items):
        piece = item + ("," if i + 1 < len(items) else "")
        if len(cur) + len(piece) + 1 > width and cur.strip():
            lines.append(cur.rstrip())
            cur = indent
        cur += piece + " "
    lines.append(cur.rstrip())
    return "\n".join(lines)


def emit_order(name, order):
    print(f"inline const std::vector<std::size_t> {name} = {{")
    print(line_wrap([str(i) for i in order], "    "))
    print("};")


def emit(name, result):
    buckets, limits = result
    print(f"inline const Expected {name} = {{")
    print("    {")
    for b in buckets:
        print(line_wrap([str(i) for i in b], "        ").replace("        ", "        {", 1) + "},")
    print("    },")
    print(line_wrap([str(l) for l in limits], "        ").replace("        ", "    {", 1) + "},")
    print("};")


def emit_params(name, params):
    print(f"inline const std::vector<ExpectedParam> {name} = {{")
    for n, shape, kept in params:
        numel = 1
        for s in shape:
            numel *= s
        print(f'    {{"{n}", {numel}, {"true" if kept else "false"}}},')
    print("};")


def main():
    torch.manual_seed(0)
    f = tempfile.NamedTemporaryFile(delete=False)
    f.close()
    os.unlink(f.name)
    dist.init_process_group("gloo", init_method="file://" + f.name, rank=0, world_size=1)

    rn_module, rn = resnet50()
    gp = gpt2()
    cifar = CifarNet()
    cf = [(n, tuple(p.shape), False) for n, p in cifar.named_parameters()]

    print("// Generated by tests/reducer/bucket_expected.py with PyTorch " + torch.__version__ +
          " and torchvision " + torchvision.__version__ + "; do not edit.")
    print("// Parameters: {name, numel, kept float32 in the mixed-precision cases}, named_parameters order.")
    emit_params("kResNet50Params", rn)
    emit_params("kGpt2Params", gp)
    emit_params("kCifarNetParams", cf)

    for label, params in (("ResNet50", rn), ("Gpt2", gp)):
        t32, tmix = tensors(params), tensors(params, mixed=True)
        print(f"// ---- {label}: construction (PyTorch 2.x limits, bucket list reversed)")
        emit(f"k{label}Default", initial(t32, False, None))
        emit(f"k{label}FindUnused", initial(t32, True, None))
        for cap in (1, 5, 25):
            emit(f"k{label}Cap{cap}", initial(t32, True, cap))
        emit(f"k{label}MixedDefault", initial(tmix, False, None))
        emit(f"k{label}MixedFindUnused", initial(tmix, True, None))
        emit(f"k{label}MixedCap5", initial(tmix, True, 5))

    # ResNet-50's real gradient-ready order and rebuilt buckets (default cap).
    rn_ready, rn_ddp_buckets = ddp_two_iterations(rn_module, (2, 3, 64, 64), 1000, None)
    rn_rebuilt = rebuilt(tensors(rn), rn_ready, None)
    assert rn_rebuilt[0] == rn_ddp_buckets, (rn_rebuilt, rn_ddp_buckets)
    print("// ---- ResNet50: rebuild, in the gradient-ready order DDP recorded (torchvision, CPU)")
    emit_order("kResNet50ReadyOrder", rn_ready)
    emit("kResNet50Rebuilt", rn_rebuilt)
    emit("kResNet50RebuiltCap5", rebuilt(tensors(rn), rn_ready, 5))
    emit("kResNet50MixedRebuilt", rebuilt(tensors(rn, mixed=True), rn_ready, None))

    # GPT-2: a given order, reverse registration.
    gp_ready = list(reversed(range(len(gp))))
    print("// ---- Gpt2: rebuild, in reverse registration order")
    emit("kGpt2Rebuilt", rebuilt(tensors(gp), gp_ready, None))
    emit("kGpt2RebuiltCap5", rebuilt(tensors(gp), gp_ready, 5))
    emit("kGpt2MixedRebuilt", rebuilt(tensors(gp, mixed=True), gp_ready, None))

    # The CIFAR Net: real order and DDP's rebuilt buckets, bucket_cap_mb=0.01.
    cf_ready, cf_ddp_buckets = ddp_two_iterations(cifar, (4, 3, 32, 32), 10, 0.01)
    cf_rebuilt = rebuilt(tensors(cf), cf_ready, 0.01)
    assert cf_rebuilt[0] == cf_ddp_buckets, (cf_rebuilt, cf_ddp_buckets)
    print("// ---- CifarNet: DDP's gradient-ready order and rebuilt buckets, bucket_cap_mb=0.01")
    emit_order("kCifarNetReadyOrder", cf_ready)
    emit("kCifarNetRebuilt", cf_rebuilt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
