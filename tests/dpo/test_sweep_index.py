"""sweep.json: one row per run across invocations into the same sweep folder, each naming its run's origin."""
from __future__ import annotations

import json

from scalelab.core.jsonio import read_json, write_json
from scalelab.dpo import run as dpo_run
from scalelab.dpo.config import load_dpo_config


def test_a_second_invocation_adds_its_rows_and_reruns_replace_theirs(tmp_path, monkeypatch):
    def fake_run(cfg):
        write_json(cfg.run_dir / "provenance.json", {"git_sha": "abc", "command": f"train {cfg.run.name}"})
        return {"loss_last": cfg.train.beta, "predictions": {"dropped": True}}

    monkeypatch.setattr(dpo_run, "run_dpo", fake_run)
    monkeypatch.setattr("scalelab.dpo.sweep_report.write_sweep_report", lambda path: path / "REPORT.md")
    cfg = load_dpo_config(None, [f"run.out_dir={json.dumps(str(tmp_path))}", "data.source='pairs'",
                                 "data.path='x.jsonl'"])
    dpo_run.run_sweep(cfg, [0.05, 0.1], ["dpo"], "s")
    dpo_run.run_sweep(cfg, [0.1], ["ipo"], "s")
    dpo_run.run_sweep(cfg, [0.1], ["dpo"], "s")   # a rerun of one run: its row is replaced, not doubled
    runs = read_json(tmp_path / "s" / "sweep.json")["runs"]
    assert [r["run"] for r in runs] == ["dpo-beta0.05", "ipo-beta0.1", "dpo-beta0.1"]
    assert runs[1]["provenance"] == {"git_sha": "abc", "command": "train ipo-beta0.1", "source": "provenance.json"}
    assert runs[0]["loss_last"] == 0.05 and all("predictions" not in r for r in runs)


def test_skip_trained_keeps_finished_runs_and_trains_the_rest(tmp_path, monkeypatch):
    trained_now = []

    def fake_run(cfg):
        trained_now.append(cfg.run.name)
        (cfg.run_dir / "adapter").mkdir(parents=True, exist_ok=True)
        (cfg.run_dir / "adapter" / "adapter_model.safetensors").write_bytes(b"w")
        write_json(cfg.run_dir / "results.json", {"loss_last": cfg.train.beta})
        return {"loss_last": cfg.train.beta}

    monkeypatch.setattr(dpo_run, "run_dpo", fake_run)
    monkeypatch.setattr("scalelab.dpo.sweep_report.write_sweep_report", lambda path: path / "REPORT.md")
    cfg = load_dpo_config(None, [f"run.out_dir={json.dumps(str(tmp_path))}", "data.source='pairs'",
                                 "data.path='x.jsonl'", "sweep.orpo_lambdas=[0.1]", "sweep.orpo_learning_rate=8e-6"])
    configs = dpo_run.planned_configs(cfg, "s")
    assert [(c.run.name, c.train.learning_rate) for c in configs][-1] == ("orpo-beta0.1", 8e-6)
    dpo_run.run_configs(cfg, configs[:2], "s")
    (tmp_path / "s" / "dpo-beta0.1" / "adapter" / "adapter_model.safetensors").unlink()   # came back without weights
    rows = dpo_run.run_configs(cfg, configs, "s", skip_trained=True)
    assert trained_now == ["dpo-beta0.05", "dpo-beta0.1", "dpo-beta0.1", "dpo-beta0.3", "orpo-beta0.1"]
    assert [r["run"] for r in rows] == ["dpo-beta0.05", "dpo-beta0.1", "dpo-beta0.3", "orpo-beta0.1"]
    assert rows[0]["loss_last"] == 0.05                       # the skipped run's row comes from its results.json
