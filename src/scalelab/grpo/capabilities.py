"""What each rollout engine supports, by engine name: the record every engine class carries as its
`capabilities` (engines.ENGINE_CLASSES), kept here without the engines' imports (torch, vLLM) so that config
validation and the CLI can ask it cheaply."""
from __future__ import annotations

from scalelab.grpo.types import EngineCapabilities

CAPABILITIES: dict[str, EngineCapabilities] = {
    # its sampler draws a whole generate call from one RNG stream: per-prompt seeds need a call per prompt
    "hf": EngineCapabilities(sync_methods=("shared", "inplace"), default_sync="shared", seeds_per_request=False),
    "vllm_server": EngineCapabilities(sync_methods=("safetensors", "lora_adapter", "nccl"), default_sync="safetensors",
                                      lora_sync="lora_adapter", server_per_rank=True),
    # isolate_runs: an engine closed in-process does not hand all its GPU memory back to the next run
    "vllm_colocated": EngineCapabilities(
        sync_methods=("inplace",), default_sync="inplace", isolate_runs=True,
        torchrun_refusal="needs vLLM's external-launcher executor (one engine per rank in the torchrun process "
                         "group), which the engine does not set up yet; use 'hf', or 'vllm_server' (one server per "
                         "rank on the rank's GPU)"),
}


def capabilities(engine_name: str) -> EngineCapabilities:
    if engine_name not in CAPABILITIES:
        raise ValueError(f"rollout engine {engine_name!r}; allowed: {', '.join(CAPABILITIES)}")
    return CAPABILITIES[engine_name]


def resolve_method(method: str, engine_name: str, lora: bool) -> str:
    """'auto' -> the engine's natural method (for a server with a LoRA policy: the adapter alone)."""
    return capabilities(engine_name).auto_sync(lora) if method == "auto" else method
