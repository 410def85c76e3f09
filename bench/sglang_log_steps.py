#!/usr/bin/env python
"""Per-step time of an SGLang engine, read from its own server log, with and without prompt chunks in the interval.

    python bench/sglang_log_steps.py SERVER_LOG [--out steps.json]

SGLang logs a "Decode batch" line every few dozen decode steps (its decode_log_interval) with the requests running
and the tokens generated per second over the interval, and a "Prefill batch" line for every step that carries
prompt tokens (with --enable-mixed-chunk those steps also decode the running requests). Over one interval every
step decodes one token per running request, so running / (tokens per second) is the mean step time. An interval
holding no prefill line ran decode steps alone; one holding prefill lines mixed prompt chunks in. Grouped by the
number of requests running, the two say whether an engine's steps are slow in decode itself (sampling, attention)
or only when prompt chunks ride along.

The estimate assumes the running count was steady over the interval (it is logged at the end); intervals with a
fast-changing batch (a burst of arrivals or completions) blur it, which is why medians are reported.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from scalelab.core.provenance import collect

LINE = re.compile(r"^\[[^\]]+\] (Decode|Prefill) batch, (.*)$")
BANDS = ((1, 32), (32, 64), (64, 128), (128, 200), (200, 100_000))


@dataclass(frozen=True)
class Interval:
    running: int           # requests running at the decode line
    queued: int            # requests waiting at the decode line
    step_ms: float         # running / generated tokens per second
    prefill_tokens: int    # prompt tokens of the prefill lines since the previous decode line


def _fields(text: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, v in (part.split(":", 1) for part in text.split(", ") if ":" in part)}


def intervals(lines: list[str]) -> list[Interval]:
    """The decode intervals of a log, each with the prompt tokens prefilled inside it; an interval that generated
    nothing (throughput 0) is skipped."""
    out, prefill = [], 0
    for n, line in enumerate(lines, 1):
        m = LINE.match(line.strip())
        if not m:
            continue
        f = _fields(m.group(2))
        try:
            if m.group(1) == "Prefill":
                prefill += int(f["#new-token"])
                continue
            running, rate = int(f["#running-req"]), float(f["gen throughput (token/s)"])
            queued = int(f.get("#queue-req", "0"))
        except (KeyError, ValueError) as e:
            raise ValueError(f"line {n}: a batch line without the field {e}: {line.strip()[:120]}") from e
        if rate > 0:
            out.append(Interval(running, queued, 1e3 * running / rate, prefill))
        prefill = 0
    return out


def by_band(ivs: list[Interval]) -> list[dict]:
    """Per band of running requests: intervals, the median step with and without prompt chunks in the interval."""
    rows = []
    for lo, hi in BANDS:
        band = [i for i in ivs if lo <= i.running < hi]
        if not band:
            continue
        alone = [i.step_ms for i in band if i.prefill_tokens == 0]
        mixed = [i.step_ms for i in band if i.prefill_tokens > 0]
        rows.append({"running": f"{lo}-{hi - 1}" if hi < 100_000 else f">={lo}", "intervals": len(band),
                     "decode_alone": len(alone),
                     "step_ms_decode_alone_median": round(statistics.median(alone), 2) if alone else None,
                     "step_ms_with_prefill_median": round(statistics.median(mixed), 2) if mixed else None,
                     "prefill_tokens_per_interval_mean": round(statistics.mean(i.prefill_tokens for i in band))})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    raw = Path(args.log).read_bytes()
    ivs = intervals(raw.decode(errors="replace").splitlines())
    if not ivs:
        print(f"{args.log}: no decode batch lines", file=sys.stderr)
        return 1
    doc = {"log": args.log, "intervals": len(ivs), "by_running": by_band(ivs),
           "how": "step = running / generated tokens per second over each decode-log interval (bench/sglang_log_steps.py)",
           "provenance": collect({"log_sha256": hashlib.sha256(raw).hexdigest(), "log_bytes": len(raw)})}
    text = json.dumps(doc, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
