"""The write-up's section on the model the real sweep tunes, before tuning: the rows of an `evals battery`
folder's battery.json (`scalelab evals battery --model ...`), and the tasks it planned but has not measured yet.

    base_md(folder, shown) -> list[str]     the section (heading, sentence, table, what is still missing)

Its regression battery can only see a regression where the base scores clearly above chance: the reason the
DPO job moved from SmolLM2-135M (MMLU at chance) to this model.
"""
from __future__ import annotations

from pathlib import Path

from scalelab.core.jsonio import read_json


def _ci(row: dict) -> str:
    lo, hi = row.get("ci_low"), row.get("ci_high")
    return f"{100 * lo:.1f}-{100 * hi:.1f}%" if lo is not None and hi is not None else ""


def missing_tasks(battery: dict) -> list[str]:
    """The planned tasks (settings.tasks) with no row, in plan order."""
    have = {r["task"] for r in battery.get("rows", [])}
    return [t for t in battery.get("settings", {}).get("tasks", []) if t not in have]


def base_md(folder: Path, shown: str | None = None) -> list[str]:
    """shown: the folder's name as the page prints it (default: the path as given)."""
    b = read_json(Path(folder) / "battery.json")
    prov, model = b.get("provenance", {}), b.get("model", {})
    gpus = ", ".join(prov.get("hardware", {}).get("gpus", [])) or "an unrecorded GPU"
    packages = prov.get("packages", {})
    lines = [f"## The base model before tuning: {model.get('name', '?')}", "",
             f"The real sweep tunes `{model.get('name', '?')}` (weights sha256 {str(model.get('sha256', '?'))[:16]}…, "
             f"of the {model.get('sha256_of', 'weights')}). Its own battery (`{shown or Path(folder).as_posix()}`, "
             f"git {str(prov.get('git_sha', '?'))[:10]}, {gpus}, vLLM {packages.get('vllm', '?')} greedy for "
             "generation), with 95% Wilson intervals:", "",
             "| task | metric | n | score | 95% CI | note |", "|---|---|---:|---:|---|---|"]
    for r in b.get("rows", []):
        lines.append(f"| {r['task']} | {r['metric']} | {r['n']:,} | {100 * r['value']:.1f}% | {_ci(r)} | "
                     f"{r.get('note', '')} |")
    missing = missing_tasks(b)
    if missing:
        lines += ["", f"Not measured yet: {', '.join(missing)} (planned in the same battery; a later window resumes "
                  "there, the rows above are stored and skipped)."]
    return lines + [""]
