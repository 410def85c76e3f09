"""The colocated vLLM engine without a GPU: sampled-token log-probs read from FlatLogprobs and from the dict form
(values, misalignment errors), generate's post-processing against a stand-in `vllm` module, and the
rollout.server tuning fields (validation, LLM kwargs and server flags set only when asked)."""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from scalelab.core.config import ConfigError
from scalelab.core.engines import build_command
from scalelab.grpo.config import captured_size_below, load_grpo_config
from scalelab.grpo.engine_vllm_colocated import VLLMColocatedEngine, colocated_llm_kwargs
from scalelab.grpo.engine_vllm_server import _server_spec, vllm_tuning_flags
from scalelab.grpo.ipc import ipc_weight_chunks, load_ipc_weights
from scalelab.grpo.logprobs import EngineOutputError, dict_sampled_logprobs, flat_sampled_logprobs, sampled_logprobs
from scalelab.grpo.types import EngineContext, SamplingParams
from tests.bench_script import load_bench


@dataclass
class Flat:
    """Shaped like vllm.logprobs.FlatLogprobs: position i's entries are [start_indices[i], end_indices[i])."""
    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class Logprob:
    logprob: float


def flat_of(positions: list[list[tuple[int, float]]]) -> Flat:
    """(token id, logprob) entries per position, the sampled token first (as vLLM's sampler writes them)."""
    f = Flat()
    for entries in positions:
        f.start_indices.append(len(f.logprobs))
        f.token_ids += [t for t, _ in entries]
        f.logprobs += [lp for _, lp in entries]
        f.end_indices.append(len(f.logprobs))
    return f


# ---------------------------------------------------------------------------------------------
# parsing


def test_flat_logprobs_zero_is_the_per_token_list():
    flat = flat_of([[(7, -0.5)], [(3, -1.25)], [(1, -0.0625)]])
    assert flat_sampled_logprobs((7, 3, 1), flat) == [-0.5, -1.25, -0.0625]


def test_flat_with_top_k_reads_each_positions_first_entry():
    # logprobs=1: the sampled token (first) then the top-1, which may be another token or the same one again
    flat = flat_of([[(7, -2.0), (4, -0.1)], [(3, -0.2), (3, -0.2)]])
    assert flat_sampled_logprobs([7, 3], flat) == [-2.0, -0.2]


def test_flat_token_mismatch_names_the_position():
    flat = flat_of([[(7, -0.5)], [(9, -1.0)], [(1, -0.1)]])
    with pytest.raises(EngineOutputError, match="position 1: sampled token 3, logprob entry for 9"):
        flat_sampled_logprobs([7, 3, 1], flat)


def test_flat_position_count_mismatch():
    with pytest.raises(EngineOutputError, match="3 sampled tokens but logprobs for 2 positions"):
        flat_sampled_logprobs([7, 3, 1], flat_of([[(7, -0.5)], [(3, -1.0)]]))


def test_dict_form_values_and_missing_token():
    positions = [{7: Logprob(-0.5)}, {3: Logprob(-1.5), 8: Logprob(-0.1)}]
    assert dict_sampled_logprobs([7, 3], positions) == [-0.5, -1.5]
    with pytest.raises(EngineOutputError, match="position 1: no logprob for the sampled token 4"):
        dict_sampled_logprobs([7, 4], positions)
    with pytest.raises(EngineOutputError, match="2 sampled tokens but logprobs for 1 positions"):
        dict_sampled_logprobs([7, 3], positions[:1])


def test_dispatch_by_form():
    assert sampled_logprobs([5], flat_of([[(5, -0.75)]])) == [-0.75]
    assert sampled_logprobs([5], [{5: Logprob(-0.75)}]) == [-0.75]
    with pytest.raises(EngineOutputError, match="no logprobs"):
        sampled_logprobs([5], None)


# ---------------------------------------------------------------------------------------------
# generate against a stand-in vllm module


@dataclass
class OldSampling:  # an older vLLM's SamplingParams: no flat_logprobs field
    n: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    logprobs: int
    detokenize: bool
    stop_token_ids: list


@dataclass
class NewSampling(OldSampling):
    flat_logprobs: bool = False


STOP = 2


def completion(prompt: int, j: int, flat: bool) -> types.SimpleNamespace:
    """Sample j of prompt i: tokens [10 + j, STOP, 11 + prompt] (vLLM stopped late), logprob -(pos + 1) / 4 - j."""
    ids = [10 + j, STOP, 11 + prompt]
    lps = [-(k + 1) / 4 - j for k in range(3)]
    logprobs = flat_of([[(t, lp)] for t, lp in zip(ids, lps)]) if flat else [{t: Logprob(lp)} for t, lp in
                                                                              zip(ids, lps)]
    return types.SimpleNamespace(index=j, token_ids=ids, logprobs=logprobs, finish_reason="length")


class FakeLLM:
    def __init__(self, model: str, **kwargs):
        self.kwargs = kwargs
        self.params = None

    def generate(self, prompts, sp, use_tqdm=False):
        self.params = sp
        flat = getattr(sp, "flat_logprobs", False)
        # the n completions of a request come back out of order; generate sorts them by index
        return [types.SimpleNamespace(outputs=[completion(i, j, flat) for j in reversed(range(sp.n))])
                for i in range(len(prompts))]


@pytest.fixture
def fake_vllm(monkeypatch):
    def install(sampling_cls):
        monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM, SamplingParams=sampling_cls))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return install


def engine(flat_logprobs: bool = True) -> VLLMColocatedEngine:
    return VLLMColocatedEngine(Path("/nonexistent"), lambda ids: "x", [STOP], torch.bfloat16, {"seed": 0},
                               flat_logprobs=flat_logprobs, decode_batch=lambda rows: [f"{len(r)}" for r in rows])


@pytest.mark.parametrize("sampling_cls,asked,used", [(NewSampling, True, True), (NewSampling, False, False),
                                                     (OldSampling, True, False)])
def test_generate_reads_either_form_the_same(fake_vllm, sampling_cls, asked, used):
    fake_vllm(sampling_cls)
    e = engine(asked)
    batch = e.generate([[5, 6], [7]], SamplingParams(n=2, max_new_tokens=3, seed=4))
    assert e.flat_logprobs is used and getattr(e.llm.params, "flat_logprobs", False) is used
    assert e.llm.params.stop_token_ids == [STOP] and e.llm.params.detokenize is False
    assert batch.prompt_ids == ((5, 6), (5, 6), (7,), (7,))
    assert batch.completion_ids == ((10, STOP), (11, STOP), (10, STOP), (11, STOP))  # cut after the stop token
    assert batch.logprobs == ((-0.25, -0.5), (-1.25, -1.5), (-0.25, -0.5), (-1.25, -1.5))
    assert batch.finished == (True,) * 4 and batch.texts == ("2",) * 4
    assert e.describe() == {"flat_logprobs": used, "engine_core": "inprocess"}  # a stand-in LLM: no vllm_config


class RpcLLM(FakeLLM):
    """A stand-in LLM whose collective_rpc runs the function on a stand-in worker, as vLLM's engine core would
    after unpickling it, and which records what was loaded."""
    def __init__(self, model: str, **kwargs):
        super().__init__(model, **kwargs)
        self.loaded, self.calls, self.resets = {}, 0, 0
        self.worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
            get_model=lambda: types.SimpleNamespace(load_weights=lambda ws: self.loaded.update(
                {n: t.clone() for n, t in ws}))))

    def collective_rpc(self, fn, args=()):
        self.calls += 1
        return [fn(self.worker, *args)]

    def reset_prefix_cache(self):
        self.resets += 1


@pytest.mark.parametrize("core,env", [("inprocess", "0"), ("subprocess", "1")])
def test_engine_core_sets_vllms_process_mode(fake_vllm, monkeypatch, core, env):
    fake_vllm(NewSampling)
    e = VLLMColocatedEngine(Path("/nonexistent"), lambda ids: "x", [STOP], torch.bfloat16, {}, engine_core=core)
    import os
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == env and e.describe()["engine_core"] == core


def test_subprocess_sync_moves_every_weight_through_handles_in_bounded_chunks(fake_vllm, monkeypatch):
    fake_vllm(NewSampling)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=RpcLLM, SamplingParams=NewSampling))
    # CPU tensors share through files here (CUDA tensors through cudaIpcMemHandles on the GPU): the same
    # reduce/rebuild path, which pickles without a multiprocessing spawn in progress
    import torch.multiprocessing as tmp
    old = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy("file_system")
    try:
        e = VLLMColocatedEngine(Path("/nonexistent"), lambda ids: "x", [STOP], torch.bfloat16, {},
                                engine_core="subprocess")
        weights = {f"layer{i}.weight": torch.full((64, 64), float(i)) for i in range(5)}  # 16 KiB each
        chunks = list(ipc_weight_chunks(weights.items(), max_bytes=40_000))
        assert [len(c.tensors) for c in chunks] == [3, 2]  # 3 x 16 KiB crosses 40 kB, then the rest
        e.load_named_weights(iter(weights.items()))
    finally:
        tmp.set_sharing_strategy(old)
    assert e.llm.calls == 1 and e.llm.resets == 1  # 80 KiB: one chunk at the default 512 MiB bound
    assert set(e.llm.loaded) == set(weights)
    assert all(torch.equal(e.llm.loaded[n], t) for n, t in weights.items())


def test_load_ipc_weights_falls_back_to_the_runners_model_attribute():
    import pickle
    got = []
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
        model=types.SimpleNamespace(load_weights=lambda ws: got.extend(ws))))
    blob = pickle.dumps([("w", torch.tensor, ([1.0, 2.0],))])  # any (rebuild, args) pair rebuilds the same way
    assert load_ipc_weights(worker, blob) == 1 and got[0][0] == "w" and torch.equal(got[0][1], torch.tensor([1., 2.]))


def test_engine_core_must_be_known():
    with pytest.raises(ConfigError, match="rollout.server.engine_core"):
        load_grpo_config(None, ["rollout.server.engine_core=\"thread\""])


# ---------------------------------------------------------------------------------------------
# rollout.server tuning fields


def test_new_fields_default_to_vllms_own():
    s = load_grpo_config(None, []).rollout.server
    assert (s.max_num_seqs, s.max_cudagraph_capture_size, s.flat_logprobs) == (0, 0, True)
    kwargs = colocated_llm_kwargs(s, torch.bfloat16, 3)
    assert "max_num_seqs" not in kwargs and "compilation_config" not in kwargs
    assert kwargs["dtype"] == "bfloat16" and kwargs["seed"] == 3 and vllm_tuning_flags(s) == {}


def test_set_fields_reach_llm_kwargs_and_server_flags(tmp_path):
    cfg = load_grpo_config(None, ["rollout.server.max_num_seqs=1024",
                                  "rollout.server.max_cudagraph_capture_size=1024"])
    kwargs = colocated_llm_kwargs(cfg.rollout.server, torch.bfloat16, 0)
    assert kwargs["max_num_seqs"] == 1024 and kwargs["compilation_config"] == {"max_cudagraph_capture_size": 1024}
    ctx = EngineContext(None, None, cfg.rollout, 0, "safetensors", tmp_path, seed=0)
    cmd = build_command(_server_spec(ctx, tmp_path / "m", torch.bfloat16))
    assert cmd[cmd.index("--max-num-seqs") + 1] == "1024"
    assert cmd[cmd.index("--max-cudagraph-capture-size") + 1] == "1024"


@pytest.mark.parametrize("size", [1, 2, 4, 8, 248, 256, 272, 512, 1024])
def test_sizes_vllm_captures_load(size):
    assert load_grpo_config(None, [f"rollout.server.max_cudagraph_capture_size={size}"])


@pytest.mark.parametrize("overrides,message", [
    (["rollout.server.max_cudagraph_capture_size=1000"], "no graph of size 1000 \\(it would use 992\\)"),
    (["rollout.server.max_cudagraph_capture_size=100"], "no graph of size 100 \\(it would use 96\\)"),
    (["rollout.server.max_cudagraph_capture_size=3"], "no graph of size 3 \\(it would use 2\\)"),
    (["rollout.server.max_cudagraph_capture_size=512", "rollout.server.enforce_eager=true"],
     "512 needs CUDA graphs, but rollout.server.enforce_eager=true"),
    (["rollout.server.max_num_seqs=-1"], "'rollout.server.max_num_seqs'.*must be >= 0"),
])
def test_bad_tuning_values_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_grpo_config(None, overrides)


def test_captured_size_below():
    assert [captured_size_below(n) for n in (3, 7, 9, 255, 257, 1000)] == [2, 4, 8, 248, 256, 992]


# ---------------------------------------------------------------------------------------------
# bench/grpo_rollout_bench.py records the options of its run


def test_bench_records_asked_options_and_skips_syncs(tmp_path):
    from scalelab.core.jsonio import read_json
    bench = load_bench("grpo_rollout_bench")
    out = tmp_path / "v.json"
    assert bench.main(["--tiny", "--no-sync", "--no-update", "--max-num-seqs", "64", "--cudagraph-max", "64",
                       "--no-flat-logprobs", "--out", str(out)]) == 0
    r = read_json(out)
    assert r["vllm_options"]["requested"] == {"max_num_seqs": 64, "max_cudagraph_capture_size": 64,
                                              "flat_logprobs": False, "enforce_eager": False,
                                              "gpu_memory_utilization": 0.35, "max_model_len": 1024,
                                              "engine_core": "inprocess"}
    assert r["vllm_options"]["effective"] is None and r["weight_sync"] == [] and r["update_ms"] is None
    hf = r["engines"]["hf"]
    assert r["baseline"] == "hf" and hf["median_call_ms"] >= hf["median_ms"] > 0


def test_bench_refuses_bad_options_before_loading_anything(capsys):
    bench = load_bench("grpo_rollout_bench")
    with pytest.raises(SystemExit):
        bench.parse_args(["--cudagraph-max", "1000", "--out", "x.json"])
    assert "it would use 992" in capsys.readouterr().err
    args = bench.parse_args(["--max-new-tokens", "1000", "--out", "x.json"])
    with pytest.raises(SystemExit, match="longest prompt \\(48 tokens\\) \\+ --max-new-tokens \\(1000\\) = 1048"):
        bench.check_context([[0] * 48, [0] * 40], args)


def test_effective_options_read_what_vllm_resolved():
    from scalelab.grpo.engine_vllm_colocated import vllm_effective_options

    class Config:
        scheduler_config = types.SimpleNamespace(max_num_seqs=1024, max_num_batched_tokens=16384,
                                                 async_scheduling=True)
        compilation_config = types.SimpleNamespace(max_cudagraph_capture_size=512,
                                                   cudagraph_capture_sizes=[1, 2, 4, *range(8, 256, 8),
                                                                            *range(256, 513, 16)])

        @property
        def use_v2_model_runner(self):
            raise RuntimeError("needs triton")  # a computed property must not break the record

    llm = types.SimpleNamespace(llm_engine=types.SimpleNamespace(vllm_config=Config()))
    assert vllm_effective_options(llm) == {
        "max_num_seqs": 1024, "max_num_batched_tokens": 16384, "async_scheduling": True,
        "max_cudagraph_capture_size": 512, "cudagraph_sizes": 3 + 31 + 17, "cudagraph_mode": None,
        "model_runner_v2": None}


def test_vllm_engine_starts_take_turns(tmp_path):
    """engine_start_lock: two starts never overlap (threads here; flock excludes per open file)."""
    import threading
    import time as _time

    from scalelab.core.engines import engine_start_lock
    inside, overlaps = [], []

    def start():
        with engine_start_lock(tmp_path):
            inside.append(1)
            overlaps.append(len(inside))
            _time.sleep(0.05)
            inside.pop()
    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [1, 1, 1] and (tmp_path / "vllm-engine-start.lock").is_file()
