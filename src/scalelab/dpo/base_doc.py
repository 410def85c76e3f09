"""The write-up's section on the model the real sweep tunes, before tuning: the rows of an `evals battery`
folder's battery.json (`scalelab evals battery --model ...`), and the tasks it planned but has not measured yet.

    base_md([(folder, shown), ...]) -> list[str]   the section over one or more battery folders (heading,
                                                  sentence, table, what none of them has measured yet)

Its regression battery can only see a regression where the base scores clearly above chance: the reason the
DPO job moved from SmolLM2-135M (MMLU at chance) to this model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from scalelab.core.jsonio import read_json
from scalelab.evals.battery_plan import MULTIPLE_CHOICE


def _ci(row: dict) -> str:
    lo, hi = row.get("ci_low"), row.get("ci_high")
    return f"{100 * lo:.1f}-{100 * hi:.1f}%" if lo is not None and hi is not None else ""


def missing_tasks(battery: dict) -> list[str]:
    """The planned tasks (settings.tasks) with no row, in plan order."""
    have = {r["task"] for r in battery.get("rows", [])}
    return [t for t in battery.get("settings", {}).get("tasks", []) if t not in have]


def _source(b: dict, shown: str) -> str:
    """`folder` (git, GPU, what measured it): generation through vLLM, multiple choice through lm-eval."""
    prov = b.get("provenance", {})
    gpus = ", ".join(prov.get("hardware", {}).get("gpus", [])) or "an unrecorded GPU"
    packages = prov.get("packages", {})
    tools = []
    if b.get("server"):
        tools.append(f"vLLM {packages.get('vllm', '?')} greedy for generation")
    if any(r["task"] in MULTIPLE_CHOICE for r in b.get("rows", [])):
        tools.append(f"lm-eval {packages.get('lm-eval', '?')} for multiple choice")
    return f"`{shown}`, git {str(prov.get('git_sha', '?'))[:10]}, {gpus}" + "".join(f", {t}" for t in tools)


def base_md(folders: Sequence[tuple[Path, str | None]]) -> list[str]:
    """One section over the base's battery folders, in order: each folder's rows, then the tasks any of them
    planned that none has measured. shown: a folder's name as the page prints it (default: the path as given)."""
    batteries = [(read_json(Path(f) / "battery.json"), shown or Path(f).as_posix()) for f, shown in folders]
    model = batteries[0][0].get("model", {})
    lines = [f"## The base model before tuning: {model.get('name', '?')}", "",
             f"The real sweep tunes `{model.get('name', '?')}` (weights sha256 {str(model.get('sha256', '?'))[:16]}…, "
             f"of the {model.get('sha256_of', 'weights')}). Its own battery ("
             + "; ".join(_source(b, shown) for b, shown in batteries) + "), with 95% intervals (Wilson, or mean ± "
             "1.96 standard errors for a mean probability):", "",
             "| task | metric | n | score | 95% CI | note |", "|---|---|---:|---:|---|---|"]
    for b, _ in batteries:
        for r in b.get("rows", []):
            lines.append(f"| {r['task']} | {r['metric']} | {r['n']:,} | {100 * r['value']:.1f}% | {_ci(r)} | "
                         f"{r.get('note', '')} |")
    measured = {r["task"] for b, _ in batteries for r in b.get("rows", [])}
    missing = list(dict.fromkeys(t for b, _ in batteries for t in missing_tasks(b) if t not in measured))
    if missing:
        lines += ["", f"Not measured yet: {', '.join(missing)} (planned in the same battery; a later window resumes "
                  "there, the rows above are stored and skipped)."]
    return lines + [""]
