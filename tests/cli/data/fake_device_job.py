"""A job under `memscope capture --all-device-memory` with the stand-in torch
of tests/cli/data/fake_torch (NOT PyTorch, NOT CUDA, NOT CUPTI). It prints
the CUDA_INJECTION64_PATH it was given, makes two caching-allocator
segments (20 MiB and 12 MiB) on cuda:0, and writes what memscope's CUPTI
injection library would write for this process on a GPU
(.memscope-capture/device-pid-P.gpu-0.timeline, timeline format version 4,
docs/timeline.md): the two segments' cudaMallocs at the snapshot's
addresses (the first from libc10_cuda, the second with its caller lost),
NCCL's 64 MiB, cuBLAS's 8 MiB, and an NVML sample of 604 MiB used (so 500
MiB of context). Exits with the status given as its argument."""
import os
import struct
import sys

import torch

MiB = 1 << 20
print("CUDA_INJECTION64_PATH=" + os.environ.get("CUDA_INJECTION64_PATH", "<unset>"))
torch.cuda._fake_init(0)
segments = [torch.cuda._fake_alloc(20 * MiB, "model.py"), torch.cuda._fake_alloc(12 * MiB, "model.py")]


def varint(v):
    out = b""
    while v >= 0x80:
        out += bytes([(v & 0x7F) | 0x80])
        v >>= 7
    return out + bytes([v])


def zigzag(delta):
    delta &= (1 << 64) - 1
    return ((delta << 1) ^ (-(delta >> 63) & ((1 << 64) - 1))) & ((1 << 64) - 1)


class Writer:
    """Version 4's general records (recording/timeline.h), strings before their use."""

    def __init__(self, device, capacity):
        header = b"MSCOPETL" + struct.pack("<IIiiiIQq", 4, 0, 0, 1, device, 0, capacity, 1700000000000000)
        self.out = header + b"\0" * 16 + bytes([41]) + varint(0) + varint(capacity) + varint(device)
        self.prev = [0, 0, 0, 0, 0]  # time, addr, size, stream, name
        self.strings = {"": 0}

    def intern(self, text):
        if text not in self.strings:
            self.strings[text] = len(self.strings)
            data = text.encode()
            self.out += bytes([40]) + varint(self.strings[text]) + varint(len(data)) + data
        return self.strings[text]

    def event(self, kind, time=0, addr=0, size=0, name=""):
        name_id = self.intern(name)
        t, a, s, st, n = self.prev
        fields = [zigzag(time - t), zigzag(addr - a), zigzag(size - s), 0, 0, zigzag(name_id - n)]
        lengths, body = 0, b""
        for i, v in enumerate(fields):
            width = (v.bit_length() + 7) // 8
            lengths |= width << (4 * i)
            body += v.to_bytes(width, "little")
        self.out += bytes([kind]) + struct.pack("<I", lengths) + body
        self.prev = [time, addr, size, st, name_id]


SEGMENT_ALLOC, MARK = 3, 34
w = Writer(device=0, capacity=80 << 30)
w.event(SEGMENT_ALLOC, 100, segments[0], 20 * MiB, "/venv/torch/lib/libc10_cuda.so")
w.event(SEGMENT_ALLOC, 200, segments[1], 12 * MiB, "")
w.event(SEGMENT_ALLOC, 300, 0x7E0000000000, 64 * MiB, "/venv/nvidia/nccl/lib/libnccl.so.2")
w.event(SEGMENT_ALLOC, 400, 0x7E1000000000, 8 * MiB, "/venv/nvidia/cublas/lib/libcublasLt.so.12")
w.event(MARK, 500, name="nvml_used_bytes %d end" % ((20 + 12 + 64 + 8 + 500) * MiB))
capture_dir = os.path.join(os.environ["MEMSCOPE_CAPTURE_DIR"], ".memscope-capture")
with open(os.path.join(capture_dir, "device-pid-%d.gpu-0.timeline" % os.getpid()), "wb") as f:
    f.write(w.out)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
