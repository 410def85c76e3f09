"""A committed run's held-out generations dropped, its verdicts kept: `scalelab grpo eval RUN --drop-texts`.

Every evaluation keeps each problem's greedy completion so that `--rescore` can grade it again on the CPU. At
1,319 GSM8K answers that is ~0.2 MB of xz per policy per run, and the tracked tree that travels with every GPU call
has a budget: an ablation's runs (a learning-rate sweep, the staleness study) need their verdicts, not their texts.
Dropping keeps per problem the lenient verdict, the strict one (read from the text before it goes) and the token
count, so every figure of eval/summary.json, the paired intervals included, is recomputed from what stays. Nothing
is written unless the texts first re-grade to the recorded verdicts and summary (rescore.py) and the verdicts alone
then give that summary exactly. eval/texts.json records what went: each file's row count and the sha256 of its
plain content, which finds it in the repository's history.

    drop_texts(run_dir, policies=POLICIES) -> list[Dropped]   rewrite eval/base.json and/or trained.json without texts

One policy alone (`--drop-texts trained`) keeps the other's texts: a base evaluation that a later run points to
(a `.same` pointer names its sha256) must stay as it is.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from scalelab.core.jsonio import PACKED, is_stored, json_text, read_bytes, read_json, write_json
from scalelab.grpo.config import GrpoConfig, load_grpo_config
from scalelab.grpo.heldout import PolicyEval, compare, eval_dir, load_eval, strict_scores
from scalelab.grpo.rescore import rescore_run

POLICIES = ("base", "trained")


@dataclass(frozen=True)
class Dropped:
    policy: str
    rows: int
    texts: int       # rows that had a text before
    sha256: str      # of the record's plain content before


def verdicts_only(ev: PolicyEval, cfg: GrpoConfig) -> PolicyEval:
    """`ev` without its greedy texts, each row's strict verdict kept (None for tasks without a strict reading)."""
    strict = strict_scores(ev, cfg)
    rows = tuple(replace(r, greedy_text=None, greedy_strict=None if strict is None else bool(strict[i]))
                 for i, r in enumerate(ev.examples))
    return replace(ev, examples=rows)


def _replace_stored(path: Path, record: dict) -> None:
    """Write `record` as the plain file and remove the packed forms it supersedes (a pointer included)."""
    write_json(path, record)
    for suffix in PACKED:
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def drop_texts(run_dir: str | Path, policies: tuple[str, ...] = POLICIES) -> list[Dropped]:
    run_dir = Path(run_dir)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ValueError(f"drop_texts: policies {list(policies)}; allowed: {', '.join(POLICIES)}")
    cfg = load_grpo_config(run_dir / "config.toml")
    evals = {p: load_eval(run_dir, p) for p in POLICIES}
    missing = [p for p, ev in evals.items() if ev is None]
    summary_path = eval_dir(run_dir) / "summary.json"
    if missing or not is_stored(summary_path):
        raise FileNotFoundError(f"{eval_dir(run_dir)}: needs base.json, trained.json and summary.json "
                                f"(missing: {', '.join([p + '.json' for p in missing] or ['summary.json'])})")
    if not any(r.greedy_text is not None for p in policies for r in evals[p].examples):
        raise ValueError(f"{eval_dir(run_dir)}: no greedy texts of {', '.join(policies)} to drop "
                         f"(dropped before? see texts.json)")
    if not rescore_run(run_dir).reproduces:
        raise ValueError(f"{eval_dir(run_dir)}: its texts do not re-grade to the recorded verdicts and summary; "
                         f"nothing was dropped (`scalelab grpo eval {run_dir} --rescore` shows where)")
    slim = {p: verdicts_only(ev, cfg) if p in policies else ev for p, ev in evals.items()}
    again = json_text(compare(slim["base"], slim["trained"], cfg))
    if again != json_text(read_json(summary_path)):
        raise ValueError(f"{summary_path}: the verdicts alone do not give the recorded summary; nothing was dropped")
    done = list(_earlier(run_dir))
    for p in policies:
        ev = evals[p]
        before = read_bytes(eval_dir(run_dir) / f"{p}.json")  # as stored: decompressed, a pointer followed
        done.append(Dropped(p, len(ev.examples), sum(r.greedy_text is not None for r in ev.examples),
                            hashlib.sha256(before).hexdigest()))
        _replace_stored(eval_dir(run_dir) / f"{p}.json", slim[p].to_dict())
    write_json(eval_dir(run_dir) / "texts.json",
               {"dropped": [asdict(d) for d in done],
                "why": "verdicts kept, greedy texts dropped (scalelab.grpo.textdrop); sha256 is of each record's "
                       "plain content before, which finds it in the repository's history"})
    return done[-len(policies):]


def _earlier(run_dir: Path) -> list[Dropped]:
    """What an earlier drop of the other policy recorded (texts.json), kept beside this one's."""
    path = eval_dir(run_dir) / "texts.json"
    return [Dropped(**d) for d in read_json(path)["dropped"]] if is_stored(path) else []
