"""A study = named variants of one config, each a run folder <out_dir>/<study>/<variant>/, run one after another
and resumable: a finished variant is skipped, an interrupted one resumes from its checkpoint (train.py).

The seeds, staleness and hacking commands are studies. The base policy's held-out evaluation depends on neither
the seed nor the training knobs (heldout.base_key), so the first variant's is copied to the others instead of
being recomputed. `isolate=True` runs each variant in its own process (`scalelab grpo train`): an in-process
vLLM engine does not hand all its GPU memory back when closed, so the next variant could not start one.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from scalelab.core.config import dump_toml
from scalelab.core.jsonio import read_json, stored, write_json
from scalelab.core.provenance import git_sha
from scalelab.grpo.config import GrpoConfig, load_grpo_config
from scalelab.grpo.heldout import base_key, eval_dir, load_eval
from scalelab.grpo.report import build_report
from scalelab.grpo.train import train

Trainer = Callable[[GrpoConfig], dict]


@dataclass(frozen=True)
class Variant:
    name: str  # folder under the study folder
    overrides: tuple[str, ...]  # --set overrides on top of the study's config and overrides


@dataclass(frozen=True)
class VariantRun:
    name: str
    run_dir: Path
    skipped: bool  # already finished before this call


def study_dir(cfg: GrpoConfig) -> Path:
    """<run.out_dir>/<run.name>: the study's variants are run folders below it."""
    return Path(cfg.run.out_dir) / cfg.run.name


def write_study_json(path: Path, data: dict) -> None:
    """A study's aggregate (seeds.json, staleness.json, hacking.json) with the git sha and command that wrote
    it; each variant's run folder keeps its own provenance.json."""
    write_json(path, {**data, "provenance": {"git_sha": git_sha(), "command": " ".join(sys.argv)}})


def variant_config(config: str | Path | None, overrides: Sequence[str], where: Path, v: Variant) -> GrpoConfig:
    return load_grpo_config(config, [*overrides, *v.overrides, f"run.out_dir={json.dumps(str(where))}",
                                     f"run.name={json.dumps(v.name)}"])


def finished(cfg: GrpoConfig) -> bool:
    """results.json covers every step, and (eval.at_end) the held-out summary exists."""
    results = cfg.run_dir / "results.json"
    if not results.is_file() or read_json(results).get("steps", 0) < cfg.train.max_steps:
        return False
    return not cfg.eval.at_end or (eval_dir(cfg.run_dir) / "summary.json").is_file()


def share_base_eval(cfg: GrpoConfig, done: Sequence[Path]) -> bool:
    """Copy a finished variant's base evaluation into this run when its key matches; True when copied."""
    key = base_key(cfg)
    if load_eval(cfg.run_dir, "base", key) is not None:
        return False
    for other in done:
        if load_eval(other, "base", key) is not None:
            eval_dir(cfg.run_dir).mkdir(parents=True, exist_ok=True)
            src = stored(eval_dir(other) / "base.json")  # load_eval found it: plain or .gz
            shutil.copy2(src, eval_dir(cfg.run_dir) / src.name)
            return True
    return False


def launch(cfg: GrpoConfig) -> subprocess.Popen:
    """`scalelab grpo train` on the variant's resolved config in a fresh process; output to <variant>.log."""
    path = cfg.run_dir.parent / f"{cfg.run.name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    dump_toml(cfg, path)
    with open(path.with_suffix(".log"), "a") as out:  # the child holds its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "scalelab.cli", "grpo", "train", "--config", str(path)],
                                stdout=out, stderr=subprocess.STDOUT)


def run_isolated(cfgs: Sequence[GrpoConfig], jobs: int, log: Callable[[str], None]) -> None:
    """Each config in its own process, at most `jobs` at once (small models leave a GPU mostly idle, so several
    runs can share it); a failed run is an error naming its log. Stopping this process (SIGTERM, e.g. a time
    limit) stops the runs too, each resumable from its last checkpoint, rather than leaving them orphaned."""
    waiting, running = list(cfgs), []
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                cfg = waiting.pop(0)
                running.append((cfg, launch(cfg)))
            cfg, proc = running.pop(0)
            if proc.wait() != 0:
                raise RuntimeError(f"variant {cfg.run.name} failed (exit {proc.returncode}); see "
                                   f"{cfg.run_dir.parent / (cfg.run.name + '.log')}")
            log(f"[study] {cfg.run.name}: done")
    finally:
        for _, proc in running:
            proc.terminate()
            proc.wait()
        signal.signal(signal.SIGTERM, previous)


def run_variants(config: str | Path | None, overrides: Sequence[str], variants: Sequence[Variant],
                 trainer: Trainer | None = None, isolate: bool = False, log: Callable[[str], None] = print,
                 jobs: int = 1) -> list[VariantRun]:
    """Train every unfinished variant and write its REPORT.md; returns where each one is. In process, one after
    another (`trainer`, default train.train); isolated, in up to `jobs` processes at once."""
    where = study_dir(load_grpo_config(config, overrides))
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"study variants need distinct names, got {names}")
    out, todo = [], []
    for v in variants:
        cfg = variant_config(config, overrides, where, v)
        done = finished(cfg)
        out.append(VariantRun(v.name, cfg.run_dir, done))
        if done:
            log(f"[study] {v.name}: finished before, skipped ({cfg.run_dir})")
            continue
        if cfg.eval.at_end and share_base_eval(cfg, [r.run_dir for r in out[:-1]]):
            log(f"[study] {v.name}: base evaluation reused from an earlier variant")
        log(f"[study] {v.name}: training ({' '.join(v.overrides) or 'the config as is'})")
        if isolate:
            todo.append(cfg)  # `grpo train` writes the report too
        else:
            (trainer or train)(cfg)
            build_report(cfg.run_dir)
    if todo:
        run_isolated(todo, jobs, log)
    return out
