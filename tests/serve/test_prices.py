"""serve/prices.py: the API price table read out of a pinned wheel, never installed; errors name the file or model."""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from scalelab.core.wheelparts import WheelPart
from scalelab.serve.prices import LITELLM, PriceError, load_price_table, parse_table, read_wheel_table

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
    assert table.output_prices(["gpt-x", "together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo"]) == \
        {"gpt-x": pytest.approx(10.0), "together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo": pytest.approx(1.2)}
    assert table.source.startswith(f"litellm=={LITELLM.version} (wheel sha256 {part.sha256[:12]})")


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
