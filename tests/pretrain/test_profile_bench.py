"""bench/gpu_pretrain_profile.py's trace reading (the GPU run itself is a benchmark): busy time is the union of
kernel intervals, kernels are binned by name, per-step figures divide by the profiled steps."""
from __future__ import annotations

import pytest

from tests.bench_script import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("gpu_pretrain_profile")


def kernel(name: str, ts: float, dur: float) -> dict:
    return {"cat": "kernel", "ph": "X", "name": name, "ts": ts, "dur": dur}


def test_union_counts_overlap_once(bench):
    assert bench.union_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17  # [0,12) + [20,25)
    assert bench.union_us([]) == 0


@pytest.mark.parametrize("name, kind", [
    ("nvjet_qqtst_128x256_64x4_2x1_v_bz_coopA_TNT", "gemm"),
    ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
    ("triton_per_fused_native_layer_norm_0", "triton"),
    ("triton_poi_fused__scaled_mm__to_copy_add_clamp_gelu_mul_reciprocal_t_view_22", "triton"),  # not a GEMM
    ("_ce_rows", "loss kernel"),
    ("Memcpy HtoD (Pageable -> Device)", "copy"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"),
    ("void at::native::vectorized_elementwise_kernel<4>", "other"),
])
def test_kernel_kinds(bench, name, kind):
    assert bench.kind_of(name) == kind


def test_summary_per_step(bench):
    trace = {"traceEvents": [
        kernel("nvjet_hsh_gemm", 0, 300), kernel("triton_poi_fused_add_0", 300, 100),
        kernel("nvjet_hsh_gemm", 1000, 300), kernel("triton_poi_fused_add_0", 1250, 100),  # overlaps 50 us
        {"cat": "cpu_op", "ph": "X", "name": "aten::mm", "ts": 0, "dur": 2000},  # host events are not GPU time
    ]}
    s = bench.summarize(trace, wall_s=0.002, steps=2, top=5)
    assert s["gpu_busy_ms_per_step"] == pytest.approx((400 + 350) / 1000 / 2)
    assert s["gpu_busy_fraction"] == pytest.approx(750 / 2000)
    assert s["ms_per_step_by_kind"] == pytest.approx({"gemm": 0.3, "triton": 0.1})
    assert s["kernels_per_step"] == 2 and s["wall_ms_per_step"] == pytest.approx(1.0)
    assert [k["name"] for k in s["top_kernels"]] == ["nvjet_hsh_gemm", "triton_poi_fused_add_0"]
    assert s["top_kernels"][0]["calls_per_step"] == 1


def test_summary_reads_each_kernels_launch_width(bench):
    launched = {**kernel("_gelu_rows", 0, 10), "args": {"block": [512, 1, 1], "grid": [262144, 1, 1]}}
    s = bench.summarize({"traceEvents": [launched, kernel("x", 10, 5)]}, wall_s=1e-4, steps=1, top=5)
    assert [(k["name"], k["threads_per_block"]) for k in s["top_kernels"]] == [("_gelu_rows", 512), ("x", None)]


def test_idle_gaps_are_named_by_the_gpu_events_around_them(bench):
    def event(cat: str, name: str, ts: float, dur: float) -> dict:
        return {"cat": cat, "ph": "X", "name": name, "ts": ts, "dur": dur}
    trace = {"traceEvents": [
        event("kernel", "nvjet_a", 0, 100),
        event("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 700, 10),      # 600 us before the batch copy
        event("kernel", "triton_b", 1010, 100),                                 # 300 us after it
        event("kernel", "triton_c", 1115, 100),                                 # a 5 us launch gap
        event("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 1215, 1),
        event("kernel", "multi_tensor_apply", 1716, 50),                        # 500 us after a host sync
        event("kernel", "inside", 1720, 10),                                    # overlapped: no gap
        event("kernel", "late", 1866, 10),                                      # 100 us: other
        {"cat": "cpu_op", "ph": "X", "name": "aten::copy_", "ts": 0, "dur": 5000},  # host events: not GPU activity
    ]}
    idle = bench.idle_by_cause(trace, steps=2)
    assert idle == pytest.approx({"before a batch copy": 0.3, "after a batch copy": 0.15, "after a host sync": 0.25,
                                  "launch gaps": 0.0025, "other": 0.05})
    assert list(idle) == ["before a batch copy", "after a host sync", "after a batch copy", "other", "launch gaps"]
