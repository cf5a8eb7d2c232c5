"""ZeroRedundancyOptimizer in real PyTorch (Debian's python3-torch, CPU, gloo):
the partition, each rank's optimizer state and the flat buckets, for the
models memscope's tests run with --zero.

    python3 zero_oracle.py WORLD_SIZE MODEL:MODE [MODEL:MODE ...]
        prints {"MODEL:MODE": RESULT, ...}; MODE is on or bucket-view

MODEL is memscope's zoo model of the same name, built here as plain modules
with the same parameter names and order: mlp (256 -> 3 x 512 -> 10) or
cifar-net (the CIFAR-10 tutorial Net). Each rank wraps it in DDP, builds
ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam),
trains one step and reports (one process group for every case: the workers
start once):

  partition      every rank's parameter names, in its param group's order
  state_bytes    per rank: the bytes of its local optimizer's exp_avg and
                 exp_avg_sq (Adam's `step` is left out: on a GPU it is a host
                 tensor unless fused or capturable, as memscope models it)
  state_blocks   the same tensors as the CUDA caching allocator would hold
                 them: each one's bytes rounded up to a multiple of 512
                 (round_size in c10/cuda/CUDACachingAllocator.cpp), what
                 memscope's OPTIMIZER_STATE counts
  bucket_numels  per rank, with parameters_as_bucket_view=True
"""
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(256 if i == 0 else 512, 512) for i in range(3)])
        self.head = nn.Linear(512, 10)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)

    @staticmethod
    def batch():
        return torch.randn(8, 256), torch.randint(0, 10, (8,))


class CifarNet(nn.Module):
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
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))

    @staticmethod
    def batch():
        return torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))


MODELS = {"mlp": Mlp, "cifar-net": CifarNet}


def run_case(rank, model_name, bucket_view):
    torch.manual_seed(0)
    model = MODELS[model_name]()
    names = {p: n for n, p in model.named_parameters()}
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3,
                                  parameters_as_bucket_view=bucket_view)
    x, y = model.batch()
    opt.zero_grad()
    F.cross_entropy(ddp(x), y).backward()
    opt.step()
    state = blocks = 0
    for s in opt.optim.state.values():
        for key, t in s.items():
            if torch.is_tensor(t) and key != "step":
                state += t.numel() * t.element_size()
                blocks += max(512, -(-t.numel() * t.element_size() // 512) * 512)
    result = {
        "partition": [[names[p] for g in groups for p in g["params"]] for groups in opt._partition_parameters()],
        "state_bytes": state,
        "state_blocks": blocks,
    }
    if bucket_view:
        result["bucket_numels"] = [b.numel() for b in opt._buckets[0]]
    return result


def worker(rank, world_size, cases, init_file, out_dir):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world_size)
    results = {}
    for case in cases:
        model_name, mode = case.split(":")
        results[case] = run_case(rank, model_name, mode == "bucket-view")
    with open(os.path.join(out_dir, "rank-%d.json" % rank), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def main():
    world_size, cases = int(sys.argv[1]), sys.argv[2:]
    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "init")
        mp.spawn(worker, args=(world_size, cases, init_file, d), nprocs=world_size)
        ranks = [json.load(open(os.path.join(d, "rank-%d.json" % r))) for r in range(world_size)]
    out = {}
    for case in cases:
        out[case] = {"partition": ranks[0][case]["partition"], "state_bytes": [r[case]["state_bytes"] for r in ranks],
                     "state_blocks": [r[case]["state_blocks"] for r in ranks]}
        if "bucket_numels" in ranks[0][case]:
            out[case]["bucket_numels"] = ranks[0][case]["bucket_numels"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
