"""The curriculum's promotion rule by hand, and in the loop: stages per step, prompts from the stage's pool,
staleness-aware counting, resume == uninterrupted."""
from __future__ import annotations

import pytest
import torch

from scalelab.core.config import ConfigError, load_config
from scalelab.core.rundir import RunDir
from scalelab.grpo.checkpoint import trainable_state
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.curriculum import Curriculum, stage_options
from scalelab.grpo.train import train
from tests.grpo.test_train import Crash, crash_at
from tests.grpo.tiny import tiny_parts


def test_stage_options_merge_over_the_target_and_end_with_it():
    target = {"digits": 2, "operations": "+-"}
    assert stage_options(target, [{"digits": 1}, {"operations": "+"}]) == [
        {"digits": 1, "operations": "+-"}, {"digits": 2, "operations": "+"}, target]


def test_promotion_needs_a_full_window_at_the_threshold():
    c = Curriculum(n_stages=3, promote_at=0.5, window=3)
    assert c.observe(0, 0.9) == (False, 0.9)  # one step is not a window
    assert c.observe(1, 0.9) == (False, 0.9)
    assert c.observe(2, 0.0) == (True, pytest.approx(0.6))  # (0.9 + 0.9 + 0) / 3 = 0.6 >= 0.5
    assert (c.stage, c.recent, c.promotions) == (1, [], [2])
    assert [c.observe(s, 0.4)[0] for s in (3, 4, 5)] == [False, False, False]  # 0.4 < 0.5
    assert c.observe(6, 1.0) == (True, pytest.approx(0.6))  # the window slides: (0.4 + 0.4 + 1.0) / 3
    assert c.final and c.observe(7, 1.0)[0] is False  # the target stage is never left
    restored = Curriculum(3, 0.5, 3)
    restored.load_state_dict(c.state_dict())
    assert (restored.stage, restored.recent, restored.promotions) == (2, [1.0], [2, 6])


def test_curriculum_metric_must_be_logged():
    with pytest.raises(ConfigError, match="'data.curriculum.metric': 'reward/format' is not logged"):
        load_config(GrpoConfig, None, ["data.curriculum.levels=[{digits = 1}]", "data.curriculum.metric=reward/format"])


# The length exploit pays n / 24 > 0 on every completion, so the rolling reward passes 0.05 after `window` steps.
CURRICULUM = ["train.device=cpu", "data.task_options={digits = 2, operations = '+'}", "data.limit=32",
              "data.curriculum.levels=[{digits = 1}]", "data.curriculum.window=2", "data.curriculum.promote_at=0.05",
              "data.curriculum.metric=reward_mean", "data.rewards=['length_aware']",
              "data.reward_options={length_aware = {exploit = 'length', target_chars = 24}}",
              "data.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=6",
              "optim.micro_batch_size=8", "model.lora.r=4", "optim.lr=1e-2", "train.checkpoint_every=2"]


def run(tmp_path, name, *extra, log=lambda s: None):
    cfg = load_config(GrpoConfig, None, [*CURRICULUM, f"run.out_dir={tmp_path}", f"run.name={name}", *extra])
    parts = tiny_parts(cfg)
    train(cfg, parts, log=log)
    return parts, list(RunDir(tmp_path / name).events("grpo_step"))


def test_stages_in_the_loop_with_staleness_and_resume(tmp_path):
    parts, recs = run(tmp_path, "whole", "train.max_steps=5", "rollout.staleness=1")
    stages = [r["curriculum_stage"] for r in recs]
    # promoted after step 1 (window 2); the batch of step 2 was generated at step 1, before the promotion
    assert stages == [0, 0, 0, 1, 1]
    assert [r["curriculum_promoted"] for r in recs] == [False, True, False, False, False]
    assert recs[2]["curriculum_rolling"] is None  # a stage-0 batch after the promotion does not count
    assert all("/d1+t2/" in i for r in recs[:3] for i in r["example_ids"])
    assert all("/d2+t2/" in i for r in recs[3:] for i in r["example_ids"])
    whole = trainable_state(parts.policy)

    with pytest.raises(Crash):  # killed during step 3, after the checkpoint of step 1
        run(tmp_path, "split", "train.max_steps=5", "rollout.staleness=1", log=crash_at(3))
    parts, recs = run(tmp_path, "split", "train.max_steps=5", "rollout.staleness=1")
    last = {r["step"]: r for r in recs}
    assert [last[s]["curriculum_stage"] for s in range(5)] == stages
    split = trainable_state(parts.policy)
    assert all(torch.equal(whole[k], split[k]) for k in whole)
    assert RunDir(tmp_path / "split").read("results.json")["curriculum_final_stage"] == 1
