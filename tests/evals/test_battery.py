"""`scalelab evals battery` on scripted completions: a tiny chat endpoint on loopback answers each GSM8K item with
a canned reply (right in the box, right without a box, wrong, cut off at max_tokens), so every count, interval and
share below is computed by hand; the second run asks the server nothing; bad input ends in one line."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scalelab.cli import main
from scalelab.core.jsonio import read_json, read_jsonl
from scalelab.evals.battery_chat import parse_reply
from scalelab.evals.battery_plan import GROUPS, BatteryInputError, select_tasks
from scalelab.evals.intervals import normal_interval, wilson_interval
from scalelab.evals.mathtasks import strict_correct
from scalelab.evals.tasks import get_task

# ---------------------------------------------------------------------------------------------
# intervals, by hand


def test_wilson_interval_against_hand_computed_values():
    # 27 of 100, z = 1.959964, z^2 = 3.841459: denominator 1 + z^2/n = 1.0384146;
    # centre (0.27 + z^2/200) / 1.0384146 = 0.2892073 / 1.0384146 = 0.2785085;
    # half z * sqrt(0.27 * 0.73 / 100 + z^2 / 40000) / 1.0384146 = 1.959964 * sqrt(0.0020670) / 1.0384146
    #      = 0.0891083 / 1.0384146 = 0.0858119  ->  [0.19270, 0.36432]
    lo, hi = wilson_interval(0.27, 100)
    assert lo == pytest.approx(0.19270, abs=5e-5) and hi == pytest.approx(0.36432, abs=5e-5)
    # 3 of 6: centre 0.5; half 1.959964 * sqrt(0.25/6 + 3.841459/144) / (1 + 3.841459/6) = 0.512408 / 1.640243
    lo, hi = wilson_interval(0.5, 6)
    assert lo == pytest.approx(0.5 - 0.312398, abs=5e-5) and hi == pytest.approx(0.5 + 0.312398, abs=5e-5)
    # 0 of 10 keeps a width: upper = z^2/n / (1 + z^2/n) = 0.3841459 / 1.3841459 = 0.277533
    assert wilson_interval(0.0, 10) == (0.0, pytest.approx(0.277533, abs=5e-6))
    assert normal_interval(0.40, 0.02) == (pytest.approx(0.40 - 0.0391993), pytest.approx(0.40 + 0.0391993))
    with pytest.raises(ValueError, match="n must be > 0"):
        wilson_interval(0.5, 0)


def test_task_selection_and_groups():
    assert select_tasks("mc,gsm8k") == ("gsm8k", *GROUPS["mc"])
    assert select_tasks("generate") == ("gsm8k", "math500", "humaneval", "mbpp", "ifeval_lite", "toolcall_schema",
                                        "toolcall_args")
    assert set(select_tasks("all")) == set(GROUPS["generate"]) | set(GROUPS["mc"])
    with pytest.raises(BatteryInputError, match="unknown task.*gsm9k.*groups: generate, mc, all"):
        select_tasks("gsm9k,mc")


def test_parse_reply_names_the_missing_field():
    ok = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], "usage": {"completion_tokens": 2}}
    assert parse_reply(ok).completion_tokens == 2
    with pytest.raises(ValueError, match=r"no choices\[0\]\.message\.content in the reply"):
        parse_reply({"choices": [{"text": "hi"}]})
    with pytest.raises(ValueError, match="usage.completion_tokens is '2', not a count"):
        parse_reply({**ok, "usage": {"completion_tokens": "2"}})


# ---------------------------------------------------------------------------------------------
# a scripted chat endpoint

LIMIT = 6
# gsm8k test items 0-5 (gold 18, 3, 70000, 540, 20, 64): (reply, completion tokens, finish_reason)
SCRIPT = {
    "gsm8k/test/0": ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18. \\boxed{18}", 10, "stop"),        # lenient + strict
    "gsm8k/test/1": ("2 + 1 = 3 bolts in all.", 20, "stop"),                           # lenient only: no box
    "gsm8k/test/2": ("The profit is \\boxed{7000}.", 30, "stop"),                      # wrong
    "gsm8k/test/3": ("3 * 3 * 60 = 540 meters: \\boxed{540}", 40, "stop"),             # lenient + strict
    "gsm8k/test/4": ("Let us count the cups she feeds in the morning and", 768, "length"),  # cut off, no number
    "gsm8k/test/5": ("Half price glasses: \\boxed{64}", 60, "stop"),                   # lenient + strict
}
MALFORMED = {"choices": [], "usage": {"completion_tokens": 1}}


class FakeChat:
    """ThreadingHTTPServer answering /health, /v1/models and /v1/chat/completions from a question -> reply map."""

    def __init__(self, replies: dict[str, dict], status: int = 200):
        self.replies, self.status, self.chat_requests = replies, status, 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"data": [{"id": "fake-model"}]} if self.path == "/v1/models" else {})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.chat_requests += 1
                assert body["temperature"] == 0.0 and body["model"] == "fake-model"
                question = body["messages"][-1]["content"]
                reply = fake.replies.get(question, chat_reply("I do not know.", 5, "stop"))  # unscripted: wrong
                self._send(fake.status, reply if fake.status == 200 else {"error": "boom"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def chat_reply(text: str, tokens: int, finish: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 50, "completion_tokens": tokens, "total_tokens": 50 + tokens}}


@pytest.fixture
def examples(shared_data):
    return get_task("gsm8k", prompt_format="qwen_boxed").load("test", str(shared_data / "gsm8k"), LIMIT)


def scripted(examples, override: dict[str, dict] | None = None) -> dict[str, dict]:
    replies = {e.prompt[-1]["content"]: chat_reply(*SCRIPT[e.id]) for e in examples}
    for item_id, body in (override or {}).items():
        replies[next(e.prompt[-1]["content"] for e in examples if e.id == item_id)] = body
    return replies


@pytest.fixture
def model_dir(tmp_path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def battery(fake: FakeChat, model_dir: Path, out: Path, data: Path, *extra: str) -> int:
    return main(["evals", "battery", "--model", str(model_dir), "--out", str(out), "--tasks", "gsm8k",
                 "--limit", str(LIMIT), "--server-url", fake.url, "--data-dir", str(data), "--concurrency", "4",
                 *extra])


def error_line(capsys) -> str:
    """The CLI's error: one line, the last on stderr (progress lines come before it)."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line for line in lines if line.startswith("scalelab:")] == lines[-1:]
    return lines[-1]


def test_scores_counts_and_shares_of_scripted_completions(examples, model_dir, shared_data, tmp_path):
    fake = FakeChat(scripted(examples))
    try:
        assert battery(fake, model_dir, tmp_path / "out", shared_data,
                       "--reference-model", "qwen2.5-coder-0.5b-instruct-q4km") == 0
    finally:
        fake.close()
    assert fake.chat_requests == LIMIT
    b = read_json(tmp_path / "out" / "battery.json")
    s = b["tasks"]["gsm8k"]
    # lenient: items 0, 1, 3, 5 right = 4/6; strict (the box): 0, 3, 5 = 3/6; item 4 hit max_tokens: 1/6
    assert (s["n"], s["correct"], s["strict_correct"]) == (6, 4, 3)
    assert s["length_share"] == pytest.approx(1 / 6)
    assert s["mean_completion_tokens"] == pytest.approx((10 + 20 + 30 + 40 + 768 + 60) / 6)
    assert s["max_tokens"] == 768 and s["settings"]["options"] == {"prompt_format": "qwen_boxed"}
    rows = {r["metric"]: r for r in b["rows"]}
    assert rows["lenient"]["value"] == pytest.approx(4 / 6) and rows["strict"]["value"] == pytest.approx(0.5)
    assert (rows["strict"]["ci_low"], rows["strict"]["ci_high"]) == (pytest.approx(0.187602, abs=5e-5),
                                                                     pytest.approx(0.812398, abs=5e-5))
    items = read_jsonl(tmp_path / "out" / "items" / "gsm8k.jsonl.gz")
    assert [i["id"] for i in items] == [e.id for e in examples]
    assert [(i["correct"], i["strict"]) for i in items] == [(True, True), (True, False), (False, False),
                                                            (True, True), (False, False), (True, True)]
    assert [i["finish_reason"] for i in items].count("length") == 1 and items[4]["completion_tokens"] == 768
    assert items[2]["extracted"] == "7000" and items[2]["reason"].startswith("wrong: got 7000, expected 70000")
    # the stored verdicts are the scorers' own on the stored completions
    task = get_task("gsm8k", prompt_format="qwen_boxed")
    for e, item in zip(examples, items):
        assert item["correct"] == task.score(e, item["completion"]).correct
        assert item["strict"] == strict_correct(e, item["completion"])
    report = (tmp_path / "out" / "REPORT.md").read_text()
    assert ("| gsm8k (strict) | 6 | 50.0% | [18.8%, 81.2%] | — | the \\boxed{} answer only |") in report
    lenient = next(line for line in report.splitlines() if line.startswith("| gsm8k (lenient) | 6 | 66.7% |"))
    assert "49.6 (Qwen2.5-0.5B-Instruct bf16, published)" in lenient
    assert "27.1 (this Q4_K_M model, reference protocol, measured)" in lenient
    assert "16.7% hit max_tokens 768" in lenient


def test_second_run_asks_nothing_and_other_settings_redo_the_task(examples, model_dir, shared_data, tmp_path):
    fake = FakeChat(scripted(examples))
    try:
        assert battery(fake, model_dir, tmp_path / "out", shared_data) == 0
        first = read_json(tmp_path / "out" / "tasks" / "gsm8k.json")
        assert first["provenance"]["git_sha"] and first["provenance"]["command"]  # what made this task's record
        assert battery(fake, model_dir, tmp_path / "out", shared_data) == 0
        assert fake.chat_requests == LIMIT  # the stored task was kept: no request
        assert read_json(tmp_path / "out" / "tasks" / "gsm8k.json") == first
        # another limit is another settings hash: the task runs again, on its 5 items
        assert main(["evals", "battery", "--model", str(model_dir), "--out", str(tmp_path / "out"), "--tasks",
                     "gsm8k", "--limit", "5", "--server-url", fake.url, "--data-dir", str(shared_data)]) == 0
    finally:
        fake.close()
    assert fake.chat_requests == LIMIT + 5
    again = read_json(tmp_path / "out" / "tasks" / "gsm8k.json")
    assert again["n"] == 5 and again["settings_sha256"] != first["settings_sha256"]


def test_malformed_reply_is_one_line_naming_task_and_item(examples, model_dir, shared_data, tmp_path, capsys):
    fake = FakeChat(scripted(examples, {"gsm8k/test/2": MALFORMED}))
    try:
        assert battery(fake, model_dir, tmp_path / "out", shared_data, "--concurrency", "1") == 2
    finally:
        fake.close()
    err = error_line(capsys)
    assert err.startswith(f"scalelab: server error: gsm8k item gsm8k/test/2: malformed reply from {fake.url}"
                          "/v1/chat/completions: no choices[0].message.content in the reply")
    assert not (tmp_path / "out" / "tasks" / "gsm8k.json").exists()  # nothing stored for the failed task


def test_a_failed_task_does_not_stop_the_next(examples, model_dir, shared_data, tmp_path, capsys):
    fake = FakeChat(scripted(examples, {"gsm8k/test/2": MALFORMED}))
    try:
        rc = main(["evals", "battery", "--model", str(model_dir), "--out", str(tmp_path / "out"), "--tasks",
                   "gsm8k,math500", "--limit", "3", "--server-url", fake.url, "--data-dir", str(shared_data)])
    finally:
        fake.close()
    assert rc == 2 and "gsm8k item gsm8k/test/2" in error_line(capsys)
    assert not (tmp_path / "out" / "tasks" / "gsm8k.json").exists()
    after = read_json(tmp_path / "out" / "tasks" / "math500.json")  # ran and was stored after gsm8k failed
    assert after["n"] == 3 and after["correct"] == 0  # every unscripted reply is "I do not know."


def test_server_error_status_names_the_item(examples, model_dir, shared_data, tmp_path, capsys):
    fake = FakeChat(scripted(examples), status=500)
    try:
        assert battery(fake, model_dir, tmp_path / "out", shared_data, "--concurrency", "1") == 2
    finally:
        fake.close()
    err = error_line(capsys)
    assert err.startswith("scalelab: server error: gsm8k item gsm8k/test/0: request to ") and "HTTP 500" in err


def test_a_server_that_dies_before_ready_is_one_line(model_dir, shared_data, tmp_path, capsys):
    rc = main(["evals", "battery", "--model", str(model_dir), "--out", str(tmp_path / "out"), "--tasks",
               "toolcall_args", "--limit", "2", "--engine-python", "/bin/false", "--data-dir", str(shared_data)])
    err = error_line(capsys)
    assert rc == 2
    assert err.startswith("scalelab: server error: vllm server exited with code 1 before it was ready")


def test_bad_input_names_what_and_where(model_dir, tmp_path, capsys):
    assert main(["evals", "battery", "--model", str(model_dir), "--out", str(tmp_path), "--tasks", "gsm9k"]) == 2
    assert "unknown task(s) gsm9k" in capsys.readouterr().err
    assert main(["evals", "battery", "--model", str(model_dir), "--out", str(tmp_path), "--tasks", "gsm8k",
                 "--data-dir", str(tmp_path / "nowhere")]) == 2
    assert f"data dir {tmp_path / 'nowhere'}: not found" in capsys.readouterr().err
    (tmp_path / "data").mkdir()
    assert main(["evals", "battery", "--model", str(model_dir), "--out", str(tmp_path), "--tasks", "humaneval",
                 "--data-dir", str(tmp_path / "data")]) == 2
    assert f"humaneval: data folder {tmp_path / 'data' / 'humaneval'} not found" in capsys.readouterr().err
    assert main(["evals", "battery", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path),
                 "--tasks", "toolcall_args"]) == 2
    assert "no-model" in capsys.readouterr().err


def test_a_second_battery_on_the_same_folder_fails_at_once_naming_the_holder(examples, model_dir, shared_data,
                                                                             tmp_path, capsys):
    out = tmp_path / "out"
    lock = out / ".locks" / "battery.lock"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    fake = FakeChat(scripted(examples))
    try:
        assert holder.stdout.readline().strip() == "held"
        assert battery(fake, model_dir, out, shared_data) == 2
        err = error_line(capsys)
        assert f"evals battery --out {out}: another process (pid {holder.pid}) holds {lock}" in err
        assert fake.chat_requests == 0 and not (out / "battery.json").exists()
    finally:
        holder.kill()
        holder.wait()
    assert battery(fake, model_dir, out, shared_data) == 0     # the kernel dropped the dead holder's lock
    assert fake.chat_requests == LIMIT and lock.read_text() == ""
    fake.close()


LOCK_HOLDER = """import sys, time
from scalelab.core.filelock import exclusive_or_fail
with exclusive_or_fail(sys.argv[1], "holder"):
    print("held", flush=True)
    time.sleep(60)
"""
