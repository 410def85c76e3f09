"""Model loading: the offline SmolLM2 GGUF -> cached safetensors folder, and the name-resolution rules."""
from __future__ import annotations

import json
import os

import pytest
import torch

from scalelab.core import gguf_cache, hfmodel

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def smollm2_gguf():
    try:
        return hfmodel.registered_gguf("smollm2-135m-instruct")
    except FileNotFoundError as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {e}")
        pytest.skip(str(e))


@pytest.mark.slow
def test_cached_smollm2_equals_gguf_model(smollm2_gguf, tmp_path, monkeypatch):
    gguf_model, gguf_tok = hfmodel.load_gguf(smollm2_gguf)
    out = tmp_path / "models" / hfmodel.sha256_file(smollm2_gguf)[:16]
    hfmodel.write_plain_folder(gguf_model, gguf_tok, out, {"gguf_file": smollm2_gguf.name})
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert (out / "model.safetensors").stat().st_size > 400e6  # 135M float32 parameters, lm_head tied

    def no_dequantize(*a, **k):
        raise AssertionError("the cached folder should have been used")
    monkeypatch.setattr(gguf_cache, "load_gguf", no_dequantize)
    model, tok = hfmodel.load_causal_lm("smollm2-135m-instruct", dtype="float32", device="cpu", cache_dir=tmp_path)
    assert type(model).__name__ == "LlamaForCausalLM" and getattr(model.config, "quantization_config", None) is None

    messages = [{"role": "user", "content": "What is 12 + 35?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is 12 + 35?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    assert ids["input_ids"][0].tolist() == gguf_tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, gguf_model.eval()(**ids).logits)
        greedy = [model.generate(**ids, max_new_tokens=6, do_sample=False)[0].tolist() for _ in range(2)]
        reference = gguf_model.generate(**ids, max_new_tokens=6, do_sample=False)[0].tolist()
    assert greedy[0] == greedy[1] == reference
    assert tok.decode(greedy[0][ids["input_ids"].shape[1]:]) == "12 + 35"  # then " = 50" (measured)


def test_materialize_rules(tmp_path):
    assert hfmodel.materialize(str(tmp_path)) == str(tmp_path)
    assert hfmodel.materialize("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(FileNotFoundError, match="no such folder"):
        hfmodel.materialize(str(tmp_path / "missing"))


def test_registry_names_the_package_to_install(monkeypatch):
    fake = hfmodel.GgufModel("no-such-dist-xyz", "9.9", "x/model.gguf", "test")
    monkeypatch.setitem(hfmodel.MODEL_REGISTRY, "fake-model", fake)
    with pytest.raises(FileNotFoundError, match=r"no-such-dist-xyz==9\.9"):
        hfmodel.materialize("fake-model")


def test_resolve_dtype():
    assert hfmodel.resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert hfmodel.resolve_dtype("auto", torch.device("cuda")) is torch.bfloat16
    assert hfmodel.resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    with pytest.raises(ValueError, match="float64"):
        hfmodel.resolve_dtype("float64", torch.device("cpu"))


@pytest.mark.slow
def test_a_gguf_is_parsed_once_per_load_and_gives_what_three_parses_gave(smollm2_gguf, monkeypatch):
    """transformers builds a GGUFReader for the tokenizer, the config and the weights; within load_gguf one reader
    serves all three, the weights and vocabulary come out as three fresh readers give them, and the gguf module
    is left as it was."""
    import gguf
    original, built = gguf.GGUFReader, []

    def counting(*a, **k):
        built.append(a[0])
        return original(*a, **k)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    once_model, once_tok = hfmodel.load_gguf(smollm2_gguf)
    assert len(built) == 1 and gguf.GGUFReader is counting
    with monkeypatch.context() as m:  # three readers, as transformers alone builds them
        m.setattr(gguf_cache, "one_gguf_reader", __import__("contextlib").nullcontext)
        thrice_model, thrice_tok = hfmodel.load_gguf(smollm2_gguf)
    assert len(built) == 4
    assert once_tok.get_vocab() == thrice_tok.get_vocab()
    want = thrice_model.state_dict()
    for name, tensor in once_model.state_dict().items():
        assert torch.equal(tensor, want[name]), name
