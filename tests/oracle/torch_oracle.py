"""PyTorch as the oracle of memscope's ops (issue 31).

Each case is one model: a memscope model description (what a user writes, or
a Hugging Face config) and the same model written as plain PyTorch modules
from the code people run (torch.nn, transformers' modeling files). Both are
run through forward, loss and backward; what is compared is the bytes of
tensor storage, never the allocator's blocks:

  forward_peak   the most bytes alive during forward, above what was alive before it
  forward_end    bytes alive after forward (the output and what autograd saved)
  saved          bytes the autograd graph alone keeps alive after forward
                 (the output and the caller's references dropped, the graph
                 kept): unique storages saved for backward, parameters and
                 the batch excluded
  loss_peak, loss_end, backward_peak, backward_end   the same for the loss
                 and for loss.backward(), all relative to the start of forward

PyTorch's side is measured on CPU (Debian's torch 1.13) by its profiler's
memory events: every allocation and free of the CPU allocator, with its
address and size, in order. Where the CPU kernel allocates differently from
the CUDA kernel the model targets, the module calls what CUDA runs (the
native_dropout kernel, which saves a bool mask; CUDA's dropout is fused) and
the case says so in its `note`.

  torch_oracle.py CASES.json          writes the cases with PyTorch's figures
"""

import contextlib
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from cuda_kernels import Dropout, cuda_cross_entropy
from hf_models import HF_MODELS, LlamaMLP, LlamaRMSNorm
from lora import apply_lora

PHASES = ("forward", "loss", "backward")


# ---------------------------------------------------------------- measuring


# Elementwise ops (TensorIterator): on CPU, an input of another dtype than
# the computation's is copied to it first (aten::to inside the op); CUDA
# casts inside the kernel. A Python scalar argument is such an input.
ELEMENTWISE = {"aten::" + n for n in (
    "add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "div", "div_", "pow", "pow_", "where", "masked_fill",
    "masked_fill_", "eq", "ne", "lt", "gt", "le", "ge", "neg", "reciprocal", "addcmul_", "addcdiv_", "lerp_")}

FREED_INSIDE = "(freed inside)"  # a rule's last op: only allocations freed before its first op returns

# Allocations the CPU kernels make and the CUDA kernels do not: not counted.
# Each is a chain of ops (the allocation's innermost ancestors, or with a
# trailing "..." any consecutive ancestors), a short name (docs/fidelity.md)
# and why; "*" matches any elementwise op.
CPU_ONLY = [
    (("*", "aten::to", "..."), "dtype copies",
     "on CPU an elementwise op copies an input of another dtype (a bool mask, a Python scalar) to the "
     "computation's dtype first; CUDA casts inside the kernel"),
    (("aten::native_layer_norm_backward", "aten::resize_"), "layer_norm buffer",
     "layer_norm backward on CPU sums dgamma and dbeta in a per-thread buffer (2 x threads x N floats); "
     "CUDA reduces them in the kernel"),
    (("aten::mkldnn_convolution",), "oneDNN conv buffers",
     "conv2d on CPU runs oneDNN, which reorders the weight and writes its output in its own layout, then "
     "copies it to the output tensor; cuDNN writes the output directly (its workspace is modelled apart)"),
    (("aten::convolution_backward",), "oneDNN conv buffers",
     "conv2d backward on CPU reorders grad_output and the weight for oneDNN; cuDNN reads them in place"),
    (("aten::native_batch_norm", "aten::empty", FREED_INSIDE), "batch_norm temporaries",
     "batch_norm on CPU computes the statistics and each channel's scale and shift in temporaries of C "
     "floats; CUDA (cuDNN) computes them in the kernel"),
    (("aten::native_batch_norm_backward", "aten::empty_like", "aten::empty", FREED_INSIDE), "batch_norm temporaries",
     "batch_norm backward on CPU makes an input-sized temporary; cuDNN writes the input's gradient only"),
    (("aten::addmm", FREED_INSIDE), "oneDNN bf16 matmul buffers",
     "a bfloat16 matrix product on CPU runs oneDNN, which packs its operands in temporaries; cuBLAS reads them "
     "in place (its workspace is modelled apart)"),
    (("aten::mm", FREED_INSIDE), "oneDNN bf16 matmul buffers", "as for addmm"),
    (("aten::bmm", FREED_INSIDE), "oneDNN bf16 matmul buffers", "as for addmm"),
    (("CheckpointFunction",), "checkpoint's RNG state",
     "reentrant checkpoint saves torch.get_rng_state() (and on a GPU run the CUDA generator's state): CPU "
     "tensors, on a GPU run too"),
    (("CheckpointFunctionBackward",), "checkpoint's RNG state",
     "its backward forks the RNG around the recomputation (fork_rng): CPU tensors, on a GPU run too"),
    (("aten::native_dropout_backward", "aten::mul"), "dropout backward",
     "native_dropout_backward on CPU multiplies by the mask, then by the scale out of place; CUDA's fused "
     "kernel writes one output (the second product is counted)"),
]


def _frees(event):
    """The frees anywhere inside an op (its subtree), as (address, time)."""
    out, todo = set(), [event]
    while todo:
        e = todo.pop()
        for c in e.children:
            if type(c.extra_fields).__name__ == "_ExtraFields_Allocation":
                if c.extra_fields.alloc_size < 0:
                    out.add((c.extra_fields.ptr, c.start_time_ns))
            else:
                todo.append(c)
    return out


def _cpu_only(chain, alloc):
    """The CPU_ONLY rule whose ops are the allocation's innermost ancestors
    (or, for a rule ending in "...", any consecutive ancestors; for one
    ending in FREED_INSIDE, the innermost ones, the allocation freed inside
    the first). chain: the ancestor events, outermost first."""
    names = [e.name for e in chain]
    for rule, _, _ in CPU_ONLY:
        ops = rule[:-1] if rule[-1] in ("...", FREED_INSIDE) else rule
        n = len(ops)
        starts = range(len(names) - n + 1) if rule[-1] == "..." else [len(names) - n]
        for i in starts:
            if i >= 0 and all(r == c or (r == "*" and c in ELEMENTWISE) for r, c in zip(ops, names[i:i + n])):
                ptr, t = alloc.extra_fields.ptr, alloc.start_time_ns
                if rule[-1] != FREED_INSIDE or any(p == ptr and f > t for p, f in _frees(chain[i])):
                    return rule
    return None


def _allocations(prof):
    """The allocations and frees of the ms:: ranges, in order, as (time,
    delta), the ranges, and the bytes of CPU_ONLY allocations. Not counted
    (nor their frees):

    - what the profiler allocates itself (outside the ranges) and
      record_function's handle (an aten::empty, a range's first child);
    - the 8-byte CPU tensors that wrap a Python scalar: made by Python's
      binding before the call (a direct child of the range), by a scalar
      overload before it calls its tensor form (x.div_(2): an 8-byte child
      of aten::div_ before its child aten::div), or inside the op and freed
      there (x.ne(1)). On CUDA too they are CPU tensors, never on the GPU;
    - CPU_ONLY's allocations."""
    raw, ranges, skip, cpu_only = [], {}, set(), {}

    def is_alloc(e):
        return type(e.extra_fields).__name__ == "_ExtraFields_Allocation"

    def key(e):  # the tree's Python objects are made on access: no id()
        return (e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size)

    def walk(e, chain):
        if e.name.startswith("ms::"):
            ranges[e.name[4:]] = (e.start_time_ns, e.end_time_ns)
            first = e.children[0] if e.children else None
            if first is not None and first.name == "aten::empty":
                skip.update(key(c) for c in first.children if is_alloc(c))
        children = list(e.children)
        if e.name in ELEMENTWISE:  # a scalar wrapped inside the op (ne(x, 1)): allocated and freed in it
            sizes = {c.extra_fields.ptr: c for c in children if is_alloc(c) and c.extra_fields.alloc_size == 8}
            for c in children:
                if is_alloc(c) and c.extra_fields.alloc_size < 0 and c.extra_fields.ptr in sizes:
                    skip.add(key(sizes[c.extra_fields.ptr]))
        for i, c in enumerate(children):
            if not is_alloc(c):
                walk(c, chain + [e])
                continue
            size = c.extra_fields.alloc_size
            raw.append(key(c))
            if size <= 0:
                continue
            later_elementwise = any(d.name in ELEMENTWISE for d in children[i + 1:])
            if size == 8 and (e.name.startswith("ms::") or (e.name in ELEMENTWISE and later_elementwise)):
                skip.add(key(c))
                continue
            rule = _cpu_only(chain + [e], c)
            if rule:
                skip.add(key(c))
                cpu_only[rule] = cpu_only.get(rule, 0) + size

    class Root:  # the tree's top level (frees outside any op are there)
        name = "<root>"
        children = prof.profiler.kineto_results.experimental_event_tree()

    walk(Root, [])
    raw.sort(key=lambda t: t[0])
    inside = lambda t: any(s <= t <= e for s, e in ranges.values())
    live, events = {}, []
    for t, ptr, size in raw:
        if size > 0:
            if inside(t) and (t, ptr, size) not in skip:
                live[ptr] = size
                events.append((t, size))
        elif ptr in live:
            events.append((t, -live.pop(ptr)))
    return events, ranges, cpu_only


def _phase_figures(events, ranges):
    out = {}
    for phase in PHASES:
        start, end = ranges[phase]
        live = sum(d for t, d in events if t < start)
        peak = live
        for t, d in events:
            if start <= t <= end:
                live += d
                peak = max(peak, live)
        out[phase + "_peak"] = peak
        out[phase + "_end"] = live
    return out


def _autocast(case):
    """torch.autocast as the case runs forward and loss (its cast cache lives
    until it exits), or nothing."""
    if not case.amp:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype={"bf16": torch.bfloat16}[case.amp])


def measure(case):
    torch.manual_seed(0)
    model, batch, loss_fn = case.build()
    model.train()
    inputs, target = batch
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        amp = _autocast(case)
        with record_function("ms::forward"):
            amp.__enter__()
            out = model(*inputs)
        with record_function("ms::loss"):
            loss = loss_fn(out, target)
            amp.__exit__(None, None, None)  # the cast cache is freed here
        with record_function("ms::backward"):
            loss.backward()
    events, ranges, cpu_only = _allocations(prof)
    figures = _phase_figures(events, ranges)
    figures["parameters"] = sum(p.numel() for p in model.parameters())  # unique: tied weights once
    figures["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    del out, loss

    # The graph alone: forward again on a fresh model, keep only the grad_fn.
    torch.manual_seed(0)
    model, batch, loss_fn = case.build()
    model.train()
    inputs, target = batch
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("ms::forward"), _autocast(case):
            out = model(*inputs)
        graph = [o.grad_fn for o in (out if isinstance(out, tuple) else (out,))]
        del out
        model.presents = None  # past_key_values go with the outputs
        with record_function("ms::loss"):
            pass
        with record_function("ms::backward"):
            pass
    events, ranges, _ = _allocations(prof)
    figures["saved"] = sum(d for t, d in events if t <= ranges["loss"][0])
    del graph
    names = {rule: (key, why) for rule, key, why in CPU_ONLY}
    return figures, [{"key": names[r][0], "why": names[r][1], "bytes": n} for r, n in cpu_only.items()]


# ---------------------------------------------------------------- cases


class Case:
    """name, the memscope model (a description or an HF config), and build()
    returning (torch module, (inputs, target), loss function). `known`: the
    figures memscope does not match yet, each with why (oracle_test.py fails
    when the differing figures are not exactly these)."""

    def __init__(self, name, memscope, build, note="", known=None, amp=None):
        self.name, self.memscope, self.build, self.note = name, memscope, build, note
        self.known = known or {}
        self.amp = amp  # "bf16": forward and loss under autocast


def spec(layers, shape, batch, loss="mse", target=None, vocab=None, seq=None):
    s = {"format": "memscope.model/1", "name": "oracle", "batch_size": batch,
         "input": {"shape": ["batch"] + list(shape[1:])}, "loss": {"type": loss}, "layers": layers}
    if vocab:
        s["input"]["vocab"] = vocab
    if seq:
        s["seq_len"] = seq
    if target:
        s["target"] = target
    return s


def float_batch(shape, out_shape):
    return ((torch.randn(*shape),), torch.randn(*out_shape))


def mse(out, target):
    return F.mse_loss(out, target)


def cross_entropy(out, target):
    return F.cross_entropy(out.view(-1, out.shape[-1]) if out.dim() > 2 else out, target.view(-1))


def seq_module(*mods):
    return nn.Sequential(*mods)


def op_cases():
    B, N, H = 8, 64, 96
    cases = []

    def simple(name, layer, module, shape=(B, N), out=(B, N), note=""):
        cases.append(Case(name, spec([layer], list(shape), B),
                          lambda: (module(), float_batch(shape, out), mse), note))

    simple("linear", {"type": "linear", "out": H}, lambda: nn.Linear(N, H), out=(B, H))
    simple("linear, no bias", {"type": "linear", "out": H, "bias": False}, lambda: nn.Linear(N, H, bias=False),
           out=(B, H))
    simple("linear on 3-d input", {"type": "linear", "out": H}, lambda: nn.Linear(N, H), shape=(B, 12, N),
           out=(B, 12, H))
    # Ops without parameters follow a linear (the batch does not require grad).
    def after_linear(name, layer, module, note=""):
        cases.append(Case(name, spec([{"type": "linear", "name": "0", "out": H}, dict(layer, name="1")], [B, N], B),
                          lambda: (nn.Sequential(nn.Linear(N, H), module()), float_batch((B, N), (B, H)), mse), note))

    after_linear("relu", {"type": "relu"}, lambda: nn.ReLU())
    after_linear("relu in place", {"type": "relu", "inplace": True}, lambda: nn.ReLU(inplace=True))
    after_linear("gelu", {"type": "gelu"}, lambda: nn.GELU())
    after_linear("gelu tanh", {"type": "gelu", "approximate": "tanh"}, lambda: nn.GELU(approximate="tanh"))
    after_linear("silu", {"type": "silu"}, lambda: nn.SiLU())
    after_linear("tanh", {"type": "tanh"}, lambda: nn.Tanh())
    after_linear("sigmoid", {"type": "sigmoid"}, lambda: nn.Sigmoid())
    after_linear("dropout", {"type": "dropout", "p": 0.1}, lambda: Dropout(0.1),
                 note="CUDA's fused dropout (native_dropout): a bool mask")
    simple("layer_norm", {"type": "layer_norm"}, lambda: nn.LayerNorm(N))
    after_linear("rms_norm (LlamaRMSNorm)", {"type": "rms_norm", "eps": 1e-6}, lambda: LlamaRMSNorm(H, 1e-6))
    after_linear("gated_mlp (LlamaMLP, SwiGLU)", {"type": "gated_mlp", "hidden": 160},
                 lambda: LlamaMLP({"hidden_size": H, "intermediate_size": 160}))
    cases.extend(vision_cases())
    cases.extend(token_cases())
    return cases


def vision_cases():
    """Conv2d, BatchNorm2d and pooling as ResNet uses them, on (8, 3, 16, 16)."""
    B, C, S = 8, 3, 16
    shape = (B, C, S, S)
    conv = {"type": "conv2d", "out": 16, "kernel": 3, "padding": 1}
    cases = []

    def case(name, layers, modules, out, note=""):
        named = [dict(l, name=str(i)) for i, l in enumerate(layers)]
        cases.append(Case(name, spec(named, list(shape), B),
                          lambda: (nn.Sequential(*[m() for m in modules]), float_batch(shape, out), mse), note))

    mk_conv = lambda: nn.Conv2d(C, 16, 3, padding=1)
    case("conv2d", [conv], [mk_conv], (B, 16, S, S))
    case("conv2d, stride 2, no bias", [dict(conv, stride=2, bias=False)],
         [lambda: nn.Conv2d(C, 16, 3, stride=2, padding=1, bias=False)], (B, 16, S // 2, S // 2))
    case("batch_norm2d", [conv, {"type": "batch_norm2d"}], [mk_conv, lambda: nn.BatchNorm2d(16)], (B, 16, S, S))
    case("max_pool2d", [conv, {"type": "max_pool2d", "kernel": 3, "stride": 2, "padding": 1}],
         [mk_conv, lambda: nn.MaxPool2d(3, 2, 1)], (B, 16, S // 2, S // 2))
    case("adaptive_avg_pool2d + flatten", [conv, {"type": "adaptive_avg_pool2d"}, {"type": "flatten"}],
         [mk_conv, lambda: nn.AdaptiveAvgPool2d((1, 1)), lambda: nn.Flatten()], (B, 16))
    stack = [conv, {"type": "batch_norm2d"}, {"type": "relu", "inplace": True},
             {"type": "conv2d", "out": 8, "kernel": 3, "padding": 1, "bias": False}, {"type": "batch_norm2d"}]
    case("conv, bn, relu, conv, bn (gradients through a conv)", stack,
         [mk_conv, lambda: nn.BatchNorm2d(16), lambda: nn.ReLU(inplace=True),
          lambda: nn.Conv2d(16, 8, 3, padding=1, bias=False), lambda: nn.BatchNorm2d(8)], (B, 8, S, S))
    return cases


class Twice(nn.Module):
    """One linear called twice (a shared layer): under autocast its weight is
    cast once (the cast cache)."""

    def __init__(self, n):
        super().__init__()
        self.a = nn.Linear(n, n)

    def forward(self, x):
        return self.a(torch.relu(self.a(x)))


def autocast_cases():
    """torch.autocast(bfloat16) around forward and loss. Only ops that
    autocast treats alike on CPU (torch 1.13) and CUDA are compared: linear,
    matmul and conv run in bfloat16 (weights through the cast cache, freed
    when autocast exits), mse_loss and cross_entropy in float32, the
    activations in their input's dtype. softmax, log_softmax, layer_norm and
    sum are float32 ops on CUDA and not on CPU in 1.13 (they are not compared
    here)."""
    B, N, H, K = 8, 64, 96, 10
    mlp = [{"type": "linear", "name": "0", "out": H}, {"type": "gelu", "name": "1"},
           {"type": "linear", "name": "2", "out": N}]
    cases = [Case("bf16 autocast: linear, gelu, linear, mse_loss", spec(mlp, [B, N], B),
                  lambda: (nn.Sequential(nn.Linear(N, H), nn.GELU(), nn.Linear(H, N)), float_batch((B, N), (B, N)),
                           mse), amp="bf16")]
    twice = [{"type": "linear", "name": "a", "out": N}, {"type": "relu"}, {"type": "shared", "ref": "a"}]
    cases.append(Case("bf16 autocast: one linear called twice (the cast cache)", spec(twice, [B, N], B),
                      lambda: (Twice(N), float_batch((B, N), (B, N)), mse), amp="bf16"))
    clf = [{"type": "linear", "name": "0", "out": H}, {"type": "relu", "name": "1"},
           {"type": "linear", "name": "2", "out": K}]
    cases.append(Case("bf16 autocast: linear, relu, linear, cross_entropy", spec(clf, [B, N], B, loss="cross_entropy"),
                      lambda: (nn.Sequential(nn.Linear(N, H), nn.ReLU(), nn.Linear(H, K)),
                               ((torch.randn(B, N),), torch.randint(0, K, (B,))), cuda_cross_entropy), amp="bf16",
                      note="F.cross_entropy as CUDA autocast dispatches it (log_softmax in bfloat16, nll_loss casts)"))
    conv = [{"type": "conv2d", "name": "0", "out": 16, "kernel": 3, "padding": 1}, {"type": "relu", "name": "1"},
            {"type": "conv2d", "name": "2", "out": 8, "kernel": 3, "padding": 1}]
    cases.append(Case("bf16 autocast: conv2d, relu, conv2d, mse_loss", spec(conv, [8, 3, 16, 16], 8),
                      lambda: (nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 3, padding=1)),
                               float_batch((8, 3, 16, 16), (8, 8, 16, 16)), mse), amp="bf16"))
    # (mse_loss has no bfloat16 CPU kernel in 1.13: a classifier)
    pure_layers = [dict(l, name=str(i)) for i, l in enumerate(
        [{"type": "linear", "out": H}, {"type": "gelu"}, {"type": "linear", "out": K}])]
    pure = dict(spec(pure_layers, [B, N], B, loss="cross_entropy"), param_dtype="bfloat16")
    cases.append(Case("pure bf16: linear, gelu, linear, cross_entropy (parameters and batch in bfloat16)", pure,
                      lambda: (to_dtype(nn.Sequential(nn.Linear(N, H), nn.GELU(), nn.Linear(H, K)), "bfloat16"),
                               ((torch.randn(B, N, dtype=torch.bfloat16),), torch.randint(0, K, (B,))),
                               cross_entropy)))
    return cases


def token_cases():
    """Embedding and cross-entropy: token ids in, class logits out."""
    B, T, V, D, K = 4, 12, 50, 32, 10
    cases = []

    def batch():
        return ((torch.randint(0, V, (B, T)),), torch.randint(0, K, (B, T)))

    def model():
        return nn.Sequential(nn.Embedding(V, D), nn.Linear(D, K))

    layers = [{"type": "embedding", "name": "0", "num": V, "dim": D}, {"type": "linear", "name": "1", "out": K}]
    cases.append(Case("embedding + cross_entropy", spec(layers, [B, T], B, loss="cross_entropy", vocab=V),
                      lambda: (model(), batch(), cross_entropy)))
    cases.append(Case("cross_entropy, sum", spec(layers, [B, T], B, loss="cross_entropy", vocab=V) | {
        "loss": {"type": "cross_entropy", "reduction": "sum"}},
        lambda: (model(), batch(), lambda o, t: F.cross_entropy(o.view(-1, K), t.view(-1), reduction="sum"))))
    return cases


def to_dtype(model, dtype):
    """The parameters in `dtype`, buffers as they were made: what
    from_pretrained(torch_dtype=dtype) loads (memscope's param_dtype)."""
    if dtype:
        for p in model.parameters():
            p.data = p.data.to(getattr(torch, dtype))
    return model


def build_hf(config, batch, seq, dtype=None):
    arch = config["architectures"][0]
    cls = HF_MODELS[(config["model_type"], arch)]
    model = to_dtype(cls(config), dtype)
    return model, cls.batch(config, batch, seq), model.loss


def hf_case(name, config, batch, seq, known=None, dtype=None):
    memscope = {"hf": config, "batch_size": batch, "seq_len": seq}
    if dtype:
        memscope["param_dtype"] = dtype
    return Case(name, memscope, lambda: build_hf(config, batch, seq, dtype), known=known)


BERT = {"model_type": "bert", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 32, "type_vocab_size": 2}


ROBERTA = dict(BERT, model_type="roberta", pad_token_id=1, max_position_embeddings=34, type_vocab_size=1,
               layer_norm_eps=1e-5)


def hf_cases():
    cases = []
    for arch in ("BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
                 "BertForTokenClassification", "BertForQuestionAnswering"):
        cases.append(hf_case(f"{arch}, 1 layer", dict(BERT, architectures=[arch]), 2, 16))
    cases.append(hf_case("BertForSequenceClassification, regression (num_labels 1)",
                         dict(BERT, architectures=["BertForSequenceClassification"], num_labels=1), 2, 16))
    cases.append(hf_case("BertForSequenceClassification, 2 layers, gradient checkpointing (reentrant)",
                         dict(BERT, architectures=["BertForSequenceClassification"], num_hidden_layers=2,
                              gradient_checkpointing=True), 2, 16))
    cases.append(hf_case("RobertaForQuestionAnswering, 1 layer", dict(ROBERTA, architectures=[
        "RobertaForQuestionAnswering"]), 2, 16))
    for arch in ("RobertaForMaskedLM", "RobertaForSequenceClassification", "RobertaForTokenClassification"):
        cases.append(hf_case(f"{arch}, 1 layer", dict(ROBERTA, architectures=[arch], num_labels=3), 2, 16))
    gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 128, "n_embd": 64,
            "n_layer": 1, "n_head": 4, "n_positions": 32}
    cases.append(hf_case("GPT2LMHeadModel, 1 layer, use_cache false", dict(gpt2, use_cache=False), 2, 16))
    cases.append(hf_case("GPT2LMHeadModel, 1 layer", gpt2, 2, 16))
    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64,
             "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
             "max_position_embeddings": 64}
    cases.append(hf_case("LlamaForCausalLM, 1 layer, grouped-query attention", llama, 2, 16))
    ln_stats = ("layer_norm's saved mean and rstd: float32 on CUDA (layer_norm_kernel.cu: the accumulate type), "
                "bfloat16 on CPU in torch 1.13: 4 bytes more per row for each of the 3 LayerNorms")
    cases.append(hf_case("GPT2LMHeadModel, 1 layer, pure bf16 (parameters in bfloat16, no autocast)", gpt2, 2, 16,
                         dtype="bfloat16", known={f: ln_stats for f in (
                             "forward_peak", "forward_end", "saved", "loss_peak", "loss_end", "backward_peak")}))
    cases.append(hf_case("LlamaForCausalLM, 1 layer, pure bf16 (parameters in bfloat16, no autocast)", llama, 2, 16,
                         dtype="bfloat16"))
    cases.append(hf_case("Qwen2ForCausalLM, 1 layer, tied", dict(llama, model_type="qwen2", architectures=[
        "Qwen2ForCausalLM"], tie_word_embeddings=True), 2, 16))
    return cases


LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64,
         "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
         "max_position_embeddings": 64}


def lora_cases():
    """PEFT LoRA (tests/oracle/lora.py; memscope run --lora): adapters on the
    targeted linears, everything else frozen."""
    cases = []

    def hf_lora(name, config, lora, dtype=None, known=None):
        memscope = {"hf": config, "batch_size": 2, "seq_len": 16, "lora": lora}
        if dtype:
            memscope["param_dtype"] = dtype

        def build():
            model, batch, loss = build_hf(config, 2, 16, dtype)
            return apply_lora(model, lora, output_layer="lm_head"), batch, loss
        cases.append(Case(name, memscope, build, known=known,
                          note="lora_dropout: CUDA's fused dropout (native_dropout)" if lora.get("lora_dropout") else ""))

    qv = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"], "bias": "none"}
    hf_lora("LoRA: LlamaForCausalLM, 1 layer, q_proj and v_proj (r 8, alpha 16, dropout 0.05)", LLAMA, qv)
    every = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"}
    hf_lora("LoRA: LlamaForCausalLM, 1 layer, all-linear (r 8, dropout 0)", LLAMA, every)
    hf_lora("LoRA: LlamaForCausalLM, 1 layer, all-linear, pure bf16 (float32 adapters)", LLAMA, every, dtype="bfloat16")
    B, N, H = 8, 64, 96
    layers = [{"type": "linear", "name": "0", "out": H}, {"type": "relu", "name": "1"},
              {"type": "linear", "name": "2", "out": N}]
    lora = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["0", "2"]}
    cases.append(Case("LoRA: linear, relu, linear (r 4, dropout 0.1, both linears)", dict(spec(layers, [B, N], B), lora=lora),
                      lambda: (apply_lora(nn.Sequential(nn.Linear(N, H), nn.ReLU(), nn.Linear(H, N)), lora),
                               float_batch((B, N), (B, N)), mse),
                      note="lora_dropout: CUDA's fused dropout (native_dropout)"))
    return cases


GPT2 = {"model_type": "gpt2", "vocab_size": 128, "n_embd": 64, "n_layer": 1, "n_head": 4, "n_positions": 32}


def decoder_head_cases():
    """The heads of GPT-2 and the Llama family (transformers 4.46) on their
    trunks: sequence classification pools each row's last token before the
    padding (an advanced index); token classification and question answering
    drop past_key_values when forward returns."""
    cases = []

    def case(name, config, arch, batch=2, dtype=None, **fields):
        cases.append(hf_case(name, dict(config, architectures=[arch], **fields), batch, 16, dtype=dtype))

    case("GPT2ForSequenceClassification, 1 layer, pad_token_id, 3 labels", GPT2, "GPT2ForSequenceClassification",
         pad_token_id=0, num_labels=3)
    case("GPT2ForSequenceClassification, 1 layer, batch 1, no pad_token_id (the last token)", GPT2,
         "GPT2ForSequenceClassification", batch=1)
    case("GPT2ForTokenClassification, 1 layer, 3 labels", GPT2, "GPT2ForTokenClassification", num_labels=3)
    case("GPT2ForQuestionAnswering, 1 layer", GPT2, "GPT2ForQuestionAnswering")
    case("LlamaForSequenceClassification, 1 layer, pad_token_id, 3 labels", LLAMA, "LlamaForSequenceClassification",
         pad_token_id=0, num_labels=3)
    case("LlamaForTokenClassification, 1 layer, 3 labels", LLAMA, "LlamaForTokenClassification", num_labels=3)
    case("LlamaForQuestionAnswering, 1 layer", LLAMA, "LlamaForQuestionAnswering")
    case("MistralForQuestionAnswering, 1 layer, use_cache false", dict(LLAMA, model_type="mistral"),
         "MistralForQuestionAnswering", use_cache=False)
    case("Qwen2ForSequenceClassification, 1 layer, regression (num_labels 1)", dict(LLAMA, model_type="qwen2"),
         "Qwen2ForSequenceClassification", pad_token_id=0, num_labels=1)
    case("Qwen2ForTokenClassification, 1 layer, pure bf16 (the loss on logits.float())",
         dict(LLAMA, model_type="qwen2"), "Qwen2ForTokenClassification", dtype="bfloat16", num_labels=3)
    return cases


def all_cases():
    return op_cases() + autocast_cases() + hf_cases() + decoder_head_cases() + lora_cases()


def main(argv):
    if len(argv) != 2:
        print("usage: torch_oracle.py CASES.json", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # CPU kernels' per-thread buffers (CPU_ONLY) stay one size
    out = []
    for case in all_cases():
        figures, cpu_only = measure(case)
        out.append({"name": case.name, "memscope": case.memscope, "amp": case.amp, "note": case.note, "known": case.known,
                    "pytorch": figures, "cpu_only": cpu_only})
    with open(argv[1], "w") as f:
        json.dump({"torch": torch.__version__, "cases": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
