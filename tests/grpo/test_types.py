"""The GRPO records: StepRecord reads and writes metrics.jsonl's grpo_step objects key for key (committed runs
included), and each engine's capabilities drive config validation, 'auto' weight sync and torchrun checks."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from scalelab.core.config import ConfigError, load_config
from scalelab.grpo.capabilities import CAPABILITIES, capabilities, resolve_method
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.distributed import Dist, check_world, engine_config
from scalelab.grpo.engine_hf import HFGenerateEngine
from scalelab.grpo.engine_vllm_colocated import VLLMColocatedEngine
from scalelab.grpo.engine_vllm_server import VLLMServerEngine
from scalelab.grpo.engines import ENGINES, ENGINE_CLASSES
from scalelab.grpo.types import CurriculumStep, StepRecord
from scalelab.grpo.weightsync import SYNC_METHODS
from scalelab.core.jsonio import find_stored, iter_jsonl
from tests.conftest import REPO

ENVELOPE = ("event", "time_unix")  # RunDir.log_event's keys around the record


def committed_steps() -> list[dict]:
    out = []
    for path in find_stored(REPO / "results", "metrics.jsonl"):     # plain or gzipped
        out += [d for d in iter_jsonl(path) if d.get("event") == "grpo_step"]
    return out


def test_every_committed_step_record_reads_back_and_writes_the_same_keys_and_values():
    steps = committed_steps()
    assert len(steps) >= 10  # the committed GRPO runs hold hundreds
    for d in steps:
        want = {k: v for k, v in d.items() if k not in ENVELOPE}
        got = StepRecord.from_json(d).to_json()
        assert list(got) == list(want)  # the same keys in the same order
        assert got == want


def _record(**over) -> StepRecord:
    base = dict(step=3, rollout_version=2, staleness=1, rollout_ms=10.0, reward_ms=1.0, reference_ms=2.0,
                old_logprob_ms=0.0, update_ms=5.0, weight_sync_ms=3.0, step_ms=25.0, overlapped_step_ms=15.0,
                rollout_tokens=12, rollout_tokens_per_s=1200.0, generated_tokens_this_step=12, finished_frac=0.5,
                len_mean=6.0, len_p10=4.4, len_p50=6.0, len_p90=7.6, len_max=8.0, len_min=4.0,
                completion_lengths=(4, 8), reward_mean=0.5, reward_std=0.7071, zero_signal_frac=0.0,
                adv_abs_mean=0.7071, lr=1e-5, reward_components={"correctness": 0.5},
                completion_rewards={"correctness": (0.0, 1.0)}, loss=0.1, grad_norm=1.5, clip_frac=0.0,
                kl_mean=0.01, is_weight_mean=1.0, is_truncated_frac=0.0, behavior_mismatch_k3=0.0,
                behavior_logp_abs_diff=0.0, curriculum=None, example_ids=("a", "b"), sync_bytes=100,
                sync_restarted=False)
    return StepRecord(**{**base, **over})


def test_grouped_fields_are_written_flat_and_only_when_present():
    plain = _record().to_json()
    assert plain["reward/correctness"] == 0.5 and plain["completion_rewards"] == {"correctness": [0.0, 1.0]}
    assert not any(k.startswith("curriculum_") or k.startswith("rank_") or k == "gpu" for k in plain)
    full = _record(curriculum=CurriculumStep(1, None, False, 2), rank_rollout_ms=(9.0, 10.0),
                   rank_rollout_tokens=(5, 7), gpu={"rollout": {"util_pct": 80.0}})
    out = full.to_json()
    keys = list(out)
    # the curriculum's keys sit between the update statistics and example_ids; per-rank and gpu come last
    assert keys[keys.index("behavior_logp_abs_diff") + 1:keys.index("example_ids")] == [
        "curriculum_stage", "curriculum_rolling", "curriculum_promoted", "curriculum_next_stage"]
    assert keys[-3:] == ["rank_rollout_ms", "rank_rollout_tokens", "gpu"]
    assert (out["curriculum_next_stage"], out["rank_rollout_tokens"]) == (2, [5, 7])
    assert StepRecord.from_json(json.loads(json.dumps(out))) == full


def test_a_record_missing_a_field_is_refused_naming_it():
    d = _record().to_json()
    del d["kl_mean"]
    with pytest.raises(ValueError, match=r"^run/metrics.jsonl line 4: not a grpo_step record, missing kl_mean$"):
        StepRecord.from_json(d, "run/metrics.jsonl line 4")


def test_every_engine_is_registered_with_capabilities_its_sync_methods_implement():
    assert set(ENGINE_CLASSES) == set(ENGINES) == set(CAPABILITIES) == {"hf", "vllm_server", "vllm_colocated"}
    for name, cls in ENGINE_CLASSES.items():
        caps = capabilities(name)
        assert cls.name == name and caps is cls.capabilities
        assert set(caps.sync_methods) <= set(SYNC_METHODS)
        assert caps.default_sync in caps.sync_methods and caps.auto_sync(True) in caps.sync_methods
    with pytest.raises(ValueError, match="rollout engine 'sglang'; allowed: hf, vllm_server, vllm_colocated"):
        capabilities("sglang")


def test_capabilities_answer_what_engine_names_used_to():
    assert (HFGenerateEngine.capabilities.seeds_per_request, VLLMServerEngine.capabilities.seeds_per_request) == (
        False, True)
    assert [capabilities(n).isolate_runs for n in ("hf", "vllm_server", "vllm_colocated")] == [False, False, True]
    assert not VLLMColocatedEngine.capabilities.torchrun and HFGenerateEngine.capabilities.torchrun
    assert resolve_method("auto", "vllm_server", lora=True) == "lora_adapter"
    assert resolve_method("auto", "hf", lora=True) == "shared"
    assert resolve_method("nccl", "hf", lora=False) == "nccl"  # an explicit method is config's to refuse


def test_config_refuses_a_method_the_engine_class_does_not_list():
    with pytest.raises(ConfigError, match=r"'inplace' does not work with rollout.engine='vllm_server'; allowed: "
                                          r"'auto', 'safetensors', 'lora_adapter', 'nccl'"):
        load_config(GrpoConfig, None, ["rollout.engine=vllm_server", "rollout.weight_sync=inplace"])


def test_torchrun_checks_follow_the_capabilities():
    two = replace(Dist(), world=2, rank=1)
    with pytest.raises(ValueError, match=r"^rollout.engine='vllm_colocated' under torchrun needs vLLM's "):
        check_world(load_config(GrpoConfig, None, ["rollout.engine=vllm_colocated"]), two)
    server = load_config(GrpoConfig, None, ["rollout.engine=vllm_server", "rollout.server.port=8000"])
    assert engine_config(server, two).rollout.server.port == 8001  # a server per rank, on its own port
    hf = load_config(GrpoConfig, None, ["rollout.engine=hf"])
    assert engine_config(hf, two) is hf
