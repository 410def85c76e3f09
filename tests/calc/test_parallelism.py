"""Per-dimension communication volumes and the step estimate, against hand-computed cases and invariants."""
from __future__ import annotations

import dataclasses
import math

import pytest

from scalelab.calc.cluster import make_cluster
from scalelab.calc.layout import Batch, Layout, TrainSetup
from scalelab.calc.parallelism import (bubble_fraction, cp_terms, dp_terms, ep_terms, pp_terms, tp_terms)
from scalelab.calc.plan import compute_times, estimate_step, exposed_times
from scalelab.calc.precision import get_precision
from scalelab.calc.presets import get_model

P_GPT2 = 124_439_808


def make(model: str = "gpt2-124m", micro: int = 1, seq: int = 1024, global_batch: int | None = None,
         precision: str = "amp-bf16", gpu: str = "h100-sxm", **kw) -> TrainSetup:
    lay = Layout(**kw)
    batch = Batch(micro, seq, global_batch or micro * lay.dp)
    return TrainSetup(get_model(model), lay, batch, make_cluster(gpu, lay.world, calibrate=False),
                      get_precision(precision))


# ---------------------------------------------------------------------------------------------
# pipeline bubble (Narayanan et al. 2021 sec. 2.2)


def test_bubble_1f1b_and_interleaved():
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(4, 8, vpp=2) == pytest.approx(3 / 19)
    assert bubble_fraction(1, 8) == 0.0


# ---------------------------------------------------------------------------------------------
# DP


def test_ddp_allreduce_volume():
    # fp32 grads of 124,439,808 params = 497,759,232 B in ceil(497,759,232 / 25 MiB) = 19 buckets;
    # a 2-rank ring all-reduce sends 2·(1/2)·S = S bytes per GPU
    (t,) = dp_terms(make(dp=2))
    assert t.collective == "all_reduce" and t.calls_per_step == 19
    assert t.bytes_per_call * 19 == pytest.approx(P_GPT2 * 4)
    assert t.bytes_per_gpu_step == pytest.approx(P_GPT2 * 4)


def test_fsdp_is_one_and_a_half_ddp():
    # ZeRO sec. 7.2.2: stage 3 moves 3 Psi (gather fwd, gather bwd, reduce-scatter) vs 2 Psi for all-reduce;
    # a bare layer stack has no root unit that skips the backward gather
    ddp = dataclasses.replace(make(dp=4), with_head=False)
    fsdp = dataclasses.replace(make(dp=4, dp_mode="fsdp"), with_head=False)
    v = lambda s: sum(t.bytes_per_gpu_step for t in dp_terms(s))      # noqa: E731
    assert v(fsdp) == pytest.approx(1.5 * v(ddp))


def test_fsdp_root_not_regathered_and_reduce_once_per_step():
    s = make(dp=2, dp_mode="fsdp", micro=1, global_batch=8)           # m = 4 micro-batches
    fwd, bwd, rs, root_ag, root_rs = dp_terms(s)
    root = 38_597_376 + 786_432                                       # wte (tied head) + wpe
    block = (P_GPT2 - root) / 12
    assert fwd.calls_per_step == bwd.calls_per_step == 4 * 12 and rs.calls_per_step == 12
    assert fwd.bytes_per_call == bwd.bytes_per_call == pytest.approx(block * 4)
    assert (root_ag.calls_per_step, root_rs.calls_per_step) == (4, 1)
    assert root_ag.bytes_per_call == pytest.approx(root * 4) and root_ag.window == "none"
    assert rs.bytes_per_gpu_step + root_rs.bytes_per_gpu_step == pytest.approx(P_GPT2 * 4 / 2)


def test_no_dp_traffic_for_one_replica_or_forward_only():
    assert dp_terms(make()) == []
    assert dp_terms(dataclasses.replace(make(dp=2), forward_only=True)) == []


# ---------------------------------------------------------------------------------------------
# TP / SP / PP / CP / EP


def test_tp_allreduce_per_layer():
    # b·s·h·2 = 1·1024·768·2 = 1,572,864 B; 4 per layer (2 fwd + 2 bwd) x 12 layers = 48 calls;
    # a 2-rank all-reduce sends S per call
    (t,) = tp_terms(make(tp=2))
    assert (t.bytes_per_call, t.calls_per_step) == (1_572_864, 48)
    assert t.bytes_per_gpu_step == 48 * 1_572_864
    assert t.window == "none"


def test_tp1_has_no_tp_comm_and_sp_keeps_volume():
    assert tp_terms(make()) == []
    ar = sum(t.bytes_per_gpu_step for t in tp_terms(make(tp=4)))
    ag_rs = sum(t.bytes_per_gpu_step for t in tp_terms(make(tp=4, sp=True)))
    assert ag_rs == pytest.approx(ar)       # AR = RS + AG (Korthikanti et al. 2022 sec. 4.2.2)


def test_tp_forward_only_and_full_recompute():
    assert tp_terms(dataclasses.replace(make(tp=2), forward_only=True))[0].calls_per_step == 24
    assert tp_terms(make(tp=2, recompute="full"))[0].calls_per_step == 72


def test_pp_sends():
    # Llama-3-8B, TP=2, PP=4, m = 8: b·s·h·2/t = 2048·4096·2/2 = 8 MiB per send; 2 per micro-batch, x v
    (t,) = pp_terms(make("llama-3-8b", micro=1, seq=2048, global_batch=8, tp=2, pp=4, vpp=2))
    assert t.bytes_per_call == 2048 * 4096
    assert t.calls_per_step == 2 * 8 * 2


def test_cp_ring_attention():
    # Llama-3-8B CP=4, s = 8192: each block = 2048 tokens x K,V (2·8·128) x 2 B = 8 MiB;
    # per layer (cp-1) forward + 2(cp-1) backward = 9 sends; 32 layers
    (t,) = cp_terms(make("llama-3-8b", micro=1, seq=8192, cp=4))
    assert t.bytes_per_call == 2048 * 2 * 8 * 128 * 2
    assert t.calls_per_step == 9 * 32
    assert t.window == "attn"


def test_ep_all_to_all():
    # DeepSeek-V3 EP=64, s = 4096: 4096 tokens x top-8 x 7168 x 2 B per call; 4 per MoE layer (58 + ... here PP=1)
    s = make("deepseek-v3", micro=1, seq=4096, dp=64, ep=64, precision="bf16-mixed")
    (t,) = ep_terms(s)
    assert t.bytes_per_call == 4096 * 8 * 7168 * 2 == 469_762_048
    assert t.calls_per_step == 4 * 58
    assert t.scope == "inter"


def test_per_token_times_tokens_is_per_step():
    s = make("llama-3-8b", micro=2, seq=4096, global_batch=64, tp=2, pp=2, dp=2, cp=2, sp=True, dp_mode="zero1",
             precision="bf16-mixed")
    e = estimate_step(s)
    for t in e.terms:
        assert t.bytes_per_token * e.tokens_per_step == pytest.approx(t.term.bytes_per_gpu_step * s.layout.world)
    assert {t.term.dim for t in e.terms} == {"DP", "TP", "PP", "CP"}


# ---------------------------------------------------------------------------------------------
# step estimate


def test_single_gpu_step_is_compute_at_stated_efficiency():
    # 854,936,064 FLOP/token x 1024 tokens / (989.4 TFLOP/s x 0.5)
    e = estimate_step(make(), compute_eff=0.5)
    assert e.step_s == pytest.approx(854_936_064 * 1024 / (989.4e12 * 0.5))
    assert e.mfu == pytest.approx(0.5) and e.mfu_bound == pytest.approx(1.0)
    assert e.terms == () and "Compute is the whole step" in e.dominant


def test_exposed_time_shares_a_window():
    from scalelab.calc.parallelism import CommTerm
    term = lambda t, floor: CommTerm("DP", "x", "all_reduce", 2, "intra", 1, 1, 1, t, "bwd", floor, 1, 1)  # noqa: E731
    c = compute_times(make(), 1.0)
    window = c.bwd_s
    # two terms of 0.6·window each with 0.1·window unhidden: exposed = 0.2 + (1.2 - 0.2 - 1.0) = 0.2 windows
    out = exposed_times([term(0.6 * window, 0.1 * window)] * 2, c, 1)
    assert sum(out) == pytest.approx(0.2 * window)


def test_pipeline_step_includes_bubble():
    s = make("llama-3-8b", micro=1, seq=2048, global_batch=8, pp=4, precision="bf16-mixed")
    e = estimate_step(s)
    pp_exposed = sum(t.exposed_s for t in e.terms if t.term.dim == "PP")
    # step = compute·(1 + (p-1)/m) + PP sends; bubble share (p-1)/(m+p-1) = 3/11
    assert e.step_s == pytest.approx(e.compute.total_s * (1 + 3 / 8) + pp_exposed)
    assert e.bubble_fraction == pytest.approx(3 / 11)


def test_tp_over_pcie_dominates():
    # L40S has no NVLink: 128 all-reduces of 33.5 MB at 32 GB/s (~0.23 s) outweigh ~0.13 s of matmuls
    s = make("llama-3-8b", micro=1, seq=4096, tp=8, precision="bf16-mixed", gpu="l40s")
    e = estimate_step(s)
    assert e.dominant.startswith("TP communication dominates")
    assert e.mfu < e.mfu_bound < 1


def test_memory_fits_flags():
    assert estimate_step(make(micro=8, dp=8, dp_mode="fsdp")).memory.fits
    big = estimate_step(make("llama-3-70b", micro=1, seq=4096, dp=8, precision="bf16-mixed"))
    assert not big.memory.fits and math.isclose(big.memory.weights_bytes, 70_553_706_496 * 2)


def test_invalid_layout_is_reported():
    with pytest.raises(ValueError, match="ep=3 must divide"):
        estimate_step(make("deepseek-v3", dp=4, ep=3))
