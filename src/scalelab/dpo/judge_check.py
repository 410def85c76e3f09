"""Whether an LLM judge can tell good MT-Bench answers from the base model's: GPT-4's reference answers against
the base's own, rated blind, before any MT-Bench row is trusted.

MT-Bench scores are a judge's 1-10 ratings (Zheng et al. 2023). A judge that cannot rank GPT-4's answers above
a small model's cannot resolve the smaller change that preference tuning makes, and its scores would only add
noise to the verdict. So the judge rates, on turn 1 of every question with a GPT-4 reference answer (math,
reasoning, coding), both GPT-4's answer and the base model's greedy answer, each with FastChat's single-answer
prompt "single-v1", which shows no reference (the reference-guided prompt would hand the judge the answer it is
rating). It is capable when at least MIN_PARSED_SHARE of its replies on each side carry a [[rating]] and the
paired percentile-bootstrap CI (Efron & Tibshirani 1993) of mean(rating of GPT-4 - rating of base) lies above 0;
otherwise the verdict is "judge too weak". The judge may be the base model itself: a judge that favours its own
answers over GPT-4's (self-enhancement bias, Zheng et al. 2023 sec. 3.3) fails here, which is the point.

This complements evals.mtbench's capability gate (a reference rated against another question's reference):
that one asks whether the judge can read at all, this one whether it can rank the base model below better answers.

Files in out_dir, appended as replies arrive so a rerun resumes: base_answers.jsonl, ratings.jsonl, and the
verdict judge_check.json.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from scalelab.dpo.evidence import paired_bootstrap
from scalelab.evals.judge import JudgeConfig, chat_many
from scalelab.evals.mtbench import (MIN_PARSED_SHARE, JudgePrompt, MTBenchError, MTQuestion, load_judge_prompts,
                                    load_questions, parse_rating, read_jsonl)

CHECK_VERSION = 1
CAPABLE, TOO_WEAK = "capable", "judge too weak"
BLIND_PROMPT = "single-v1"
SIDES = ("reference", "base")
CHECK_FILE = "judge_check.json"


@dataclass(frozen=True)
class Rating:
    question_id: int
    side: str                      # reference (GPT-4's answer) | base (the base model's)
    rating: float | None           # None: no parseable [[rating]] in the reply
    raw: str


def check_questions(data_dir: str | Path) -> list[MTQuestion]:
    """The questions that have GPT-4 reference answers, in file order."""
    questions = [q for q in load_questions(data_dir) if q.reference is not None]
    if len(questions) < 2:
        raise MTBenchError(f"{data_dir}: {len(questions)} questions with a GPT-4 reference answer; the judge "
                           "check needs at least 2")
    return questions


def blind_messages(prompt: JudgePrompt, q: MTQuestion, answer: str) -> list[dict]:
    """[system, user] asking for a 1-10 rating of `answer` to turn 1 of q, with no reference shown."""
    text = prompt.prompt_template.format(question=q.turns[0], answer=answer)
    return [{"role": "system", "content": prompt.system_prompt}, {"role": "user", "content": text}]


def _append(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def base_answers(answerer: JudgeConfig, questions: Sequence[MTQuestion], out: Path) -> dict[int, str]:
    """question_id -> the base model's turn-1 answer (greedy, from its server), reusing out/base_answers.jsonl."""
    path = out / "base_answers.jsonl"
    have = {obj["question_id"]: obj["answer"] for _, obj in read_jsonl(path)} if path.exists() else {}
    todo = [q for q in questions if q.question_id not in have]
    for i, reply in chat_many(answerer, [[{"role": "user", "content": q.turns[0]}] for q in todo]):
        _append(path, {"question_id": todo[i].question_id, "answer": reply})
        have[todo[i].question_id] = reply
    return have


def rate(judge: JudgeConfig, prompt: JudgePrompt, questions: Sequence[MTQuestion], answers: dict[int, str],
         out: Path) -> list[Rating]:
    """Every (question, side) rated blind, reusing out/ratings.jsonl (made by this judge only)."""
    path, done = out / "ratings.jsonl", {}
    for n, obj in read_jsonl(path) if path.exists() else ():
        if obj.get("judge_model") != judge.model:
            raise MTBenchError(f"{path}:{n}: rated by {obj.get('judge_model')!r}, not {judge.model!r}; "
                               "use a fresh out folder for another judge")
        done[(obj["question_id"], obj["side"])] = Rating(obj["question_id"], obj["side"], obj["rating"], obj["raw"])
    todo = [(q, side) for q in questions for side in SIDES if (q.question_id, side) not in done]
    asks = [blind_messages(prompt, q, q.reference[0] if side == "reference" else answers[q.question_id])
            for q, side in todo]
    for i, raw in chat_many(judge, asks):
        (q, side) = todo[i]
        r = Rating(q.question_id, side, parse_rating(raw), raw)
        _append(path, {**asdict(r), "judge_model": judge.model})
        done[(q.question_id, side)] = r
    return [done[(q.question_id, side)] for q in questions for side in SIDES]


def _share(ratings: Sequence[Rating], side: str) -> float:
    mine = [r for r in ratings if r.side == side]
    return sum(r.rating is not None for r in mine) / len(mine) if mine else 0.0


def decide(ratings: Sequence[Rating], n_resamples: int = 10_000, seed: int = 0) -> dict:
    """The verdict from the ratings alone: the parsed shares, the paired difference and its CI, the status."""
    by_q: dict[int, dict[str, float | None]] = {}
    for r in ratings:
        by_q.setdefault(r.question_id, {})[r.side] = r.rating
    paired = [(v["reference"], v["base"]) for v in by_q.values()
              if v.get("reference") is not None and v.get("base") is not None]
    shares = {side: _share(ratings, side) for side in SIDES}
    out = {"n_questions": len(by_q), "n_paired": len(paired), "min_parsed_share": MIN_PARSED_SHARE,
           **{f"parsed_share_{s}": shares[s] for s in SIDES}}
    if min(shares.values()) < MIN_PARSED_SHARE or len(paired) < 2:
        return {**out, "capable": False, "status": TOO_WEAK,
                "reason": f"[[rating]] in {shares['reference']:.0%} of replies on GPT-4's answers and "
                          f"{shares['base']:.0%} on the base's (< {MIN_PARSED_SHARE:.0%} on a side)"}
    d = paired_bootstrap([b for _, b in paired], [ref for ref, _ in paired], n_resamples=n_resamples, seed=seed)
    out |= {"mean_reference": d.tuned_mean, "mean_base": d.base_mean, "difference": d.difference,
            "ci_low": d.ci_low, "ci_high": d.ci_high, "confidence": d.confidence, "n_resamples": n_resamples,
            "seed": seed}
    words = (f"GPT-4's answers rated {d.tuned_mean:.2f} vs the base's {d.base_mean:.2f} on {d.n} questions, "
             f"difference {d.difference:+.2f}, {d.confidence:.0%} CI [{d.ci_low:+.2f}, {d.ci_high:+.2f}]")
    if d.ci_low > 0:
        return {**out, "capable": True, "status": CAPABLE, "reason": words}
    return {**out, "capable": False, "status": TOO_WEAK, "reason": words + ": not above the base's"}


def run_judge_check(judge: JudgeConfig, answerer: JudgeConfig, data_dir: str | Path, out_dir: str | Path,
                    n_resamples: int = 10_000, seed: int = 0) -> dict:
    """Answer, rate, decide; writes and returns out_dir/judge_check.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_judge_prompts(data_dir)
    if BLIND_PROMPT not in prompts:
        raise MTBenchError(f"{data_dir}: no judge prompt {BLIND_PROMPT!r}; have {', '.join(sorted(prompts))}")
    questions = check_questions(data_dir)
    ratings = rate(judge, prompts[BLIND_PROMPT], questions, base_answers(answerer, questions, out), out)
    check = {"version": CHECK_VERSION, "judge_model": judge.model, "judge_url": judge.url,
             "answer_model": answerer.model, "prompt": BLIND_PROMPT, **decide(ratings, n_resamples, seed)}
    (out / CHECK_FILE).write_text(json.dumps(check, indent=1) + "\n")
    return check


def read_check(path: str | Path) -> dict:
    """A judge_check.json, or a clear error naming the file and what is wrong with it."""
    path = Path(path)
    try:
        check = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no judge check here; run `scalelab dpo judge-check` first") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    missing = [k for k in ("capable", "status", "reason") if k not in check]
    if missing or not isinstance(check.get("capable"), bool):
        raise ValueError(f"{path}: not a judge check record (missing or bad {', '.join(missing) or 'capable'})")
    return check


def judge_gate(path: str) -> dict:
    """The MT-Bench part's spec entries for battery.judge_check: the file and its sha256 (so a new verdict is
    a new record), {} when unset."""
    if not path:
        return {}
    read_check(path)
    return {"judge_check": str(path), "judge_check_sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}
