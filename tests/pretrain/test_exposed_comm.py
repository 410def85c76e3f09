"""Exposed communication: interval arithmetic and the A/B by hand, and bench/exposed_comm.py on 2 gloo processes,
where the no-sync arm must really skip the gradient all-reduce and calc's prediction is written first."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.pretrain.exposed_comm import ab_exposed, length, overlap, trace_exposed, uncovered, union

REPO = Path(__file__).resolve().parents[2]


def test_union_merges_overlapping_and_touching_intervals():
    assert union([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9)]) == [(0, 4), (5, 7)]
    assert length([(0, 2), (1, 3), (10, 11)]) == 4


def test_uncovered_is_the_part_of_a_no_b_overlaps():
    comm = [(0, 10), (20, 30)]
    compute = [(2, 4), (8, 22), (25, 26)]
    # covered: 2-4 (2), 8-10 (2), 20-22 (2), 25-26 (1) = 7 of 20
    assert overlap(comm, compute) == 7
    assert uncovered(comm, compute) == 13
    assert uncovered(comm, []) == 20 and uncovered([], compute) == 0


def test_ab_exposed_is_the_difference_of_medians_with_paired_spread():
    got = ab_exposed([1.10, 1.30, 1.20], [1.00, 1.05, 1.10])
    assert got.exposed_s == pytest.approx(1.20 - 1.05)
    assert got.spread_s == pytest.approx(0.25 - 0.10)          # diffs 0.10, 0.25, 0.10
    with pytest.raises(ValueError, match="paired repeats"):
        ab_exposed([1.0], [])


def test_trace_exposed_reads_nccl_kernels_against_the_rest():
    def kernel(name: str, ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}
    trace = {"traceEvents": [kernel("ampere_bf16_gemm", 0, 100), kernel("ncclDevKernel_AllReduce_Sum_f32", 60, 80),
                             kernel("triton_poi_fused_add", 150, 20), kernel("ncclDevKernel_AllReduce_Sum_f32", 300, 10),
                             {"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "ts": 0, "dur": 1000}]}
    got = trace_exposed(trace, steps=2)
    # comm 60-140 and 300-310 (90 us); compute covers 60-100 and 150-170 -> exposed 40 + 10 = 50 us over 2 steps
    assert got.collective_s == pytest.approx(90e-6 / 2)
    assert got.exposed_s == pytest.approx(50e-6 / 2)
    assert got.compute_s == pytest.approx(120e-6 / 2)
    assert got.overlapped_share == pytest.approx(1 - 50 / 90)


TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=16", "model.vocab_size=256",
        "model.padded_vocab_size=256", "train.micro_batch_size=2", "train.compile=false", "train.device=\"cpu\""]


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_bench_on_two_gloo_processes(tmp_path, parallel):
    out = tmp_path / parallel
    sets = [a for s in [*TINY, f'train.parallel="{parallel}"'] for a in ("--set", s)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "bench" / "exposed_comm.py"), "--config", str(REPO / "configs/pretrain/tiny-cpu.toml"), *sets,
           "--warmup", "1", "--steps", "2", "--repeats", "2", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    pred = json.loads((out / "predictions.json").read_text())
    assert pred["written_unix"] < (out / "results.json").stat().st_mtime        # predicted before measured
    assert "--gpus 2" in pred["command"] and pred["comm_before_overlap_s"] > 0
    assert res["world_size"] == 2 and res["parallel"] == parallel and res["trace"] is None   # no kernels on CPU
    assert len(res["sync_step_s"]) == len(res["nosync_step_s"]) == 2
    ab = res["ab"]
    assert ab["exposed_s"] == pytest.approx(ab["sync_step_s"] - ab["nosync_step_s"])
    if parallel == "ddp":     # each rank steps on its own batch: equal gradients only if all-reduced
        assert res["grads_agree_across_ranks"] == {"sync": True, "nosync": False}
    else:
        assert res["grads_agree_across_ranks"] == {"sync": None, "nosync": None}
