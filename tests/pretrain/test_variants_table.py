"""bench/gpu_pretrain_variants.sh's table: every variant's --set list must make a valid recipe config here, so a
typo or a combination the config refuses fails on CPU rather than in a GPU call."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from scalelab.pretrain.config import load_pretrain_config

REPO = Path(__file__).resolve().parents[2]
SCRIPT = (REPO / "bench/gpu_pretrain_variants.sh").read_text()
TABLE = dict(re.findall(r'^  \[([a-z0-9-]+)\]="(.*)"$', SCRIPT, flags=re.M))


def sets(line: str) -> list[str]:
    """The table's `--set key=value` pairs, shell-unescaped (\\" -> ")."""
    return [s.replace('\\"', '"') for s in re.findall(r'--set ((?:[^ "\\]|\\")+)', line)]


def test_the_table_was_read():
    assert len(TABLE) > 20 and TABLE["plain"] == ""
    assert sets(TABLE["cudnn-fp8-head"]) == ['train.attention="cudnn"', 'train.fp8="lm_head"']


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_variant_is_a_valid_config(name):
    cfg = load_pretrain_config(REPO / "configs/pretrain/gpt2-124m-fineweb-edu.toml", sets(TABLE[name]))
    for kv in sets(TABLE[name]):  # each setting reached the config
        key, value = kv.split("=", 1)
        section, field = key.split(".")
        assert str(getattr(getattr(cfg, section), field)).lower() == value.strip('"').lower(), kv
