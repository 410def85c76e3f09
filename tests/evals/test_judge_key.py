"""The judge's API key goes only over https or to this machine; elsewhere the request is refused before any
connection, and the key appears in no error."""
from __future__ import annotations

import json

import pytest

from scalelab.evals import judge as judge_mod
from scalelab.evals.judge import JudgeConfig, JudgeError, chat, key_may_go_to
from tests.evals.test_mtbench import FakeJudge

KEY = "sk-test-key-9f3a"
REPLY = json.dumps({"choices": [{"message": {"content": "Rating: [[7]]"}}]}).encode()


@pytest.mark.parametrize("url,allowed", [
    ("https://api.openai.com/v1", True),
    ("https://203.0.113.7:8443", True),
    ("http://127.0.0.1:8000", True),
    ("http://127.8.9.10:8000/v1", True),  # all of 127.0.0.0/8 is loopback
    ("http://[::1]:8000", True),
    ("http://localhost:8000", True),
    ("http://LOCALHOST.:8000", True),
    ("http://judge.localhost", False),  # only the name localhost itself: a subdomain resolves as DNS says
    ("http://10.0.0.5:8000", False),
    ("http://128.0.0.1:8000", False),  # one past the loopback block
    ("http://judge.example.com/v1", False),
    ("http://localhost.example.com", False),  # a name that merely starts with localhost
    ("http://[::2]:8000", False),
    ("ftp://127.0.0.1/x", False),
    ("127.0.0.1:8000", False),  # no scheme: not a url urllib would send over http
])
def test_where_a_key_may_go(url, allowed):
    assert key_may_go_to(url) is allowed


def test_a_loopback_http_judge_gets_the_authorization_header(monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", KEY)
    with FakeJudge(lambda body: (200, REPLY)) as fake:
        assert chat(JudgeConfig(url=fake.url, model="m", api_key_env="MY_JUDGE_KEY"), []) == "Rating: [[7]]"
    assert fake.headers[0]["Authorization"] == f"Bearer {KEY}"


def test_a_redirect_is_not_followed_with_the_key(monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", KEY)
    with FakeJudge(lambda body: (302, b"")) as fake:
        with pytest.raises(JudgeError, match="HTTP 302") as err:
            chat(JudgeConfig(url=fake.url, model="m", api_key_env="MY_JUDGE_KEY"), [])
    assert len(fake.requests) == 1 and KEY not in str(err.value)


class NoNetwork:
    def __init__(self):
        self.opened = []

    def open(self, request, timeout=None):
        self.opened.append(request)
        raise AssertionError("a request was attempted")


def test_a_key_is_not_sent_to_a_plain_http_host_elsewhere(monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", KEY)
    opener = NoNetwork()
    monkeypatch.setattr(judge_mod, "_OPENER", opener)
    cfg = JudgeConfig(url="http://judge.example.com:8000", model="m", api_key_env="MY_JUDGE_KEY")
    with pytest.raises(JudgeError) as err:
        chat(cfg, [])
    message = str(err.value)
    assert message.startswith("http://judge.example.com:8000/v1/chat/completions: refusing to send $MY_JUDGE_KEY")
    assert "\n" not in message and KEY not in message
    assert opener.opened == []  # refused before any connection, and not retried


def test_without_a_key_a_plain_http_host_elsewhere_is_used_unauthenticated(monkeypatch):
    monkeypatch.delenv("MY_JUDGE_KEY", raising=False)
    opener = NoNetwork()
    monkeypatch.setattr(judge_mod, "_OPENER", opener)
    with pytest.raises(AssertionError, match="a request was attempted"):
        chat(JudgeConfig(url="http://judge.example.com:8000", model="m", api_key_env="MY_JUDGE_KEY"), [])
    assert len(opener.opened) == 1 and opener.opened[0].get_header("Authorization") is None
