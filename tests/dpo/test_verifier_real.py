"""On-policy GSM8K pairs from the real Qwen2.5-Coder-0.5B-Instruct (HF sampler, CPU): k = 4 samples of 3 questions on
the reference protocol, graded by the evals verifier; every pair's chosen re-grades right and its rejected wrong, the
dropped groups are counted, and each recorded token count is the sampler's own. 5.4 min on 2 busy cores. At 192
tokens every sample of 2 questions was cut off before its answer (no pair): 320 is what the model needs here."""
from __future__ import annotations

import pytest

from scalelab.dpo.config import VerifierConfig
from scalelab.dpo.samplers import HFSampler
from scalelab.dpo.verifier_pairs import build_verifier_set, choose_examples
from scalelab.evals.tasks import get_task

pytestmark = pytest.mark.slow


def test_real_model_gsm8k_pairs(qwen05_folder, shared_data):
    from scalelab.core.hfmodel import load_causal_lm
    cfg = VerifierConfig(task="gsm8k", task_options={"prompt_format": "qwen_boxed"}, num_prompts=3,
                         samples_per_prompt=4, max_new_tokens=320, batch_prompts=3, pairs_per_prompt=1, seed=0)
    task = get_task(cfg.task, **cfg.task_options)
    model, tok = load_causal_lm(str(qwen05_folder), dtype="float32", device="cpu")
    pairs, s = build_verifier_set(HFSampler(model, tok), task, cfg)
    assert s.prompts_all_correct + s.prompts_all_wrong + s.prompts_informative == 3
    assert s.n_pairs == s.prompts_informative == len(pairs) and 0 < s.sample_accuracy < 1
    by_id = {ex.id: ex for ex in choose_examples(task, cfg)}
    for p in pairs:
        ex = by_id[p.id.split(":")[1]]
        assert task.score(ex, p.chosen[0]["content"]).correct and not task.score(ex, p.rejected[0]["content"]).correct
        m = p.meta
        assert 0 < m["chosen_tokens"] <= 320 and 0 < m["rejected_tokens"] <= 320
        assert m["length_diff_tokens"] == m["chosen_tokens"] - m["rejected_tokens"]
        # the sampler's count is of the generated ids; re-encoding the decoded text gives it back within a token
        assert abs(len(tok(p.chosen[0]["content"], add_special_tokens=False)["input_ids"]) - m["chosen_tokens"]) <= 1
    assert (s.length_diff or {}).get("n", 0) == len(pairs)
