"""The demo's shortened tiny-cpu run: its overrides compose with the named config (a mistyped key would fail
here, not minutes into `scalelab demo`)."""
from __future__ import annotations

from scalelab.grpo.config import load_grpo_config
from scalelab.grpo.demo import CONFIG, DEMO_OVERRIDES


def test_demo_config_is_the_short_tiny_cpu_run_with_heldout_eval():
    cfg = load_grpo_config(CONFIG, DEMO_OVERRIDES)
    assert cfg.sequences_per_step == 2 * 8 and cfg.train.max_steps == 6 and cfg.rollout.max_new_tokens == 8
    assert cfg.eval.at_end and cfg.eval.split == "test" and cfg.data.split == "train"
    assert str(cfg.run_dir).endswith("runs/grpo/demo-cpu") and cfg.train.torch_threads == 1
