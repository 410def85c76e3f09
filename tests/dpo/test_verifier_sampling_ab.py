"""bench/verifier_sampling_ab.py's bookkeeping, on a stand-in for the server's /v1/completions: the variant
grammar, the A B B A order within a server, the per-batch seeds (dpo.samplers.batch_seed, absent unseeded),
requests in flight, and the counts and medians of a hand-made workload."""
from __future__ import annotations

import threading
import time

import pytest

from scalelab.dpo.config import VerifierConfig
from tests.bench_script import load_bench

ab = load_bench("verifier_sampling_ab")
V = ab.Variant


def test_variants_parse_and_bad_ones_name_the_text():
    assert ab.parse_variant("seeded@2048x4") == V(True, 2048, 4)
    assert ab.parse_variant(" unseeded@1024") == V(False, 1024, 1)
    assert ab.parse_variant("seeded@1024").name == "seeded@1024x1"
    for bad in ("seeded", "fixed@1024", "seeded@x4", "seeded@0", "seeded@1024x0"):
        with pytest.raises(ValueError, match=f"variant {bad!r}"):
            ab.parse_variant(bad)


def test_schedule_groups_by_server_and_orders_a_b_b_a():
    a, b, c = V(True, 1024), V(False, 2048), V(True, 2048, 4)
    assert ab.schedule([a, b, c]) == [(1024, [a, a]), (2048, [b, c, c, b])]
    assert ab.schedule([b, c, b], repeats=3) == [(2048, [b, c, c, b, b, c])]


class StandIn:
    """Answers each request with n completions per prompt: prompt p's j-th completion is [p, j, (stop)] with the
    stop id only when j is even, and the rest padded to max_tokens for odd j; records seeds and the most
    requests seen in flight."""

    def __init__(self, delay_s: float = 0.0):
        self.seeds, self.inflight, self.most, self.delay_s = [], 0, 0, delay_s
        self.lock = threading.Lock()

    def __call__(self, url, body, timeout):
        with self.lock:
            self.inflight += 1
            self.most = max(self.most, self.inflight)
            self.seeds.append(body.get("seed"))
        time.sleep(self.delay_s)
        choices = []
        for i, prompt in enumerate(body["prompt"]):
            for j in range(body["n"]):
                ids = [prompt[0], j, 99] if j % 2 == 0 else [prompt[0], j] + [7] * (body["max_tokens"] - 2)
                choices.append({"index": i * body["n"] + j, "token_ids": ids})
        with self.lock:
            self.inflight -= 1
        return {"choices": choices[::-1]}     # out of order: the bench sorts by index


def workload(n_prompts: int, batch: int) -> "ab.Workload":
    # correct when the completion text is "<prompt> 0" (j = 0): one right of k = 4 per prompt
    return ab.Workload([[p] for p in range(n_prompts)], lambda i, text: text == f"{i} 0",
                       lambda ids: " ".join(map(str, ids)), {99},
                       VerifierConfig(samples_per_prompt=4, temperature=1.0, top_p=1.0, max_new_tokens=5,
                                      batch_prompts=batch, seed=3))


def test_measure_counts_tokens_limits_and_grades_with_per_batch_seeds():
    post = StandIn()
    run = ab.measure("http://x", workload(5, 2), V(True, 1024), post=post)
    assert post.seeds == [3 * 100_003 + 0, 3 * 100_003 + 2, 3 * 100_003 + 4]
    assert run.sequences == 20
    assert run.tokens == 5 * (2 + 2 + 5 + 5)      # even j: 2 ids before the stop; odd j: max_tokens, no stop
    assert run.hit_limit == 10 and run.correct == 5
    post = StandIn()
    ab.measure("http://x", workload(5, 2), V(False, 1024), post=post)
    assert post.seeds == [None, None, None]


def test_inflight_bounds_the_requests_at_once():
    post = StandIn(delay_s=0.05)
    ab.measure("http://x", workload(16, 2), V(True, 2048, 3), post=post)
    assert post.most == 3
    post = StandIn(delay_s=0.02)
    ab.measure("http://x", workload(8, 2), V(True, 2048, 1), post=post)
    assert post.most == 1


def test_a_short_reply_names_the_batch():
    def short(url, body, timeout):
        return {"choices": [{"index": 0, "token_ids": [1]}]}
    with pytest.raises(RuntimeError, match="batch at prompt 0: asked for 8 completions, got 1"):
        ab.measure("http://x", workload(2, 2), V(True, 1024), post=short)


def test_summary_medians_shares_and_ratio_to_the_first_variant():
    runs = [ab.Run("a", 10.0, 100, 1000, 10, 50), ab.Run("b", 5.0, 100, 1000, 0, 60),
            ab.Run("b", 4.0, 100, 1000, 0, 40), ab.Run("a", 20.0, 100, 1000, 30, 50)]
    rows = {r["variant"]: r for r in ab.summarize(runs)}
    assert rows["a"]["median_tokens_per_s"] == 75.0 and rows["a"]["min_tokens_per_s"] == 50.0
    assert rows["b"]["median_tokens_per_s"] == 225.0 and rows["b"]["vs_first"] == 3.0
    assert rows["a"]["hit_limit_share"] == 0.2 and rows["b"]["correct_share"] == 0.5
    assert rows["a"]["mean_tokens_per_sequence"] == 10.0 and rows["a"]["median_wall_s"] == 15.0


def test_predictions_parse_and_sit_beside_the_measured_ratios():
    predicted = ab.parse_predictions("unseeded@2048=2.5, seeded@2048x4=1.2")
    assert predicted == {"unseeded@2048x1": 2.5, "seeded@2048x4": 1.2}
    for bad in ("unseeded@2048", "unseeded@2048=x", "unseeded@2048=0", "odd@1=1"):
        with pytest.raises(ValueError, match="prediction"):
            ab.parse_predictions(bad)
    rows = ab.beside([{"variant": "seeded@1024x1", "vs_first": 1.0}, {"variant": "unseeded@2048x1", "vs_first": 2.0}],
                     predicted)
    assert rows[0]["predicted_vs_first"] is None and rows[0]["measured_over_predicted"] is None
    assert rows[1]["predicted_vs_first"] == 2.5 and rows[1]["measured_over_predicted"] == 0.8
