"""The judge check on a hand-made MT-Bench folder with a stand-in judge: GPT-4's answers rated above the base's
is "capable", equal ratings or unparseable replies are "judge too weak", a rerun asks nothing again, and the
battery's MT-Bench part reports "judge too weak" without generating."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scalelab.dpo import judge_check as jc
from scalelab.evals.judge import JudgeConfig

SINGLE = {"name": "single-v1", "type": "single", "system_prompt": "Rate the answer.",
          "prompt_template": "[Question]\n{question}\n[Answer]\n{answer}\n[End]", "output_format": "[[rating]]"}


def mt_bench(folder: Path) -> Path:
    qs = [(81, "writing", None), (111, "math", "REF-A"), (112, "math", "REF-B"), (121, "coding", "REF-C")]
    (folder / "question.jsonl").write_text("".join(
        json.dumps({"question_id": q, "category": c, "turns": [f"Q{q} turn 1", f"Q{q} turn 2"]}) + "\n"
        for q, c, _ in qs))
    (folder / "reference_answer_gpt-4.jsonl").write_text("".join(
        json.dumps({"question_id": q, "choices": [{"turns": [r, r + " again"]}]}) + "\n" for q, _, r in qs if r))
    (folder / "judge_prompts.jsonl").write_text(json.dumps(SINGLE) + "\n")
    return folder


class StandIn:
    """chat_many stand-in: the answer server replies "base says ..."; the judge rates replies containing REF
    with `ref`, others with `base` (None: no rating in the reply). Counts the requests."""

    def __init__(self, ref: str = "[[9]]", base: str = "[[3]]"):
        self.ref, self.base, self.calls = ref, base, 0

    def __call__(self, cfg, conversations):
        for i, messages in enumerate(conversations):
            self.calls += 1
            text = messages[-1]["content"]
            if cfg.model == "base":
                yield i, f"base says {text}"
            else:
                yield i, f"My rating: {self.ref if 'REF' in text else self.base}"


JUDGE, ANSWERER = JudgeConfig("http://127.0.0.1:1", "judge"), JudgeConfig("http://127.0.0.1:1", "base")


def test_reference_answers_rated_above_the_base_make_a_capable_judge(tmp_path, monkeypatch):
    stand_in = StandIn()
    monkeypatch.setattr(jc, "chat_many", stand_in)
    data = mt_bench(tmp_path)
    check = jc.run_judge_check(JUDGE, ANSWERER, data, tmp_path / "out", n_resamples=200)
    # 3 reference questions (the writing one has none): 3 base answers + 6 ratings
    assert stand_in.calls == 9 and check["n_questions"] == check["n_paired"] == 3
    assert check["capable"] and check["status"] == jc.CAPABLE
    assert (check["mean_reference"], check["mean_base"], check["difference"]) == (9.0, 3.0, 6.0)
    assert check["ci_low"] == check["ci_high"] == 6.0
    assert json.loads((tmp_path / "out" / jc.CHECK_FILE).read_text()) == check
    ratings = [json.loads(x) for x in (tmp_path / "out" / "ratings.jsonl").read_text().splitlines()]
    blind = [r for r in ratings if r["side"] == "base"]
    assert all(r["judge_model"] == "judge" and "REF" not in r["raw"] for r in blind)   # no reference shown
    jc.run_judge_check(JUDGE, ANSWERER, data, tmp_path / "out", n_resamples=200)
    assert stand_in.calls == 9                                           # resumed: nothing asked again


@pytest.mark.parametrize("ref, base, why", [("[[5]]", "[[5]]", "not above the base's"),
                                            ("[[9]]", "no idea", r"\[\[rating\]\] in 100% .* 0% on the base's")])
def test_a_judge_that_cannot_rank_them_is_too_weak(tmp_path, monkeypatch, ref, base, why):
    monkeypatch.setattr(jc, "chat_many", StandIn(ref, base))
    check = jc.run_judge_check(JUDGE, ANSWERER, mt_bench(tmp_path), tmp_path / "out", n_resamples=200)
    assert not check["capable"] and check["status"] == "judge too weak" and re.search(why, check["reason"])


def test_another_judges_ratings_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(jc, "chat_many", StandIn())
    data = mt_bench(tmp_path)
    jc.run_judge_check(JUDGE, ANSWERER, data, tmp_path / "out", n_resamples=200)
    with pytest.raises(jc.MTBenchError, match="rated by 'judge', not 'other'"):
        jc.run_judge_check(JudgeConfig("http://127.0.0.1:1", "other"), ANSWERER, data, tmp_path / "out")


def test_read_check_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="dpo judge-check"):
        jc.read_check(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"status": "capable"}')
    with pytest.raises(ValueError, match=r"bad\.json: not a judge check record"):
        jc.read_check(tmp_path / "bad.json")


def test_the_battery_reports_a_weak_judge_without_generating(tmp_path, monkeypatch):
    from scalelab.dpo import battery as bat
    from scalelab.dpo.config import load_dpo_config
    monkeypatch.setattr(jc, "chat_many", StandIn("[[5]]", "[[5]]"))
    data = tmp_path / "data"
    (data / "mt_bench").mkdir(parents=True)
    mt_bench(data / "mt_bench")
    jc.run_judge_check(JUDGE, ANSWERER, data / "mt_bench", tmp_path / "check", n_resamples=200)
    path = tmp_path / "check" / jc.CHECK_FILE
    cfg = load_dpo_config(None, ["battery.parts=['mtbench']", f"battery.data_dir='{data}'",
                                 "battery.judge_url='http://127.0.0.1:1'", "battery.judge_model='judge'",
                                 f"battery.judge_check='{path}'", "model.name='/no/such/model'"])
    (part,) = bat.plan(cfg)
    assert part.spec["judge_check"] == str(path) and len(part.spec["judge_check_sha256"]) == 64
    side = bat.Side("base", tmp_path / "base", cfg)
    record = bat.measure_mtbench(part, side)                       # the model is never loaded
    block = bat.mtbench_block(record, record)
    assert block["status"] == "not measured" and block["reason"].startswith("judge too weak: GPT-4's answers")
    unset = load_dpo_config(None, ["battery.parts=['mtbench']", f"battery.data_dir='{data}'"])
    assert "judge_check" not in bat.plan(unset)[0].spec            # old records keep their keys
