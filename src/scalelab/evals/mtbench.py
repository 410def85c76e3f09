"""MT-Bench (Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena"): 80 two-turn
questions in 8 categories, each turn rated 1-10 by an LLM judge with single-answer grading.

    <data_dir>/question.jsonl                {question_id, category, turns: [t1, t2]}
    <data_dir>/reference_answer_gpt-4.jsonl  {question_id, choices: [{turns: [r1, r2]}]}  (math/reasoning/coding)
    <data_dir>/judge_prompts.jsonl           {name, type, system_prompt, prompt_template, output_format}

Grading follows the paper's single-answer scheme (FastChat's prompts, read from the data file): "single-v1"
for turn 1 and "single-v1-multi-turn" for turn 2; math, reasoning and coding use the reference-guided
"single-math-v1[-multi-turn]" with the GPT-4 answer, because the paper found judges fail to grade math and
reasoning they cannot solve themselves unless shown a reference (sec. 3.4). The turn-2 prompts show the
whole conversation and ask about the second answer only.

A judge must first pass a capability gate: it grades the GPT-4 reference answers of GATE_PER_CATEGORY x 3
reference questions against the reference of a different question; unless it parses and separates them by
`min_capability_gap` points, the result is "not measured" instead of a number from a judge that cannot tell
a right answer from a wrong one (a 135M model babbles, or rates everything alike).

    <out_dir>/capability.json   the gate's numbers and replies, this run
    <out_dir>/answers.jsonl     {question_id, turns}                                   append-only
    <out_dir>/judgments.jsonl   {question_id, turn, rating, judge_prompt, raw, judge_model}  append-only

A rerun with the same out_dir reuses the answers and skips the judged (question, turn) pairs.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from scalelab.core import errors
from scalelab.evals.judge import JudgeConfig, JudgeError, chat_many

__all__ = ["MTQuestion", "MTAnswer", "GenerateFn", "JudgeConfig", "JudgeError", "Judgment", "MTBenchResult",
           "MTBenchError", "load_questions", "load_judge_prompts", "answer_questions", "parse_rating",
           "judge_prompt_name", "judge_messages", "run_gate", "summarize", "run_mtbench", "result_dict"]

QUESTIONS_FILE = "question.jsonl"
REFERENCES_FILE = "reference_answer_gpt-4.jsonl"
JUDGE_PROMPTS_FILE = "judge_prompts.jsonl"
N_TURNS = 2
NEED_REF_CATEGORIES = ("math", "reasoning", "coding")  # FastChat's NEED_REF_CATS for MT-Bench
GATE_PER_CATEGORY = 2  # 2 x 3 categories = 6 right/wrong pairs, 12 judge requests
MIN_PARSED_SHARE = 0.8  # the gate: a judge that cannot follow "[[rating]]" is not a judge
MAX_PARSE_FAILED_SHARE = 0.2  # the run: more unparseable turns than this and the mean is not trusted
RATING_SCALE = (1.0, 10.0)

GenerateFn = Callable[[list[list[dict]]], list[str]]  # batch of chat message lists -> one reply each


class MTBenchError(errors.DataError, ValueError):
    """Malformed MT-Bench data or run files (the message names the file and line), or a bad generate reply."""


# ---------------------------------------------------------------------------------------------
# data


@dataclass(frozen=True)
class MTQuestion:
    question_id: int
    category: str
    turns: tuple[str, ...]  # the user's two messages
    reference: tuple[str, ...] | None  # GPT-4's answers to both turns (math/reasoning/coding), else None


@dataclass(frozen=True)
class JudgePrompt:
    name: str
    type: str  # "single" (a 1-10 rating) or "pairwise"
    system_prompt: str
    prompt_template: str
    output_format: str


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) per non-blank line; MTBenchError naming path:line for anything else."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise MTBenchError(f"{path}: not found") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise MTBenchError(f"{path}:{n}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise MTBenchError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
        yield n, obj


def _field(path: Path, n: int, obj: dict, key: str, kind: type) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise MTBenchError(f"{path}:{n}: {key!r} must be {kind.__name__}, got {value!r}"[:300])
    return value


def _turns(path: Path, n: int, value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) != N_TURNS or not all(isinstance(t, str) for t in value):
        raise MTBenchError(f"{path}:{n}: {what} must be a list of {N_TURNS} strings, got {value!r}"[:300])
    return tuple(value)


def load_references(data_dir: Path) -> dict[int, tuple[str, ...]]:
    path, refs = data_dir / REFERENCES_FILE, {}
    for n, obj in read_jsonl(path):
        choices = _field(path, n, obj, "choices", list)
        if not choices or not isinstance(choices[0], dict):
            raise MTBenchError(f"{path}:{n}: 'choices' must hold at least one object")
        refs[_field(path, n, obj, "question_id", int)] = _turns(path, n, choices[0].get("turns"),
                                                                "'choices[0].turns'")
    return refs


def _question(path: Path, n: int, obj: dict, refs: dict[int, tuple[str, ...]]) -> MTQuestion:
    qid, category = _field(path, n, obj, "question_id", int), _field(path, n, obj, "category", str)
    if category in NEED_REF_CATEGORIES and qid not in refs:
        raise MTBenchError(f"{path}:{n}: {category} question {qid} has no reference answer in {REFERENCES_FILE}")
    return MTQuestion(qid, category, _turns(path, n, obj.get("turns"), "'turns'"), refs.get(qid))


def load_questions(data_dir: str | Path, limit: int | None = None,
                   categories: Sequence[str] | None = None) -> list[MTQuestion]:
    """The questions in file order, those of `categories` only when given, the first `limit` when given."""
    data_dir = Path(data_dir)
    path, refs = data_dir / QUESTIONS_FILE, load_references(data_dir)
    questions = [_question(path, n, obj, refs) for n, obj in read_jsonl(path)]
    if categories is not None:
        known = sorted({q.category for q in questions})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise MTBenchError(f"{path}: no category {unknown[0]!r}; known: {', '.join(known)}")
        questions = [q for q in questions if q.category in categories]
    return questions if limit is None else questions[:limit]


def load_judge_prompts(data_dir: str | Path) -> dict[str, JudgePrompt]:
    path, prompts = Path(data_dir) / JUDGE_PROMPTS_FILE, {}
    for n, obj in read_jsonl(path):
        fields = {f.name: _field(path, n, obj, f.name, str) for f in dataclasses.fields(JudgePrompt)}
        prompts[fields["name"]] = JudgePrompt(**fields)
    return prompts


# ---------------------------------------------------------------------------------------------
# answering


@dataclass(frozen=True)
class MTAnswer:
    question_id: int
    turns: tuple[str, ...]  # the model's answers to turn 1 and turn 2


def _generate(generate: GenerateFn, batch: list[list[dict]], turn: int) -> list[str]:
    replies = generate(batch)
    if not isinstance(replies, list) or len(replies) != len(batch) or not all(isinstance(r, str) for r in replies):
        raise MTBenchError(f"generate returned {type(replies).__name__} of length "
                           f"{len(replies) if isinstance(replies, list) else '?'} for turn {turn}; "
                           f"expected a list of {len(batch)} strings")
    return replies


def answer_questions(generate: GenerateFn, questions: Sequence[MTQuestion]) -> list[MTAnswer]:
    """Turn 1 of every question in one batch, then turn 2 in one batch with turn 1's exchange as history."""
    if not questions:
        return []
    histories: list[list[dict]] = [[] for _ in questions]
    answers: list[list[str]] = [[] for _ in questions]
    for t in range(N_TURNS):
        for q, h in zip(questions, histories):
            h.append({"role": "user", "content": q.turns[t]})
        for h, a, reply in zip(histories, answers, _generate(generate, [list(h) for h in histories], t + 1)):
            h.append({"role": "assistant", "content": reply})
            a.append(reply)
    return [MTAnswer(q.question_id, tuple(a)) for q, a in zip(questions, answers)]


# ---------------------------------------------------------------------------------------------
# judge prompts and ratings


def judge_prompt_name(category: str, turn: int) -> str:
    base = "single-math-v1" if category in NEED_REF_CATEGORIES else "single-v1"
    return base if turn == 1 else base + "-multi-turn"


def _template_fields(q: MTQuestion, answer_turns: Sequence[str]) -> dict[str, str]:
    fields = {"question": q.turns[0], "answer": answer_turns[0], "question_1": q.turns[0],
              "question_2": q.turns[1], "answer_1": answer_turns[0]}
    if len(answer_turns) > 1:
        fields["answer_2"] = answer_turns[1]
    if q.reference is not None:
        fields |= {"ref_answer_1": q.reference[0], "ref_answer_2": q.reference[1]}
    return fields


def judge_messages(prompts: dict[str, JudgePrompt], q: MTQuestion, answer_turns: Sequence[str],
                   turn: int) -> tuple[str, list[dict]]:
    """(prompt name, [system, user]) grading `answer_turns` (turn 1 needs one answer, turn 2 both)."""
    name = judge_prompt_name(q.category, turn)
    if name not in prompts:
        raise MTBenchError(f"{JUDGE_PROMPTS_FILE}: no judge prompt {name!r}; have {', '.join(sorted(prompts))}")
    p = prompts[name]
    try:
        text = p.prompt_template.format(**_template_fields(q, answer_turns))
    except KeyError as e:
        raise MTBenchError(f"judge prompt {name!r} needs {e.args[0]!r}, which question {q.question_id} "
                           f"turn {turn} does not provide") from None
    return name, [{"role": "system", "content": p.system_prompt}, {"role": "user", "content": text}]


# "[[N]]" as the prompts ask, else "[N]" as FastChat tolerates. The last match: the verdict follows the
# explanation, and a judge that first echoes the instruction's example "Rating: [[5]]" must not score 5.
_RATING = re.compile(r"\[\[(\d+(?:\.\d*)?)\]\]")
_RATING_LOOSE = re.compile(r"\[(\d+(?:\.\d*)?)\]")


def parse_rating(text: str) -> float | None:
    """The judge's 1-10 rating, or None when there is none (or it is off the scale the prompt asks for)."""
    for pattern in (_RATING, _RATING_LOOSE):
        found = pattern.findall(text)
        if found:
            value = float(found[-1])
            return value if RATING_SCALE[0] <= value <= RATING_SCALE[1] else None
    return None


# ---------------------------------------------------------------------------------------------
# the capability gate


def gate_questions(questions: Sequence[MTQuestion]) -> list[MTQuestion]:
    """Up to GATE_PER_CATEGORY reference questions per category, interleaved (math, reasoning, coding, math, ...)
    so that each one's neighbour, whose reference serves as its wrong answer, is from another category."""
    by_cat = [[q for q in questions if q.category == c and q.reference][:GATE_PER_CATEGORY]
              for c in NEED_REF_CATEGORIES]
    gate = [group[k] for k in range(GATE_PER_CATEGORY) for group in by_cat if k < len(group)]
    return gate if len(gate) >= 2 else []  # one question has no other's answer to be wrong with


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _gate_numbers(replies: list[dict], min_gap: float) -> dict[str, Any]:
    right = [r["rating"] for r in replies if r["answer"] == "right" and r["rating"] is not None]
    wrong = [r["rating"] for r in replies if r["answer"] == "wrong" and r["rating"] is not None]
    parsed_share = (len(right) + len(wrong)) / len(replies) if replies else 0.0
    mean_right, mean_wrong = _mean(right), _mean(wrong)
    gap = mean_right - mean_wrong if mean_right is not None and mean_wrong is not None else None
    capable = parsed_share >= MIN_PARSED_SHARE and gap is not None and gap >= min_gap
    return {"capable": capable, "n_pairs": len(replies) // 2, "n_replies": len(replies),
            "n_parsed": len(right) + len(wrong), "parsed_share": parsed_share, "min_parsed_share": MIN_PARSED_SHARE,
            "mean_right": mean_right, "mean_wrong": mean_wrong, "gap": gap, "min_gap": min_gap,
            "replies": replies}


def run_gate(judge: JudgeConfig, prompts: dict[str, JudgePrompt], questions: Sequence[MTQuestion]) -> dict:
    """Rate each gate question's reference answer ("right") and its neighbour's ("wrong") on turn 1."""
    gate = gate_questions(questions)
    items: list[tuple[MTQuestion, str, str]] = []
    for i, q in enumerate(gate):
        wrong = gate[(i + 1) % len(gate)].reference
        assert q.reference is not None and wrong is not None
        items += [(q, "right", q.reference[0]), (q, "wrong", wrong[0])]
    convs = [judge_messages(prompts, q, [answer], 1)[1] for q, _, answer in items]
    replies: list[dict] = [{} for _ in items]
    for i, raw in chat_many(judge, convs):
        q, kind, _ = items[i]
        replies[i] = {"question_id": q.question_id, "answer": kind, "rating": parse_rating(raw), "raw": raw}
    return _gate_numbers(replies, judge.min_capability_gap)


def gate_failure(judge_model: str, cap: dict) -> str:
    if cap["n_replies"] == 0:
        return f"judge {judge_model} not gated: the data has fewer than 2 reference questions"
    if cap["parsed_share"] < cap["min_parsed_share"]:
        return (f"judge {judge_model} failed the capability gate: {cap['n_parsed']}/{cap['n_replies']} replies "
                f"had a [[rating]] (< {cap['min_parsed_share']:.0%})")
    right, wrong, gap = (("n/a" if cap[k] is None else f"{cap[k]:.2f}") for k in ("mean_right", "mean_wrong", "gap"))
    return (f"judge {judge_model} failed the capability gate: reference answers rated {right} vs wrong answers "
            f"{wrong}, gap {gap} < {cap['min_gap']}")


# ---------------------------------------------------------------------------------------------
# answers and judgments on disk (append-only jsonl, so a rerun resumes)


@dataclass(frozen=True)
class Judgment:
    question_id: int
    turn: int  # 1 or 2
    rating: float | None  # None: the judge's reply had no parseable rating
    judge_prompt: str  # the judge prompt's name, e.g. "single-math-v1-multi-turn"
    raw: str  # the judge's whole reply


def _append(path: Path | None, record: dict) -> None:
    if path is not None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_answers(path: Path) -> dict[int, MTAnswer]:
    answers: dict[int, MTAnswer] = {}
    for n, obj in read_jsonl(path) if path.exists() else ():
        a = MTAnswer(_field(path, n, obj, "question_id", int), _turns(path, n, obj.get("turns"), "'turns'"))
        answers[a.question_id] = a
    return answers


def read_judgments(path: Path, judge_model: str) -> dict[tuple[int, int], Judgment]:
    """The judgments already in `path`; MTBenchError if another judge made them (one out_dir, one judge)."""
    done: dict[tuple[int, int], Judgment] = {}
    if not path.exists():
        return done
    for n, obj in read_jsonl(path):
        if obj.get("judge_model") != judge_model:
            raise MTBenchError(f"{path}:{n}: judged by {obj.get('judge_model')!r}, not {judge_model!r}; "
                               "use a fresh out_dir for another judge")
        rating = obj.get("rating")
        if rating is not None and not isinstance(rating, (int, float)):
            raise MTBenchError(f"{path}:{n}: 'rating' must be a number or null, got {rating!r}")
        j = Judgment(_field(path, n, obj, "question_id", int), _field(path, n, obj, "turn", int), rating,
                     _field(path, n, obj, "judge_prompt", str), _field(path, n, obj, "raw", str))
        done[(j.question_id, j.turn)] = j
    return done


def get_answers(generate: GenerateFn, questions: Sequence[MTQuestion], out: Path | None) -> dict[int, MTAnswer]:
    path = out / "answers.jsonl" if out is not None else None
    have = read_answers(path) if path is not None else {}
    for a in answer_questions(generate, [q for q in questions if q.question_id not in have]):
        _append(path, {"question_id": a.question_id, "turns": list(a.turns)})
        have[a.question_id] = a
    return have


def judge_answers(judge: JudgeConfig, prompts: dict[str, JudgePrompt], questions: Sequence[MTQuestion],
                  answers: dict[int, MTAnswer], out: Path | None) -> list[Judgment]:
    """Every (question, turn) judged, reusing those in out/judgments.jsonl; new ones appended as they arrive."""
    path = out / "judgments.jsonl" if out is not None else None
    done = read_judgments(path, judge.model) if path is not None else {}
    todo = [(q, t) for q in questions for t in range(1, N_TURNS + 1) if (q.question_id, t) not in done]
    asks = [judge_messages(prompts, q, answers[q.question_id].turns[:t], t) for q, t in todo]
    for i, raw in chat_many(judge, [messages for _, messages in asks]):
        (q, t), name = todo[i], asks[i][0]
        j = Judgment(q.question_id, t, parse_rating(raw), name, raw)
        _append(path, {**dataclasses.asdict(j), "judge_model": judge.model})
        done[(q.question_id, t)] = j
    return [done[(q.question_id, t)] for q in questions for t in range(1, N_TURNS + 1)]


# ---------------------------------------------------------------------------------------------
# the result


@dataclass(frozen=True)
class MTBenchResult:
    status: str  # "measured" | "not measured"
    reason: str  # why not measured; "" when measured
    judge_model: str
    n_questions: int  # questions answered and judged (0 when stopped before answering)
    mean_turn1: float | None  # 1-10, over parsed ratings
    mean_turn2: float | None
    mean: float | None  # over both turns' parsed ratings, the paper's MT-Bench score
    per_category: dict[str, float]
    n_parse_failed: int  # judged turns without a rating
    capability: dict  # the gate's numbers (run_gate)


def not_measured(reason: str, judge_model: str, capability: dict, n_questions: int = 0,
                 n_parse_failed: int = 0) -> MTBenchResult:
    return MTBenchResult("not measured", reason, judge_model, n_questions, None, None, None, {}, n_parse_failed,
                         capability)


def summarize(questions: Sequence[MTQuestion], judgments: Sequence[Judgment], judge_model: str,
              capability: dict) -> MTBenchResult:
    category = {q.question_id: q.category for q in questions}
    scored = [(j.turn, category[j.question_id], j.rating) for j in judgments if j.rating is not None]
    failed = len(judgments) - len(scored)
    if judgments and failed / len(judgments) > MAX_PARSE_FAILED_SHARE:
        return not_measured(f"judge {judge_model} gave no parseable rating for {failed}/{len(judgments)} turns "
                            f"(> {MAX_PARSE_FAILED_SHARE:.0%})", judge_model, capability, len(questions), failed)
    per_category = {c: _mean([r for _, cat, r in scored if cat == c]) for c in dict.fromkeys(category.values())}
    return MTBenchResult("measured", "", judge_model, len(questions),
                         _mean([r for turn, _, r in scored if turn == 1]),
                         _mean([r for turn, _, r in scored if turn == 2]), _mean([r for _, _, r in scored]),
                         {c: m for c, m in per_category.items() if m is not None}, failed, capability)


def run_mtbench(generate: GenerateFn, data_dir: str | Path, judge: JudgeConfig, limit: int | None = None,
                out_dir: str | Path | None = None) -> MTBenchResult:
    """Gate the judge, answer the first `limit` questions (two turns), judge every turn, summarize. Without a
    judge, or with one that fails the gate, nothing is generated and the result is "not measured"."""
    if not judge.configured:
        return not_measured("no judge endpoint configured", judge.model, {})
    prompts, questions = load_judge_prompts(data_dir), load_questions(data_dir, limit)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    capability = run_gate(judge, prompts, load_questions(data_dir))
    if out is not None:
        (out / "capability.json").write_text(json.dumps(capability, indent=2, ensure_ascii=False) + "\n")
    if not capability["capable"]:
        return not_measured(gate_failure(judge.model, capability), judge.model, capability)
    answers = get_answers(generate, questions, out)
    judgments = judge_answers(judge, prompts, questions, answers, out)
    return summarize(questions, judgments, judge.model, capability)


def result_dict(r: MTBenchResult) -> dict:
    return dataclasses.asdict(r)
