"""The regression battery: generation helper, paired statistics, base caching, resume, lm-eval on a tiny model."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from scalelab.core.rundir import RunDir
from scalelab.dpo import battery as bat
from scalelab.dpo import battery_stats as stats
from scalelab.dpo.config import load_dpo_config
from scalelab.dpo.evidence import FAIL, NOT_MEASURED, PASS, wilson_interval
from scalelab.core.hfgen import left_pad
from scalelab.dpo.generate import cut_at_stop, greedy_generate

# ---------------------------------------------------------------------------------------------
# fixtures: a run folder holding a random LoRA adapter on the tiny model


def make_adapter(model_dir: Path, out: Path, seed: int) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from scalelab.dpo.export import write_base_record
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"]))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # B = 0 at init would make base and tuned identical
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    peft_model.save_pretrained(out)
    write_base_record(out, str(model_dir))
    return out


GEN_ONLY = ["battery.parts=['target', 'own', 'mtbench']", "battery.own_tasks=['toolcall_args', 'ifeval_lite']",
            "battery.own_n=3", "battery.target_n=4", "battery.max_new_tokens=6", "battery.mtbench_max_new_tokens=5",
            "battery.gen_batch_size=2", "battery.bootstrap_resamples=200"]


def make_run(parent: Path, name: str, model_dir: Path, overrides: list[str], seed: int = 0):
    cfg = load_dpo_config(None, [f"model.name='{model_dir}'", "model.device='cpu'", "model.dtype='float32'",
                                 f"run.out_dir='{parent}'", f"run.name='{name}'", *overrides])
    rd = RunDir(cfg.run_dir).create(cfg)
    rd.log_event("relaunch")
    make_adapter(model_dir, rd.path / "adapter", seed)
    return cfg, rd.path


class FakeMTBench:
    """run_mtbench stand-in: answers two one-turn conversations through the battery's GenerateFn and reports
    6.0 for the base model (its files sit in battery-base/) and 5.0 for the tuned one."""

    def __init__(self):
        self.calls = 0

    def __call__(self, generate, data_dir, judge, limit=None, out_dir=None):
        from scalelab.evals.mtbench import MTBenchResult
        replies = generate([[{"role": "user", "content": "Say hi."}], [{"role": "user", "content": "What is 2+2?"}]])
        assert len(replies) == 2 and all(isinstance(r, str) for r in replies)
        self.calls += 1
        mean = 6.0 if "battery-base" in str(out_dir) else 5.0
        return MTBenchResult("measured", "", "fake-judge", 2, mean, mean, mean, {"writing": mean}, 0, {})


@pytest.fixture
def counted(monkeypatch):
    """Count every measurement (side, part) and stub MT-Bench's judge."""
    counts: Counter = Counter()
    for kind, fn in list(bat.MEASURE.items()):
        def wrapped(part, side, fn=fn):
            counts[(side.name, part.name)] += 1
            return fn(part, side)
        monkeypatch.setitem(bat.MEASURE, kind, wrapped)
    import scalelab.evals.mtbench as mtbench
    monkeypatch.setattr(mtbench, "run_mtbench", FakeMTBench())
    return counts

# ---------------------------------------------------------------------------------------------
# generation


def test_cut_at_stop_and_left_pad():
    assert cut_at_stop([5, 6, 2, 2], [2], 4) == ([5, 6], False)
    assert cut_at_stop([5, 6, 7, 8], [2, 3], 4) == ([5, 6, 7, 8], True)
    assert cut_at_stop([3, 0, 0], [2, 3], 3) == ([], False)
    ids, mask = left_pad([[7, 8, 9], [4]], pad_id=0)
    assert ids.tolist() == [[7, 8, 9], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_batched_greedy_equals_one_at_a_time(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    convs = [[{"role": "user", "content": t}] for t in ("What is 3 + 4?", "Hi", "What is 17 + 25? Answer now.")]
    batched = greedy_generate(model, tok, convs, max_new_tokens=7, batch_size=3)
    alone = [greedy_generate(model, tok, [c], max_new_tokens=7, batch_size=1)[0] for c in convs]
    assert batched == alone
    for g in batched:
        assert g.hit_limit == (g.n_tokens == 7) and 0 <= g.n_tokens <= 7

# ---------------------------------------------------------------------------------------------
# statistics on hand-made numbers


def test_comparison_row_hand_computed():
    base = {f"q{i}": v for i, v in enumerate([0, 0, 0, 0, 1, 1])}
    tuned = {f"q{i}": v for i, v in enumerate([1, 1, 1, 1, 1, 0])}
    row = stats.comparison_row("target", "target", "correct", base, tuned, True, 500, 0)
    # b = 4 (tuned only), c = 1 (base only): p = 2 * P[Bin(5, 1/2) <= 1] = 2 * 6 / 32
    assert (row["tuned_only"], row["base_only"], row["both_correct"], row["neither_correct"]) == (4, 1, 1, 0)
    assert row["mcnemar_p"] == pytest.approx(0.375)
    assert (row["base"], row["tuned"], row["delta"]) == pytest.approx((2 / 6, 5 / 6, 0.5))
    assert row["ci_low"] <= 0.5 <= row["ci_high"]
    with pytest.raises(ValueError, match="different examples"):
        stats.comparison_row("x", "x", "acc", {"a": 1}, {"b": 1}, True, 100, 0)


def test_lengths_block_hand_computed():
    rec = stats.LengthRecord
    base = {"target": [rec(10, False), rec(20, False)], "own-x": [rec(30, False), rec(40, True)]}
    tuned = {"target": [rec(20, False), rec(20, False)], "own-x": [rec(30, False), rec(80, True)]}
    out = stats.lengths_block(base, tuned, ([10, 20, 30, 40, 0], [20, 20, 30, 80, 5]))
    assert out["base"]["mean_tokens"] == 25 and out["tuned"]["mean_tokens"] == 37.5 and out["ratio"] == 1.5
    assert out["base"]["p90_tokens"] == pytest.approx(37.0)        # 30 + 0.7 x (40 - 30)
    assert out["base"]["hit_limit_share"] == 0.25 == out["tuned"]["hit_limit_share"]
    assert out["per_source"]["target"]["tuned"]["mean_tokens"] == 20
    pr = out["paired_ratios"]                                       # ratios 2, 1, 1, 2; the empty base is left out
    assert (pr["n"], pr["mean_ratio"], pr["share_longer"]) == (4, 1.5, 0.5)
    assert pr["geometric_mean_ratio"] == pytest.approx(2 ** 0.5)
    assert out["paired_excluded_empty_base"] == 1


def hand_battery(target=(0.40, 0.55, 0.02, 0.28), mmlu=(0.50, 0.49), lengths=(10.0, 12.0), mt=None) -> dict:
    base_mean, tuned_mean, lo, hi = target
    before = {"n": 100, "mean_tokens": lengths[0], "median_tokens": 9.0, "p90_tokens": 20.0, "hit_limit_share": 0.01}
    after = {"n": 100, "mean_tokens": lengths[1], "median_tokens": 10.0, "p90_tokens": 25.0, "hit_limit_share": 0.05}
    from scalelab.core.config import to_dict
    from scalelab.dpo.config import BatteryConfig
    return {"config": to_dict(BatteryConfig()), "target": {"task": "arithmetic", "options": {}}, "comparisons": {
        "target": {"name": "target", "part": "target", "metric": "correct", "kind": "binary", "n": 200,
                   "base": base_mean, "tuned": tuned_mean, "delta": tuned_mean - base_mean, "ci_low": lo,
                   "ci_high": hi, "confidence": 0.95, "n_resamples": 10000, "seed": 0, "tuned_only": 40,
                   "base_only": 10, "both_correct": 70, "neither_correct": 80, "mcnemar_p": 1.7e-5,
                   "task": "arithmetic", "split": "test"},
        "mmlu": {"name": "mmlu", "part": "mmlu", "metric": "acc", "kind": "binary", "n": 1000, "base": mmlu[0],
                 "tuned": mmlu[1], "delta": mmlu[1] - mmlu[0], "ci_low": -0.03, "ci_high": 0.01,
                 "tuned_only": 20, "base_only": 30, "both_correct": 470, "neither_correct": 480, "mcnemar_p": 0.2}},
        "lengths": {"sources": ["target"], "per_source": {"target": {"base": before, "tuned": after}},
                    "base": before, "tuned": after, "ratio": lengths[1] / lengths[0],
                    "paired_ratios": {"n": 100, "mean_ratio": 1.3, "median_ratio": 1.1, "geometric_mean_ratio": 1.15,
                                      "share_longer": 0.6}},
        "mtbench": mt or {"status": "not measured", "reason": "no judge endpoint configured"},
        "mtbench_max_drop": 0.5}


def _by_prefix(results, prefix):
    return next(r for r in results if r.name.startswith(prefix))


def test_evidence_rows_from_hand_made_battery():
    results = stats.evidence(hand_battery())
    assert [r.status for r in results] == [PASS, PASS, PASS, NOT_MEASURED]
    assert _by_prefix(results, "MMLU").value == pytest.approx(1.0)          # 50.0 -> 49.0 points
    assert _by_prefix(results, "length").value == pytest.approx(1.2)
    assert _by_prefix(results, "MT-Bench").detail == "no judge endpoint configured"
    block = stats.evidence_block(hand_battery())  # the bar passes; MT-Bench, beside it, is named as unmeasured
    assert block["verdict"] == PASS and block["not_measured_beside_bar"] == ["MT-Bench"]
    no_target = hand_battery()
    del no_target["comparisons"]["target"]
    assert stats.evidence_block(no_target)["verdict"] == NOT_MEASURED  # a bar criterion unmeasured: never a pass

    failing = stats.evidence(hand_battery(target=(0.40, 0.45, -0.01, 0.11), mmlu=(0.50, 0.475),
                                          lengths=(10.0, 13.5)))
    assert [r.status for r in failing[:3]] == [FAIL, FAIL, FAIL]
    assert _by_prefix(failing, "MMLU").value == pytest.approx(2.5)

    measured = {"status": "measured", "reason": "", "judge_model": "j", "base_mean": 6.0, "tuned_mean": 5.6}
    results = stats.evidence(hand_battery(mt=measured))
    mt = _by_prefix(results, "MT-Bench")
    assert (mt.status, mt.value) == (PASS, pytest.approx(0.4))
    assert stats.evidence_block(hand_battery(mt=measured))["verdict"] == PASS
    dropped = stats.evidence(hand_battery(mt={**measured, "tuned_mean": 5.4}))
    assert _by_prefix(dropped, "MT-Bench").status == FAIL

# ---------------------------------------------------------------------------------------------
# the battery on the tiny model (generated parts; MT-Bench with a stub judge)


def test_battery_writes_parts_caches_base_and_resumes(tiny_model_dir, tmp_path, counted):
    cfg, run = make_run(tmp_path, "dpo-beta0.1", tiny_model_dir, GEN_ONLY)
    b = bat.run_battery(cfg, run)
    parts = ["target", "own", "mtbench"]
    assert counted == Counter({(s, p): 1 for s in ("base", "tuned") for p in parts})
    on_disk = json.loads((run / "battery" / "battery.json").read_text())
    assert on_disk["comparisons"] == b["comparisons"]
    assert sorted(b["comparisons"]) == ["ifeval_lite", "target", "toolcall_args"]
    assert b["comparisons"]["target"]["n"] == 4 and b["comparisons"]["toolcall_args"]["n"] == 3
    assert (b["comparisons"]["ifeval_lite"]["part"], b["comparisons"]["ifeval_lite"]["task"]) == ("own", "ifeval_lite")
    assert b["target"] == {"task": "arithmetic", "options": {}}
    for p in parts:  # each side's record sits where battery.json says
        assert Path(b["parts"][p]["base"]).parent == bat.base_cache_dir(cfg, run)
        assert Path(b["parts"][p]["tuned"]).parent == run / "battery" / "tuned"
        assert json.loads(Path(b["parts"][p]["tuned"]).read_text())["adapter_sha256"] == b["adapter_sha256"]
    # the MT-Bench stub saw base then tuned: 6.0 -> 5.0 fails the 0.5-point row
    assert (b["mtbench"]["base_mean"], b["mtbench"]["tuned_mean"], b["mtbench"]["delta"]) == (6.0, 5.0, -1.0)
    assert next(c for c in b["evidence"]["criteria"] if c["name"].startswith("MT-Bench"))["status"] == FAIL
    # lengths: 4 + 3 + 3 generated answers and 2 MT-Bench answers per side, each within its limit
    ln = b["lengths"]
    assert ln["base"]["n"] == ln["tuned"]["n"] == 12 and ln["per_source"]["mtbench"]["base"]["n"] == 2
    record = json.loads(Path(b["parts"]["target"]["tuned"]).read_text())
    assert all(0 <= e["n_tokens"] <= 6 and e["hit_limit"] == (e["n_tokens"] == 6) for e in record["examples"])
    acc = sum(e["correct"] for e in record["examples"]) / 4
    assert b["comparisons"]["target"]["tuned"] == pytest.approx(acc)
    events = [e["event"] for e in RunDir(run).events()]
    assert events.count("battery_part") == 6 and events[-1] == "battery_end"

    # a second run of the same sweep: the base side is reused, only the tuned side is measured
    counted.clear()
    cfg2, run2 = make_run(tmp_path, "dpo-beta0.3", tiny_model_dir, GEN_ONLY, seed=1)
    b2 = bat.run_battery(cfg2, run2)
    assert counted == Counter({("tuned", p): 1 for p in parts})
    assert b2["comparisons"]["target"]["base"] == b["comparisons"]["target"]["base"]

    # resume: a finished part is reused, a missing one is measured again
    counted.clear()
    Path(b["parts"]["own"]["tuned"]).unlink()
    (run / "battery" / "battery.json").unlink()
    b3 = bat.run_battery(cfg, run)
    assert counted == Counter({("tuned", "own"): 1})
    assert b3["comparisons"]["target"] == b["comparisons"]["target"]


def test_sides_measured_apart_then_assembled(tiny_model_dir, tmp_path, counted):
    """side=base needs no adapter (it can run while the run trains); side=tuned skips the base; side=both then
    measures nothing and writes battery.json from the saved records."""
    cfg, run = make_run(tmp_path, "r", tiny_model_dir, GEN_ONLY)
    adapter = run / "adapter"
    hidden = adapter.rename(tmp_path / "adapter-later")
    assert bat.run_battery(cfg, run, side="base") is None
    parts = ["target", "own", "mtbench"]
    assert counted == Counter({("base", p): 1 for p in parts})
    assert not (run / "battery" / "battery.json").exists()
    hidden.rename(adapter)
    counted.clear()
    assert bat.run_battery(cfg, run, side="tuned") is None
    assert counted == Counter({("tuned", p): 1 for p in parts})
    counted.clear()
    b = bat.run_battery(cfg, run)
    assert counted == Counter() and (run / "battery" / "battery.json").is_file()
    assert (b["mtbench"]["base_mean"], b["mtbench"]["tuned_mean"]) == (6.0, 5.0)
    with pytest.raises(ValueError, match="battery side 'neither'; allowed: base, tuned, both"):
        bat.run_battery(cfg, run, side="neither")


def test_concurrent_processes_measure_a_shared_part_once(tiny_model_dir, tmp_path, counted):
    """Two battery processes on one sweep's base side at once (threads here; flock works per open file): the
    second waits on the part's lock and reuses the first's record."""
    import threading
    cfg, run = make_run(tmp_path, "r", tiny_model_dir, ["battery.parts=['target']", *GEN_ONLY[3:]])
    errors: list[BaseException] = []

    def side_base():
        try:
            bat.run_battery(cfg, run, side="base")
        except BaseException as e:  # surfaced in the main thread below
            errors.append(e)
    threads = [threading.Thread(target=side_base) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert counted == Counter({("base", "target"): 1})
    parts = [e for e in RunDir(run).events() if e["event"] == "battery_part"]
    assert sorted(e["reused"] for e in parts) == [False, True]
    assert (bat.base_cache_dir(cfg, run) / ".locks").is_dir()


def test_a_changed_setting_measures_again(tiny_model_dir, tmp_path, counted):
    cfg, run = make_run(tmp_path, "r", tiny_model_dir, ["battery.parts=['target']", *GEN_ONLY[3:]])
    bat.run_battery(cfg, run)
    counted.clear()
    cfg2 = load_dpo_config(None, [f"model.name='{tiny_model_dir}'", "model.device='cpu'", "model.dtype='float32'",
                                  "battery.parts=['target']", *GEN_ONLY[3:], "battery.target_n=5"])
    b = bat.run_battery(cfg2, run)
    assert counted == Counter({("base", "target"): 1, ("tuned", "target"): 1})
    assert b["comparisons"]["target"]["n"] == 5


def test_records_are_found_by_the_recorded_sha_once_the_weights_are_gone(tiny_model_dir, tmp_path, counted):
    """A run folder that travelled without its weights (packed for the trip home) still assembles battery.json
    from its records through the sha256 written beside the weights; a record it lacks is a clear error, not a
    measurement of the base model under the adapter's name."""
    from scalelab.dpo.export import WEIGHTS, recorded_weights_sha, write_weights_sha
    cfg, run = make_run(tmp_path, "r", tiny_model_dir, ["battery.parts=['target']", *GEN_ONLY[3:]])
    adapter = run / "adapter"
    digest = write_weights_sha(adapter)
    assert digest == bat.sha256_file(adapter / WEIGHTS) and recorded_weights_sha(adapter) == digest
    first = bat.run_battery(cfg, run)
    (adapter / WEIGHTS).unlink()
    counted.clear()
    again = bat.run_battery(cfg, run)
    assert counted == Counter() and again["adapter_sha256"] == first["adapter_sha256"] == digest
    assert again["comparisons"] == first["comparisons"]
    cfg5 = load_dpo_config(None, [f"model.name='{tiny_model_dir}'", "model.device='cpu'", "model.dtype='float32'",
                                  "battery.parts=['target']", *GEN_ONLY[3:], "battery.target_n=5"])
    with pytest.raises(FileNotFoundError, match=f"absent, and the tuned side's target record .*{digest}.*retrain"):
        bat.run_battery(cfg5, run, side="tuned")
    (adapter / "adapter_model.safetensors.sha256").write_text("not-a-digest\n")
    with pytest.raises(ValueError, match="adapter_model.safetensors.sha256: not a sha256 hex digest"):
        bat.run_battery(cfg, run)


def test_a_run_without_adapter_is_a_clear_error(tmp_path):
    cfg = load_dpo_config(None, [])
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors.*scalelab dpo train"):
        bat.run_battery(cfg, tmp_path)


def test_config_rejects_unknown_parts():
    from scalelab.core.config import ConfigError
    with pytest.raises(ConfigError, match="battery.parts.*allowed: mmlu, truthfulqa, own, target, mtbench"):
        load_dpo_config(None, ["battery.parts=['mmlu', 'hellaswag']"])


def test_battery_settings_from_another_config_file(tmp_path, tiny_model_dir):
    from scalelab.dpo.battery_folders import run_config
    cfg, run = make_run(tmp_path, "r", tiny_model_dir, ["battery.own_n=7", "train.beta=0.3"])
    other = tmp_path / "other.toml"
    other.write_text("[battery]\nmmlu_limit = 3\n[train]\nbeta = 0.9\n")
    c = run_config(run, other, ["battery.target_n=11"])
    assert (c.battery.mmlu_limit, c.battery.own_n, c.battery.target_n, c.train.beta) == (3, 7, 11, 0.3)
    (tmp_path / "none.toml").write_text("[train]\nbeta = 0.9\n")
    from scalelab.core.config import ConfigError
    with pytest.raises(ConfigError, match="none.toml: no \\[battery\\] table"):
        run_config(run, tmp_path / "none.toml")

# ---------------------------------------------------------------------------------------------
# real lm-eval: MMLU (5-shot) and TruthfulQA on the tiny model, base vs base + adapter


@pytest.mark.slow
def test_lm_eval_parts_on_the_tiny_model(tiny_model_dir, tmp_path, shared_data, counted):
    cfg, run = make_run(tmp_path, "r", tiny_model_dir, [
        "battery.parts=['mmlu', 'truthfulqa']", f"battery.data_dir='{shared_data}'", "battery.mmlu_limit=1",
        "battery.truthfulqa_limit=3", "battery.lm_eval_batch_size=4", "battery.bootstrap_resamples=200"])
    b = bat.run_battery(cfg, run)
    rows = b["comparisons"]
    assert [(k, rows[k]["n"], rows[k]["kind"]) for k in rows] == [
        ("mmlu", 57, "binary"), ("truthfulqa_mc1", 3, "binary"), ("truthfulqa_mc2", 3, "continuous")]
    for side in ("base", "tuned"):
        rec = json.loads(Path(b["parts"]["mmlu"][side]).read_text())
        assert rec["lm_eval"]["mmlu"]["num_fewshot"] == 5
        # the paired mean over the 57 questions is lm-eval's own MMLU accuracy
        assert rows["mmlu"][side] == pytest.approx(rec["lm_eval"]["mmlu"]["acc"])
        tqa = json.loads(Path(b["parts"]["truthfulqa"][side]).read_text())
        assert rows["truthfulqa_mc2"][side] == pytest.approx(tqa["lm_eval"]["truthfulqa_mc2"]["acc"])
    # the tuned side really ran with the adapter: MC2's probability mass moved
    assert rows["truthfulqa_mc2"]["delta"] != 0.0
    # one request cache for the sweep: the tuned side (measured first) built and encoded, the base side read
    for part in ("mmlu", "truthfulqa"):
        tuned, base = (json.loads(Path(b["parts"][part][s]).read_text())["eval"] for s in ("tuned", "base"))
        assert Path(base["request_cache"]).parent == (tmp_path / "battery-base" / "lm-eval-requests").resolve()
        assert base["request_cache"] == tuned["request_cache"]
        assert tuned["tokens"]["encoded"] == base["tokens"]["read"] == base["tokens"]["pairs"] > 0
    assert b["lengths"] == {}  # no generated part ran
    at_chance = wilson_interval(rows["mmlu"]["base"], rows["mmlu"]["n"])[0] <= 0.25   # a random model: no verdict
    mmlu = NOT_MEASURED if at_chance else PASS if rows["mmlu"]["delta"] >= -0.02 else FAIL
    assert [c["status"] for c in b["evidence"]["criteria"]] == [NOT_MEASURED, mmlu, NOT_MEASURED, NOT_MEASURED]

# ---------------------------------------------------------------------------------------------
# wiring: the end of `dpo train`, and `scalelab dpo battery <sweep>`


def test_finish_run_runs_the_battery_then_writes_the_report(tiny_model_dir, tmp_path, counted):
    from scalelab.dpo.run import finish_run
    cfg, run = make_run(tmp_path, "r", tiny_model_dir, ["battery.enabled=true", "battery.parts=['target']",
                                                         *GEN_ONLY[3:]])
    finish_run(cfg, RunDir(run))
    b = json.loads((run / "battery" / "battery.json").read_text())
    t = b["comparisons"]["target"]
    text = (run / "REPORT.md").read_text()
    assert f"| target (arithmetic, test) | correct | 4 | {100 * t['base']:.1f}% | {100 * t['tuned']:.1f}% |" in text
    assert counted == Counter({("base", "target"): 1, ("tuned", "target"): 1})


def test_cli_battery_on_a_sweep_evaluates_the_base_once(tiny_model_dir, tmp_path, counted, capsys):
    from scalelab.cli import main
    sweep = tmp_path / "sweep"
    for i, name in enumerate(["dpo-beta0.1", "dpo-beta0.3"]):
        make_run(sweep, name, tiny_model_dir, [f"train.beta={0.1 if i == 0 else 0.3}"], seed=i)
    assert main(["dpo", "battery", str(sweep), *[a for s in GEN_ONLY for a in ("--set", s)]]) == 0
    parts = ["target", "own", "mtbench"]
    assert counted == Counter({**{("base", p): 1 for p in parts}, **{("tuned", p): 2 for p in parts}})
    out = capsys.readouterr().out
    import re
    for name in ("dpo-beta0.1", "dpo-beta0.3"):
        b = json.loads((sweep / name / "battery" / "battery.json").read_text())
        line = re.search(rf"^{name}: target (\S+) pts .* evidence (.+)$", out, re.M)
        assert line and float(line.group(1)) == pytest.approx(100 * b["comparisons"]["target"]["delta"], abs=0.05)
        assert line.group(2) == b["evidence"]["verdict"]
    assert (sweep / "REPORT.md").is_file() and (sweep / "dpo-beta0.3" / "REPORT.md").is_file()
    assert "| dpo-beta0.3 | dpo | 0.3 |" in (sweep / "REPORT.md").read_text()


def test_cli_battery_one_side_writes_no_reports(tiny_model_dir, tmp_path, counted, capsys):
    from scalelab.cli import main
    sweep = tmp_path / "sweep"
    make_run(sweep, "dpo-beta0.1", tiny_model_dir, [])
    sets = [a for s in ["battery.parts=['target']", *GEN_ONLY[3:]] for a in ("--set", s)]
    assert main(["dpo", "battery", str(sweep), "--side", "base", *sets]) == 0
    assert counted == Counter({("base", "target"): 1})
    assert "dpo-beta0.1: base side measured" in capsys.readouterr().out
    assert not (sweep / "REPORT.md").exists() and not (sweep / "dpo-beta0.1" / "battery" / "battery.json").exists()
