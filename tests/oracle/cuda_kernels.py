"""What CUDA runs where PyTorch's CPU kernels differ, callable on CPU, for
the oracle's modules (torch_oracle.py, hf_models.py)."""

import torch
import torch.nn as nn


def cuda_dropout(x, p, training=True):
    """F.dropout as CUDA runs it: the fused native_dropout (saves a bool mask).
    On CPU, F.dropout multiplies by a float32 noise tensor instead."""
    if not training or p == 0:
        return x
    return torch.native_dropout(x, p, True)[0]


class Dropout(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        return cuda_dropout(x, self.p, self.training)


def cuda_cross_entropy(x, target, reduction="mean"):
    """F.cross_entropy as CUDA autocast runs it: cross_entropy_loss is on no
    CUDA autocast list, so it runs its composition, nll_loss(log_softmax(x,
    1, x.dtype)), where log_softmax keeps x's dtype and nll_loss (float32
    list) casts. CPU autocast lists cross_entropy_loss itself as float32 and
    casts x first."""
    return torch.nn.functional.nll_loss(torch.log_softmax(x, 1, dtype=x.dtype), target, reduction=reduction)
