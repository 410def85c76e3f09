"""serve/prices.py: the API price table read out of a pinned wheel, never installed; errors name the file or model;
the API side of a cost comparison (blended and per-output-token prices at a token ratio), and the note when no
table can be read."""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from scalelab.core.wheelparts import WheelPart
from scalelab.serve import prices
from scalelab.serve.prices import (
    LITELLM, PriceError, api_prices, blended_usd_per_1m, load_price_table, parse_table, read_wheel_table,
    workload_usd_per_1m_output,
)

TABLE = {"gpt-x": {"input_cost_per_token": 2.5e-06, "output_cost_per_token": 1e-05, "litellm_provider": "openai"},
         "together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo": {"input_cost_per_token": 1.2e-06,
                                                         "output_cost_per_token": 1.2e-06,
                                                         "litellm_provider": "together_ai"},
         "embed-only": {"input_cost_per_token": 1e-07, "litellm_provider": "openai"}}


def fake_wheel(folder: Path, table: dict) -> WheelPart:
    """A wheel-shaped zip holding only the table, named as pip names litellm's wheels."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"litellm-{LITELLM.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(LITELLM.member, json.dumps(table))
        z.writestr("litellm/__init__.py", "raise SystemExit('never imported')\n")
    return WheelPart(LITELLM.distribution, LITELLM.version, LITELLM.member,
                     hashlib.sha256(wheel.read_bytes()).hexdigest())


def test_prices_per_million_tokens_from_the_table(tmp_path):
    part = fake_wheel(tmp_path, TABLE)
    table = load_price_table(tmp_path, part)          # the wheel is already in the cache: no download
    p = table.price("gpt-x")
    assert (p.input_usd_per_1m, p.output_usd_per_1m, p.provider) == (pytest.approx(2.5), pytest.approx(10.0), "openai")
    assert table.source.startswith(f"litellm=={LITELLM.version} (wheel sha256 {part.sha256[:12]})")
    assert table.published == "2026-11-20"        # PyPI's upload time of the pinned wheel


def test_blended_and_per_output_prices_at_a_token_ratio():
    p = parse_table(json.dumps(TABLE), "t").price("gpt-x")              # $2.50 in, $10.00 out per 1M
    # 3 prompt tokens per output token: 1M output tokens bill 3M input + 1M output = 3 x 2.5 + 10 = $17.50;
    # spread over the 4M tokens of either kind: 17.5 / 4 = $4.375 per 1M
    assert workload_usd_per_1m_output(p, 3.0) == pytest.approx(17.5)
    assert blended_usd_per_1m(p, 3.0) == pytest.approx(4.375)
    # no prompt at all: both are the output price
    assert workload_usd_per_1m_output(p, 0.0) == blended_usd_per_1m(p, 0.0) == pytest.approx(10.0)


def test_api_prices_for_configured_models_name_what_is_missing():
    table = parse_table(json.dumps(TABLE), "t")
    api = api_prices(["gpt-x", "together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo", "gpt-y"], 0.5, "measured", table)
    assert [p.model for p in api.prices] == ["gpt-x", "together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo"]
    assert api.note == "not priced: no model 'gpt-y'"
    # 0.5 x 2.5 + 10 = 11.25; 0.5 x 1.2 + 1.2 = 1.8
    assert api.usd_per_1m_output() == {"gpt-x": pytest.approx(11.25),
                                       "together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo": pytest.approx(1.8)}
    assert api_prices([], 0.5, "measured", table).note == "no API models configured ([cost] api_models)"


def test_no_cache_and_no_network_gives_a_note_not_prices(tmp_path, monkeypatch):
    """The real reader with an empty cache and pip cut off from every index: no price is made up."""
    monkeypatch.setenv(prices.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")       # pip's own switch: no index, so no network
    monkeypatch.setenv("PIP_FIND_LINKS", "")      # and no local wheel folder the machine's pip config may name
    api = api_prices(["gpt-4o-mini"], 3.0, "measured", lambda: load_price_table(prices.default_cache()))
    assert api.prices == () and api.source == ""
    assert api.note.startswith("no API prices were read (price table: wheel litellm==1.110.2: pip download failed")
    assert api.usd_per_1m_output() == {}


def test_errors_name_the_model_or_file(tmp_path):
    part = fake_wheel(tmp_path / "ok", TABLE)
    table = read_wheel_table(next((tmp_path / "ok").glob("*.whl")), part)
    with pytest.raises(PriceError, match="no model 'Qwen2.5-72B-Instruct'; similar: together_ai/Qwen/Qwen2.5-72B"):
        table.price("Qwen2.5-72B-Instruct")
    with pytest.raises(PriceError, match="'embed-only' has no per-token input/output cost"):
        table.price("embed-only")
    with pytest.raises(PriceError, match="bad.json: not JSON"):
        parse_table("{nope", "bad.json")
    tampered = WheelPart(part.distribution, part.version, part.member, "0" * 64)
    with pytest.raises(PriceError, match="price table: wheel litellm-1.110.2-py3-none-any.whl: sha256"):
        load_price_table(tmp_path / "ok", tampered)


@pytest.mark.slow
def test_the_pinned_litellm_table_from_pypi(tmp_path):
    """The real wheel (pip download, ~44 MB): its hash is the pinned one and known models price as listed."""
    cache = Path(os.environ.get("SCALELAB_CACHE", Path.home() / ".cache" / "scalelab")) / "wheels"
    try:
        table = load_price_table(cache)
    except PriceError as e:
        if "pip download failed" in str(e) and not os.environ.get("CI"):
            pytest.skip(f"PyPI unreachable: {e}")
        raise
    assert len(table.entries) > 1000
    assert table.price("gpt-4o-mini").output_usd_per_1m == pytest.approx(0.60)
    assert table.price("together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo").output_usd_per_1m == pytest.approx(1.20)
    # the row a report prints for gpt-4o-mini ($0.15 in, $0.60 out) at 2:1 input:output tokens:
    # 2 x 0.15 + 0.60 = $0.90 per 1M output tokens, (2 x 0.15 + 0.60) / 3 = $0.30 per 1M tokens blended
    api = api_prices(["gpt-4o-mini"], 2.0, "measured", table)
    (p,) = api.prices
    assert (p.provider, p.input_usd_per_1m) == ("openai", pytest.approx(0.15))
    assert api.usd_per_1m_output()["gpt-4o-mini"] == pytest.approx(0.90)
    assert blended_usd_per_1m(p, 2.0) == pytest.approx(0.30)
    assert api.published == "2026-11-20" and api.source.startswith("litellm==1.110.2 (wheel sha256 9d94d1c7d524)")
