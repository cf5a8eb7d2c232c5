"""A stand-in for PyTorch, NOT PyTorch: only the names memscope capture's
start-up module (capture/sitecustomize.py) calls, with PyTorch 2.4's
signatures, and a simulated CUDA memory history whose _snapshot() is a
dict in PyTorch's shape (segments, device_traces, allocator_settings,
external_annotations from record_function scopes). tests/cli/capture_test.py
uses it to run capture's GPU path (history turned on as CUDA initialises,
the OOM observer, snapshots per rank at exit and at an OOM) on a machine
without a GPU. What real PyTorch does on a GPU is untested here."""
import sys
import types

__version__ = "2.4.0+memscope.fake"
MiB = 1 << 20
_sim = {"init": False, "queued": [], "history": None, "observers": [], "device": 0, "clock": 0,
        "trace": [], "annotations": [], "segments": {}, "live": set(), "next": 0x7F0000000000}


def _now():
    _sim["clock"] += 10
    return _sim["clock"]


def _module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


# ---- CUDA: lazy initialisation, the memory history, the OOM observer.
def _lazy_call(callable, **kwargs):
    if _sim["init"]:
        callable()
    else:
        _sim["queued"].append(callable)


def _fake_init(device):
    """What the job's first CUDA call does: initialise, then run the lazy calls."""
    _sim["device"], _sim["init"] = device, True
    for f in _sim["queued"]:
        f()


def _entry(action, addr, size, frames):
    if _sim["history"] is not None:
        _sim["trace"].append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": _now(),
                              "frames": frames})


def _fake_alloc(size, where="job.py"):
    """A block of `size` bytes (a multiple of 2 MiB above 10 MiB): the whole of
    a free cached segment of that size, else of a new segment, as PyTorch's
    allocator does for such sizes. Freed blocks stay cached (reserved)."""
    frames = [{"filename": where, "line": 1, "name": "alloc"}]
    free = [a for a, s in sorted(_sim["segments"].items()) if s == size and a not in _sim["live"]]
    if free:
        addr = free[0]
    else:
        addr, _sim["next"] = _sim["next"], _sim["next"] + size
        _sim["segments"][addr] = size
        _entry("segment_alloc", addr, size, frames)
    _entry("alloc", addr, size, frames)
    _sim["live"].add(addr)
    return addr


def _fake_free(addr):
    _sim["live"].remove(addr)
    _entry("free_requested", addr, _sim["segments"][addr], [])
    _entry("free_completed", addr, _sim["segments"][addr], [])


def _fake_oom(size):
    """An allocation that fails: the oom entry, the observers, then PyTorch's error."""
    if _sim["history"] is not None:
        _sim["trace"].append({"action": "oom", "device_free": 0, "size": size, "stream": 0, "time_us": _now(),
                              "frames": []})
    for f in _sim["observers"]:
        f(_sim["device"], size, sum(_sim["segments"][a] for a in _sim["live"]), 0)
    raise RuntimeError("CUDA out of memory. Tried to allocate %d bytes" % size)


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None):
    _sim["history"] = {"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries}


def _snapshot(device=None):
    d = _sim["device"]
    segments = []
    for a, s in sorted(_sim["segments"].items()):
        used = s if a in _sim["live"] else 0
        segments.append({"device": d, "address": a, "total_size": s, "allocated_size": used, "active_size": used,
                         "requested_size": used, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                         "is_expandable": False, "frames": [],
                         "blocks": [{"address": a, "size": s, "requested_size": used,
                                     "state": "active_allocated" if used else "inactive", "frames": []}]})
    traces = [[] for _ in range(d)] + [list(_sim["trace"][-_sim["history"]["max_entries"]:])]
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                                   "expandable_segments": False, "garbage_collection_threshold": 0.0},
            "external_annotations": list(_sim["annotations"])}


memory = _module("torch.cuda.memory", _record_memory_history=_record_memory_history, _snapshot=_snapshot)
cuda = _module("torch.cuda", is_available=lambda: True, _lazy_call=_lazy_call, memory=memory,
               _fake_init=_fake_init, _fake_alloc=_fake_alloc, _fake_free=_fake_free, _fake_oom=_fake_oom,
               history=lambda: _sim["history"])
_C = _module("torch._C", _cuda_attach_out_of_memory_observer=_sim["observers"].append)


# ---- record_function: scopes become external_annotations while the history records.
class record_function:
    def __init__(self, name, args=None):
        self.name = name

    def _note(self, stage):
        if _sim["history"] is not None:
            _sim["annotations"].append({"name": self.name, "stage": stage, "device": _sim["device"],
                                        "time_us": _now()})

    def __enter__(self):
        self._note("START")
        return self

    def __exit__(self, *exc):
        self._note("END")
        return False


profiler = _module("torch.autograd.profiler", record_function=record_function)


def backward(tensors=None, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    if getattr(tensors, "on_backward", None):
        tensors.on_backward()


autograd = _module("torch.autograd", profiler=profiler, backward=backward)


class Tensor:
    def __init__(self, on_backward=None):
        self.on_backward = on_backward

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        autograd.backward(self)


# ---- nn and optim: just the classes the start-up module wraps.
class Module:
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class _Loss(Module):
    pass


loss = _module("torch.nn.modules.loss", _Loss=_Loss)
modules = _module("torch.nn.modules", loss=loss)
nn = _module("torch.nn", Module=Module, modules=modules)


class Optimizer:
    def __init__(self, params=(), defaults=None):
        self.params = list(params)

    def zero_grad(self, set_to_none=True):
        pass

    def step(self, closure=None):
        pass


optim = _module("torch.optim", Optimizer=Optimizer)
