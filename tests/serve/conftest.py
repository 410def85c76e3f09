"""Serve tests price against a stand-in table unless they ask for the real one: the report's default price source
(serve.prices.pinned_table, the pinned litellm wheel from the cache or PyPI) is replaced here, so a test of a
report neither downloads 44 MB nor depends on what the cache holds. tests/serve/test_prices.py reads the real
wheel on its own."""
from __future__ import annotations

import json

import pytest

from scalelab.serve import prices

# The config's default API models, at the per-token costs litellm 1.110.2 lists for them (a stand-in: the source
# says so, and the report prints that source).
STAND_IN = {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07,
                            "litellm_provider": "openai"},
            "together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo": {"input_cost_per_token": 1.2e-06,
                                                            "output_cost_per_token": 1.2e-06,
                                                            "litellm_provider": "together_ai"}}
STAND_IN_SOURCE = "stand-in price table (tests/serve/conftest.py)"


@pytest.fixture(autouse=True)
def stand_in_price_table(monkeypatch):
    table = prices.parse_table(json.dumps(STAND_IN), STAND_IN_SOURCE)
    monkeypatch.setattr(prices, "pinned_table", lambda: table)
    return table
