"""bench/crosscheck_prompts.py: the two clients' prompt counts compared slot by slot, by hand."""
from __future__ import annotations

import json

import pytest

from tests.bench_script import load_bench

cp = load_bench("crosscheck_prompts")


def write(tmp_path, ours: list[int], theirs: list[int], warmup: int = 0):
    reqs = [{"request_id": i, "prompt_tokens": n, "warmup": False} for i, n in enumerate(ours)]
    reqs = [{"request_id": -1 - j, "prompt_tokens": 7, "warmup": True} for j in range(warmup)] + reqs[::-1]
    (tmp_path / "ours_0.json").write_text(json.dumps({"requests": reqs}))
    (tmp_path / "vllm_bench_warmup.json").write_text(json.dumps({"input_lens": theirs}))


def test_same_prompts_in_send_order_with_warmup_left_out(tmp_path):
    write(tmp_path, [162, 642, 989], [162, 642, 989], warmup=2)
    out = cp.main([str(tmp_path), "--out", str(tmp_path / "check.json")])
    assert (out["equal_in_order"], out["same_prompts"], out["first_unequal_slot"]) == (3, True, None)
    assert out["max_prompt_tokens"] == {"ours": 989, "vllm_bench": 989} and out["over_vllm_bench_limit"] == 0
    assert set(out["provenance"]["records"]) == {"ours_0.json", "vllm_bench_warmup.json"}
    assert json.loads((tmp_path / "check.json").read_text())["equal_in_order"] == 3


def test_a_dropped_prompt_shifts_the_later_slots(tmp_path):
    # vLLM's loader dropped our 1,111-token prompt and took the next one: slots 1 and 2 differ from there on
    write(tmp_path, [100, 1111, 200, 300], [100, 200, 300, 400])
    out = cp.main([str(tmp_path)])
    assert (out["equal_in_order"], out["first_unequal_slot"], out["same_prompts"]) == (1, 1, False)
    assert out["over_vllm_bench_limit"] == 1


def test_a_file_of_the_wrong_kind_is_named(tmp_path):
    write(tmp_path, [1], [1])
    (tmp_path / "vllm_bench_warmup.json").write_text(json.dumps({"ttfts": [0.1]}))
    with pytest.raises(ValueError, match="vllm_bench_warmup.json: no 'input_lens'"):
        cp.main([str(tmp_path)])
