"""bf16 compute for a bf16 base model with fp32 LoRA adapters (mixed precision, Micikevicius et al. 2018).

peft keeps the adapters of a bf16 model in fp32 (its `autocast_adapter_dtype` default) so that small updates are
not lost to bf16 rounding, and then casts each adapter's input to fp32: every LoRA matmul runs as an fp32 GEMM on
the CUDA cores rather than the tensor cores, and every [tokens, width] activation an adapter sees is copied to
fp32 and its output promoted back. In a profile of the GRPO update of a 0.5B model those matmuls and copies cost
more GPU time than the model's own bf16 matmuls. Under torch.autocast(bf16) with peft's input casting off, the
adapters' matmuls run in bf16 on bf16 activations, while their weights, gradients and optimizer state stay fp32.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch


def wants_autocast(model: Any) -> bool:
    """True for a bf16 base (frozen bf16 weights) that trains fp32 parameters: peft's LoRA on a bf16 model."""
    frozen_bf16 = trained_fp32 = False
    for p in model.parameters():
        frozen_bf16 |= p.dtype == torch.bfloat16 and not p.requires_grad
        trained_fp32 |= p.dtype == torch.float32 and p.requires_grad
        if frozen_bf16 and trained_fp32:
            return True
    return False


def compute_autocast(model: Any, enabled: bool = True) -> contextlib.AbstractContextManager:
    """The context a forward pass of `model` runs in: bf16 autocast with peft's input casting off when `enabled`
    and wants_autocast(model), else nothing. The backward runs outside it, in the dtypes the forward chose."""
    if not enabled or not wants_autocast(model):
        return contextlib.nullcontext()
    from peft.helpers import disable_input_dtype_casting  # lazy: only a peft model reaches here
    device = next(p.device.type for p in model.parameters())
    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast(device_type=device, dtype=torch.bfloat16))
    stack.enter_context(disable_input_dtype_casting(model))
    return stack
