"""FLOPs per token and memory per GPU against hand-computed cases."""
from __future__ import annotations

import dataclasses

import pytest

from scalelab.calc.flops import (attention_flops_per_context_token, decode_flops_per_token, forward_flops_per_token,
                                 prefill_flops, train_flops_per_token)
from scalelab.calc.memory import (activation_bytes_per_layer, inflight_microbatches, kv_cache_bytes_per_token,
                                  logits_bytes, model_state_bytes)
from scalelab.calc.precision import get_precision
from scalelab.calc.presets import get_model

GPT2 = get_model("gpt2-124m")
N_GPT2 = 123_614_976        # flops params (test_models.test_flops_params_kaplan_convention)


# ---------------------------------------------------------------------------------------------
# FLOPs


def test_train_flops_is_6n_plus_12ltd():
    # PaLM App. B: 6N + 12·L·T·d; GPT-2 124M at T = 1024: 6·123,614,976 + 12·12·1024·768
    assert train_flops_per_token(GPT2, 1024) == 6 * N_GPT2 + 12 * 12 * 1024 * 768 == 854_936_064
    assert forward_flops_per_token(GPT2, 1024) == 854_936_064 / 3


def test_attention_coefficient_is_4ld_for_mha_and_gqa():
    # 2·L·h·(d_qk + d_v) = 4·L·d when h·head_dim = d, whatever the number of KV heads
    m = get_model("llama-3-8b")
    assert attention_flops_per_context_token(m) == 4 * 32 * 4096 == 524_288


def test_forward_without_head_drops_2vd():
    assert forward_flops_per_token(GPT2, 1024, with_head=False) == pytest.approx(
        forward_flops_per_token(GPT2, 1024) - 2 * 50257 * 768)


def test_prefill_counts_the_causal_triangle():
    # P = 3 tokens attend to 1, 2, 3 keys: 2N·3 + c·(1+2+3)
    c = attention_flops_per_context_token(GPT2)
    assert prefill_flops(GPT2, 3) == 2 * N_GPT2 * 3 + c * 6
    assert decode_flops_per_token(GPT2, 100) == 2 * N_GPT2 + c * 100


def test_moe_flops_use_active_experts_only():
    m = get_model("deepseek-v3")
    dense_equiv = dataclasses.replace(m, top_k=m.n_experts)
    assert forward_flops_per_token(m, 1) < forward_flops_per_token(dense_equiv, 1) / 10


# ---------------------------------------------------------------------------------------------
# model states (ZeRO, Rajbhandari et al. 2020 Fig. 1: Psi = 7.5B, N_d = 64, K = 12)


@pytest.mark.parametrize("mode, gb", [("ddp", 120.0), ("zero1", 31.40625), ("zero2", 16.640625), ("fsdp", 1.875)])
def test_zero_figure_1(mode, gb):
    # baseline (2+2+12)Psi = 120 GB; P_os 4Psi + 12Psi/64 = 31.4; P_os+g 2Psi + 14Psi/64 = 16.6; P_os+g+p 16Psi/64 = 1.88
    s = model_state_bytes(7.5e9, get_precision("bf16-mixed"), mode, 64)
    assert s.total / 1e9 == pytest.approx(gb)


def test_amp_precision_is_16_bytes_per_param_too():
    s = model_state_bytes(1e9, get_precision("amp-bf16"), "ddp", 8)
    assert (s.weights, s.grads, s.optimizer) == (4e9, 4e9, 8e9)


# ---------------------------------------------------------------------------------------------
# activations (Korthikanti et al. 2022 Table 2)

# s = 1024, b = 1, h = 768, a = 12: sbh = 786,432 and 5as/h = 5·12·1024/768 = 80
SBH = 1024 * 768


def test_korthikanti_no_parallelism():
    # sbh(34 + 5as/h) = 786,432 · 114 = 89,653,248 bytes
    assert activation_bytes_per_layer(GPT2, 1024, 1, recompute="none", dropout=True) == SBH * 114 == 89_653_248


def test_korthikanti_tensor_parallel():
    # t = 4: sbh(10 + 24/4 + 80/4) = sbh · 36
    assert activation_bytes_per_layer(GPT2, 1024, 1, tp=4, recompute="none", dropout=True) == SBH * 36


def test_korthikanti_sequence_parallel():
    # t = 4 with SP: sbh(34/4 + 80/4) = sbh · 28.5
    assert activation_bytes_per_layer(GPT2, 1024, 1, tp=4, sp=True, recompute="none", dropout=True) == SBH * 28.5


def test_korthikanti_selective_and_full_recompute():
    assert activation_bytes_per_layer(GPT2, 1024, 1, tp=4, sp=True, recompute="selective", dropout=True) == SBH * 34 / 4
    assert activation_bytes_per_layer(GPT2, 1024, 1, tp=4, recompute="full") == 2 * SBH


def test_activations_without_dropout_and_for_swiglu_gqa():
    # no dropout masks: 34 - 2 (two sbh masks); core 2 instead of 5
    assert activation_bytes_per_layer(GPT2, 1024, 1, recompute="selective", dropout=False) == SBH * 32
    # Llama-3-8B: QKV input 2 + norms 4 + MLP input 2 = 8 replicated; Q 2 + K,V 2·(1024/4096) each + O-in 2
    # = 5; SwiGLU 6·14336/4096 = 21 -> 34 sbh
    m = get_model("llama-3-8b")
    assert activation_bytes_per_layer(m, 100, 1, recompute="selective", dropout=False) == 100 * 4096 * 34


def test_pipeline_inflight_microbatches():
    assert inflight_microbatches(4, 8) == 4                      # 1F1B: p in flight
    assert inflight_microbatches(4, 8, vpp=2) == 4 * (1 + 3 / 8)  # interleaved, Korthikanti sec. 4.2.3
    assert inflight_microbatches(4, 2) == 2                      # never more than m


def test_logits_fp32():
    assert logits_bytes(GPT2, 1024, 2, tp=2) == 4 * 1024 * 2 * 50257 / 2


# ---------------------------------------------------------------------------------------------
# KV cache


def test_kv_cache_bytes_per_token():
    assert kv_cache_bytes_per_token(get_model("llama-3-70b")) == 2 * 80 * 8 * 128 * 2 == 327_680
    assert kv_cache_bytes_per_token(get_model("llama-3-8b")) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv_cache_bytes_per_token(get_model("deepseek-v3")) == 61 * (512 + 64) * 2 == 70_272
    assert kv_cache_bytes_per_token(GPT2, dtype_bytes=4) == 2 * 12 * 768 * 4
