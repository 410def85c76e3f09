"""Workloads: ShareGPT sampling (the real packaged file and local files), synthetic prompts, arrival schedules."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from scalelab.core.gpt2bpe import gpt2_encoding
from scalelab.core.readers import SourceError
from scalelab.serve.workload import (LengthFilter, arrival_times, count_tokens, first_exchange, gamma_shape_for_cv,
                                     sample_sharegpt, single_token_words, synthetic_requests)


class WordTokenizer:
    """One token per whitespace-separated word: lengths in the local-file tests are countable by eye."""

    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split())))


@pytest.fixture(scope="module")
def packaged_sample():
    return sample_sharegpt(40, seed=7, scan_limit=1500)


def test_packaged_sharegpt_respects_length_filters(packaged_sample):
    enc = gpt2_encoding()
    assert len(packaged_sample) == 40
    assert [r.request_id for r in packaged_sample] == list(range(40))
    for r in packaged_sample:
        assert 100 <= r.prompt_tokens <= 2000 and 100 <= r.output_tokens <= 500
        assert r.prompt_tokens == len(enc.encode_ordinary(r.prompt))


def test_packaged_sharegpt_is_deterministic_per_seed(packaged_sample):
    again = sample_sharegpt(40, seed=7, scan_limit=1500)
    other = sample_sharegpt(40, seed=8, scan_limit=1500)
    assert again == packaged_sample
    assert [r.prompt for r in other] != [r.prompt for r in packaged_sample]


def conversation(human: str, gpt: str, first: str = "human") -> dict:
    turns = [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]
    return {"id": "x", "conversations": turns if first == "human" else [{"from": "gpt", "value": "hi"}] + turns}


def test_local_truncated_sharegpt_file_with_custom_filter(tmp_path):
    rows = [conversation("a " * 5, "b " * 3),  # 5 / 3 words: passes 4..6 / 2..4
            conversation("a " * 2, "b " * 3),  # prompt too short
            conversation("a " * 6, "b " * 9),  # output too long
            conversation("c " * 4, "d " * 2, first="gpt"),  # leading gpt turn skipped: pair is the 2nd/3rd
            {"id": "y", "conversations": [{"from": "human", "value": "no answer"}]}]
    text = json.dumps(rows)
    path = tmp_path / "sg.json"
    path.write_text(text[:-40])  # cut inside the last record, as the packaged file is
    lengths = LengthFilter(prompt_min=4, prompt_max=6, output_min=2, output_max=4)
    got = sample_sharegpt(2, seed=0, source=str(path), tokenizer=WordTokenizer(), lengths=lengths)
    assert sorted((r.prompt_tokens, r.output_tokens) for r in got) == [(4, 2), (5, 3)]
    with pytest.raises(SourceError, match="only 2 of 4 conversations pass"):
        sample_sharegpt(3, seed=0, source=str(path), tokenizer=WordTokenizer(), lengths=lengths)
    # cycling: the two passing exchanges repeat in the same order, each request keeps an id of its own
    cycled = sample_sharegpt(5, seed=0, source=str(path), tokenizer=WordTokenizer(), lengths=lengths, cycle=True)
    assert [r.request_id for r in cycled] == [0, 1, 2, 3, 4]
    assert [r.prompt for r in cycled] == [got[0].prompt, got[1].prompt] * 2 + [got[0].prompt]


def test_first_exchange_needs_human_then_gpt():
    assert first_exchange(conversation("q", "a")) == ("q", "a")
    assert first_exchange({"conversations": [{"from": "gpt", "value": "a"}]}) is None
    assert first_exchange(["not", "a", "dict"]) is None


def test_missing_local_file_is_a_clear_error(tmp_path):
    with pytest.raises(SourceError, match="no such ShareGPT file"):
        sample_sharegpt(1, seed=0, source=str(tmp_path / "nope.json"))


def test_synthetic_prompt_token_count_is_exact():
    enc = gpt2_encoding()
    reqs = synthetic_requests(20, seed=3, prompt_range=(50, 300), output_range=(10, 20))
    n_words = len(single_token_words(enc))
    rng = np.random.default_rng(3)  # replay the draws: prompt length, output length, then the word picks
    for r in reqs:
        p, o = int(rng.integers(50, 301)), int(rng.integers(10, 21))
        rng.integers(0, n_words, size=p)
        assert (r.prompt_tokens, r.output_tokens) == (p, o)
        assert count_tokens(enc, r.prompt) == p
    assert synthetic_requests(20, seed=3, prompt_range=(50, 300), output_range=(10, 20)) == reqs


def test_poisson_schedule_mean_gap_and_cv():
    t = arrival_times(200_001, rate_rps=5.0, seed=1)
    gaps = np.diff(t, prepend=0.0)  # the first request waits one gap after the run start, as vLLM's does
    assert t[0] > 0.0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.2, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)  # exponential: CV = 1


@pytest.mark.parametrize("k", [0.25, 4.0])
def test_gamma_burstiness_sets_cv(k):
    gaps = np.diff(arrival_times(200_001, rate_rps=5.0, seed=2, burstiness=k))
    assert gaps.mean() == pytest.approx(0.2, rel=0.02)  # the rate does not change with burstiness
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(k), rel=0.03)  # gamma: CV = 1/sqrt(k)


def four_sigma(cv: float, n: int) -> tuple[float, float]:
    """How far a correct sampler's seeded draw may land, as relative errors (4 standard errors, large n):
    the mean of n i.i.d. gaps of coefficient of variation c has relative standard error c / sqrt(n); their
    sample standard deviation ~ sqrt((kurtosis - 1) / n) / 2, and a gamma's kurtosis is 3 + 6/k = 3 + 6 c^2.
    The CV's error is bounded by the sum of the two."""
    mean_se = cv / math.sqrt(n)
    sd_se = 0.5 * math.sqrt((2 + 6 * cv ** 2) / n)
    return 4 * mean_se, 4 * (mean_se + sd_se)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
def test_gamma_arrivals_with_the_cv_as_the_parameter(cv):
    n, rate = 100_000, 8.0
    gaps = np.diff(arrival_times(n + 1, rate_rps=rate, seed=11, cv=cv))
    mean_tol, cv_tol = four_sigma(cv, n)          # cv 2: 2.5% on the mean, 5.8% on the CV
    assert gaps.mean() == pytest.approx(1 / rate, rel=mean_tol)
    assert gaps.std(ddof=1) / gaps.mean() == pytest.approx(cv, rel=cv_tol)
    # the CV and the shape name the same process: k = 1 / cv^2 gives the same draws
    assert np.array_equal(arrival_times(50, rate, 11, cv=cv), arrival_times(50, rate, 11, gamma_shape_for_cv(cv)))


def test_cv_one_is_poisson_and_both_knobs_at_once_is_an_error():
    assert np.array_equal(arrival_times(100, 2.0, seed=4, cv=1.0), arrival_times(100, 2.0, seed=4))
    assert gamma_shape_for_cv(0.5) == pytest.approx(4.0) and gamma_shape_for_cv(2.0) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="both burstiness"):
        arrival_times(10, 2.0, seed=0, burstiness=0.5, cv=2.0)
    with pytest.raises(ValueError, match="must be > 0"):
        gamma_shape_for_cv(0.0)


def test_schedule_inf_rate_and_seeding():
    assert np.array_equal(arrival_times(4, math.inf, seed=0), np.zeros(4))
    assert np.array_equal(arrival_times(50, 3.0, seed=9), arrival_times(50, 3.0, seed=9))
    with pytest.raises(ValueError, match="must be > 0"):
        arrival_times(3, 0.0, seed=0)
