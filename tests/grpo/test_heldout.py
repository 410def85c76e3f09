"""Held-out evaluation: per-example pass@1 with a scripted engine (values by hand), greedy decoding, the split
never trained on, and eval in the loop / after the fact on a tiny run."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from scalelab.core.config import ConfigError, load_config
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.engine_hf import HFGenerateEngine
from scalelab.grpo.heldout import EvalSettings, base_key, compare, eval_run, evaluate_policy, headline, load_eval
from scalelab.grpo.parts import heldout_examples, training_stages
from scalelab.grpo.train import train
from scalelab.grpo.types import SamplingParams
from tests.grpo.tiny import tiny_llama, tiny_parts, tiny_tokenizer


@dataclass
class Scripted:
    """An engine that answers each call from a list of replies: greedy calls get `greedy`, sampled `sampled`."""
    greedy: list[str]
    sampled: list[str]
    weights_version: int = 0

    def generate(self, prompts, params: SamplingParams):
        source = self.greedy if params.temperature == 0 else self.sampled
        texts = [source.pop(0) for _ in range(len(prompts) * params.n)]
        return type("B", (), {"texts": texts, "lengths": [len(t) for t in texts]})()


def examples(answers):
    return [type("E", (), {"id": f"e{i}", "answer": a, "prompt": "q", "task": "arithmetic"})()
            for i, a in enumerate(answers)]


def exact(ex, text: str) -> bool:
    return text.strip() == ex.answer


def test_pass_at_1_per_example_by_hand():
    exs = examples(["3", "5", "7"])
    settings = EvalSettings(greedy=True, samples=2, temperature=1.0, max_new_tokens=4, prompts_per_call=2, seed=0)
    engine = Scripted(greedy=["3", "4", "7"], sampled=["3", "3", "0", "5", "0", "0"])
    ev = evaluate_policy(engine, tiny_tokenizer(), exs, settings, "base", "k", "test", scorer=exact)
    assert [r.greedy_correct for r in ev.examples] == [True, False, True]
    assert [r.sample_correct for r in ev.examples] == [2, 1, 0]
    assert ev.greedy_pass1 == pytest.approx(2 / 3)
    assert ev.sampled_pass1 == pytest.approx((1 + 0.5 + 0) / 3)
    assert ev.pass_at_n == pytest.approx((1 + 1 + 0) / 3)  # pass@2 with n = 2: any of the two right

    trained = evaluate_policy(Scripted(["3", "5", "7"], ["3", "3", "5", "5", "7", "0"], 4), tiny_tokenizer(), exs,
                              settings, "trained", "k", "test", scorer=exact)
    cfg = load_config(GrpoConfig, None, ["eval.bootstrap_resamples=200"])
    s = compare(ev, trained, cfg)
    assert s["greedy_pass1"]["delta"] == pytest.approx(1 / 3)  # example 2 flipped to right
    assert s["sampled_pass1"]["delta"] == pytest.approx((0 + 0.5 + 0.5) / 3)
    assert s["pass_at_n"] == {"n": 2, "base": pytest.approx(2 / 3), "trained": 1.0}
    assert s["trained_steps"] == 4
    assert headline(s).startswith("held-out test (3 examples) greedy pass1: 66.7% -> 100.0% (+33.3 points")


def test_greedy_decoding_is_the_argmax_and_ignores_the_seed():
    model, tok = tiny_llama(), tiny_tokenizer()
    engine = HFGenerateEngine(model, tok, [1], ("shared",))
    prompt = tok("3+4=?")["input_ids"]
    a = engine.generate([prompt], SamplingParams(n=1, temperature=0.0, max_new_tokens=5, seed=1))
    b = engine.generate([prompt], SamplingParams(n=1, temperature=0.0, max_new_tokens=5, seed=2))
    assert a.completion_ids == b.completion_ids
    with torch.no_grad():
        first = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
    assert a.completion_ids[0][0] == first


def test_heldout_split_is_never_the_training_split_and_shares_no_question():
    with pytest.raises(ConfigError, match="'eval.split': 'train' is the training split"):
        load_config(GrpoConfig, None, ["eval.split=train"])
    cfg = load_config(GrpoConfig, None, ["data.task_options={digits = 2}", "data.limit=300", "eval.limit=50"])
    train_q = {e.prompt[0]["content"] for e in training_stages(cfg)[-1]}
    test_q = {e.prompt[0]["content"] for e in heldout_examples(cfg)}
    assert len(test_q) > 40 and not train_q & test_q
    other_seed = load_config(GrpoConfig, None, ["data.task_options={digits = 2}", "eval.limit=50", "train.seed=7"])
    assert [e.id for e in heldout_examples(other_seed)] == [e.id for e in heldout_examples(cfg)]
    assert base_key(other_seed) == base_key(cfg)  # the seed does not change the base evaluation


# A model biased to stop at once, paid for length: two steps visibly change what it generates.
TINY = ["train.device=cpu", "data.task_options={digits = 1}", "data.limit=32", "data.prompts_per_step=2",
        "rollout.group_size=8", "rollout.max_new_tokens=8", "optim.micro_batch_size=16", "model.lora.enabled=false",
        "optim.lr=5e-3", "train.max_steps=2", "eval.at_end=true", "eval.limit=6", "eval.samples=2",
        "eval.bootstrap_resamples=200", "data.rewards=['length_aware']",
        "data.reward_options={length_aware = {exploit = 'length', target_chars = 16}}"]


def test_eval_in_the_loop_then_after_the_fact(tmp_path):
    cfg = load_config(GrpoConfig, None, [*TINY, f"run.out_dir={tmp_path}", "run.name=r"])
    results = train(cfg, tiny_parts(cfg, eos_bias=2.0), log=lambda s: None)
    base, trained = load_eval(cfg.run_dir, "base"), load_eval(cfg.run_dir, "trained")
    assert (base.weights_version, trained.weights_version) == (0, 2)
    assert [r.id for r in base.examples] == [e.id for e in heldout_examples(cfg)]
    assert all(r.samples == 2 and len(r.sample_tokens) == 2 for r in trained.examples)
    assert results["heldout"]["n_examples"] == 6 and results["heldout"]["split"] == "test"
    # same sampling seed, moved weights: some sampled completion ends elsewhere
    assert [r.sample_tokens for r in trained.examples] != [r.sample_tokens for r in base.examples]

    # after the fact, from the folder: nothing to redo; forced, on a fresh untrained model: the checkpoint's
    # weights give the in-loop trained results again
    summary = eval_run(cfg.run_dir, parts=tiny_parts(cfg, eos_bias=2.0), log=lambda s: None)
    assert summary == results["heldout"]
    forced = eval_run(cfg.run_dir, force=True, parts=tiny_parts(cfg, eos_bias=2.0), log=lambda s: None)
    assert forced["greedy_pass1"] == summary["greedy_pass1"]
    again = load_eval(cfg.run_dir, "trained")
    assert [r.sample_tokens for r in again.examples] == [r.sample_tokens for r in trained.examples]


def test_strict_gsm8k_pass1_beside_lenient_on_the_reference_protocol():
    from scalelab.evals.tasks import get_task
    task = get_task("gsm8k", prompt_format="qwen_boxed")
    exs = [type("E", (), {"id": f"g{i}", "answer": a, "prompt": "q", "task": "gsm8k",
                          "meta": {"prompt_format": "qwen_boxed"}})() for i, a in enumerate(["18", "3", "7"])]
    score = lambda ex, text: task.score(ex, text).correct  # noqa: E731  lenient: the box, else the last number
    settings = EvalSettings(greedy=True, samples=0, temperature=1.0, max_new_tokens=4, prompts_per_call=3, seed=0)
    base = evaluate_policy(Scripted(["so 18", "\\boxed{4}", "7 it is"], []), tiny_tokenizer(), exs, settings,
                           "base", "k", "test", scorer=score)
    trained = evaluate_policy(Scripted(["\\boxed{18}", "\\boxed{3}", "7 it is"], [], 5), tiny_tokenizer(), exs,
                              settings, "trained", "k", "test", scorer=score)
    cfg = load_config(GrpoConfig, None, ["eval.bootstrap_resamples=200", "data.task=\"gsm8k\"",
                                         "data.task_options={prompt_format = \"qwen_boxed\"}"])
    s = compare(base, trained, cfg)
    # lenient: base right on 1 and 3 (last numbers 18 and 7), trained on all three
    assert (s["greedy_pass1"]["base"], s["greedy_pass1"]["trained"]) == (pytest.approx(2 / 3), 1.0)
    # strict: only boxed answers count: base 0 of 3, trained 2 of 3 (the third is unboxed)
    assert (s["greedy_strict_pass1"]["base"], s["greedy_strict_pass1"]["trained"]) == (0.0, pytest.approx(2 / 3))
    assert "strict 0.0% -> 66.7%" in headline(s)
