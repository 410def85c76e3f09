"""The battery's references and its write-up: the published figures that go beside a model's scores (reference
data in published.toml, keyed by registry name), and REPORT.md, made from battery.json alone."""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.core.jsonio import read_json
from scalelab.core.numfmt import pct
from scalelab.core.sections import doc, write_doc
from scalelab.core.tables import LEFT, RIGHT, table
from scalelab.evals.battery_records import BatteryFolder, ScoreRow

PUBLISHED = Path(__file__).with_name("published.toml")
# the row a task's reference figures sit beside: GSM8K's lenient reading is the one the figures report
HEADLINE_METRICS = ("lenient", "pass@1")


@dataclass(frozen=True)
class Reference:
    key: str
    label: str                  # short, in the table cell
    what: str                   # exactly what the figures are
    source: str
    scores: dict[str, float]    # task -> percent
    caveats: dict[str, str] = field(default_factory=dict)


def load_references(path: Path = PUBLISHED) -> dict[str, list[Reference]]:
    """registry name -> the reference blocks that name it, in file order."""
    data = tomllib.loads(path.read_text())
    out: dict[str, list[Reference]] = {}
    for key, block in data.get("reference", {}).items():
        ref = Reference(key, block["label"], block["what"], block["source"], dict(block["scores"]),
                        dict(block.get("caveats", {})))
        for model in block["models"]:
            out.setdefault(model, []).append(ref)
    return out


def references_for(model: str, path: Path = PUBLISHED) -> list[Reference]:
    return load_references(path).get(model, []) if model else []


def published_cell(task: str, refs: list[Reference]) -> str:
    parts = []
    for r in refs:
        if task in r.scores:
            caveat = f"; {r.caveats[task]}" if task in r.caveats else ""
            parts.append(f"{r.scores[task]:.1f} ({r.label}{caveat})")
    return "; ".join(parts) or "—"


def score_table(rows: list[ScoreRow], refs: list[Reference]) -> list[str]:
    cells = []
    for r in rows:
        published = published_cell(r.task, refs) if r.metric in HEADLINE_METRICS else "—"
        cells.append([f"{r.task} ({r.metric})", r.n, pct(r.value), f"[{pct(r.ci_low)}, {pct(r.ci_high)}]",
                      published, r.note])
    return table(["task", "n", "score", "95% CI", "published (what)", "note"], cells,
                 [LEFT, RIGHT, RIGHT, LEFT, LEFT, LEFT])


def _intro(b: dict[str, Any]) -> list[str]:
    m, prov = b["model"], b.get("provenance", {})
    sha = f", weights sha256 {m['sha256'][:16]}… (of the {m['sha256_of']})" if m.get("sha256") else ""
    gpus = ", ".join(prov.get("hardware", {}).get("gpus", [])) or "no GPU"
    return [f"# Baseline battery: {m['name']}", "",
            f"Model `{m['name']}` → `{m['folder']}`{sha}. Code {prov.get('git_sha', 'unknown')}, {gpus}.", "",
            "Generative tasks: the model served by vLLM, each item through `/v1/chat/completions`, greedy "
            "(temperature 0), scored by its task's own scorer (code in the sandbox); GSM8K and MATH-500 in the "
            "reference protocol (Qwen's boxed-answer system prompt). Multiple-choice tasks: lm-eval on the local "
            "copies of the data. Intervals are 95% Wilson score intervals (Wilson 1927) from n and the score, "
            "except TruthfulQA MC2, a mean probability: mean ± 1.96·stderr.", ""]


def _references(refs: list[Reference]) -> list[str]:
    if not refs:
        return ["## References", "", "No published figures are listed for this model (evals/published.toml).", ""]
    return ["## References", "", *[f"- **{r.label}**: {r.what}. Source: {r.source}." for r in refs], ""]


def _settings(b: dict[str, Any]) -> list[str]:
    rows = [[name, t["settings_sha256"], t.get("max_tokens", "—"), f"{t['wall_s']:.1f}"]
            for name, t in b["tasks"].items()]
    return ["## Runs", "", *table(["task", "settings sha256", "max_tokens", "wall s"], rows,
                                  [LEFT, LEFT, RIGHT, RIGHT]),
            "", f"Command: `{b.get('provenance', {}).get('command', '')}`"]


def report(out_dir: str | Path) -> Path:
    """<out_dir>/REPORT.md from <out_dir>/battery.json."""
    folder = BatteryFolder(Path(out_dir))
    b = read_json(folder.battery_json)
    refs = [Reference(**r) for r in b.get("references", [])]
    rows = [ScoreRow(**r) for r in b["rows"]]
    d = doc(("intro", _intro(b)), ("scores", [*score_table(rows, refs), ""]), ("references", _references(refs)),
            ("runs", _settings(b)), trailing_newline=True)
    tmp = folder.report_md.with_name(folder.report_md.name + ".tmp")
    write_doc(d, tmp)
    os.replace(tmp, folder.report_md)
    return folder.report_md
