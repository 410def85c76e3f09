"""pass@1 of a policy on the task's held-out split, before and after training, per example so the difference
gets a paired interval.

    evaluate_policy(engine, tokenizer, examples, settings) -> PolicyEval      measure (engine.generate + verifier)
    compare(base, trained, cfg.eval) -> dict                                   compute (passk.py statistics)
    <run>/eval/base.json, trained.json, summary.json                           save

Greedy pass@1 is one temperature-0 completion per example. Sampled pass@1 and pass@n use n completions per
example at eval.temperature and the unbiased estimator (passk.pass_at_k). The base result depends only on the
model, the task and eval.* (the key below), not on the training seed, so a study reuses one base evaluation.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from scalelab.core.jsonio import is_stored, read_json, write_json
from scalelab.evals.mathtasks import strict_correct
from scalelab.evals.tasks import Example, score_example
from scalelab.grpo.checkpoint import find_checkpoint, load_trainable
from scalelab.grpo.config import GrpoConfig, load_grpo_config
from scalelab.grpo.parts import build_parts, encode_prompt, heldout_examples, open_engine
from scalelab.grpo.passk import mean_pass_at_k, paired_bootstrap
from scalelab.grpo.types import SamplingParams
from scalelab.grpo.weightsync import sync_weights

Scorer = Callable[[Any, str], bool]


@dataclass(frozen=True)
class EvalSettings:
    greedy: bool
    samples: int
    temperature: float
    max_new_tokens: int
    prompts_per_call: int
    seed: int

    @classmethod
    def from_config(cls, cfg: GrpoConfig) -> "EvalSettings":
        e = cfg.eval
        return cls(e.greedy, e.samples, e.temperature, e.max_new_tokens or cfg.rollout.max_new_tokens,
                   e.prompts_per_call, e.data_seed)


@dataclass(frozen=True)
class ExampleResult:
    id: str
    answer: str
    greedy_correct: bool | None  # None: no greedy pass
    greedy_tokens: int | None
    greedy_text: str | None
    samples: int
    sample_correct: int
    sample_tokens: tuple[int, ...]
    greedy_strict: bool | None = None  # kept when the text is dropped (textdrop.py); read from the text otherwise


@dataclass(frozen=True)
class PolicyEval:
    policy: str  # "base" | "trained"
    weights_version: int  # optimizer steps behind these weights
    key: str  # base_key of the config: equal keys, interchangeable base results
    split: str
    greedy_pass1: float | None
    sampled_pass1: float | None
    pass_at_n: float | None  # pass@samples
    examples: tuple[ExampleResult, ...]
    wall_s: float

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PolicyEval":
        rows = tuple(ExampleResult(**{**r, "sample_tokens": tuple(r["sample_tokens"])}) for r in d["examples"])
        return cls(**{**d, "examples": rows})


def default_scorer(example: Any, text: str) -> bool:
    return score_example(example, text).correct


def base_key(cfg: GrpoConfig) -> str:
    """What the base policy's held-out result depends on (not the training seed, the steps or the loss)."""
    e = asdict(cfg.eval)
    for k in ("at_end", "bootstrap_resamples", "confidence", "every", "curve_limit"):  # not the scores
        e.pop(k)
    fields = {"model": cfg.model.name, "dtype": cfg.model.dtype, "task": cfg.data.task,
              "task_options": cfg.data.task_options, "source": cfg.data.source, "eval": e,
              "engine": cfg.rollout.engine, "max_new_tokens": e["max_new_tokens"] or cfg.rollout.max_new_tokens}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# measure


def _generate(engine: Any, prompts: list[list[int]], params: SamplingParams, per_call: int) -> list[Any]:
    """Completions group-major (prompt i's n completions together), over calls of `per_call` prompts."""
    out = []
    for i in range(0, len(prompts), per_call):
        batch = engine.generate(prompts[i:i + per_call], params)
        out += [(t, n) for t, n in zip(batch.texts, batch.lengths)]
    return out


def evaluate_policy(engine: Any, tokenizer: Any, examples: Sequence[Any], s: EvalSettings, policy: str,
                    key: str, split: str, scorer: Scorer = default_scorer) -> PolicyEval:
    t0 = time.perf_counter()
    prompts = [encode_prompt(tokenizer, ex.prompt) for ex in examples]
    greedy = _generate(engine, prompts, SamplingParams(1, 0.0, 1.0, s.max_new_tokens, s.seed),
                       s.prompts_per_call) if s.greedy else None
    sampled = _generate(engine, prompts, SamplingParams(s.samples, s.temperature, 1.0, s.max_new_tokens, s.seed),
                        s.prompts_per_call) if s.samples else []
    rows = []
    for i, ex in enumerate(examples):
        mine = sampled[i * s.samples:(i + 1) * s.samples]
        g = greedy[i] if greedy else None
        rows.append(ExampleResult(ex.id, ex.answer, None if g is None else scorer(ex, g[0]),
                                  None if g is None else g[1], None if g is None else g[0], s.samples,
                                  sum(scorer(ex, t) for t, _ in mine), tuple(n for _, n in mine)))
    ns, cs = [r.samples for r in rows], [r.sample_correct for r in rows]
    return PolicyEval(policy, engine.weights_version, key, split,
                      float(np.mean([r.greedy_correct for r in rows])) if s.greedy else None,
                      mean_pass_at_k(ns, cs, 1) if s.samples else None,
                      mean_pass_at_k(ns, cs, s.samples) if s.samples else None, tuple(rows),
                      time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------
# compute


def strict_scores(ev: PolicyEval, cfg: GrpoConfig) -> list[float] | None:
    """Greedy pass@1 per example in the strict reading (the answer only in the marker the prompt asked for:
    mathtasks.strict_correct), re-scored from the kept texts (a row whose text was dropped gives its recorded
    strict verdict); None for tasks without a strict reading, or when a row has neither."""
    if cfg.data.task != "gsm8k" or any(r.greedy_text is None and r.greedy_strict is None for r in ev.examples):
        return None
    fmt = cfg.data.task_options.get("prompt_format", "cot_hash")
    return [float(r.greedy_strict if r.greedy_text is None else
                  strict_correct(Example("gsm8k", r.id, [], r.answer, {"prompt_format": fmt}), r.greedy_text))
            for r in ev.examples]


def compare(base: PolicyEval, trained: PolicyEval, cfg: GrpoConfig) -> dict:
    """Trained - base on the same examples: greedy and sampled pass@1 with paired bootstrap intervals."""
    if [r.id for r in base.examples] != [r.id for r in trained.examples]:
        raise ValueError("base and trained were scored on different held-out examples")
    e = cfg.eval
    boot = lambda b, t: asdict(paired_bootstrap(b, t, e.bootstrap_resamples, e.confidence, e.data_seed))  # noqa: E731
    out: dict[str, Any] = {"task": cfg.data.task, "task_options": cfg.data.task_options, "split": base.split,
                           "n_examples": len(base.examples), "trained_steps": trained.weights_version,
                           "greedy_pass1": None, "sampled_pass1": None, "pass_at_n": None}
    if base.greedy_pass1 is not None and trained.greedy_pass1 is not None:
        out["greedy_pass1"] = boot([float(r.greedy_correct) for r in base.examples],
                                   [float(r.greedy_correct) for r in trained.examples])
        out["greedy_tokens_mean"] = {"base": float(np.mean([r.greedy_tokens for r in base.examples])),
                                     "trained": float(np.mean([r.greedy_tokens for r in trained.examples]))}
        strict = strict_scores(base, cfg), strict_scores(trained, cfg)
        if strict[0] is not None and strict[1] is not None:
            out["greedy_strict_pass1"] = boot(*strict)
    if base.sampled_pass1 is not None and trained.sampled_pass1 is not None:
        per = lambda ev: [r.sample_correct / r.samples for r in ev.examples]  # noqa: E731  unbiased pass@1 each
        out["sampled_pass1"] = boot(per(base), per(trained))
        out["pass_at_n"] = {"n": base.examples[0].samples, "base": base.pass_at_n, "trained": trained.pass_at_n}
    return out


# ---------------------------------------------------------------------------------------------
# save / load


def eval_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "eval"


def save_eval(run_dir: str | Path, ev: PolicyEval) -> Path:
    path = eval_dir(run_dir) / f"{ev.policy}.json"
    write_json(path, ev.to_dict())
    return path


def load_eval(run_dir: str | Path, policy: str, key: str | None = None) -> PolicyEval | None:
    """The saved evaluation of `policy`, or None (also when it was made under another base key)."""
    path = eval_dir(run_dir) / f"{policy}.json"
    if not is_stored(path):  # plain, or gzipped in a committed folder
        return None
    ev = PolicyEval.from_dict(read_json(path))
    return ev if key is None or ev.key == key else None


def save_summary(run_dir: str | Path, summary: dict) -> Path:
    path = eval_dir(run_dir) / "summary.json"
    write_json(path, summary)
    return path


def headline(summary: dict) -> str:
    """One line: greedy (else sampled) pass@1 base -> trained, with the interval of the difference."""
    which = "greedy_pass1" if summary.get("greedy_pass1") else "sampled_pass1"
    d = summary.get(which)
    if not d:
        return "held-out: no pass@1 measured"
    line = (f"held-out {summary['split']} ({summary['n_examples']} examples) {which.replace('_', ' ')}: "
            f"{100 * d['base']:.1f}% -> {100 * d['trained']:.1f}% ({100 * d['delta']:+.1f} points, "
            f"{100 * d['confidence']:.0f}% CI {100 * d['ci_low']:+.1f} to {100 * d['ci_high']:+.1f})")
    strict = summary.get("greedy_strict_pass1")
    if which == "greedy_pass1" and strict:
        line += (f"; strict {100 * strict['base']:.1f}% -> {100 * strict['trained']:.1f}% "
                 f"({100 * strict['delta']:+.1f}, CI {100 * strict['ci_low']:+.1f} to {100 * strict['ci_high']:+.1f})")
    return line


# ---------------------------------------------------------------------------------------------
# a finished run, after the fact (`scalelab grpo eval <run>`)


def eval_run(run_dir: str | Path, force: bool = False, parts: Any = None,
             log: Callable[[str], None] = print) -> dict:
    """Score the base policy and the run's checkpoint on the held-out split (each only when its file is missing,
    or `force`), then write eval/summary.json; returns the summary."""
    run_dir = Path(run_dir)
    ckpt = find_checkpoint(run_dir)
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir / 'checkpoint.json'}: not found; `grpo eval` scores a run's checkpoint "
                                f"(train it first)")
    cfg = load_grpo_config(run_dir / "config.toml")
    parts = parts or build_parts(cfg)
    examples, key, settings = parts.heldout or heldout_examples(cfg), base_key(cfg), EvalSettings.from_config(cfg)
    engine, method = open_engine(cfg, parts, run_dir / "rollout", 0)
    try:
        base = None if force else load_eval(run_dir, "base", key)
        if base is None:
            log(f"[eval] base policy on {len(examples)} {cfg.eval.split} examples")
            base = evaluate_policy(engine, parts.tokenizer, examples, settings, "base", key, cfg.eval.split)
            save_eval(run_dir, base)
        version = int(load_trainable(ckpt, parts.policy)["next_step"])
        trained = None if force else load_eval(run_dir, "trained", key)
        if trained is None or trained.weights_version != version:
            sync_weights(method, parts.policy, engine, version, run_dir / "rollout" / "sync")
            log(f"[eval] trained policy (step {version}) on the same examples")
            trained = evaluate_policy(engine, parts.tokenizer, examples, settings, "trained", key, cfg.eval.split)
            save_eval(run_dir, trained)
    finally:
        engine.close()
    summary = compare(base, trained, cfg)
    save_summary(run_dir, summary)
    return summary
