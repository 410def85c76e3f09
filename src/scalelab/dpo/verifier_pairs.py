"""Preference pairs from a verifier: sample k answers per prompt from the base model, grade them, pair right vs wrong.

For a task with a programmatic checker (arithmetic, GSM8K, MATH) the model's own correct and incorrect
samples make on-policy preference pairs with no human labels, as in Iterative RPO (Pang et al. 2024).
A prompt whose k answers are all right or all wrong gives no pair (no preference signal); the share of
such prompts is reported, since it sets how many prompts must be sampled for a given number of pairs.

Output: <file>.jsonl of PreferencePair records + <file>.manifest.json (task, model, sampling settings,
counts, sha256 of the jsonl, provenance), so a run records exactly which set it trained on. While sampling, each
finished batch goes to <file>.samples.jsonl (dpo.sample_log), so a build cut short resumes where it stopped; it
stays beside the set, every sampled answer with its token count (the all-right and all-wrong groups too).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from scalelab.core import provenance
from scalelab.core.hfmodel import sha256_file
from scalelab.core.jsonio import is_stored, read_bytes, read_json, write_json
from scalelab.dpo.config import VerifierConfig
from scalelab.dpo.data import PreferencePair, write_pairs_jsonl
from scalelab.dpo.sample_log import SampleLog, key_hash, sample_logged
from scalelab.dpo.samplers import HFSampler, OnBatch, Sampler

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
    sample_s: float                 # wall time of this process's sampling (batches loaded from the side file: none)
    length_diff: dict | None = None  # chosen - rejected tokens over the pairs (length_diff_summary)
    batches_loaded: int = 0         # from the side file of a build cut short (dpo.sample_log)
    batches_sampled: int = 0        # sampled by this process


# ---------------------------------------------------------------------------------------------
# sampling (dpo.samplers: HF generate here, a vLLM server on the GPU, a scripted one in tests)


def sample_answers(model, tokenizer, prompts: Sequence[list[dict]], cfg: VerifierConfig,
                   on_batch: OnBatch | None = None) -> list[list[str]]:
    """k sampled completions per prompt (HF generate), seeded per batch so a rerun reproduces them."""
    return [[s.text for s in group] for group in HFSampler(model, tokenizer)(prompts, cfg, on_batch)]


# ---------------------------------------------------------------------------------------------
# grading and pairing (pure: testable with hand-made completions)


def grade(task, examples: Sequence[Any], completions: Sequence[list[str]]) -> list[list[bool]]:
    return [[bool(task.score(ex, c).correct) for c in group] for ex, group in zip(examples, completions)]


def _distinct(completions: list[str], correct: list[bool], n_tokens: list[int] | None,
              want: bool) -> list[tuple[str, int | None]]:
    """(text, tokens) of the distinct completions graded `want`, first occurrence kept."""
    counts = n_tokens if n_tokens is not None else [None] * len(completions)
    seen: dict[str, int | None] = {}
    for c, ok, n in zip(completions, correct, counts):
        if ok == want:
            seen.setdefault(c, n)
    return list(seen.items())


def _length_meta(chosen: int | None, rejected: int | None) -> dict:
    if chosen is None or rejected is None:
        return {}
    return {"chosen_tokens": chosen, "rejected_tokens": rejected, "length_diff_tokens": chosen - rejected}


def informative_pairs(example, completions: list[str], correct: list[bool], max_pairs: int,
                      rng: np.random.Generator, n_tokens: list[int] | None = None) -> list[PreferencePair]:
    """Up to max_pairs distinct (right, wrong) answer pairs for one prompt; none if all right or all wrong.
    With n_tokens (each completion's generated tokens) a pair's meta records chosen - rejected in tokens."""
    right, wrong = (_distinct(completions, correct, n_tokens, want) for want in (True, False))
    combos = [(i, j) for i in range(len(right)) for j in range(len(wrong))]
    picks = [combos[n] for n in rng.permutation(len(combos))[:max_pairs]]
    return [PreferencePair(list(example.prompt), [{"role": "assistant", "content": right[i][0]}],
                           [{"role": "assistant", "content": wrong[j][0]}], f"verifier:{example.task}",
                           f"{example.task}:{example.id}:{i}-{j}", _length_meta(right[i][1], wrong[j][1]))
            for i, j in sorted(picks)]


def group_counts(correct: Sequence[list[bool]]) -> dict:
    """How many prompts gave a pair and how many were dropped as all right or all wrong (no preference signal)."""
    flat = [x for ok in correct for x in ok]
    return {"sample_accuracy": float(np.mean(flat)) if flat else 0.0,
            "prompts_all_correct": sum(all(ok) for ok in correct),
            "prompts_all_wrong": sum(not any(ok) for ok in correct),
            "prompts_informative": sum(any(ok) and not all(ok) for ok in correct)}


def build_pairs(examples: Sequence[Any], completions: Sequence[list[str]], correct: Sequence[list[bool]],
                pairs_per_prompt: int, seed: int,
                n_tokens: Sequence[list[int]] | None = None) -> tuple[list[PreferencePair], dict]:
    """All informative pairs plus the counts a summary needs."""
    rng = np.random.default_rng(seed)
    tokens = n_tokens if n_tokens is not None else [None] * len(examples)
    pairs: list[PreferencePair] = []
    for ex, group, ok, n in zip(examples, completions, correct, tokens):
        pairs += informative_pairs(ex, group, ok, pairs_per_prompt, rng, n)
    return pairs, group_counts(correct)


def length_diff_summary(pairs: Sequence[PreferencePair]) -> dict | None:
    """chosen - rejected tokens over the pairs that record it. DPO's implicit reward is a sum over tokens, so a
    set whose chosen answers are systematically longer (or shorter) teaches length as much as correctness
    (Park et al. 2024); the sign and size of this difference say which way a tuned model may drift."""
    d = np.array([p.meta["length_diff_tokens"] for p in pairs if "length_diff_tokens" in p.meta], dtype=float)
    if d.size == 0:
        return None
    return {"n": int(d.size), "mean": float(d.mean()), "median": float(np.median(d)),
            "p10": float(np.quantile(d, 0.1)), "p90": float(np.quantile(d, 0.9)),
            "share_chosen_longer": float((d > 0).mean()), "share_chosen_shorter": float((d < 0).mean()),
            "share_equal": float((d == 0).mean())}


# ---------------------------------------------------------------------------------------------
# the whole build


def choose_examples(task, cfg: VerifierConfig) -> list:
    """num_prompts examples of the split, a seeded subset (file order kept) for tasks backed by a data set."""
    examples = list(task.load(cfg.split, seed=cfg.seed))
    if cfg.num_prompts < len(examples):
        keep = np.sort(np.random.default_rng(cfg.seed).permutation(len(examples))[:cfg.num_prompts])
        examples = [examples[i] for i in keep]
    return examples


def build_verifier_set(sampler: Sampler, task, cfg: VerifierConfig, on_batch: OnBatch | None = None,
                       log: SampleLog | None = None) -> tuple[list[PreferencePair], VerifierSetSummary]:
    """Sample k answers per prompt with `sampler` (dpo.samplers), grade them with the task's verifier, pair. With
    `log` (sample_log_for) each finished batch is appended to the side file, and the batches it holds already are
    not sampled again: a resumed build gives the pairs an uninterrupted one would from the same samples."""
    examples = choose_examples(task, cfg)
    t0 = time.perf_counter()
    samples, loaded, sampled = sample_logged(sampler, examples, cfg, log, on_batch)
    sample_s = time.perf_counter() - t0
    texts = [[s.text for s in group] for group in samples]
    pairs, counts = build_pairs(examples, texts, grade(task, examples, texts), cfg.pairs_per_prompt, cfg.seed,
                                [[s.n_tokens for s in group] for group in samples])
    summary = VerifierSetSummary(cfg.task, cfg.split, len(examples), cfg.samples_per_prompt, n_pairs=len(pairs),
                                 sample_s=round(sample_s, 2), length_diff=length_diff_summary(pairs),
                                 batches_loaded=loaded, batches_sampled=sampled, **counts)
    return pairs, summary


def manifest_path(jsonl: str | Path) -> Path:
    jsonl = Path(jsonl)
    return jsonl.with_name(jsonl.name.removesuffix(".jsonl") + ".manifest.json")


def samples_path(jsonl: str | Path) -> Path:
    """The raw samples' side file (dpo.sample_log) beside the set."""
    jsonl = Path(jsonl)
    return jsonl.with_name(jsonl.name.removesuffix(".jsonl") + ".samples.jsonl")


def manifest_key(model_name: str, cfg: VerifierConfig) -> dict:
    """What must match for a saved set to be reused: the model and every sampling setting. The sampler fields
    enter only when set, so sets built before they existed (HF generate) stay reusable, and request_seeds only
    when false, for the same reason; concurrent_batches never does, as how many requests are in flight changes
    how fast the samples come, not which are asked for."""
    verifier = asdict(cfg) | {"reuse": None}
    for unset in [k for k in ("sampler_url", "sampler_model") if not verifier[k]]:
        del verifier[unset]
    del verifier["concurrent_batches"]
    if verifier["request_seeds"]:
        del verifier["request_seeds"]
    return {"version": MANIFEST_VERSION, "model": model_name, "verifier": verifier}


def sample_log_for(jsonl: str | Path, key: dict) -> SampleLog:
    """The side file for building `jsonl` under `key`. One left under other settings by the finished set at `jsonl`
    (its manifest has that key) holds that set's raw samples and is replaced with it, as the set is rebuilt; one
    under other settings and no finished set of them is a build cut short, which SampleLog.load refuses to mix."""
    log, mpath = SampleLog(samples_path(jsonl), key_hash(key)), manifest_path(jsonl)
    if log.path.is_file() and mpath.is_file():
        manifest = read_json(mpath)
        finished = key_hash({k: manifest.get(k) for k in key})
        if finished != log.key and log.first_key() == finished:
            log.path.unlink()
    return log


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
