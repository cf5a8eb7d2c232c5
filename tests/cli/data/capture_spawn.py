"""A 2-process DDP job for `memscope capture`, launched the way many users
launch one: torch.multiprocessing.spawn, gloo on CPU, no torchrun (so no
$RANK in the workers' environment). Each worker trains nn.Linear(4, 2)
under DDP with SGD for 2 steps and prints "rank R: trained 2 steps". The
first argument is the rendezvous port."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    for _ in range(2):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    # One write(2) of the whole line: print() writes the text and its newline
    # apart, and the two workers share the pipe, so their lines would interleave.
    os.write(1, b"rank %d: trained 2 steps\n" % rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, int(sys.argv[1])), nprocs=2)
