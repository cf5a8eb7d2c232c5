"""A tiny training job for `memscope capture`: nn.Linear(4, 2), SGD, MSE
loss, 3 steps on CPU. With PROFILE_OUT set it trains under PyTorch's CPU
profiler (torch.autograd.profiler.profile) and writes every event it saw as
JSON lines (name, start and end in us, thread) to that file. The first
argument, if any, is the exit status."""
import json
import os
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = torch.nn.MSELoss()
x, y = torch.randn(8, 4), torch.randn(8, 2)


def train():
    for _ in range(3):
        opt.zero_grad(set_to_none=False)  # zeroes the gradients from step 1 on (PyTorch 1.13 and 2.x alike)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()


out = os.environ.get("PROFILE_OUT")
if out:
    with torch.autograd.profiler.profile() as prof:
        train()
    with open(out, "w") as f:
        for e in prof.function_events:
            f.write(json.dumps({"name": e.name, "start": e.time_range.start, "end": e.time_range.end,
                                "thread": e.thread}) + "\n")
else:
    train()
print("trained 3 steps")
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
