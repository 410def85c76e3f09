"""The won't-fit pre-check: hand-computed bytes for a toy model, and the published Qwen2.5 shapes on H200."""
from __future__ import annotations

import pytest

from scalelab.calc.models import ModelSpec
from scalelab.calc.presets import get_model
from scalelab.serve.fit import (
    ENGINE_LIMITS, GIB, EngineLimits, check_fit, head_split_error, instance_kv_bytes_per_token, kv_capacity_tokens,
    reserve_bytes_per_gpu, weights_bytes,
)

# 2 layers, d=64, 4 query heads of 16, 2 KV heads, SwiGLU 128, vocab 100, untied head, no biases, RMSNorm
TOY = ModelSpec("toy", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=100)
LIMITS = EngineLimits(max_num_batched_tokens=16, max_num_seqs=4, source="test")
# params: embedding 100*64 = 6400; attention/layer 64*(64 + 2*32) + 64*64 = 12288, x2 = 24576;
# MLP/layer 3*64*128 = 24576, x2 = 49152; norms (2*2 + 1)*64 = 320; head 6400 -> 86848 params = 173696 bytes
TOY_WEIGHTS = 173_696.0
# KV/token: 2 layers x (K + V = 2 x 2 heads x 16) x 2 bytes = 256 bytes
TOY_KV = 256.0
# reserve/GPU at TP=1: 1 GiB + 16 tokens x 2 B x (2*64 + (64 + 2*32) + 3*128 = 640) + 4 x 100 x 4 B x 2
TOY_RESERVE_TP1 = GIB + 16 * 2 * 640 + 4 * 100 * 4 * 2


def test_toy_bytes_by_hand():
    assert weights_bytes(TOY) == TOY_WEIGHTS
    assert instance_kv_bytes_per_token(TOY, 1) == TOY_KV
    assert instance_kv_bytes_per_token(TOY, 2) == TOY_KV          # one KV head per GPU
    assert instance_kv_bytes_per_token(TOY, 4) == 2 * TOY_KV      # 4 GPUs, 2 KV heads: each head stored twice
    assert reserve_bytes_per_gpu(TOY, 1, LIMITS) == TOY_RESERVE_TP1
    # TP=2: 16 x 2 x (128 + 128/2 + 384/2 = 384) + the same sampler buffers
    assert reserve_bytes_per_gpu(TOY, 2, LIMITS) == GIB + 16 * 2 * 384 + 3200


def test_toy_fit_boundary_and_capacity():
    need = TOY_WEIGHTS + 1000 * TOY_KV + TOY_RESERVE_TP1
    cpu_bytes = 24 * GIB                                           # core.hardware "cpu": 24 GiB
    tight = check_fit(TOY, "cpu", 1, 0.04, 1000, LIMITS)           # 0.96 GiB < 1 GiB of reserve alone
    assert not tight.fits and tight.need_bytes == need and tight.have_bytes == pytest.approx(0.04 * cpu_bytes)
    ok = check_fit(TOY, "cpu", 1, 0.05, 1000, LIMITS)
    assert ok.fits and ok.need_bytes == need
    free = 0.05 * cpu_bytes - TOY_WEIGHTS - TOY_RESERVE_TP1
    assert kv_capacity_tokens(TOY, "cpu", 1, 0.05, LIMITS) == pytest.approx(free / TOY_KV)
    assert kv_capacity_tokens(TOY, "cpu", 1, 0.04, LIMITS) == 0.0


def test_tp_must_split_the_heads():
    assert "4 attention heads" in head_split_error(TOY, 3)
    assert head_split_error(TOY, 4) == ""                          # 2 KV heads replicated over 4 GPUs
    assert "4 attention heads" in head_split_error(TOY, 8)
    odd_kv = ModelSpec("odd", 2, 96, 6, 3, 128, 100)
    assert "3 KV heads" in head_split_error(odd_kv, 2)             # 6 % 2 == 0 but 3 KV heads split neither way
    r = check_fit(get_model("qwen2.5-7b"), "h200", 8, 0.9, 2048)
    assert not r.fits and "28 attention heads" in r.reason


def test_qwen72b_needs_two_h200():
    m = get_model("qwen2.5-72b")
    one = check_fit(m, "h200", 1, 0.9, 4096)
    # 72,706,203,648 params x 2 B = 135.4 GiB > 1 x 131.3 GiB (141e9 B) x 0.9 = 118.2 GiB
    assert not one.fits
    assert "135.4 GiB of weights" in one.reason and "1 x 131.3 GiB" in one.reason and "118.2 GiB" in one.reason
    two = check_fit(m, "h200", 2, 0.9, 4096)
    assert two.fits and two.have_bytes == pytest.approx(2 * 141e9 * 0.9)
    # 4096 tokens x 80 layers x 2 x 8 heads x 128 x 2 B = 1.25 GiB of KV
    vllm = ENGINE_LIMITS["vllm"]
    assert two.need_bytes - weights_bytes(m) - 2 * reserve_bytes_per_gpu(m, 2, vllm) == pytest.approx(4096 * 327_680)


def test_launch_flags_set_the_limits_the_model_uses():
    from scalelab.serve.fit import ENGINE_LIMITS, limits_for
    assert limits_for("vllm") is ENGINE_LIMITS["vllm"] and limits_for("vllm").mixed_prefill
    v = limits_for("vllm", {"max-num-seqs": 256, "max_num_batched_tokens": 2048, "no-enable-prefix-caching": True})
    assert (v.max_num_seqs, v.max_num_batched_tokens, v.mixed_prefill) == (256, 2048, True)
    assert "launch flags: max_num_batched_tokens=2048, max_num_seqs=256" in v.source
    s = limits_for("sglang", {"max-running-requests": 256, "disable-radix-cache": True})
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.mixed_prefill) == (256, 8192, False)
    m = limits_for("sglang", {"enable-mixed-chunk": True, "chunked-prefill-size": 4096})
    assert (m.max_num_seqs, m.max_num_batched_tokens, m.mixed_prefill) == (1024, 4096, True)
    assert limits_for("sglang", {"enable-mixed-chunk": False}).mixed_prefill is False
    assert limits_for("vllm", {"enable-mixed-chunk": True}) is ENGINE_LIMITS["vllm"]   # not vLLM's flag
