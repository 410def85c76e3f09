"""API prices a reader can check: read from a version-pinned PyPI package's bundled price table.

litellm ships the table it bills with as a JSON file inside its wheel (model name -> input/output cost per token,
provider, mode). We take that file from the pinned wheel and nothing else: the wheel is fetched with
`pip download --no-deps`, checked against its pinned sha256 and opened as a zip; litellm is never installed or
imported. The package version and the wheel's hash say which table a $/1M-token comparison used, so anyone can
fetch the same file and get the same numbers.

An API bills a request's prompt and output tokens at two prices. A self-hosted GPU-hour serves both, and the
serving table prices it per 1M *output* tokens; so the API side of that comparison is what the API would bill for
the same workload per 1M output tokens: r x input + output, r = the workload's input:output token ratio. The
blended price per 1M tokens of either kind at that ratio, (r x input + output) / (r + 1), is the figure price
comparisons usually quote (Artificial Analysis blends at r = 3).
"""
from __future__ import annotations

import functools
import json
import os
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping, Sequence

from scalelab.core.wheelparts import ModelError, WheelPart, check_wheel, pip_download

LITELLM = WheelPart("litellm", "1.110.2", "litellm/model_prices_and_context_window_backup.json",
                    "9d94d1c7d524b6fd10c14f9c8c6c4f0ac31705f9964ac59dcfd8337c046d8917")
# When PyPI published the pinned wheel (the upload-time of that file in PyPI's simple index): how old the prices are.
PUBLISHED = {LITELLM.requirement: "2026-11-20"}
CACHE_ENV = "SCALELAB_CACHE"             # the scalelab cache (default ~/.cache/scalelab); wheels under wheels/


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

    @property
    def published(self) -> str:
        """The PyPI publication date of the pinned package, '' when not recorded."""
        return PUBLISHED.get(self.source.split(" ")[0], "")


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


def default_cache() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "scalelab") / "wheels"


@functools.lru_cache(maxsize=4)
def _pinned(cache: Path) -> PriceTable:
    return load_price_table(cache)


def pinned_table() -> PriceTable:
    """The pinned table from the scalelab cache, fetched from PyPI on first use; read once per process (the
    wheel's hash pins its content). PriceError when neither the cache nor PyPI has it."""
    return _pinned(default_cache())


# ---------------------------------------------------------------------------------------------
# the API side of a self-hosted cost comparison


def blended_usd_per_1m(p: ApiPrice, ratio: float) -> float:
    """$ per 1M tokens of either kind when r input tokens come with each output token: (r x in + out) / (r + 1)."""
    return (ratio * p.input_usd_per_1m + p.output_usd_per_1m) / (ratio + 1)


def workload_usd_per_1m_output(p: ApiPrice, ratio: float) -> float:
    """What the API bills for the prompts and outputs behind 1M output tokens: r x in + out (the figure a
    self-hosted $ per 1M output tokens, whose GPU-hours served the prompts too, compares against)."""
    return ratio * p.input_usd_per_1m + p.output_usd_per_1m


@dataclass(frozen=True)
class ApiPrices:
    """API prices for a cost comparison: the models found in the table and the workload's token ratio, or a note
    saying why there are none (no table read, no model found). Never a price the table did not give."""
    source: str                          # the table's source ('' when none was read)
    published: str                       # its package's PyPI publication date ('' when unknown)
    prices: tuple[ApiPrice, ...]
    ratio: float | None                  # the workload's input:output tokens; None when unknown
    ratio_source: str                    # where the ratio was read
    note: str = ""                       # models missing from the table, or why no price was read

    def usd_per_1m_output(self) -> dict[str, float]:
        """{model: the API's $ for this workload per 1M output tokens}; output prices alone without a ratio."""
        r = self.ratio or 0.0
        return {p.model: workload_usd_per_1m_output(p, r) for p in self.prices}


def api_prices(models: Sequence[str], ratio: float | None, ratio_source: str,
               table: PriceTable | Callable[[], PriceTable] = pinned_table) -> ApiPrices:
    """The configured models' prices from `table` (or from what calling it returns). A table that cannot be read
    gives no prices and a note naming why; a model the table lacks is named in the note and left out."""
    if not models:
        return ApiPrices("", "", (), ratio, ratio_source, "no API models configured ([cost] api_models)")
    try:
        t = table if isinstance(table, PriceTable) else table()
    except PriceError as e:
        return ApiPrices("", "", (), ratio, ratio_source, f"no API prices were read ({e})")
    found, missing = [], []
    for m in models:
        try:
            found.append(t.price(m))
        except PriceError as e:
            missing.append(str(e).removeprefix(f"{t.source}: "))
    note = f"not priced: {'; '.join(missing)}" if missing else ""
    return ApiPrices(t.source, t.published, tuple(found), ratio, ratio_source, note)
