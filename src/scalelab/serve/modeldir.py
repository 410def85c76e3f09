"""A servable HF model folder made from a calc `ModelSpec`, and the way back from a folder to a `ModelSpec`.

    <out>/config.json              LlamaForCausalLM / Qwen2ForCausalLM / GPT2LMHeadModel of the spec's shape
    <out>/generation_config.json   bos/eos = GPT-2's <|endoftext|> (50256)
    <out>/vocab.json, merges.txt   GPT-2's BPE padded with filler tokens to the spec's vocab size
    <out>/tokenizer_config.json, special_tokens_map.json
    <out>/model.safetensors        only with with_random_weights=True

vLLM serves the folder without weights under `--load-format dummy`: the shapes come from config.json, so the
engine does the work of the real model. Random weights sample ids uniformly over the whole embedding table, so
the tokenizer must detokenize every id in [0, vocab_size): ids past GPT-2's 50257 are filler tokens `<|padN|>`
that decode to their own text and are never produced by encoding (no merge leads to them). The fillers live in
vocab.json, not as added tokens, so they are not "special" (vLLM's skip_special_tokens would drop their text,
leaving empty stream chunks) and cost ~20 bytes each: a 152064 vocab is a 3 MB vocab.json.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from scalelab.calc.models import ModelSpec
from scalelab.core import errors
from scalelab.core.gpt2bpe import EOT
from scalelab.core.hfio import write_generation_config, write_tokenizer, write_weights

FILLER = "<|pad{}|>"


class ModelDirError(errors.ModelError, ValueError):
    """The spec cannot be written as the asked architecture, or a config.json cannot be read as a ModelSpec."""


@dataclass(frozen=True)
class HfArch:
    architecture: str       # config.json "architectures"[0]: what vLLM picks its model class by
    model_type: str
    rope_theta: float       # default when the caller gives none; the published models' value
    rms_norm_eps: float


ARCHES: dict[str, HfArch] = {
    "llama": HfArch("LlamaForCausalLM", "llama", 500000.0, 1e-5),     # Llama 3 config.json
    "qwen2": HfArch("Qwen2ForCausalLM", "qwen2", 1000000.0, 1e-6),    # Qwen2.5 config.json
    "gpt2": HfArch("GPT2LMHeadModel", "gpt2", 0.0, 0.0),              # learned positions, LayerNorm 1e-5
}


def pick_arch(spec: ModelSpec) -> str:
    """'auto': GPT-2 for a GPT-2-shaped spec (learned positions), Qwen2 for QKV biases, else Llama."""
    if spec.learned_pos_len:
        return "gpt2"
    return "qwen2" if spec.bias == "qkv" else "llama"


# ---------------------------------------------------------------------------------------------
# spec -> config.json


def _require(spec: ModelSpec, arch: str, field: str, allowed: tuple[Any, ...]) -> None:
    value = getattr(spec, field)
    if value not in allowed:
        raise ModelDirError(f"{spec.name}: {field}={value!r} cannot be written as {ARCHES[arch].architecture} "
                            f"(allowed: {', '.join(map(repr, allowed))})")


def _check_expressible(spec: ModelSpec, arch: str) -> None:
    for field in ("n_experts", "q_lora_rank", "kv_lora_rank"):
        _require(spec, arch, field, (0,))
    _require(spec, arch, "attention", ("gqa",))
    if arch == "gpt2":
        for field, allowed in (("mlp", "gelu"), ("norm", "layernorm"), ("bias", "all"), ("tied_embeddings", True)):
            _require(spec, arch, field, (allowed,))
        _require(spec, arch, "n_kv_heads", (spec.n_heads,))
        _require(spec, arch, "d_head", (0, spec.d_model // spec.n_heads))
        return
    _require(spec, arch, "mlp", ("swiglu",))
    _require(spec, arch, "norm", ("rmsnorm",))
    _require(spec, arch, "learned_pos_len", (0,))
    _require(spec, arch, "bias", ("qkv",) if arch == "qwen2" else ("none",))
    if arch == "qwen2":  # vLLM's Qwen2 ignores head_dim and uses hidden_size // heads
        _require(spec, arch, "d_head", (0, spec.d_model // spec.n_heads))


def _rope_config(spec: ModelSpec, arch: str, max_position_embeddings: int, rope_theta: float) -> dict[str, Any]:
    a = ARCHES[arch]
    return {
        "architectures": [a.architecture], "model_type": a.model_type,
        "hidden_size": spec.d_model, "intermediate_size": spec.d_ff, "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_heads, "num_key_value_heads": spec.n_kv_heads, "head_dim": spec.head_dim,
        "hidden_act": "silu", "rms_norm_eps": a.rms_norm_eps, "max_position_embeddings": max_position_embeddings,
        # rope_theta is the key transformers 4.x and most serving stacks read; rope_parameters is 5.x's
        "rope_theta": rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True, **({"use_sliding_window": False, "sliding_window": None,
                               "max_window_layers": spec.n_layers} if arch == "qwen2" else {})}


def _gpt2_config(spec: ModelSpec) -> dict[str, Any]:
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": spec.n_layers,
            "n_embd": spec.d_model, "n_head": spec.n_heads, "n_inner": spec.d_ff, "n_positions": spec.learned_pos_len,
            "n_ctx": spec.learned_pos_len, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def hf_config(spec: ModelSpec, arch: str = "auto", max_position_embeddings: int = 4096,
              rope_theta: float | None = None, dtype: str = "bfloat16") -> dict[str, Any]:
    """config.json's content for `spec` as `arch` ("auto", or a key of ARCHES)."""
    arch = pick_arch(spec) if arch == "auto" else arch
    if arch not in ARCHES:
        raise ModelDirError(f"arch {arch!r}; allowed: auto, {', '.join(ARCHES)}")
    _check_expressible(spec, arch)
    body = _gpt2_config(spec) if arch == "gpt2" else _rope_config(
        spec, arch, max_position_embeddings, rope_theta if rope_theta is not None else ARCHES[arch].rope_theta)
    # torch_dtype: the name transformers 4.x and vLLM read; dtype: transformers 5.x's name for the same
    return {**body, "vocab_size": spec.vocab_size, "tie_word_embeddings": spec.tied_embeddings,
            "bos_token_id": EOT, "eos_token_id": EOT, "torch_dtype": dtype, "dtype": dtype}


# ---------------------------------------------------------------------------------------------
# the folder


def pad_vocab(vocab_json: Path, vocab_size: int) -> None:
    """Extend GPT-2's vocab.json to `vocab_size` entries with never-encoded filler tokens."""
    vocab = json.loads(vocab_json.read_text(encoding="utf-8"))
    if vocab_size < len(vocab):
        raise ModelDirError(f"vocab_size {vocab_size} is smaller than GPT-2's {len(vocab)} tokens: the tokenizer "
                            "would produce ids the model has no embedding for")
    fillers = {FILLER.format(i): i for i in range(len(vocab), vocab_size)}
    clash = fillers.keys() & vocab.keys()
    if clash:
        raise ModelDirError(f"filler tokens {sorted(clash)[:3]} already exist in {vocab_json}")
    vocab.update(fillers)
    # compact separators: at 150k entries the default ", " and ": " add 0.3 MB to a file that travels
    vocab_json.write_text(json.dumps(vocab, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")


def write_random_weights(out: Path, dtype: str, seed: int) -> int:
    """Random-initialised weights for the folder's config (transformers' own init); returns the count."""
    import torch  # lazy: torch takes seconds to import, and this module is used without it
    from transformers import AutoConfig, AutoModelForCausalLM  # lazy: transformers takes seconds to import
    config = AutoConfig.from_pretrained(out)
    with torch.random.fork_rng():  # seed this model without moving the caller's global RNG
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(getattr(torch, dtype))
    state = model.state_dict()
    if config.tie_word_embeddings:  # one storage, stored once (safetensors refuses shared tensors)
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    write_weights({k: v.contiguous() for k, v in state.items()}, out)
    return sum(p.numel() for p in model.parameters())


def make_model_dir(spec: ModelSpec, out: str | Path, arch: str = "auto", *, max_position_embeddings: int = 4096,
                   rope_theta: float | None = None, dtype: str = "bfloat16", with_random_weights: bool = False,
                   seed: int = 0) -> Path:
    """Write a servable folder for `spec` (see the module docstring). `max_position_embeddings` is vLLM's default
    max_model_len: 4096 keeps one full sequence within a small CPU KV cache; raise it (or pass --max-model-len)
    for long-context runs."""
    out = Path(out)
    config = hf_config(spec, arch, max_position_embeddings, rope_theta, dtype)
    out.mkdir(parents=True, exist_ok=True)
    # callers take a folder holding config.json as finished: one cut short (a missing tokenizer package, a full
    # disk) must not keep it, or the next run serves a folder without its tokenizer or weights
    try:
        write_generation_config(out)
        context = config.get("max_position_embeddings", config.get("n_positions"))
        write_tokenizer(out, context, None)
        pad_vocab(out / "vocab.json", spec.vocab_size)
        tmp = out / "config.json.partial"
        tmp.write_text(json.dumps(config, indent=2) + "\n")
        tmp.replace(out / "config.json")
        if with_random_weights:   # reads config.json back through transformers
            write_random_weights(out, dtype, seed)
    except BaseException:
        (out / "config.json").unlink(missing_ok=True)
        raise
    return out


# ---------------------------------------------------------------------------------------------
# config.json -> spec


ConfigReader = Callable[[Callable[[str], Any], dict[str, Any]], dict[str, Any]]


def _rope_fields(get: Callable[[str], Any], cfg: dict[str, Any]) -> dict[str, Any]:
    d, heads = get("hidden_size"), get("num_attention_heads")
    head_dim = cfg.get("head_dim") or d // heads  # Mistral writes "head_dim": null
    return {"n_layers": get("num_hidden_layers"), "d_model": d, "n_heads": heads,
            "n_kv_heads": cfg.get("num_key_value_heads") or heads, "d_ff": get("intermediate_size"),
            "vocab_size": get("vocab_size"), "d_head": 0 if head_dim == d // heads else head_dim,
            "tied_embeddings": bool(cfg.get("tie_word_embeddings", False))}


def _llama_fields(get: Callable[[str], Any], cfg: dict[str, Any]) -> dict[str, Any]:
    return {**_rope_fields(get, cfg), "bias": "none"}


def _qwen2_fields(get: Callable[[str], Any], cfg: dict[str, Any]) -> dict[str, Any]:
    return {**_rope_fields(get, cfg), "bias": "qkv"}  # Qwen2 always has Q/K/V biases, no other bias


def _gpt2_fields(get: Callable[[str], Any], cfg: dict[str, Any]) -> dict[str, Any]:
    d, heads = get("n_embd"), get("n_head")
    return {"n_layers": get("n_layer"), "d_model": d, "n_heads": heads, "n_kv_heads": heads,
            "d_ff": cfg.get("n_inner") or 4 * d, "vocab_size": get("vocab_size"), "mlp": "gelu",
            "tied_embeddings": True, "learned_pos_len": get("n_positions"), "bias": "all", "norm": "layernorm"}


CONFIG_READERS: dict[str, ConfigReader] = {"llama": _llama_fields, "mistral": _llama_fields, "qwen2": _qwen2_fields,
                                           "gpt2": _gpt2_fields}
# The settings the readers assume; any other value changes the parameter count or the computation.
ASSUMED: dict[str, dict[str, tuple[Any, ...]]] = {
    "llama": {"hidden_act": ("silu",), "attention_bias": (False,), "mlp_bias": (False,)},
    "mistral": {"hidden_act": ("silu",)},
    "qwen2": {"hidden_act": ("silu",)},
    "gpt2": {},
}


def read_config_json(path: str | Path) -> tuple[Path, dict[str, Any]]:
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        cfg = json.loads(file.read_text())
    except FileNotFoundError:
        raise ModelDirError(f"{file}: not found (give a model folder or its config.json)") from None
    except json.JSONDecodeError as e:
        raise ModelDirError(f"{file}: invalid JSON at line {e.lineno}: {e.msg}") from None
    if not isinstance(cfg, dict):
        raise ModelDirError(f"{file}: top level is not a JSON object")
    return file, cfg


def config_kind(file: Path, cfg: dict[str, Any]) -> str:
    """The reader key: "model_type", else the architecture class name's family."""
    kind = cfg.get("model_type")
    if kind is None:
        by_class = {a.architecture: name for name, a in ARCHES.items()} | {"MistralForCausalLM": "mistral"}
        kind = by_class.get((cfg.get("architectures") or [None])[0])
        if kind is None:
            raise ModelDirError(f"{file}: no 'model_type' key and 'architectures' = {cfg.get('architectures')!r} "
                                f"is not one of {', '.join(sorted(by_class))}")
    if kind not in CONFIG_READERS:
        raise ModelDirError(f"{file}: 'model_type' = {kind!r} is not supported; known: {', '.join(CONFIG_READERS)}")
    return kind


def spec_from_hf_config(path: str | Path, name: str = "") -> ModelSpec:
    """A calc ModelSpec of the dense Llama / Mistral / Qwen2 / GPT-2 model that `path` (a folder or its
    config.json) describes. Errors name the file and the key."""
    file, cfg = read_config_json(path)
    kind = config_kind(file, cfg)

    def get(key: str) -> Any:
        if key not in cfg or cfg[key] is None:
            raise ModelDirError(f"{file}: model_type {kind!r} needs key {key!r}, which is missing")
        return cfg[key]

    for key, allowed in ASSUMED[kind].items():
        if cfg.get(key, allowed[0]) not in allowed:
            raise ModelDirError(f"{file}: {key!r} = {cfg[key]!r} is not supported for {kind} "
                                f"(allowed: {', '.join(map(repr, allowed))})")
    fields = CONFIG_READERS[kind](get, cfg)
    return ModelSpec(name=name or file.parent.name, source=str(file), **fields)


def same_shape(a: ModelSpec, b: ModelSpec) -> bool:
    """Equal in every field but the labels (name, source)."""
    label = {"name": "", "source": ""}
    return dataclasses.replace(a, **label) == dataclasses.replace(b, **label)
