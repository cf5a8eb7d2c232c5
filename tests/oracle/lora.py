"""PEFT's LoRA (huggingface/peft, src/peft/tuners/lora) as plain modules, for
the oracle (torch_oracle.py): no peft package is needed. What decides memory
is reproduced: lora.Linear's forward, its modules and their order, which
linears get adapters (tuners_utils.check_target_module_exists), and that only
the adapters train (mark_only_lora_as_trainable with bias "none")."""

import math
import re

import torch
import torch.nn as nn

from cuda_kernels import Dropout


class LoraLinear(nn.Module):
    """peft.tuners.lora.layer.Linear with one adapter, "default"."""

    def __init__(self, base_layer, c):
        super().__init__()
        self.base_layer = base_layer
        r, p = c["r"], c.get("lora_dropout", 0.0)
        # update_layer: nn.Dropout (here CUDA's fused kernel) or nn.Identity at p = 0
        self.lora_dropout = nn.ModuleDict({"default": Dropout(p) if p > 0 else nn.Identity()})
        self.lora_A = nn.ModuleDict({"default": nn.Linear(base_layer.in_features, r, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, base_layer.out_features, bias=c.get("lora_bias", False))})
        alpha = c.get("lora_alpha", 8)
        self.scaling = {"default": alpha / math.sqrt(r) if c.get("use_rslora") else alpha / r}
        # autocast_adapter_dtype: float16 and bfloat16 adapters are cast to float32
        self.lora_A.float()
        self.lora_B.float()

    def _cast_input_dtype(self, x, dtype):
        if x.dtype == dtype:
            return x
        return x.to(dtype=dtype)

    def forward(self, x):
        result = self.base_layer(x)
        torch_result_dtype = result.dtype
        lora_A = self.lora_A["default"]
        lora_B = self.lora_B["default"]
        dropout = self.lora_dropout["default"]
        scaling = self.scaling["default"]
        x = self._cast_input_dtype(x, lora_A.weight.dtype)
        result = result + lora_B(lora_A(dropout(x))) * scaling
        result = result.to(torch_result_dtype)
        return result


def _excluded(c, key):
    ex = c.get("exclude_modules")
    if isinstance(ex, str) and re.fullmatch(ex, key):
        return True
    if isinstance(ex, list) and (key in ex or any(key.endswith("." + e) for e in ex)):
        return True
    return any(re.match(rf"(^|.*\.){m}($|\..*)", key) for m in c.get("modules_to_save") or [])


def is_target(c, key, output_layer):
    if _excluded(c, key):
        return False
    t = c["target_modules"]
    if t == "all-linear":
        return key != output_layer
    if isinstance(t, str):
        return re.fullmatch(t, key) is not None
    return key in t or any(key.endswith("." + k) for k in t)


def apply_lora(model, c, output_layer=None):
    """get_peft_model(model, LoraConfig(**c)) for nn.Linear targets: each
    targeted linear replaced by LoraLinear in its parent (same place in the
    module order), then every parameter but the adapters frozen."""
    keys = [k for k, m in model.named_modules() if isinstance(m, nn.Linear)]
    for key in keys:
        if not is_target(c, key, output_layer):
            continue
        parent_name, _, name = key.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, name, LoraLinear(getattr(parent, name), c))
    for n, p in model.named_parameters():
        p.requires_grad = "lora_" in n
    return model


def trainable_parameters(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = ["LoraLinear", "apply_lora", "is_target", "trainable_parameters", "torch"]
