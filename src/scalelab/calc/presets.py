"""Published model shapes, by name. Each entry cites the config it was copied from.

There is no GPT-2 "1B": the released sizes are 124M, 355M ("350M"), 774M and 1558M (Radford et al. 2019,
Table 2; the 117M/345M/762M/1542M in that table are the paper's own rounding). `gpt2-1.5b` is the largest.
"""
from __future__ import annotations

from scalelab.calc.models import ModelSpec


def _gpt2(name: str, n_layers: int, d_model: int, n_heads: int) -> ModelSpec:
    # GPT-2: LayerNorm with bias, biases on every Linear, GELU MLP of 4d, learned positions, tied head.
    return ModelSpec(name, n_layers, d_model, n_heads, n_heads, 4 * d_model, 50257, mlp="gelu",
                     tied_embeddings=True, learned_pos_len=1024, bias="all", norm="layernorm",
                     source=f"openai-community/{'gpt2' if n_layers == 12 else name} config.json (Radford et al. 2019)")


PRESETS: dict[str, ModelSpec] = {m.name: m for m in [
    _gpt2("gpt2-124m", 12, 768, 12),
    _gpt2("gpt2-350m", 24, 1024, 16),       # hub name gpt2-medium
    _gpt2("gpt2-774m", 36, 1280, 20),       # gpt2-large
    _gpt2("gpt2-1.5b", 48, 1600, 25),       # gpt2-xl
    ModelSpec("llama-3-8b", 32, 4096, 32, 8, 14336, 128256,
              source="meta-llama/Meta-Llama-3-8B config.json; Llama 3 paper (Dubey et al. 2024) Table 3"),
    ModelSpec("llama-3-70b", 80, 8192, 64, 8, 28672, 128256,
              source="meta-llama/Meta-Llama-3-70B config.json; Dubey et al. 2024 Table 3"),
    ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256,
              source="meta-llama/Llama-3.1-70B config.json (same shapes as Llama-3-70B)"),
    ModelSpec("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256,
              source="meta-llama/Llama-3.1-405B config.json; Dubey et al. 2024 Table 3"),
    ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, bias="qkv",
              source="Qwen/Qwen2.5-7B config.json (untied head, QKV bias)"),
    ModelSpec("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, bias="qkv",
              source="Qwen/Qwen2.5-72B config.json (untied head, QKV bias)"),
    ModelSpec("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, attention="mla",
              n_experts=256, n_shared_experts=1, top_k=8, d_ff_expert=2048, n_dense_layers=3,
              q_lora_rank=1536, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128,
              source="deepseek-ai/DeepSeek-V3 config.json; DeepSeek-V3 report sec. 4.2 (671B total, 37B active; "
                     "the 14B multi-token-prediction module is not counted)"),
]}

# Names people also use for the same checkpoints.
ALIASES: dict[str, str] = {"gpt2": "gpt2-124m", "gpt2-medium": "gpt2-350m", "gpt2-355m": "gpt2-350m",
                           "gpt2-large": "gpt2-774m", "gpt2-xl": "gpt2-1.5b", "llama-3-405b": "llama-3.1-405b",
                           "llama-3.1-8b": "llama-3-8b"}


def get_model(name: str) -> ModelSpec:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)} "
                       f"(aliases: {', '.join(ALIASES)}); or pass --model-config FILE.toml")
    return PRESETS[key]
