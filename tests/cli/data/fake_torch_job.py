"""A training job for the stand-in torch of tests/cli/data/fake_torch (NOT
PyTorch): rank R (RANK, as torchrun sets it) on device LOCAL_RANK holds a
10 MiB parameter, and each of 2 steps makes a (R + 2) * 10 MiB activation in
forward and a 10 MiB gradient in backward (kept), freeing the activation.
With --oom it then fails a 1 GiB allocation, as a job that runs out of GPU
memory does. Exit status 0, or 1 after the OOM."""
import os
import sys

import torch

MiB = 1 << 20
rank, device = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda._fake_init(device)  # the job's first CUDA call
param = torch.cuda._fake_alloc(10 * MiB, "model.py")


class Net(torch.nn.Module):
    def forward(self, x):
        return torch.cuda._fake_alloc((rank + 2) * 10 * MiB, "model.py")


class MSELoss(torch.nn.modules.loss._Loss):
    def forward(self, activation):
        return torch.Tensor(lambda: backward(activation))


grads = []


def backward(activation):
    if not grads:
        grads.append(torch.cuda._fake_alloc(10 * MiB, "backward.py"))
    torch.cuda._fake_free(activation)


model, loss_fn, opt = Net(), MSELoss(), torch.optim.Optimizer([param])
for step in range(2):
    opt.zero_grad()
    loss = loss_fn(model(None))
    loss.backward()
    opt.step()
print("rank %d: 2 steps" % rank)
if "--oom" in sys.argv:
    try:
        torch.cuda._fake_oom(1 << 30)
    except RuntimeError as e:
        print("rank %d: %s" % (rank, e), file=sys.stderr)
        sys.exit(1)
