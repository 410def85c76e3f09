"""Read a model (and optionally batch defaults) from a TOML file for `scalelab calc`.

Two shapes are accepted, both under a [model] table or at the top level:
- calc's own fields (those of `ModelSpec`, or the short aliases layers/hidden/heads/kv_heads/ffn/vocab/
  experts/top_k...), validated by `core.config` so that a wrong key or value names the field;
- a scalelab pretrain config (configs/pretrain/*.toml: n_layer, n_head, n_embd, block_size,
  padded_vocab_size, bias), read as the GPT-2 architecture it trains; its [train] table then supplies
  the defaults for batch, DP mode and precision (micro_batch_size, block_size, total_batch_tokens,
  parallel, dtype), so the predictor can be pointed at the very file a measured run used.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from scalelab.calc.models import ATTENTION_KINDS, MLP_KINDS, ModelSpec
from scalelab.core.config import config_from_dict, param, read_toml

ALIASES = {"layers": "n_layers", "hidden": "d_model", "heads": "n_heads", "kv_heads": "n_kv_heads",
           "ffn": "d_ff", "vocab": "vocab_size", "experts": "n_experts", "shared_experts": "n_shared_experts",
           "ffn_expert": "d_ff_expert", "dense_layers": "n_dense_layers", "head_dim": "d_head"}


@dataclass
class ModelFile:
    name: str = param("custom", "label in reports")
    n_layers: int = param(12, "transformer blocks", ge=1)
    d_model: int = param(768, "residual width", ge=1)
    n_heads: int = param(12, "attention (query) heads", ge=1)
    n_kv_heads: int = param(0, "K/V heads (GQA); 0 = n_heads", ge=0)
    d_ff: int = param(0, "dense MLP hidden width; 0 = 4 x d_model", ge=0)
    vocab_size: int = param(50257, "embedding rows", ge=1)
    mlp: str = param("swiglu", "MLP kind", choices=tuple(MLP_KINDS))
    attention: str = param("gqa", "attention kind", choices=tuple(ATTENTION_KINDS))
    d_head: int = param(0, "head width; 0 = d_model / n_heads", ge=0)
    tied_embeddings: bool = param(False, "output head shares the input embedding")
    learned_pos_len: int = param(0, "rows of a learned position table; 0 = RoPE", ge=0)
    bias: str = param("none", "which Linear layers have biases", choices=("none", "all", "qkv"))
    norm: str = param("rmsnorm", "normalisation", choices=("rmsnorm", "layernorm"))
    n_experts: int = param(0, "routed experts per MoE layer; 0 = dense", ge=0)
    n_shared_experts: int = param(0, "shared experts per MoE layer", ge=0)
    top_k: int = param(0, "routed experts per token", ge=0)
    d_ff_expert: int = param(0, "hidden width of one expert", ge=0)
    n_dense_layers: int = param(0, "leading dense layers of a MoE model", ge=0)
    q_lora_rank: int = param(0, "MLA query rank", ge=0)
    kv_lora_rank: int = param(0, "MLA KV latent rank", ge=0)
    qk_nope_dim: int = param(0, "MLA per-head non-RoPE QK width", ge=0)
    qk_rope_dim: int = param(0, "MLA per-head RoPE QK width", ge=0)
    v_head_dim: int = param(0, "MLA per-head V width", ge=0)

    def to_spec(self, source: str) -> ModelSpec:
        values = dataclasses.asdict(self)
        values["n_kv_heads"] = self.n_kv_heads or self.n_heads
        values["d_ff"] = self.d_ff or 4 * self.d_model
        return ModelSpec(**values, source=source)


@dataclass(frozen=True)
class BatchDefaults:
    micro_batch: int | None = None
    seq: int | None = None
    global_batch_tokens: int | None = None
    dp_mode: str | None = None
    precision: str | None = None


def _from_pretrain(t: dict, name: str) -> dict:
    """A pretrain [model] table -> ModelFile fields: GPT-2 (LayerNorm, GELU 4d, learned positions, tied)."""
    return {"name": name, "n_layers": t.get("n_layer", 4), "n_heads": t.get("n_head", 4),
            "d_model": t.get("n_embd", 128), "vocab_size": t.get("padded_vocab_size", t.get("vocab_size", 50304)),
            "learned_pos_len": t.get("block_size", 128), "bias": "all" if t.get("bias", True) else "none",
            "mlp": "gelu", "norm": "layernorm", "tied_embeddings": True}


def load_model_file(path: str | Path) -> tuple[ModelSpec, BatchDefaults]:
    path = Path(path)
    data = read_toml(path, what="model config")
    table = data.get("model", data)
    if "n_layer" in table or "n_embd" in table or any(k in data for k in ("train", "optim", "schedule")):
        fields, train = _from_pretrain(table, path.stem), data.get("train", {})
        tokens = train.get("total_batch_tokens") or None
        parallel = {"ddp": "ddp", "fsdp2": "fsdp"}.get(train.get("parallel", "ddp"))
        # the pretrain trainer keeps fp32 weights and autocasts to bf16 unless dtype = "float32"
        precision = "fp32" if train.get("dtype") == "float32" else "amp-bf16"
        batch = BatchDefaults(train.get("micro_batch_size"), table.get("block_size"), tokens, parallel, precision)
    else:
        fields, batch = {ALIASES.get(k, k): v for k, v in table.items()}, BatchDefaults()
    return config_from_dict(ModelFile, fields, str(path)).to_spec(str(path)), batch
