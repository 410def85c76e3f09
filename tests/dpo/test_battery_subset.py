"""battery.mmlu_subset: the MMLU part names the subset size in its spec (so its record key differs from the full
run's), a subset with a per-subject limit or hub data is refused, and the default leaves the spec as before."""
from __future__ import annotations

import pytest

from scalelab.core.config import ConfigError
from scalelab.dpo.battery import plan
from scalelab.dpo.config import load_dpo_config


def _mmlu_spec(*overrides):
    cfg = load_dpo_config(None, ["battery.parts=['mmlu']", "battery.data_dir=/data", *overrides])
    (part,) = plan(cfg)
    return part.spec


def test_subset_in_spec_only_when_set():
    assert "mmlu_subset" not in _mmlu_spec()
    assert _mmlu_spec("battery.mmlu_subset=2000")["mmlu_subset"] == 2000


@pytest.mark.parametrize("bad", ["battery.mmlu_limit=5", "battery.source='hub'"])
def test_subset_refuses_limit_and_hub(bad):
    with pytest.raises(ConfigError, match="mmlu_subset"):
        load_dpo_config(None, ["battery.mmlu_subset=2000", bad])
