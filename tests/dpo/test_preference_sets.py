"""The preference sets of the real-model runs: GSM8K verifier pairs on the reference protocol (scripted sampler),
the hash hold-out, the vLLM completions sampler against a stand-in server, HH-RLHF skip counts, UltraFeedback."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from scalelab.dpo.config import VerifierConfig
from scalelab.dpo.data import (MalformedRow, PreferencePair, hash_fraction, load_pairs, skip_reasons, split_by_hash,
                               write_pairs_jsonl)
from scalelab.dpo.samplers import CompletionsSampler, Sample, batch_seed
from scalelab.dpo.verifier_pairs import build_verifier_set, choose_examples, length_diff_summary
from scalelab.evals.tasks import get_task

U = lambda text: {"role": "user", "content": text}        # noqa: E731
A = lambda text: {"role": "assistant", "content": text}   # noqa: E731


class ScriptedSampler:
    """Fixed completions per prompt (by position: the batch's seed names its first prompt); a completion's token
    count is its number of words."""

    def __init__(self, groups):
        self.groups, self.calls = groups, []

    def batch(self, prompts, cfg, seed):
        start = seed - batch_seed(cfg, 0)
        self.calls.append(len(prompts))
        assert all(len(g) == cfg.samples_per_prompt for g in self.groups)
        return [[Sample(t, len(t.split())) for t in g] for g in self.groups[start:start + len(prompts)]]

    def workers(self, cfg):
        return 1


def gsm8k_cfg(**kw) -> VerifierConfig:
    return VerifierConfig(task="gsm8k", task_options={"prompt_format": "qwen_boxed"}, num_prompts=4,
                          samples_per_prompt=8, pairs_per_prompt=1, seed=0, **kw)


def test_gsm8k_verifier_pairs_counts_and_length_difference(shared_data):
    cfg = gsm8k_cfg()
    task = get_task(cfg.task, **cfg.task_options)
    examples = choose_examples(task, cfg)
    # the reference protocol: Qwen2.5-Math's system prompt, the bare question as the user turn
    assert examples[0].prompt[0]["role"] == "system" and "\\boxed{}" in examples[0].prompt[0]["content"]
    gold = [int(ex.answer) for ex in examples]
    right, wrong = (lambda i: f"\\boxed{{{gold[i]}}}"), (lambda i: f"\\boxed{{{gold[i] + 1}}}")
    groups = [
        [f"So {right(0)}."] * 8,                                                  # all right: dropped
        [f"So {wrong(1)}."] * 8,                                                  # all wrong: dropped
        [f"So {right(2)}."] * 3 + [f"Adding them gives {wrong(2)} in total."] * 5,    # 2 words vs 6
        [f"Step one, then step two. Hence {right(3)}."] + [wrong(3)] * 7,        # 7 words vs 1
    ]
    pairs, summary = build_verifier_set(ScriptedSampler(groups), task, cfg)
    assert (summary.prompts_all_correct, summary.prompts_all_wrong, summary.prompts_informative) == (1, 1, 2)
    assert summary.sample_accuracy == pytest.approx((8 + 0 + 3 + 1) / 32)
    assert summary.n_pairs == len(pairs) == 2 and summary.samples_per_prompt == 8
    assert [p.meta for p in pairs] == [{"chosen_tokens": 2, "rejected_tokens": 6, "length_diff_tokens": -4},
                                       {"chosen_tokens": 7, "rejected_tokens": 1, "length_diff_tokens": 6}]
    assert pairs[0].chosen == [A(f"So {right(2)}.")] and pairs[1].rejected == [A(wrong(3))]
    # diffs -4 and 6: mean 1, linear quantiles -4 + 0.1 * 10 and -4 + 0.9 * 10
    assert summary.length_diff == {"n": 2, "mean": 1.0, "median": 1.0, "p10": -3.0, "p90": 5.0,
                                   "share_chosen_longer": 0.5, "share_chosen_shorter": 0.5, "share_equal": 0.0}


def test_pair_meta_round_trips_and_old_records_are_unchanged(tmp_path):
    with_meta = PreferencePair([U("q")], [A("a")], [A("b")], "verifier:gsm8k", "x", {"length_diff_tokens": 3})
    plain = PreferencePair([U("q")], [A("a")], [A("b")], "test", "y")
    path = write_pairs_jsonl(tmp_path / "p.jsonl", [with_meta, plain])
    assert load_pairs("pairs", str(path)).pairs == [with_meta, plain]
    assert "meta" not in json.loads(path.read_text().splitlines()[1])  # sets written before meta hash the same
    assert length_diff_summary([plain]) is None


# ---------------------------------------------------------------------------------------------
# hold-out by the hash of the question


def test_hash_fraction_is_the_sha256_prefix():
    # FIPS 180-2's test vector: sha256("abc") starts ba7816bf8f01cfea
    assert hash_fraction("abc") == 0xba7816bf8f01cfea / 2 ** 64 == pytest.approx(0.728395, abs=1e-6)


def _q_pairs(n):
    sys = {"role": "system", "content": "Please reason step by step."}
    return [PreferencePair([sys, U(f"Question {i}?")], [A("r")], [A(w)], "t", f"{i}{w}")
            for i in range(n) for w in ("w1", "w2")]


def test_split_by_hash_keeps_questions_whole_and_ignores_order_and_subset():
    pairs = _q_pairs(200)
    train, val = split_by_hash(pairs, 0.25)
    val_q = {p.question_key for p in val}
    assert not val_q & {p.question_key for p in train} and len(train) + len(val) == 400
    assert len(val) % 2 == 0 and 30 <= len(val_q) <= 70        # Binomial(200, 0.25): mean 50, sd 6.1
    assert val_q == {p.question_key for p in pairs if hash_fraction(p.question_key) < 0.25}
    assert {p.id for p in split_by_hash(pairs[::-1], 0.25)[1]} == {p.id for p in val}
    sub_val = split_by_hash(pairs[:100], 0.25)[1]               # a smaller set holds out the same questions
    assert {p.id for p in sub_val} == {p.id for p in val if int(p.id[:-2]) < 50}
    # the system prompt (the asking format) is not part of the question
    other = [PreferencePair([U(p.prompt[1]["content"])], p.chosen, p.rejected, p.source, p.id) for p in pairs]
    assert {p.id for p in split_by_hash(other, 0.25)[1]} == {p.id for p in val}


def test_gsm8k_train_hash_holdout_size(shared_data):
    task = get_task("gsm8k", prompt_format="qwen_boxed")
    examples = task.load("train")
    keys = ["\n\n".join(m["content"].strip() for m in ex.prompt if m["role"] == "user") for ex in examples]
    held = sum(hash_fraction(k) < 0.1 for k in keys)
    assert len(examples) == 7473 and abs(held - 747.3) < 4 * 26  # Binomial(7473, 0.1): sd 25.9
    assert held == 742  # pinned: a change of the hash or of the question text moves it


# ---------------------------------------------------------------------------------------------
# the vLLM completions sampler, against a stand-in of vLLM's /v1/completions


class FakeVLLM(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        choices = []
        for p, ids in enumerate(body["prompt"]):
            for j in range(body["n"]):
                index = p * body["n"] + j
                toks = [7] * (len(ids) + j) + [99, 0, 0]  # stop id 99 ends it; what follows is not counted
                choices.append({"index": index, "text": f" p{ids[0]} s{j} ", "token_ids": toks})
        out = json.dumps({"choices": choices[::-1]}).encode()  # reversed: the sampler must sort by index
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_completions_sampler_groups_counts_and_seeds():
    server = HTTPServer(("127.0.0.1", 0), FakeVLLM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeVLLM.bodies = []
    try:
        render = lambda conv: [int(conv[0]["content"])] * int(conv[0]["content"])  # noqa: E731  (n ids of value n)
        sampler = CompletionsSampler(f"http://127.0.0.1:{server.server_port}", "policy", render, [99])
        cfg = VerifierConfig(samples_per_prompt=3, batch_prompts=2, seed=5, temperature=1.0, max_new_tokens=40)
        done = []
        out = sampler([[U("1")], [U("2")], [U("3")]], cfg, on_batch=lambda d, t: done.append((d, t)))
    finally:
        server.shutdown()
    assert [[s.text for s in g] for g in out] == [[f"p{i} s{j}" for j in range(3)] for i in (1, 2, 3)]
    # prompt i has i ids; sample j of it len(ids) + j tokens before the stop id
    assert [[s.n_tokens for s in g] for g in out] == [[1, 2, 3], [2, 3, 4], [3, 4, 5]]
    assert [b["seed"] for b in FakeVLLM.bodies] == [5 * 100_003 + 0, 5 * 100_003 + 2]
    assert FakeVLLM.bodies[0]["prompt"] == [[1], [2, 2]] and FakeVLLM.bodies[1]["prompt"] == [[3, 3, 3]]
    assert all(b["n"] == 3 and b["max_tokens"] == 40 and b["return_token_ids"] for b in FakeVLLM.bodies)
    assert done == [(2, 3), (3, 3)]


# ---------------------------------------------------------------------------------------------
# HH-RLHF harmless-base and UltraFeedback-binarized


def test_hh_rlhf_skips_counted_by_reason_and_held_out(shared_data):
    res = load_pairs("hh-rlhf", str(shared_data / "hh-rlhf" / "harmless-base_test.jsonl.gz"), strict=False)
    assert skip_reasons(res.skipped) == {"chosen and rejected dialogues differ before their final turn": 5,
                                         "'chosen' has an empty final assistant response": 4}
    train, val = split_by_hash(res.pairs, 0.1)
    assert len(train) + len(val) == 2303 and abs(len(val) - 230.3) < 4 * 14.4  # sd of Binomial(2303, 0.1)
    assert len(val) == 241  # pinned, as above


def test_skip_reasons_drops_details():
    skipped = [("f:1", "'chosen' has no final assistant turn (last role: user)"), ("f:2", "invalid JSON: Expecting"),
               ("f:3", "invalid JSON: Unterminated string"), ("f:4", "differ before their final turn (turn 3)")]
    assert skip_reasons(skipped) == {"invalid JSON": 2, "'chosen' has no final assistant turn": 1,
                                     "differ before their final turn": 1}


def _uf_row(i, prompt=None):
    """A row of HuggingFaceH4/ultrafeedback_binarized: prompt string, chosen/rejected/messages message lists."""
    q = f"Write a haiku about the number {i}."
    return {"prompt": q if prompt is None else prompt, "prompt_id": f"id{i}",
            "chosen": [U(q), A(f"good haiku {i}")], "rejected": [U(q), A(f"bad haiku {i}")],
            "messages": [U(q), A(f"good haiku {i}")], "score_chosen": 9.0, "score_rejected": 4.5}


def test_ultrafeedback_local_file_in_hub_format(tmp_path):
    path = tmp_path / "test_prefs.jsonl"
    path.write_text("".join(json.dumps(_uf_row(i)) + "\n" for i in range(4)))
    res = load_pairs("ultrafeedback", str(path))
    assert res.rows_read == 4 and [p.id for p in res.pairs] == ["id0", "id1", "id2", "id3"]
    assert res.pairs[2] == PreferencePair([U("Write a haiku about the number 2.")], [A("good haiku 2")],
                                          [A("bad haiku 2")], "ultrafeedback", "id2")
    path.write_text(json.dumps(_uf_row(0)) + "\n" + json.dumps(_uf_row(1, prompt="another question")) + "\n")
    with pytest.raises(MalformedRow, match=r"test_prefs\.jsonl:2: 'prompt' is not the conversations' last user"):
        load_pairs("ultrafeedback", str(path))


def test_ultrafeedback_hub_name_and_split(monkeypatch):
    import scalelab.dpo.data as data
    asked = []

    def fake_hub(hub_id, split, subset=""):
        asked.append((hub_id, split, subset))
        return iter([(f"{hub_id}[{split}]:{i + 1}", _uf_row(i)) for i in range(2)])
    monkeypatch.setattr(data, "iter_hub_rows", fake_hub)
    assert len(load_pairs("ultrafeedback").pairs) == 2
    assert len(load_pairs("ultrafeedback", split="test_prefs").pairs) == 2
    assert asked == [("HuggingFaceH4/ultrafeedback_binarized", "train_prefs", ""),
                     ("HuggingFaceH4/ultrafeedback_binarized", "test_prefs", "")]


def test_real_model_configs_load(shared_data):
    from pathlib import Path

    from scalelab.dpo.config import load_dpo_config
    root = Path(__file__).resolve().parents[2] / "configs" / "dpo"
    gsm = load_dpo_config(root / "qwen2.5-coder-1.5b-gsm8k-h200.toml")
    assert gsm.verifier.samples_per_prompt >= 8 and gsm.verifier.pairs_per_prompt == 1
    assert gsm.verifier.task_options == {"prompt_format": "qwen_boxed"} and gsm.data.val_split == "hash"
    hh = load_dpo_config(root / "qwen2.5-coder-1.5b-hh-h200.toml")
    assert hh.data.source == "hh-rlhf" and not hh.data.strict and hh.data.val_split == "hash"
    assert hh.data.path.endswith("hh-rlhf/harmless-base_test.jsonl.gz")


def test_report_states_the_data_counts():
    from scalelab.dpo.report import data_md
    hh = {"rows_read": 2312, "path": "hh.jsonl.gz", "skipped": 9, "n_train": 2062, "n_val": 241, "val_split": "hash",
          "skipped_by_reason": {"dialogues differ before their final turn": 5, "empty final response": 4}}
    assert data_md(hh) == ["## Preference data", "", "2312 rows read from `hh.jsonl.gz`, 9 skipped; 2062 train / "
                           "241 held-out pairs (split: hash).", "- skipped: dialogues differ before their final "
                           "turn: 5", "- skipped: empty final response: 4", ""]
    v = {"n_prompts": 4, "samples_per_prompt": 8, "sample_accuracy": 0.375, "prompts_informative": 2,
         "prompts_all_correct": 1, "prompts_all_wrong": 1,
         "length_diff": {"n": 2, "mean": 1.0, "median": 1.0, "p10": -3.0, "p90": 5.0, "share_chosen_longer": 0.5}}
    text = "\n".join(data_md({"rows_read": 2, "path": "p.jsonl", "n_train": 2, "n_val": 0, "verifier": v}))
    assert "4 questions x 8 samples, sampled accuracy 37.5%; 2 gave pairs, 1 dropped as all right, 1 as all wrong" \
        in text
    assert "over 2 pairs: mean +1.0 tokens, median +1.0, p10 -3.0, p90 +5.0; chosen longer in 50%" in text
