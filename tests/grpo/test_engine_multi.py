"""Several colocated vLLM engines as one (rollout.server.engines): the prompt split and the merge by hand, the
wrapper over stand-in engines (concurrency, weights, versions, describe, close), the builder against a stand-in
`vllm` module, the config field's checks, and on a GPU with vLLM two real engines."""
from __future__ import annotations

import importlib.util
import sys
import threading
import types
from dataclasses import dataclass

import pytest
import torch

from scalelab.core.config import ConfigError
from scalelab.grpo.completions import repeat_prompts
from scalelab.grpo.config import load_grpo_config
from scalelab.grpo.engine_vllm_colocated import VLLMColocatedEngine
from scalelab.grpo.engine_vllm_multi import (EngineShare, MultiColocatedEngine, PromptSlice, engine_shares,
                                             merge_batches, split_prompts)
from scalelab.grpo.engines import build_engine
from scalelab.grpo.types import EngineContext, RolloutBatch, SamplingParams
from scalelab.grpo.weightsync import sync_weights
from tests.grpo.tiny import tiny_llama, tiny_tokenizer


def rows_of(prompts, n: int, version: int = 0, engine: str = "fake", ms: float = 1.0) -> RolloutBatch:
    """What an engine returns for `prompts`, every row telling which prompt and sample it is: prompt p's sample j
    is completion (p[0], j), logprobs (-p[0], -j), finished when j is even, text 'p[0].j'."""
    keys = [(p[0], j) for p in prompts for j in range(n)]
    return RolloutBatch(tuple(repeat_prompts(prompts, n)), tuple((a, j) for a, j in keys),
                        tuple(f"{a}.{j}" for a, j in keys), tuple((-float(a), -float(j)) for a, j in keys),
                        tuple(j % 2 == 0 for _, j in keys), ms, version, engine)


# ---------------------------------------------------------------------------------------------
# split and merge


def test_five_prompts_over_two_engines_by_hand():
    slices = split_prompts(5, 2)
    assert slices == (PromptSlice(0, 0, 3), PromptSlice(1, 3, 5))  # balanced, the first one larger
    # n = 3: engine 0 holds rows 0..8 (prompts 0-2), engine 1 rows 9..14 (prompts 3-4)
    assert [list(s.rows(3)) for s in slices] == [list(range(0, 9)), list(range(9, 15))]


@pytest.mark.parametrize("num_prompts,engines,sizes", [(5, 2, [3, 2]), (8, 4, [2, 2, 2, 2]), (7, 3, [3, 2, 2]),
                                                       (2, 3, [1, 1]), (1, 4, [1]), (0, 2, []), (6, 1, [6])])
def test_slices_are_contiguous_balanced_and_skip_idle_engines(num_prompts, engines, sizes):
    slices = split_prompts(num_prompts, engines)
    assert [s.stop - s.start for s in slices] == sizes
    assert [s.engine for s in slices] == list(range(len(sizes)))  # more engines than prompts: the last sit idle
    assert [s.start for s in slices] == [sum(sizes[:k]) for k in range(len(sizes))]


def test_no_engine_is_refused():
    with pytest.raises(ValueError, match="engines must be >= 1, got 0"):
        split_prompts(4, 0)


def merged(prompts, n: int, engines: int) -> RolloutBatch:
    parts = [rows_of(prompts[s.start:s.stop], n) for s in split_prompts(len(prompts), engines)]
    return merge_batches(parts, 42.0, 7, "vllm_colocated")


def test_five_prompts_three_samples_two_engines_merge_back_in_group_major_order():
    prompts = [[10, 1], [20], [30, 3, 3], [40], [50, 5]]
    batch = merged(prompts, 3, 2)
    # row i*3 + j is prompt i's sample j, with its logprobs, finished flag and text beside it
    assert batch.prompt_ids == tuple(tuple(p) for p in prompts for _ in range(3))
    assert batch.completion_ids == tuple((a, j) for a in (10, 20, 30, 40, 50) for j in range(3))
    assert batch.logprobs[9:12] == ((-40.0, 0.0), (-40.0, -1.0), (-40.0, -2.0))  # prompt 3: the second part's
    assert batch.finished == (True, False, True) * 5
    assert batch.texts[8:10] == ("30.2", "40.0")  # the seam between the two engines' rows
    assert (batch.generation_ms, batch.weights_version, batch.engine) == (42.0, 7, "vllm_colocated")


@pytest.mark.parametrize("engines", [1, 2, 3, 4, 7])
def test_any_split_gives_the_one_engine_rows(engines):
    prompts = [[10 * i] for i in range(1, 5)]
    whole = rows_of(prompts, 2, version=7, engine="vllm_colocated", ms=42.0)
    assert merged(prompts, 2, engines) == whole  # 7 engines for 4 prompts: 3 idle, the same rows


def test_one_engine_is_the_identity_and_no_prompts_an_empty_batch():
    prompts = [[1], [2], [3]]
    assert split_prompts(3, 1) == (PromptSlice(0, 0, 3),)
    assert merged(prompts, 2, 1) == rows_of(prompts, 2, version=7, engine="vllm_colocated", ms=42.0)
    empty = merge_batches([], 0.5, 0, "vllm_colocated")
    assert empty.completion_ids == () and empty.num_tokens == 0


def test_engine_seeds_are_distinct_and_memory_is_shared_out():
    shares = engine_shares(7, 0.6, 3)
    assert [s.seed for s in shares] == [7, 8, 9]
    assert [s.gpu_memory_utilization for s in shares] == pytest.approx([0.2] * 3)
    assert engine_shares(7, 0.6, 1) == (EngineShare(7, 0.6),)


# ---------------------------------------------------------------------------------------------
# the wrapper over stand-in engines


class FakeEngine:
    """A sub-engine's interface: generate (optionally waiting at a barrier first), load_named_weights, describe,
    close; records what it was asked."""

    def __init__(self, barrier: threading.Barrier | None = None):
        self.barrier, self.weights_version, self.weights_dtype = barrier, 0, torch.float32
        self.asked, self.threads, self.loaded, self.closed = [], [], [], False

    def generate(self, prompts, params):
        self.asked.append([list(p) for p in prompts])
        self.threads.append(threading.get_ident())
        if self.barrier is not None:
            self.barrier.wait()  # returns only once the other engine is generating too
        return rows_of(prompts, params.n, self.weights_version)

    def load_named_weights(self, named):
        self.loaded.append({name: t.clone() for name, t in named})

    def describe(self):
        return {"flat_logprobs": True, "engine_core": "subprocess", "max_num_seqs": 1024}

    def close(self):
        self.closed = True


def multi(fakes) -> MultiColocatedEngine:
    return MultiColocatedEngine(fakes, engine_shares(3, 0.5, len(fakes)))


def test_the_engines_generate_at_the_same_time():
    """Each stand-in waits at one barrier of two before it returns: run one after the other, the first would wait
    alone until the barrier's timeout broke it."""
    barrier = threading.Barrier(2, timeout=20)
    fakes = [FakeEngine(barrier), FakeEngine(barrier)]
    e = multi(fakes)
    try:
        batch = e.generate([[10], [20], [30]], SamplingParams(n=2))
    finally:
        e.close()
    assert not barrier.broken
    assert fakes[0].asked == [[[10], [20]]] and fakes[1].asked == [[[30]]]
    threads = {fakes[0].threads[0], fakes[1].threads[0], threading.get_ident()}
    assert len(threads) == 3  # one thread per engine, neither the caller's
    assert batch.completion_ids == ((10, 0), (10, 1), (20, 0), (20, 1), (30, 0), (30, 1))
    assert batch.engine == "vllm_colocated" and batch.generation_ms > 0


def test_an_engine_error_reaches_the_caller_after_every_engine_ended():
    class Broken(FakeEngine):
        def generate(self, prompts, params):
            raise RuntimeError("engine core died")

    ok = FakeEngine()
    e = multi([Broken(), ok])
    with pytest.raises(RuntimeError, match="engine core died"):
        e.generate([[1], [2]], SamplingParams(n=1))
    assert ok.asked == [[[2]]]
    e.close()


def test_one_pass_over_the_weights_reaches_every_engine_and_the_version_follows(tmp_path):
    fakes = [FakeEngine(), FakeEngine(), FakeEngine()]
    e = multi(fakes)
    policy = tiny_llama()
    # the trainer's path: weightsync hands the engine a generator, which can be read only once
    rec = sync_weights("inplace", policy, e, 5, tmp_path)
    params = dict(policy.named_parameters())
    for f in fakes:
        assert len(f.loaded) == 1 and set(f.loaded[0]) == set(params)
        assert all(torch.equal(t, params[n]) for n, t in f.loaded[0].items())
        assert f.weights_version == 5
    assert rec.bytes == sum(p.numel() * 4 for p in params.values()) and e.weights_version == 5
    assert e.generate([[1], [2], [3]], SamplingParams(n=1)).weights_version == 5
    e.close()


def test_describe_names_the_engine_count_and_each_engines_options_and_close_closes_all():
    fakes = [FakeEngine(), FakeEngine()]
    e = multi(fakes)
    d = e.describe()
    assert d["engines"] == 2 and d["engine_core"] == "subprocess" and d["max_num_seqs"] == 1024
    assert [(p["seed"], p["gpu_memory_utilization"], p["max_num_seqs"]) for p in d["per_engine"]] == [
        (3, 0.25, 1024), (4, 0.25, 1024)]
    e.close()
    assert all(f.closed for f in fakes)


def test_shares_must_match_the_engines():
    with pytest.raises(ValueError, match="2 engines for 1 shares"):
        MultiColocatedEngine([FakeEngine(), FakeEngine()], engine_shares(0, 0.5, 1))


# ---------------------------------------------------------------------------------------------
# the builder against a stand-in vllm module


@dataclass
class Sampling:  # vLLM's SamplingParams without flat_logprobs: the dict form of logprobs
    n: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    logprobs: int
    detokenize: bool
    stop_token_ids: list


class FakeLLM:
    """Records its kwargs and the thread of each generate; prompt p's sample j is tokens [p[0], 10 + j]."""
    made: list = []

    def __init__(self, model: str, **kwargs):
        self.kwargs, self.asked = kwargs, []
        FakeLLM.made.append(self)

    def generate(self, prompts, sp, use_tqdm=False):
        self.asked.append([p["prompt_token_ids"] for p in prompts])
        def out(p, j):
            ids = [p["prompt_token_ids"][0], 10 + j]
            return types.SimpleNamespace(index=j, token_ids=ids, finish_reason="length",
                                         logprobs=[{t: types.SimpleNamespace(logprob=-0.5)} for t in ids])
        return [types.SimpleNamespace(outputs=[out(p, j) for j in range(sp.n)]) for p in prompts]


@pytest.fixture
def fake_vllm(monkeypatch):
    FakeLLM.made = []
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM, SamplingParams=Sampling))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def context(tmp_path, *overrides: str) -> EngineContext:
    cfg = load_grpo_config(None, ["rollout.engine=vllm_colocated", "model.lora.enabled=false",
                                  "rollout.server.gpu_memory_utilization=0.6", *overrides])
    return EngineContext(tiny_llama(), tiny_tokenizer(), cfg.rollout, 0, "inplace", tmp_path, seed=11)


def test_the_registry_builds_k_engines_each_seeded_and_sized(fake_vllm, tmp_path):
    import os
    e = build_engine("vllm_colocated", context(tmp_path, "rollout.server.engines=3",
                                               "rollout.server.engine_core='subprocess'"))
    assert isinstance(e, MultiColocatedEngine) and len(e.engines) == 3
    assert [m.kwargs["seed"] for m in FakeLLM.made] == [11, 12, 13]
    assert [m.kwargs["gpu_memory_utilization"] for m in FakeLLM.made] == pytest.approx([0.2] * 3)
    assert all(s.engine_core == "subprocess" for s in e.engines)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    batch = e.generate([[5], [6], [7], [8]], SamplingParams(n=2, max_new_tokens=2, seed=1))
    assert [m.asked for m in FakeLLM.made] == [[[[5], [6]]], [[[7]]], [[[8]]]]
    assert batch.completion_ids == tuple((p, 10 + j) for p in (5, 6, 7, 8) for j in range(2))
    assert batch.logprobs == ((-0.5, -0.5),) * 8 and len(batch.texts) == 8
    assert e.describe()["engines"] == 3 and [p["seed"] for p in e.describe()["per_engine"]] == [11, 12, 13]
    e.close()


def test_one_engine_is_the_single_engine_as_before(fake_vllm, tmp_path):
    e = build_engine("vllm_colocated", context(tmp_path))
    assert type(e) is VLLMColocatedEngine and len(FakeLLM.made) == 1
    assert FakeLLM.made[0].kwargs["seed"] == 11 and FakeLLM.made[0].kwargs["gpu_memory_utilization"] == 0.6
    assert "engines" not in e.describe()


# ---------------------------------------------------------------------------------------------
# the config field


@pytest.mark.parametrize("overrides,message", [
    (["rollout.server.engines=0"], "'rollout.server.engines'.*must be >= 1"),
    (["rollout.server.engines=2"], "'rollout.server.engines': 2 engines need rollout.server.engine_core="
                                   "'subprocess'"),
])
def test_bad_engine_counts_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_grpo_config(None, overrides)


def test_engines_load_with_the_subprocess_engine_core():
    s = load_grpo_config(None, ["rollout.server.engines=4", "rollout.server.engine_core='subprocess'"]).rollout.server
    assert (s.engines, s.engine_core) == (4, "subprocess")
    assert load_grpo_config(None, []).rollout.server.engines == 1


# ---------------------------------------------------------------------------------------------
# two real engines (GPU with vLLM)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
                    reason="needs a CUDA GPU and vllm in this process")
def test_two_real_engines_split_a_call_and_both_take_new_weights(tmp_path):
    cfg = load_grpo_config(None, [
        "rollout.engine=vllm_colocated", "model.lora.enabled=false", "rollout.server.engines=2",
        "rollout.server.engine_core='subprocess'", "rollout.server.max_model_len=128",
        "rollout.server.enforce_eager=true", "rollout.server.gpu_memory_utilization=0.2"])
    policy = tiny_llama(hidden=128).to("cuda", torch.bfloat16)
    engine = build_engine("vllm_colocated", EngineContext(policy, tiny_tokenizer(), cfg.rollout, 0, "inplace",
                                                          tmp_path, 0))
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]  # prompts 0-1 on engine 0, prompt 2 on engine 1
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    try:
        assert isinstance(engine, MultiColocatedEngine) and engine.describe()["engines"] == 2
        first = engine.generate(prompts, greedy)
        assert first.prompt_ids == tuple(tuple(p) for p in prompts) and all(first.lengths)
        saved = [p.detach().clone() for p in policy.parameters()]
        with torch.no_grad():
            for p in policy.parameters():
                p.mul_(1.3)
        sync_weights("inplace", policy, engine, 1, tmp_path / "sync")
        changed = engine.generate(prompts, greedy)
        assert changed.weights_version == 1
        assert changed.logprobs[0] != first.logprobs[0] and changed.logprobs[2] != first.logprobs[2]
        with torch.no_grad():
            for p, s in zip(policy.parameters(), saved):
                p.copy_(s)
        sync_weights("inplace", policy, engine, 2, tmp_path / "sync")
        assert engine.generate(prompts, greedy).completion_ids == first.completion_ids  # both engines restored
    finally:
        engine.close()
