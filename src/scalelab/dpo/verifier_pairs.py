"""Preference pairs from a verifier: sample k answers per prompt from the base model, grade them, pair right vs wrong.

For a task with a programmatic checker (arithmetic, GSM8K, MATH) the model's own correct and incorrect
samples make on-policy preference pairs with no human labels, as in Iterative RPO (Pang et al. 2024).
A prompt whose k answers are all right or all wrong gives no pair (no preference signal); the share of
such prompts is reported, since it sets how many prompts must be sampled for a given number of pairs.

Output: <file>.jsonl of PreferencePair records + <file>.manifest.json (task, model, sampling settings,
counts, sha256 of the jsonl, provenance), so a run records exactly which set it trained on.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from scalelab.core import provenance
from scalelab.core.hfmodel import sha256_file
from scalelab.core.jsonio import is_stored, read_bytes, read_json, write_json
from scalelab.dpo.config import VerifierConfig
from scalelab.dpo.data import PreferencePair, write_pairs_jsonl

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class VerifierSetSummary:
    task: str
    split: str
    n_prompts: int
    samples_per_prompt: int
    sample_accuracy: float          # share of all samples graded correct
    prompts_all_correct: int
    prompts_all_wrong: int
    prompts_informative: int        # at least one right and one wrong answer
    n_pairs: int
    sample_s: float                 # wall time of generation


# ---------------------------------------------------------------------------------------------
# sampling


def _render(tokenizer, prompts: Sequence[list[dict]]) -> dict[str, torch.Tensor]:
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"   # decoder-only: pad on the left to generate
    try:
        return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side


@torch.no_grad()
def sample_answers(model, tokenizer, prompts: Sequence[list[dict]], cfg: VerifierConfig,
                   on_batch: Callable[[int, int], None] | None = None) -> list[list[str]]:
    """k sampled completions per prompt (HF generate), seeded per batch so a rerun reproduces them.
    on_batch(prompts done, prompts total) is called after each generate call."""
    device = next(model.parameters()).device
    out: list[list[str]] = []
    for b in range(0, len(prompts), cfg.batch_prompts):
        enc = _render(tokenizer, prompts[b:b + cfg.batch_prompts]).to(device)
        torch.manual_seed(cfg.seed * 100_003 + b)
        gen = model.generate(**enc, do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0,
                             max_new_tokens=cfg.max_new_tokens, num_return_sequences=cfg.samples_per_prompt,
                             pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        k = cfg.samples_per_prompt
        out += [[t.strip() for t in texts[i:i + k]] for i in range(0, len(texts), k)]
        if on_batch:
            on_batch(len(out), len(prompts))
    return out


# ---------------------------------------------------------------------------------------------
# grading and pairing (pure: testable with hand-made completions)


def grade(task, examples: Sequence[Any], completions: Sequence[list[str]]) -> list[list[bool]]:
    return [[bool(task.score(ex, c).correct) for c in group] for ex, group in zip(examples, completions)]


def informative_pairs(example, completions: list[str], correct: list[bool], max_pairs: int,
                      rng: np.random.Generator) -> list[PreferencePair]:
    """Up to max_pairs distinct (right, wrong) answer pairs for one prompt; none if all right or all wrong."""
    right = list(dict.fromkeys(c for c, ok in zip(completions, correct) if ok))
    wrong = list(dict.fromkeys(c for c, ok in zip(completions, correct) if not ok))
    combos = [(i, j) for i in range(len(right)) for j in range(len(wrong))]
    picks = [combos[n] for n in rng.permutation(len(combos))[:max_pairs]]
    return [PreferencePair(list(example.prompt), [{"role": "assistant", "content": right[i]}],
                           [{"role": "assistant", "content": wrong[j]}], f"verifier:{example.task}",
                           f"{example.task}:{example.id}:{i}-{j}") for i, j in sorted(picks)]


def build_pairs(examples: Sequence[Any], completions: Sequence[list[str]], correct: Sequence[list[bool]],
                pairs_per_prompt: int, seed: int) -> tuple[list[PreferencePair], dict]:
    """All informative pairs plus the counts a summary needs."""
    rng = np.random.default_rng(seed)
    pairs: list[PreferencePair] = []
    for ex, group, ok in zip(examples, completions, correct):
        pairs += informative_pairs(ex, group, ok, pairs_per_prompt, rng)
    flat = [x for ok in correct for x in ok]
    counts = {"sample_accuracy": float(np.mean(flat)) if flat else 0.0,
              "prompts_all_correct": sum(all(ok) for ok in correct),
              "prompts_all_wrong": sum(not any(ok) for ok in correct),
              "prompts_informative": sum(any(ok) and not all(ok) for ok in correct)}
    return pairs, counts


# ---------------------------------------------------------------------------------------------
# the whole build


def choose_examples(task, cfg: VerifierConfig) -> list:
    """num_prompts examples of the split, a seeded subset (file order kept) for tasks backed by a data set."""
    examples = list(task.load(cfg.split, seed=cfg.seed))
    if cfg.num_prompts < len(examples):
        keep = np.sort(np.random.default_rng(cfg.seed).permutation(len(examples))[:cfg.num_prompts])
        examples = [examples[i] for i in keep]
    return examples


def build_verifier_set(model, tokenizer, task, cfg: VerifierConfig,
                       on_batch: Callable[[int, int], None] | None = None
                       ) -> tuple[list[PreferencePair], VerifierSetSummary]:
    examples = choose_examples(task, cfg)
    t0 = time.perf_counter()
    completions = sample_answers(model, tokenizer, [ex.prompt for ex in examples], cfg, on_batch)
    sample_s = time.perf_counter() - t0
    pairs, counts = build_pairs(examples, completions, grade(task, examples, completions),
                                cfg.pairs_per_prompt, cfg.seed)
    summary = VerifierSetSummary(cfg.task, cfg.split, len(examples), cfg.samples_per_prompt, n_pairs=len(pairs),
                                 sample_s=round(sample_s, 2), **counts)
    return pairs, summary


def manifest_path(jsonl: str | Path) -> Path:
    jsonl = Path(jsonl)
    return jsonl.with_name(jsonl.name.removesuffix(".jsonl") + ".manifest.json")


def manifest_key(model_name: str, cfg: VerifierConfig) -> dict:
    """What must match for a saved set to be reused: the model and every sampling setting."""
    return {"version": MANIFEST_VERSION, "model": model_name, "verifier": asdict(cfg) | {"reuse": None}}


def write_verifier_set(path: str | Path, pairs: list[PreferencePair], summary: VerifierSetSummary,
                       key: dict) -> Path:
    path = write_pairs_jsonl(path, pairs)
    write_json(manifest_path(path), {**key, "summary": asdict(summary), "jsonl_sha256": sha256_file(path),
                                     "provenance": provenance.collect()})
    return path


def reusable(path: str | Path, key: dict) -> bool:
    """True when the jsonl exists (plain, or gzipped in a committed folder), is unchanged since written (the hash is
    of the plain content), and was built with the same key."""
    path, mpath = Path(path), manifest_path(path)
    if not (is_stored(path) and mpath.is_file()):
        return False
    manifest = read_json(mpath)
    same_key = json.loads(json.dumps(key)) == {k: manifest.get(k) for k in key}
    return same_key and manifest.get("jsonl_sha256") == hashlib.sha256(read_bytes(path)).hexdigest()
