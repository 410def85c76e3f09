"""bench/dpo_throughput.py on real inputs: a saved HF model folder, a PreferencePair jsonl, alternating repeats."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.dpo.data import write_pairs_jsonl
from tests.dpo.conftest import _tokenizer, arithmetic_pairs, make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "dpo_throughput.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("dpo_throughput_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def model_folder(tmp_path):
    out = tmp_path / "tiny-llama"
    tokenizer = _tokenizer()
    make_tiny_model(tokenizer).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def test_too_few_pairs_names_the_file_and_the_counts(tmp_path, model_folder):
    bench = _bench_module()
    pairs = write_pairs_jsonl(tmp_path / "few.jsonl", arithmetic_pairs(5))
    # --tiny: batch_pairs 2 x (1 warm-up + 3 measured steps) = 8 pairs needed
    with pytest.raises(SystemExit, match=rf"--pairs {pairs}: 5 pairs, the run needs 8"):
        bench.main(["--tiny", "--model", str(model_folder), "--pairs", str(pairs)])


def test_pairs_without_model_and_bad_model_are_refused(tmp_path):
    bench = _bench_module()
    pairs = write_pairs_jsonl(tmp_path / "p.jsonl", arithmetic_pairs(8))
    with pytest.raises(SystemExit, match="--pairs needs --model"):
        bench.main(["--tiny", "--pairs", str(pairs)])
    with pytest.raises(SystemExit, match=r"--model /nonexistent/model:"):
        bench.main(["--tiny", "--model", "/nonexistent/model"])
    with pytest.raises(SystemExit, match="--repeats 0"):
        bench.main(["--tiny", "--repeats", "0"])


def test_run_plan_reverses_every_other_round():
    bench = _bench_module()
    assert bench.run_plan(["a", "b"], 3) == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]
    assert bench.run_plan(["a", "b"], 1) == [("a", 0), ("b", 0)]


def _step_rates(result: dict, warmup: int) -> tuple[float, float]:
    """(tokens/s step, tokens/s end-to-end) of one recorded run, recomputed from its raw per-step records."""
    steps = len(result["step_s"])
    step_s, real = sum(result["step_s"][warmup:]), sum(result["real_tokens"][warmup:])
    share = result["ref_precompute_s"] * (steps - warmup) / steps
    return real / step_s, real / (step_s + share)


@pytest.mark.slow
def test_bench_real_model_and_pairs_with_alternating_repeats(tmp_path, model_folder):
    pairs = write_pairs_jsonl(tmp_path / "preferences.jsonl", arithmetic_pairs(10))
    out = tmp_path / "real.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, str(BENCH), "--tiny", "--model", str(model_folder), "--pairs", str(pairs),
           "--repeats", "2", "--variants", "trl_default,ours", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    d = json.loads(out.read_text())
    s = d["summary"]
    # A B B A: the second round runs the variants in reverse
    assert s["run_order"] == [["trl_default", 0], ["ours", 0], ["ours", 1], ["trl_default", 1]]
    assert [[r["name"], r["repeat"]] for r in d["results"]] == s["run_order"] and s["repeats"] == d["repeats"] == 2
    warmup = d["settings"]["warmup_steps"]
    for name in ("trl_default", "ours"):
        runs = [r for r in d["results"] if r["name"] == name]
        rates = [_step_rates(r, warmup) for r in runs]
        recorded = s["variants"][name]["repeats"]
        assert [x["tokens_per_s"] for x in recorded] == pytest.approx([a for a, _ in rates])
        assert [x["tokens_per_s_end_to_end"] for x in recorded] == pytest.approx([b for _, b in rates])
        t = s["variants"][name]["throughput"]
        assert t["tokens_per_s"] == pytest.approx(statistics.median(x["tokens_per_s"] for x in recorded))
        assert t["tokens_per_s_end_to_end"] == pytest.approx(
            statistics.median(x["tokens_per_s_end_to_end"] for x in recorded))
    vs = s["variants"]["ours"]["vs_trl_default"]
    medians = {n: s["variants"][n]["throughput"]["tokens_per_s"] for n in ("trl_default", "ours")}
    assert vs["speedup_step"] == pytest.approx(medians["ours"] / medians["trl_default"])
    # each repeat of ours against trl_default's first run; CPU float32 is deterministic
    assert len(vs["loss_max_abs_diff_per_repeat"]) == 2 and vs["equal_loss"] and vs["same_batches"] and s["passed"]
    assert s["loss_tolerance"] == d["settings"]["loss_atol"]
    # the only departure from TRL's defaults is a plain TRL switch, named as such
    assert s["ours_changes_vs_trl"] == [{"ours": "train.gradient_checkpointing=false", "plain_trl_switch": True,
                                         "note": "TRL's DPOConfig turns activation recompute on by default",
                                         "trl": "DPOConfig(gradient_checkpointing=False)"}]
    assert ("ours differs from TRL's defaults by train.gradient_checkpointing=false: a plain TRL switch, "
            "DPOConfig(gradient_checkpointing=False)") in proc.stdout
    # the inputs, pinned in the results and the provenance
    assert d["pairs"] == {"path": str(pairs.resolve()), "sha256": _sha256(pairs), "count": 10, "used": 8}
    assert d["model"]["folder"] == str(model_folder.resolve()) and d["model"]["name"] == str(model_folder)
    assert d["model"]["config_sha256"] == _sha256(model_folder / "config.json") and d["model_shape"] is None
    assert d["provenance"]["pairs"] == d["pairs"] and d["provenance"]["model"] == d["model"]
    # the real tokenizer's chat template renders the prompt: real tokens per step exceed the bare answers
    assert d["settings"]["model_folder"] == d["model"]["folder"] and d["settings"]["pairs_file"] == d["pairs"]["path"]
