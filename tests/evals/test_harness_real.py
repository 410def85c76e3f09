"""The lm-eval harness checked on a real model before any trained model is scored with it (issue 27, item 3):
run_lm_eval on the real Qwen2.5-Coder-0.5B-Instruct (CPU, float32, the first LIMIT items of HellaSwag, ARC-Easy
and PIQA), and every per-item log-likelihood lm-eval recorded against scalelab.evals.loglik, our own unpadded
HF forward pass over the same (context, continuation) pairs; acc and acc_norm recomputed from our sums equal
lm-eval's per item and on average.

Tolerance: |ours - lm-eval's| <= TOL_PER_TOKEN x (continuation tokens) nats per choice. Both sides run the model
in float32 on CPU; we take log_softmax in float64, lm-eval in float32 (HFLM._loglikelihood_tokens, F.log_softmax
on the model's logits). Measured on PIQA item 0, choice 0 (37 tokens): lm-eval's -112.86048 is bit for bit
torch.log_softmax in float32 of our own logits, which in float64 give -112.86292; the float32 log_softmax of
torch's CPU kernel over Qwen's 151,936 logits is off by 6.6e-5 nats per token on average (1.0e-4 at most),
while the forward pass itself is not the source (the same item run in float64 moves our
sum by 6e-6). So the bound is 2e-4 per token, twice the largest seen. A real disagreement is larger by orders of
magnitude: a continuation split at another token boundary, or a token scored from the wrong position, moves the
sum by whole nats (a Qwen token's log-probability is typically -1 to -10).
"""
from __future__ import annotations

import pytest

from scalelab.evals import harness
from scalelab.evals.loglik import choice_metrics, score_pairs

pytestmark = pytest.mark.slow

LIMIT = 4
TASKS = ("hellaswag", "arc_easy", "piqa")
TOL_PER_TOKEN = 2e-4
N_CHOICES = {"hellaswag": {4}, "piqa": {2}, "arc_easy": {3, 4, 5}}


@pytest.fixture(scope="module")
def evaluated(qwen05_folder, shared_data, tmp_path_factory):
    cache = tmp_path_factory.mktemp("lmeval-cache")
    r = harness.run_lm_eval(qwen05_folder, list(TASKS), data_dir=shared_data, limit=LIMIT, batch_size=8,
                            device="cpu", dtype="float32", cache_dir=cache, log_samples=True)
    return r, requests(shared_data, cache)


def requests(shared_data, cache) -> dict[str, dict[int, tuple[list[tuple[str, str]], str]]]:
    """task -> doc_id -> (the (context, continuation) pairs lm-eval scores, in choice order; the delimiter
    between prompt and choice), built by lm-eval from our task definitions as the run builds them."""
    specs = harness.resolve_tasks(list(TASKS))
    _, task_dir = harness.prepare_local(specs, shared_data, cache)
    tm = harness.task_manager(specs, "local", task_dir)
    out = {}
    for spec, task in zip(specs, harness.load_tasks(tm, specs, "local", {})):
        task.build_all_requests(limit=LIMIT)
        items: dict[int, dict[int, tuple[str, str]]] = {}
        for inst in task.instances:
            items.setdefault(inst.doc_id, {})[inst.idx] = inst.args
        out[spec.name] = {d: ([pairs[i] for i in sorted(pairs)], task.config.target_delimiter)
                          for d, pairs in items.items()}
    return out


@pytest.fixture(scope="module")
def ours(evaluated, qwen05_folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(qwen05_folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(qwen05_folder)
    _, reqs = evaluated
    return {name: {d: score_pairs(model, tok, pairs) for d, (pairs, _) in items.items()}
            for name, items in reqs.items()}


@pytest.mark.parametrize("name", TASKS)
def test_every_loglikelihood_equals_our_forward_pass(evaluated, ours, name):
    r, reqs = evaluated
    samples = sorted(r.samples[name], key=lambda s: s["doc_id"])
    assert [s["doc_id"] for s in samples] == list(range(LIMIT)) == sorted(reqs[name])
    worst = 0.0
    for s in samples:
        scores = ours[name][s["doc_id"]]
        assert len(scores) == len(s["loglikelihoods"]) and len(scores) in N_CHOICES[name]
        for p, theirs in zip(scores, s["loglikelihoods"]):
            per_token = abs(p.loglik - theirs) / p.n_tokens
            worst = max(worst, per_token)
            assert per_token <= TOL_PER_TOKEN, (s["doc_id"], p, theirs)
    print(f"{name}: max |ours - lm-eval| per token = {worst:.2e} nats over {LIMIT} items")


@pytest.mark.parametrize("name", TASKS)
def test_acc_and_acc_norm_recomputed_equal_lm_eval(evaluated, ours, name):
    r, reqs = evaluated
    totals = {"acc": 0.0, "acc_norm": 0.0}
    for s in r.samples[name]:
        pairs, delimiter = reqs[name][s["doc_id"]]
        choices = [cont.removeprefix(delimiter) for _, cont in pairs]  # the choice text, as doc_to_choice gives it
        mine = choice_metrics([p.loglik for p in ours[name][s["doc_id"]]], choices, int(s["target"]))
        assert (mine["acc"], mine["acc_norm"]) == (s["acc"], s["acc_norm"]), s["doc_id"]
        for k in totals:
            totals[k] += mine[k]
    task = r.task(name)
    assert task.n_examples == LIMIT
    for k, total in totals.items():
        assert task.metric(k).value == pytest.approx(total / LIMIT, abs=1e-12)
