"""Number formats of a training run: bytes per parameter for weights, grads and optimizer state, and
bytes per element that each kind of communication moves."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str
    weight_bytes: float         # per parameter, the copy the model holds
    grad_bytes: float           # per parameter
    optimizer_bytes: float      # per parameter: Adam m, v (+ fp32 master when weights are 16-bit)
    gather_bytes: float         # per parameter moved by a ZeRO-3/FSDP all-gather
    reduce_bytes: float         # per parameter moved by a gradient all-reduce / reduce-scatter
    act_bytes: float            # per activation element in TP/PP/CP/EP messages
    source: str


PRECISIONS: dict[str, Precision] = {p.name: p for p in [
    Precision("bf16-mixed", 2, 2, 12, 2, 2, 2,
              "ZeRO sec. 3.1 mixed-precision Adam (K=12), as Megatron-LM/DeepSpeed with bf16"),
    Precision("amp-bf16", 4, 4, 8, 4, 4, 2,
              "torch.autocast over fp32 weights (nanoGPT, scalelab pretrain): fp32 weights/grads/Adam; DDP "
              "all-reduces and FSDP2 without a MixedPrecisionPolicy gather and reduce fp32"),
    Precision("fsdp2-bf16", 4, 4, 8, 2, 4, 2,
              "FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) over fp32 sharded weights"),
    Precision("fp32", 4, 4, 8, 4, 4, 4, "plain fp32 training"),
]}


def get_precision(name: str) -> Precision:
    if name not in PRECISIONS:
        raise KeyError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
    return PRECISIONS[name]
