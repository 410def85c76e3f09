"""HF-generate engine: behaviour log-probs equal a forward pass's; sampling settings are ours, not the model's."""
from __future__ import annotations

import pytest
import torch

from scalelab.core.hfgen import stop_token_ids
from scalelab.grpo.completions import cut_at_stop
from scalelab.grpo.engine_hf import HFGenerateEngine
from scalelab.grpo.logprobs import completion_tokens
from scalelab.grpo.types import RolloutBatch, SamplingParams
from tests.grpo.tiny import tiny_llama, tiny_tokenizer

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]


def forward_logprobs(model, prompt, completion, temperature):
    ids = torch.tensor([list(prompt) + list(completion)])
    logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


@pytest.fixture(scope="module")
def engine():
    model, tok = tiny_llama(), tiny_tokenizer()
    # generation_config.json values of the kind instruct models ship (Qwen2.5: 0.7 / 20 / 1.05); must not leak
    model.generation_config.temperature, model.generation_config.top_k = 0.3, 3
    model.generation_config.repetition_penalty = 1.5
    return HFGenerateEngine(model, tok, stop_token_ids(model, tok), ("shared",))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_forward_pass_logprobs(engine, temperature):
    batch = engine.generate(PROMPTS, SamplingParams(n=4, temperature=temperature, max_new_tokens=12, seed=3))
    assert len(batch.completion_ids) == 12 and batch.prompt_ids[4] == tuple(PROMPTS[1])  # group-major
    for prompt, comp, lp in zip(batch.prompt_ids, batch.completion_ids, batch.logprobs):
        ref = forward_logprobs(engine.model, prompt, comp, temperature)
        # left-padded batched generation vs an unpadded single forward: same numbers up to fp32 noise
        assert torch.allclose(torch.tensor(lp), ref, atol=1e-4), (prompt, comp)


def test_sampling_ignores_the_models_generation_config(engine):
    batch = engine.generate(PROMPTS, SamplingParams(n=8, temperature=1.0, max_new_tokens=12, seed=0))
    # a near-uniform random model: at T=1 without top-k most sampled tokens fall outside the top 3
    logps = [x for lp in batch.logprobs for x in lp]
    assert min(logps) < -4.0  # ~log(1/47) = -3.85 is uniform; top-3 sampling never goes that low
    outside = 0
    for prompt, comp in zip(batch.prompt_ids, batch.completion_ids):
        ids = torch.tensor([list(prompt) + list(comp)])
        top3 = engine.model(ids).logits[0, len(prompt) - 1:-1].topk(3).indices
        outside += sum(int(c not in top3[i]) for i, c in enumerate(comp))
    assert outside > 0.5 * sum(batch.lengths)


def test_same_seed_same_batch_other_seed_other_batch(engine):
    p = SamplingParams(n=2, max_new_tokens=8, seed=11)
    a, b = engine.generate(PROMPTS, p), engine.generate(PROMPTS, p)
    c = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=8, seed=12))
    assert a.completion_ids == b.completion_ids and a.completion_ids != c.completion_ids
    assert a.completion_ids[0] != a.completion_ids[1]  # the n samples of a prompt differ


def test_completion_stops_at_and_keeps_the_stop_token():
    assert cut_at_stop([4, 5, 1, 0, 0], [1]) == (3, True)
    assert cut_at_stop([4, 5, 6], [1]) == (3, False)


def test_batch_accounting_and_round_trip():
    b = RolloutBatch(((1, 2),), ((3, 4, 5),), ("abc",), ((-1.0, -2.0, -0.5),), (False,), 500.0, 7, "hf")
    assert b.lengths == (3,) and b.num_tokens == 3 and b.tokens_per_s == pytest.approx(6.0)
    assert RolloutBatch.from_dict(b.to_dict()) == b


def test_server_choice_parsing_prefers_token_ids_and_falls_back():
    lp = {"token_logprobs": [-0.1, -0.2], "tokens": ["token_id:7", "token_id:1"]}
    assert completion_tokens({"index": 0, "token_ids": [7, 1], "logprobs": lp}) == ([7, 1], [-0.1, -0.2])
    assert completion_tokens({"index": 0, "logprobs": lp}) == ([7, 1], [-0.1, -0.2])
