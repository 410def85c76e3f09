"""Our GPT == HF GPT2LMHeadModel on the same weights (random init from a config: nothing downloaded)."""
from __future__ import annotations

import pytest
import torch

from scalelab.pretrain.config import ModelConfig
from scalelab.pretrain.parity import TOLERANCES, build_pair, measure_parity, random_tokens, run_parity
from scalelab.pretrain.train_gpt import GPT
from scalelab.pretrain.weights_map import (GPT2MappingError, check_gpt2_expressible, from_hf_state_dict,
                                           to_hf_state_dict)

SMALL = ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=32)
GPT2_124M = ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_small_model_matches_hf(dtype):
    r = run_parity(SMALL, dtype=dtype, seed=3)
    assert r.passed, r
    assert r.max_abs_logit > 0.1  # the logits compared are not all ~0 (which would make any diff tiny)
    assert (r.batch, r.seq_len) == (2, 32)
    if dtype == "float64":  # fp64 agreement ~1e-15 shows the fp32 residue is rounding, not a mapping slip
        assert r.max_abs_logits_diff < 1e-12


def test_gpt2_124m_shape_matches_hf_fp32():
    r = run_parity(GPT2_124M, dtype="float32", seed=0, batch=1, seq_len=16)
    assert r.passed, r
    assert r.max_abs_logits_diff <= TOLERANCES["float32"][0]


def test_perturbed_weight_fails_parity():
    ours, hf = build_pair(SMALL, seed=5)
    with torch.no_grad():
        ours.transformer.h[1].mlp.c_fc.weight[0, 0] += 0.05  # one weight of 2 x 64 x 256
    r = measure_parity(ours, hf, random_tokens(SMALL, 2, 32, seed=6))
    assert not r.passed
    assert r.max_abs_logits_diff > 10 * r.logits_tolerance


def test_mapping_round_trips_and_pads_vocab():
    torch.manual_seed(0)
    ours = GPT(SMALL)
    hf_sd = to_hf_state_dict(ours, SMALL)
    assert "lm_head.weight" not in hf_sd
    assert hf_sd["transformer.wte.weight"].shape == (50257, 64)           # padded rows sliced off
    assert hf_sd["transformer.h.0.attn.c_attn.weight"].shape == (64, 192)  # Conv1D [in, out]
    back = from_hf_state_dict(hf_sd, SMALL)
    assert back["transformer.wte.weight"].shape == (SMALL.padded_vocab_size, 64)
    assert torch.equal(back["transformer.wte.weight"][50257:], torch.zeros(SMALL.padded_vocab_size - 50257, 64))
    for name, tensor in ours.state_dict().items():
        if name == "lm_head.weight":
            continue
        n = tensor.shape[0] if name != "transformer.wte.weight" else 50257
        assert torch.equal(back[name][:n], tensor[:n]), name


@pytest.mark.parametrize("field,value,needle", [("bias", False, "model.bias"),
                                                ("vocab_size", 32000, "model.vocab_size"),
                                                ("rope_theta", 1e4, "model.rope_theta")])
def test_inexpressible_configs_are_refused(field, value, needle):
    cfg = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 32, "vocab_size": 50257,
           "padded_vocab_size": 50304, "bias": True, "dropout": 0.0, field: value}
    with pytest.raises(GPT2MappingError, match=needle):
        check_gpt2_expressible(cfg)
