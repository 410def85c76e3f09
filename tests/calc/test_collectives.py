"""Alpha-beta collective costs, node-aware group links, and the calibration fit."""
from __future__ import annotations

import json

import pytest

from scalelab.calc.calibration import fit_alpha_beta, load_calibration
from scalelab.calc.cluster import group_link, make_cluster
from scalelab.calc.collectives import Link, busbw_bytes_s, collective_time_s, wire_bytes

LINK = Link(100e9, 10e-6)


def test_ring_allreduce_time():
    # 1 GB over 8 ranks at 100 GB/s bus: 2·7/8·1e9/1e11 = 17.5 ms, + 10 µs latency
    assert collective_time_s("all_reduce", 1e9, 8, LINK) == pytest.approx(0.0175 + 10e-6)


@pytest.mark.parametrize("name", ["all_gather", "reduce_scatter", "all_to_all"])
def test_n_minus_1_over_n_collectives(name):
    # 400 MB over 4 ranks at 100 GB/s: 3/4·0.4e9/1e11 = 3 ms
    assert collective_time_s(name, 0.4e9, 4, LINK) == pytest.approx(0.003 + 10e-6)
    assert wire_bytes(name, 0.4e9, 4) == pytest.approx(0.3e9)


def test_group_of_one_is_free():
    assert collective_time_s("all_reduce", 1e9, 1, LINK) == 0.0
    assert wire_bytes("all_reduce", 1e9, 1) == 0.0


def test_busbw_convention_nccl_tests():
    # nccl-tests PERFORMANCE.md: busbw = algbw · 2(n-1)/n for all-reduce; a 2-rank all-reduce has busbw = algbw
    assert busbw_bytes_s("all_reduce", 1e9, 2, 0.01) == pytest.approx(1e11)
    assert busbw_bytes_s("all_reduce", 1e9, 8, 0.01) == pytest.approx(1e11 * 14 / 8)
    assert busbw_bytes_s("all_gather", 1e9, 8, 0.01) == pytest.approx(1e11 * 7 / 8)


def test_group_links_by_placement():
    c = make_cluster("h100-sxm", 64, calibrate=False)
    intra, scope = group_link(c, "all_reduce", 8, 1)                 # TP=8 inside a node
    assert scope == "intra" and intra.bus_bw_bytes_s == 450e9
    dp, scope = group_link(c, "all_reduce", 8, 8)                     # DP across nodes, one rank per node
    assert scope == "inter" and dp.bus_bw_bytes_s == 50e9
    flat, _ = group_link(c, "all_reduce", 64, 1)                     # 8 per node: 8 NICs per ring = 400 GB/s
    assert flat.bus_bw_bytes_s == 400e9
    # 64-way all-to-all, 8 per node: 56/64 of the buffer leaves through one 50 GB/s NIC -> 63/56 · 50 GB/s bus
    a2a, _ = group_link(c, "all_to_all", 64, 1)
    assert a2a.bus_bw_bytes_s == pytest.approx(50e9 * 63 / 56)


def test_overrides_win():
    c = make_cluster("h100-sxm", 8, intra_bw_gb_s=100, latency_us=3, calibrate=False)
    assert c.intra["all_gather"] == Link(100e9, 3e-6, "command-line override")


# ---------------------------------------------------------------------------------------------
# calibration


def test_fit_recovers_alpha_beta_exactly():
    sizes = [8 * 4**k for k in range(14)]
    times = [5e-6 + 2 * (2 - 1) / 2 * s / 300e9 for s in sizes]      # all_reduce, n = 2, 300 GB/s bus
    f = fit_alpha_beta("all_reduce", 2, sizes, times)
    assert f.alpha_s == pytest.approx(5e-6, rel=1e-6)
    assert f.busbw_bytes_s == pytest.approx(300e9, rel=1e-6)
    assert f.max_rel_err < 1e-9


def _bench_doc(backend: str, busbw: float, alpha: float) -> dict:
    rows = [{"collective": c, "size_bytes": s, "time_s": alpha + (1.0 if c == "all_reduce" else 0.5) * s / busbw}
            for c in ("all_reduce", "all_gather") for s in (8, 1024, 2**20, 2**30)]
    return {"backend": backend, "world_size": 2, "results": rows}


def test_calibration_file_becomes_the_h200_default(tmp_path, monkeypatch):
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "nccl_collectives.json").write_text(json.dumps(_bench_doc("nccl", 360e9, 12e-6)))
    monkeypatch.setenv("SCALELAB_RESULTS_DIR", str(tmp_path))
    fits = load_calibration("h200")
    assert fits["all_reduce"].busbw_bytes_s == pytest.approx(360e9)
    assert fits["send_recv"].alpha_s == pytest.approx(12e-6)          # proxied from all_gather
    c = make_cluster("h200", 2)
    assert c.calibrated and c.intra["all_reduce"].bus_bw_bytes_s == pytest.approx(360e9)
    assert c.intra["reduce_scatter"].bus_bw_bytes_s == 450e9          # not measured: table value
    assert not make_cluster("h200", 2, calibrate=False).calibrated


def test_gloo_smoke_file_is_not_a_gpu_calibration(tmp_path):
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "nccl_gloo.json").write_text(json.dumps(_bench_doc("gloo", 1e9, 1e-3)))
    assert load_calibration("h200", tmp_path) == {}
