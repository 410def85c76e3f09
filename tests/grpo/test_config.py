"""Named configs load; bad values are refused with the field named."""
from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.core.config import ConfigError
from scalelab.grpo.capabilities import resolve_method
from scalelab.grpo.config import load_grpo_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "grpo").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_named_configs_load(path):
    cfg = load_grpo_config(path)
    assert cfg.sequences_per_step == cfg.data.prompts_per_step * cfg.rollout.group_size


def test_three_named_configs_exist():
    assert {p.stem for p in CONFIGS} >= {"tiny-cpu", "smollm2-h200", "qwen2.5-7b-gsm8k"}


@pytest.mark.parametrize("override,message", [
    ("data.reward_weights=[1.0]", "'data.reward_weights': 1 weights for 2 rewards"),
    ("rollout.engine='vllm_server'", "'rollout.weight_sync': 'shared' does not work with rollout.engine="
                                     "'vllm_server'; allowed: 'auto', 'safetensors', 'lora_adapter'"),
    ("rollout.staleness=-1", "'rollout.staleness'"),
    ("data.reward_options={format = 3}", "'data.reward_options': expected a table of tables"),
    ("data.reward_options={partial = {}}", "'partial' is not in data.rewards"),
])
def test_bad_values_name_the_field(override, message):
    base = ["data.rewards=['correctness', 'format']", "rollout.weight_sync='shared'"]
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_grpo_config(None, [*base, override])


@pytest.mark.parametrize("engine,lora,expected", [("hf", True, "shared"), ("vllm_colocated", False, "inplace"),
                                                  ("vllm_server", True, "lora_adapter"),
                                                  ("vllm_server", False, "safetensors")])
def test_auto_weight_sync_by_engine(engine, lora, expected):
    assert resolve_method("auto", engine, lora) == expected
