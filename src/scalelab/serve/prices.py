"""API prices a reader can check: read from a version-pinned PyPI package's bundled price table.

litellm ships the table it bills with as a JSON file inside its wheel (model name -> input/output cost per token,
provider, mode). We take that file from the pinned wheel and nothing else: the wheel is fetched with
`pip download --no-deps`, checked against its pinned sha256 and opened as a zip; litellm is never installed or
imported. The package version and the wheel's hash say which table a $/1M-token comparison used, so anyone can
fetch the same file and get the same numbers.
"""
from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Sequence

from scalelab.core.wheelparts import ModelError, WheelPart, check_wheel, pip_download

LITELLM = WheelPart("litellm", "1.110.2", "litellm/model_prices_and_context_window_backup.json",
                    "9d94d1c7d524b6fd10c14f9c8c6c4f0ac31705f9964ac59dcfd8337c046d8917")


class PriceError(ValueError):
    """The price table cannot be read, or a model is not in it; the message names the file or model."""


@dataclass(frozen=True)
class ApiPrice:
    model: str                       # the table's key, e.g. "together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo"
    provider: str
    input_usd_per_1m: float
    output_usd_per_1m: float


@dataclass(frozen=True)
class PriceTable:
    source: str                      # "litellm==1.110.2 (wheel sha256 9d94...), member ..."
    read_utc: str                    # when this copy was read; the package version pins the content
    entries: Mapping[str, dict]

    def price(self, model: str) -> ApiPrice:
        row = self.entries.get(model)
        if row is None:
            near = [k for k in self.entries if model.split("/")[-1].lower() in k.lower()][:5]
            raise PriceError(f"{self.source}: no model {model!r}" + (f"; similar: {', '.join(near)}" if near else ""))
        try:
            return ApiPrice(model, str(row.get("litellm_provider", "")), 1e6 * float(row["input_cost_per_token"]),
                            1e6 * float(row["output_cost_per_token"]))
        except (KeyError, TypeError, ValueError):
            raise PriceError(f"{self.source}: model {model!r} has no per-token input/output cost") from None

    def output_prices(self, models: Sequence[str]) -> dict[str, float]:
        """{model: $ per 1M output tokens}, the mapping serve's cost tables compare against."""
        return {m: self.price(m).output_usd_per_1m for m in models}


def parse_table(text: str, source: str) -> PriceTable:
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as e:
        raise PriceError(f"{source}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(entries, dict):
        raise PriceError(f"{source}: expected an object of model -> prices, got {type(entries).__name__}")
    return PriceTable(source, datetime.now(timezone.utc).strftime("%Y-%m-%d"), entries)


def read_wheel_table(wheel: Path, part: WheelPart = LITELLM) -> PriceTable:
    source = f"{part.requirement} (wheel sha256 {part.sha256[:12]}), {part.member}"
    try:
        with zipfile.ZipFile(wheel) as z:
            text = z.read(part.member).decode("utf-8")
    except KeyError:
        raise PriceError(f"{wheel.name}: no member {part.member}") from None
    except zipfile.BadZipFile as e:
        raise PriceError(f"{wheel.name}: not a readable zip ({e})") from None
    return parse_table(text, source)


def load_price_table(cache: Path, part: WheelPart = LITELLM) -> PriceTable:
    """The pinned wheel's table, downloaded into `cache` once and checked by hash every time."""
    try:
        pip_download([part], cache)
        return read_wheel_table(check_wheel(part, cache), part)
    except ModelError as e:            # wheelparts names the wheel; say it is the price table's
        raise PriceError(f"price table: {e}") from None
