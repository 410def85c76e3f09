"""scalelab.evals.loglik on a tiny random Llama with a byte-level BPE trained in the test (so a space attaches
to the word after it, as in GPT-2's and Qwen's tokenizers): the one-pass sum against a token-by-token
recursion, the split rules and the scores against lm-eval's HFLM on the same folder, and the choice metrics
on hand-computed cases."""
from __future__ import annotations

import math

import pytest
import torch

from scalelab.evals.loglik import choice_metrics, pair_tokens, score_pairs, score_tokens

TEXT = ["the cat sat on the mat", "a dog ran in the park", "question: what is two plus two? answer: four",
        "the sky is blue and the grass is green"] * 20
PAIRS = [("the cat sat on", " the mat"), ("question: what is two plus two? answer:", " four"),
         ("the sky is ", "blue"),          # trailing space: moves to the continuation
         ("the sky is  ", "blue"),         # two of them
         ("a dog ran in the p", "ark"),    # a merge across the boundary
         ("", "the cat")]                  # empty context: the prefix token stands in


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, eos_token_id=0,
                      pad_token_id=0, bos_token_id=None)
    out = tmp_path_factory.mktemp("tiny-bpe-llama")
    LlamaForCausalLM(cfg).eval().save_pretrained(out)
    hf_tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def model_and_tokenizer(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), \
        AutoTokenizer.from_pretrained(folder)


def test_one_pass_equals_a_token_by_token_recursion(model_and_tokenizer):
    model, tok = model_and_tokenizer
    ctx, cont = pair_tokens(tok, *PAIRS[1])
    total, greedy = 0.0, True
    with torch.no_grad():
        for j, t in enumerate(cont):  # the next-token distribution after each prefix, one forward per token
            logp = torch.log_softmax(model(torch.tensor([ctx + cont[:j]])).logits[0, -1].double(), dim=-1)
            total += float(logp[t])
            greedy &= int(logp.argmax()) == t
    s = score_tokens(model, ctx, cont)
    assert (s.n_tokens, s.greedy) == (len(cont), greedy)
    assert s.loglik == pytest.approx(total, abs=1e-5)


def test_split_rules(model_and_tokenizer):
    _, tok = model_and_tokenizer
    ctx, cont = pair_tokens(tok, "the sky is ", "blue")
    assert (ctx, cont) == (tok.encode("the sky is"), tok.encode("the sky is blue")[len(ctx):])
    assert tok.decode(cont) == " blue"
    assert tok.decode(pair_tokens(tok, "the sky is  ", "blue")[1]) == "  blue"
    assert pair_tokens(tok, "", "the cat") == ([tok.eos_token_id], tok.encode("the cat"))  # no BOS: EOS
    with pytest.raises(ValueError, match="truncation"):
        score_tokens(model_and_tokenizer[0], [1] * 100, [2] * 40)


def test_scores_equal_lm_eval_hflm_on_the_same_folder(folder, model_and_tokenizer):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    model, tok = model_and_tokenizer
    lm = HFLM(pretrained=str(folder), device="cpu", batch_size=4, dtype="float32")
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)]
    theirs = lm.loglikelihood(requests, disable_tqdm=True)
    for ours, (ll, greedy), pair in zip(score_pairs(model, tok, PAIRS), theirs, PAIRS):
        # lm-eval batches 4 right-padded rows of different lengths: float32 rounding apart, the same sums
        assert ours.loglik == pytest.approx(ll, abs=1e-4), pair
        assert ours.greedy == greedy
        assert math.isfinite(ours.loglik) and ours.loglik < 0


def test_choice_metrics_hand_cases():
    # acc: -4 > -6 picks choice 0; per character -4/2 = -2 < -6/6 = -1 picks choice 1
    assert choice_metrics([-4.0, -6.0], ["ab", "abcdef"], gold=1) == {"acc": 0.0, "acc_norm": 1.0, "acc_bytes": 1.0}
    # "é" is 1 character, 2 UTF-8 bytes: per character -2 < -3/2 (choice 1); per byte -1 > -1.5 (choice 0)
    assert choice_metrics([-2.0, -3.0], ["é", "ab"], gold=0) == {"acc": 1.0, "acc_norm": 0.0, "acc_bytes": 1.0}
    assert choice_metrics([-1.0, -1.0], ["a", "b"], gold=0)["acc"] == 1.0  # a tie goes to the first, as argmax
    with pytest.raises(ValueError):
        choice_metrics([-1.0], ["a", "b"], gold=0)
