"""The serving sweep's config: validation errors name the field, row plans, shipped configs, the engine python."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from scalelab.core.config import ConfigError
from scalelab.serve.config import RowPlan, load_serve_config

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "configs" / "serve").glob("*.toml"))
BASE = ["model.path=/m"]


def load(*overrides: str):
    return load_serve_config(None, [*BASE, *overrides])


@pytest.mark.parametrize("override, field", [
    ("sweep.repeats=2", "sweep.repeats"),
    ("sweep.tp=[1, 0]", "sweep.tp[1]"),
    ("sweep.rows=[{tp=2, batch=[1, 0]}]", "sweep.rows[0].batch"),
    ("sweep.rows=[{tp=0, batch=[1]}]", "sweep.rows[0].tp"),
    ("sweep.rows=[{tp=2, batches=[1]}]", "sweep.rows[0]"),
    ("sweep.mode=poisson", "sweep.mode"),
    ("sweep.rates=[2.0, -1.0]", "sweep.rates[1]"),
    ("engine.names=['vllm', 'tgi']", "engine.names[1]"),
    ("engine.extra_flags={max-num-seqs=[1]}", "engine.extra_flags.max-num-seqs"),
    ("engine.env={A=1}", "engine.env.A"),
    ("engine.gpu_memory_utilization=1.5", "engine.gpu_memory_utilization"),
    ("engine.url=localhost:8000", "engine.url"),
    ("workload.source=alpaca", "workload.source"),
    ("workload.output_min=600", "workload.output_min"),
    ("slo.itl_s=0", "slo.itl_s"),
    ("cost.hardware=h300", "cost.hardware"),
    ("model.dtype=int4", "model.dtype"),
    ("search.lo_rps=20", "search.lo_rps"),
    ("search.floor_rps=1000", "search.floor_rps"),
    ("search.ceiling_rps=5", "search.ceiling_rps"),
    ("sweep.arrival_cv=-1", "sweep.arrival_cv"),
    ("cost.api_models=['']", "cost.api_models[0]"),
    ("sweep.bach=[1]", "sweep.bach"),
])
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=re.escape(f"'{field}'")):
        load(override)


def test_model_needs_a_path_or_a_dummy_shape():
    with pytest.raises(ConfigError, match="'model.path'"):
        load_serve_config(None, [])
    with pytest.raises(ConfigError, match="'model.shape'"):
        load_serve_config(None, ["model.make_dummy_dir=true"])


def test_custom_shape_errors_name_the_custom_field_and_build_the_spec():
    with pytest.raises(ConfigError, match="'model.custom.d_modl'"):
        load("model.shape=custom", "model.custom={n_layers=2, d_modl=64}")
    cfg = load("model.shape=custom", "model.custom={layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=1000}")
    spec = cfg.model.custom_spec()
    assert (spec.n_layers, spec.d_model, spec.n_heads, spec.n_kv_heads, spec.d_ff, spec.vocab_size) == \
        (2, 64, 4, 2, 128, 1000)


def test_rows_tables_merge_per_tp_sorted_and_deduplicated():
    cfg = load("sweep.rows=[{tp=4, batch=[64, 1]}, {tp=2, batch=[16, 1, 16]}, {tp=4, batch=[16]}]")
    assert cfg.sweep.plans() == [RowPlan(2, (1, 16)), RowPlan(4, (1, 16, 64))]
    cfg = load("sweep.tp=[2, 1]", "sweep.batch=[8, 1]")  # no rows: the product
    assert cfg.sweep.plans() == [RowPlan(1, (1, 8)), RowPlan(2, (1, 8))]


def test_one_engine_with_an_existing_url():
    with pytest.raises(ConfigError, match="'engine.names'"):
        load("engine.url=http://127.0.0.1:1", "engine.names=['vllm', 'sglang']")


def test_engine_python_from_its_environment_variable(monkeypatch):
    cfg = load("engine.python=.venv-x/bin/python", "engine.python_env=SCALELAB_TEST_PY")
    monkeypatch.delenv("SCALELAB_TEST_PY", raising=False)
    assert cfg.engine.resolved_python() == str(Path(".venv-x/bin/python").absolute())
    monkeypatch.setenv("SCALELAB_TEST_PY", "/opt/vllm/bin/python")
    assert cfg.engine.resolved_python() == "/opt/vllm/bin/python"
    assert load().engine.resolved_python() == sys.executable


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_configs_load(path):
    cfg = load_serve_config(path)
    assert cfg.run.name == path.stem  # each writes its own run folder
    no_cache = "disable-radix-cache" if cfg.engine.names == ["sglang"] else "no-enable-prefix-caching"
    assert cfg.sweep.repeats >= 3 and cfg.engine.extra_flags.get(no_cache) is True


def test_full_scale_configs_have_the_published_rows():
    names = [f"{m}-{h}" for m in ("qwen2.5-72b", "llama-3.1-70b") for h in ("h100", "h200")]
    assert {p.stem for p in SHIPPED} >= {*names, "h200-7b-tp1-tp2", "h200-72b-tp2", "tiny-cpu"}
    for name in names:
        cfg = load_serve_config(REPO / "configs" / "serve" / f"{name}.toml")
        assert cfg.sweep.plans() == [RowPlan(1, (1,)), RowPlan(2, (1, 16)), RowPlan(4, (1, 16, 64)),
                                     RowPlan(8, (1,))]
        assert cfg.cost.hardware == ("h100-sxm" if name.endswith("h100") else "h200")


def test_arrival_cv_sets_the_gamma_shape_and_excludes_burstiness():
    from scalelab.serve.sweep import plan_points
    assert load().sweep.gamma_shape == 1.0                                     # Poisson by default
    assert load("sweep.burstiness=0.5").sweep.gamma_shape == 0.5
    cfg = load("sweep.mode=rate", "sweep.rates=[2.0]", "sweep.arrival_cv=2.0")
    assert cfg.sweep.gamma_shape == pytest.approx(0.25)                        # k = 1 / CV^2
    (point,) = plan_points(cfg)
    assert point.load == {"mode": "rate", "rate_rps": 2.0, "arrivals": "gamma", "gamma_shape": pytest.approx(0.25),
                          "cv": pytest.approx(2.0)}
    with pytest.raises(ConfigError, match="'sweep.arrival_cv'.*both set the gaps' gamma shape"):
        load("sweep.arrival_cv=2.0", "sweep.burstiness=0.5")


def test_eos_choice_reaches_the_client_and_api_models_default():
    from scalelab.core.engines import RunningServer
    from scalelab.serve.client import payload
    from scalelab.serve.sweep import Setup, client_config
    from scalelab.serve.workload import Request
    for flag, sent in (("true", True), ("false", None)):
        cfg = load(f"workload.ignore_eos={flag}")
        setup = Setup(cfg, None, None, "/m", None, None)
        client = client_config(setup, RunningServer(url="http://127.0.0.1:1"))
        body = payload(client, Request(0, "hi", 1, 7))
        assert body["max_tokens"] == 7 and body.get("ignore_eos") is sent      # the trace length either way
    assert load().cost.api_models == ["gpt-4o-mini", "together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo"]
