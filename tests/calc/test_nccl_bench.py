"""bench/nccl_bench.py on CPU: two gloo processes write a valid results file that calibration can fit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.calc.calibration import load_calibration
from scalelab.core.net import free_port

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "nccl_bench.py"


def _launch(args: list[str], world: int = 2, timeout: float = 120) -> None:
    """What torchrun does, minus its own interpreter start-up: one process per rank with the env:// variables."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1"}
        env.pop("NCCL_NVLS_ENABLE", None)
        procs.append(subprocess.Popen([sys.executable, str(BENCH), *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)


@pytest.mark.slow
def test_gloo_run_writes_valid_results(tmp_path):
    out = tmp_path / "cpu" / "nccl_gloo.json"
    _launch(["--backend", "gloo", "--max-bytes", "1048576", "--warmup", "1", "--iters", "2",
             "--repeats", "2", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["backend"] == "gloo" and doc["world_size"] == 2 and doc["schema"] == "scalelab.nccl_bench/1"
    rows = doc["results"]
    assert {r["collective"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
    sizes = sorted({r["size_bytes"] for r in rows if r["collective"] == "all_reduce"})
    assert sizes == [2**k for k in range(3, 21)]                                # 8 B .. 1 MiB in x2 steps
    for r in rows:
        factor = 1.0 if r["collective"] == "all_reduce" else 0.5               # 2(n-1)/n and (n-1)/n at n = 2
        assert r["algbw_gb_s"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
        assert r["busbw_gb_s"] == pytest.approx(r["algbw_gb_s"] * factor)
        assert r["time_s"] > 0 and len(r["times_s_rank0"]) == 2
    prov = doc["provenance"]
    assert prov["env"]["NCCL_NVLS_ENABLE"] == "0"                            # set by the script itself
    assert prov["command"].startswith("torchrun --nproc_per_node 2 ") and "--backend gloo" in prov["command"]
    assert prov["torch"] and prov["git_sha"]
    fits = load_calibration("cpu", tmp_path)                                  # the fit accepts the file
    assert set(fits) >= {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    assert all(f.alpha_s > 0 and f.busbw_bytes_s > 0 for f in fits.values())
