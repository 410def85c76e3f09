"""Studies of one config: resumable variants (finished ones skipped), the staleness ablation and the seeds study
end to end on the tiny model, and the across-seed aggregation by hand."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from scalelab.core.rundir import RunDir
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.seeds import aggregate, seeds_study
from scalelab.grpo.stalestudy import staleness_study, staleness_variants
from scalelab.grpo.study import Variant, run_variants
from scalelab.grpo.train import train
from tests.grpo.tiny import tiny_parts

BASE = ["train.device=cpu", "data.task_options={digits = 1}", "data.limit=32", "data.prompts_per_step=2",
        "rollout.group_size=4", "rollout.max_new_tokens=6", "optim.micro_batch_size=8", "model.lora.enabled=false",
        "optim.lr=5e-3", "train.max_steps=3", "train.checkpoint_every=0", "eval.limit=4",
        "eval.bootstrap_resamples=200", "data.rewards=['length_aware', 'correctness']",
        "data.reward_weights=[1.0, 0.0]",
        "data.reward_options={length_aware = {exploit = 'length', target_chars = 12}}"]


class Counting:
    """A trainer that records which runs it trained (the tiny model stands in for cfg.model)."""

    def __init__(self):
        self.trained: list[str] = []

    def __call__(self, cfg: GrpoConfig) -> dict:
        self.trained.append(cfg.run.name)
        return train(cfg, tiny_parts(cfg, eos_bias=2.0), log=lambda s: None)


def overrides(tmp_path, name: str = "study") -> list[str]:
    return [*BASE, f"run.out_dir={tmp_path}", f"run.name={name}"]


def test_finished_variants_are_skipped_and_unfinished_ones_resume(tmp_path):
    variants = [Variant("a", ("train.seed=1",)), Variant("b", ("train.seed=2",))]
    first = Counting()
    runs = run_variants(None, overrides(tmp_path), variants, trainer=first, log=lambda s: None)
    assert first.trained == ["a", "b"] and [r.run_dir for r in runs] == [tmp_path / "study" / "a",
                                                                         tmp_path / "study" / "b"]
    (tmp_path / "study" / "b" / "results.json").unlink()  # b was interrupted before its end
    again = Counting()
    runs = run_variants(None, overrides(tmp_path), variants, trainer=again, log=lambda s: None)
    assert again.trained == ["b"] and [r.skipped for r in runs] == [True, False]
    assert (tmp_path / "study" / "a" / "REPORT.md").is_file()
    with pytest.raises(ValueError, match="distinct names"):
        run_variants(None, overrides(tmp_path), [variants[0], variants[0]], trainer=again)


def test_the_correction_only_for_the_listed_staleness():
    names = [v.name for v in staleness_variants([0, 1, 2, 4, 8], is_correction=[4, 8])]
    assert names == ["k0", "k1", "k2", "k4", "k8", "k4-is", "k8-is"]
    assert [v.name for v in staleness_variants([0, 4], is_correction=[0])] == ["k0", "k4"]  # k = 0 has none


def test_staleness_variants_by_name():
    names = [(v.name, v.overrides[:2]) for v in staleness_variants([0, 2], is_correction=True)]
    assert names == [("k0", ("rollout.staleness=0", "loss.is_correction=false")),
                     ("k2", ("rollout.staleness=2", "loss.is_correction=false")),
                     ("k2-is", ("rollout.staleness=2", "loss.is_correction=true"))]


def test_staleness_study_end_to_end_then_resumed(tmp_path):
    trainer = Counting()
    md = staleness_study(None, overrides(tmp_path, "stale"), [0, 1], is_correction=True, trainer=trainer,
                         log=lambda s: None)
    assert trainer.trained == ["k0", "k1", "k1-is"]
    data = json.loads((md.parent / "staleness.json").read_text())
    rows = {r["name"]: r for r in data["variants"]}
    assert {n: (r["k"], r["is_correction"], r["steps"]) for n, r in rows.items()} == {
        "k0": (0, False, [0, 1, 2]), "k1": (1, False, [0, 1, 2]), "k1-is": (1, True, [0, 1, 2])}
    assert [s["rollout_version"] for s in RunDir(tmp_path / "stale" / "k1").events("grpo_step")] == [0, 0, 1]
    # k = 0 is on-policy (mismatch ~ 0); k = 1 scores step 2's batch with weights one update newer
    assert max(rows["k0"]["series"]["behavior_mismatch_k3"]) < 1e-6
    assert rows["k1"]["series"]["behavior_mismatch_k3"][2] > 1e-6
    # one base evaluation, shared: identical base numbers in every variant
    bases = {r["final"]["heldout"]["base"] for r in rows.values()}
    assert len(bases) == 1
    base_files = {(tmp_path / "stale" / n / "eval" / "base.json").read_text() for n in rows}
    assert len(base_files) == 1
    assert (md.parent / "figures" / "staleness_curves.png").stat().st_size > 10_000
    assert "| k1-is | 1 | yes | 3 |" in md.read_text()

    again = Counting()
    staleness_study(None, overrides(tmp_path, "stale"), [0, 1], is_correction=True, trainer=again,
                    log=lambda s: None)
    assert again.trained == []


def _summary(base: float, trained: float, lo: float, hi: float) -> dict:
    d = {"base": base, "trained": trained, "delta": trained - base, "ci_low": lo, "ci_high": hi, "confidence": 0.95}
    return {"greedy_pass1": d, "sampled_pass1": None, "split": "test", "task": "arithmetic",
            "task_options": {"digits": 2}, "n_examples": 200, "trained_steps": 100}


def test_seed_aggregate_by_hand():
    agg = aggregate({0: _summary(0.14, 0.20, 0.01, 0.11), 1: _summary(0.14, 0.22, 0.03, 0.13),
                     2: _summary(0.14, 0.24, 0.05, 0.15)}, goal_points=5.0)
    m = agg["metrics"]["greedy_pass1"]
    assert [r["delta"] for r in m["per_seed"]] == pytest.approx([6.0, 8.0, 10.0])
    a = m["across_seeds"]
    # mean 8, sd 2, t(0.975, 2) * 2 / sqrt(3) = 4.968
    assert a["mean"] == pytest.approx(8.0) and a["ci_low"] == pytest.approx(8 - 4.968275, abs=1e-4)
    assert m["meets_goal"] and "sampled_pass1" not in agg["metrics"]
    assert m["verdict"] == "met: mean >= +5 and the interval above 0"


@pytest.mark.parametrize("gains,verdict", [
    ([6.0, 8.0], "not met: 2 seed(s), the goal needs >= 3"),
    ([0.0, 8.0, 16.0], "not met: the mean reaches it but the interval includes 0"),  # t interval -11.9 to +27.9
    ([4.0, 4.0, 4.5], "not met: mean +4.2 < +5")])
def test_seed_goal_needs_three_seeds_and_an_interval_above_zero(gains, verdict):
    agg = aggregate({i: _summary(0.1, 0.1 + g / 100, 0.0, 0.2) for i, g in enumerate(gains)}, goal_points=5.0)
    m = agg["metrics"]["greedy_pass1"]
    assert (m["meets_goal"], m["verdict"]) == (False, verdict)


def test_seeds_study_end_to_end(tmp_path):
    trainer = Counting()
    md = seeds_study(None, [*overrides(tmp_path, "seeds"), "train.max_steps=2"], [0, 1], trainer=trainer,
                     log=lambda s: None)
    assert trainer.trained == ["seed0", "seed1"]
    agg = json.loads((md.parent / "seeds.json").read_text())
    seeds = [RunDir(tmp_path / "seeds" / f"seed{s}").read("eval/summary.json")["greedy_pass1"] for s in (0, 1)]
    per = agg["metrics"]["greedy_pass1"]["per_seed"]
    assert [r["delta"] for r in per] == pytest.approx([100 * s["delta"] for s in seeds])
    assert "| 0 |" in md.read_text() and "Across 2 seeds" in md.read_text()
    from scalelab.core.provenance import git_sha
    assert agg["provenance"]["git_sha"] == git_sha() and agg["provenance"]["command"] == " ".join(sys.argv)


@pytest.mark.slow
def test_isolated_variants_run_as_cli_processes_two_at_a_time(tmp_path, capsys):
    from scalelab.cli import main
    from scalelab.grpo.randmodel import write_random_folder
    model = write_random_folder("tiny", None, tmp_path / "model", dtype=torch.float32)
    args = ["grpo", "staleness", "--k", "0,1", "--isolate", "yes", "--jobs", "2", "--no-heldout",
            *(x for o in [*BASE, "train.max_steps=2", "train.torch_threads=1", f"model.name={model}",
                          f"run.out_dir={tmp_path}", "run.name=iso"] for x in ("--set", o))]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[study] k0: done" in out and "[study] k1: done" in out
    for k in (0, 1):
        assert "report: " in (tmp_path / "iso" / f"k{k}.log").read_text()  # `grpo train` ran and reported
        assert RunDir(tmp_path / "iso" / f"k{k}").read("results.json")["steps"] == 2
    assert main(args) == 0
    assert "k0: finished before, skipped" in capsys.readouterr().out
