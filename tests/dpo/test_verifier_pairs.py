"""Verifier-built pairs: right answers become chosen, wrong ones rejected; uninformative prompts give none."""
from __future__ import annotations

import numpy as np
import pytest

from scalelab.dpo.config import VerifierConfig
from scalelab.dpo.verifier_pairs import (VerifierSetSummary, build_pairs, informative_pairs, manifest_key,
                                         reusable, sample_answers, write_verifier_set)
from scalelab.evals.tasks import Example, Score


class ExactTask:
    """Correct when the completion is exactly the gold answer."""
    name = "exact"

    def score(self, example, completion):
        return Score(completion == example.answer, completion, "")


def _ex(i, answer):
    return Example("exact", str(i), [{"role": "user", "content": f"q{i}"}], answer)


def test_pairs_only_from_mixed_groups_and_counts():
    examples = [_ex(0, "4"), _ex(1, "7"), _ex(2, "9")]
    completions = [["4", "4", "4"], ["1", "2", "3"], ["9", "8", "9"]]
    task = ExactTask()
    correct = [[task.score(e, c).correct for c in g] for e, g in zip(examples, completions)]
    pairs, counts = build_pairs(examples, completions, correct, pairs_per_prompt=5, seed=0)
    assert counts == {"sample_accuracy": pytest.approx(5 / 9), "prompts_all_correct": 1,
                      "prompts_all_wrong": 1, "prompts_informative": 1}
    # prompt 2: one distinct right answer ("9", sampled twice) x one wrong ("8") -> exactly one pair
    assert len(pairs) == 1
    p = pairs[0]
    assert p.prompt == examples[2].prompt and p.chosen == [{"role": "assistant", "content": "9"}]
    assert p.rejected == [{"role": "assistant", "content": "8"}] and p.source == "verifier:exact"


def test_pairs_per_prompt_caps_and_is_seeded():
    ex = _ex(0, "5")
    group, ok = ["5", "five", "6", "7", "8"], [True, True, False, False, False]
    rng = lambda: np.random.default_rng(3)  # noqa: E731
    pairs = informative_pairs(ex, group, ok, max_pairs=2, rng=rng())
    assert len(pairs) == 2 and len({(p.chosen[0]["content"], p.rejected[0]["content"]) for p in pairs}) == 2
    assert all(p.chosen[0]["content"] in ("5", "five") for p in pairs)
    assert all(p.rejected[0]["content"] in ("6", "7", "8") for p in pairs)
    assert informative_pairs(ex, group, ok, max_pairs=2, rng=rng()) == pairs
    assert len(informative_pairs(ex, group, ok, max_pairs=100, rng=rng())) == 6  # 2 right x 3 wrong


def test_manifest_reuse_detects_changes(tmp_path):
    cfg = VerifierConfig(num_prompts=3)
    pairs, _ = build_pairs([_ex(0, "1")], [["1", "2"]], [[True, False]], 1, 0)
    summary = VerifierSetSummary("exact", "train", 1, 2, 0.5, 0, 0, 1, 1, 0.1)
    path = write_verifier_set(tmp_path / "p.jsonl", pairs, summary, manifest_key("m", cfg))
    assert reusable(path, manifest_key("m", cfg))
    assert not reusable(path, manifest_key("other-model", cfg))
    assert not reusable(path, manifest_key("m", VerifierConfig(num_prompts=3, temperature=0.5)))
    assert reusable(path, manifest_key("m", VerifierConfig(num_prompts=3, reuse=False)))  # reuse is not a setting
    path.write_text(path.read_text() + "\n")
    assert not reusable(path, manifest_key("m", cfg))  # edited after writing


def test_sampling_is_seeded_and_gives_k_per_prompt(tiny_model_dir):
    from scalelab.core.hfmodel import load_causal_lm
    model, tok = load_causal_lm(str(tiny_model_dir), device="cpu")
    prompts = [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(3)]
    cfg = VerifierConfig(samples_per_prompt=3, max_new_tokens=5, batch_prompts=2, seed=1)
    a, b = sample_answers(model, tok, prompts, cfg), sample_answers(model, tok, prompts, cfg)
    assert a == b and [len(g) for g in a] == [3, 3, 3]
    assert len({c for g in a for c in g}) > 3  # temperature 1 on a random model: varied samples
    assert sample_answers(model, tok, prompts, VerifierConfig(samples_per_prompt=3, max_new_tokens=5,
                                                              batch_prompts=2, seed=2)) != a
