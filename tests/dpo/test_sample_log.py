"""The verifier set's side file of raw samples (dpo.sample_log): a build cut short resumes to the bytes of an
uninterrupted one, sampling only the batches it lacks under their own seeds; torn, damaged and foreign side files;
the server sampler's concurrent requests (at most verifier.concurrent_batches in flight) put back in prompt order."""
from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from scalelab.core.http import ServerError
from scalelab.core.jsonio import read_json
from scalelab.dpo.config import VerifierConfig, load_dpo_config
from scalelab.dpo.sample_log import SampleLog, key_hash, sample_logged
from scalelab.dpo.samplers import CompletionsSampler, HFSampler, Sample, batch_seed
from scalelab.dpo.verifier_pairs import (build_verifier_set, manifest_key, reusable, sample_log_for, samples_path,
                                         write_verifier_set)
from scalelab.evals.tasks import Example, Score

REPO = Path(__file__).resolve().parents[2]
CFG = VerifierConfig(num_prompts=10, samples_per_prompt=4, batch_prompts=3, pairs_per_prompt=2, seed=7)
STARTS = [0, 3, 6, 9]  # 10 prompts, 3 per batch: the last batch has one


class Killed(Exception):
    """A stand-in for the process being killed mid-build."""


class ModThree:
    """Prompt i's gold answer is i % 3; an answer is right when it is exactly that."""
    name = "mod3"

    def __init__(self, n: int):
        self.examples = [Example("mod3", f"q{i}", [{"role": "user", "content": str(i)}], str(i % 3)) for i in range(n)]

    def load(self, split, seed=0):
        return list(self.examples)

    def score(self, example, completion):
        return Score(completion == example.answer, completion, "")


class SeededSampler:
    """k answers per prompt drawn from the batch's seed alone: a batch sampled under any other seed answers
    differently, so a resumed set matches an uninterrupted one only when each batch got its own seed. Raises
    Killed once `fail_after` batches are done."""

    def __init__(self, fail_after: int | None = None):
        self.seeds, self.fail_after = [], fail_after

    def batch(self, prompts, cfg, seed):
        if len(self.seeds) == self.fail_after:
            raise Killed
        self.seeds.append(seed)
        rng = np.random.default_rng(seed)
        return [[Sample(str(rng.integers(3)), int(rng.integers(1, 60))) for _ in range(cfg.samples_per_prompt)]
                for _ in prompts]

    def workers(self, cfg):
        return 1


def _built(path: Path, sampler, cfg=CFG, **kw):
    key = manifest_key("m", cfg)
    pairs, summary = build_verifier_set(sampler, ModThree(10), cfg, log=sample_log_for(path, key), **kw)
    return write_verifier_set(path, pairs, summary, key), summary


def test_resumed_build_equals_an_uninterrupted_one(tmp_path):
    whole = SeededSampler()
    pairs, summary = build_verifier_set(whole, ModThree(10), CFG)  # in memory, no side file
    ref = write_verifier_set(tmp_path / "ref" / "p.jsonl", pairs, summary, manifest_key("m", CFG))
    assert whole.seeds == [7 * 100_003 + b for b in STARTS] and summary.n_pairs > 4
    assert (summary.batches_loaded, summary.batches_sampled) == (0, 4)

    path = tmp_path / "cut" / "p.jsonl"
    with pytest.raises(Killed):
        _built(path, SeededSampler(fail_after=2))
    assert [json.loads(x)["start"] for x in samples_path(path).read_text().splitlines()] == [0, 3]
    assert not path.exists()  # the set itself is written only at the end

    again, progress = SeededSampler(), []
    out, resumed = _built(path, again, on_batch=lambda done, total: progress.append((done, total)))
    assert again.seeds == [batch_seed(CFG, 6), batch_seed(CFG, 9)]   # only the missing batches, their own seeds
    assert progress == [(6, 10), (9, 10), (10, 10)]                   # the loaded batches count as done
    assert (resumed.batches_loaded, resumed.batches_sampled) == (2, 2)
    assert out.read_bytes() == ref.read_bytes()

    # the side file stays; the set stays reusable beside it, and rebuilding a deleted set samples nothing
    assert reusable(out, manifest_key("m", CFG))
    out.unlink()
    idle = SeededSampler(fail_after=0)
    assert _built(path, idle)[0].read_bytes() == ref.read_bytes() and idle.seeds == []


def test_torn_last_line_is_cut_and_its_batch_sampled_again(tmp_path):
    path = tmp_path / "p.jsonl"
    ref = _built(path, SeededSampler())[0].read_bytes()
    side = samples_path(path)
    full = side.read_bytes()
    last = full.rstrip(b"\n").rsplit(b"\n", 1)[1] + b"\n"
    for torn in (full[:len(full) - len(last) // 2], full[:-1]):  # cut mid-record; whole but for its newline
        path.unlink()
        side.write_bytes(torn)
        again = SeededSampler()
        assert _built(path, again)[0].read_bytes() == ref
        assert again.seeds == [batch_seed(CFG, 9)]
        assert side.read_bytes() == full  # the tail cut off, the batch appended again on a line of its own


def test_damaged_middle_line_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    _built(path, SeededSampler())
    side = samples_path(path)
    lines = side.read_text().splitlines(keepends=True)
    side.write_text(lines[0] + '{"start": 3, "se\n' + "".join(lines[2:]))
    path.unlink()
    with pytest.raises(ValueError, match=re.escape(f"{side}:2: invalid JSON line")):
        _built(path, SeededSampler(fail_after=0))
    # a line for other prompts (the task's data changed) is no better
    side.write_text("".join(lines).replace('"q4"', '"q99"'))
    with pytest.raises(ValueError, match=re.escape(f"{side}:2: batch 3 is not this build's")):
        _built(path, SeededSampler(fail_after=0))


def test_side_file_under_other_settings_is_never_mixed_in(tmp_path):
    path = tmp_path / "p.jsonl"
    with pytest.raises(Killed):
        _built(path, SeededSampler(fail_after=2))
    side = samples_path(path)
    before = side.read_bytes()
    other = replace(CFG, temperature=0.5)
    idle = SeededSampler(fail_after=0)
    with pytest.raises(ValueError, match=re.escape(f"{side}:1: sampled under other settings")):
        _built(path, idle, other)
    assert side.read_bytes() == before and idle.seeds == []  # neither mixed nor thrown away
    # the settings it was sampled under resume it
    assert _built(path, SeededSampler())[1].batches_loaded == 2


def test_finished_sets_side_file_goes_with_it_when_the_settings_change(tmp_path):
    path = tmp_path / "p.jsonl"
    _built(path, SeededSampler())
    other = replace(CFG, temperature=0.5)
    fresh = SeededSampler()
    _, summary = _built(path, fresh, other)
    assert fresh.seeds == [batch_seed(other, b) for b in STARTS] and summary.batches_loaded == 0
    keys = {json.loads(x)["key"] for x in samples_path(path).read_text().splitlines()}
    assert keys == {key_hash(manifest_key("m", other))} != {key_hash(manifest_key("m", CFG))}


# ---------------------------------------------------------------------------------------------
# concurrent requests to a stand-in of vLLM's /v1/completions


class SlowVLLM(BaseHTTPRequestHandler):
    """Answers a batch after a delay set by its first prompt (so batches finish out of order), counting the
    requests in flight; the batch whose first prompt is `fail` gets HTTP 500."""
    delays: dict = {}
    fail: int | None = None
    lock = threading.Lock()
    in_flight = most = 0
    bodies: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        cls, body = type(self), json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        first = body["prompt"][0][0]
        with cls.lock:
            cls.in_flight += 1
            cls.most = max(cls.most, cls.in_flight)
            cls.bodies.append(body)
        time.sleep(cls.delays[first])
        choices = [{"index": p * body["n"] + j, "text": f"p{ids[0]} s{j} seed{body.get('seed')}",
                    "token_ids": [7] * j + [99]} for p, ids in enumerate(body["prompt"]) for j in range(body["n"])]
        with cls.lock:
            cls.in_flight -= 1  # before the reply: the client can send its next request only after reading it
        out, status = json.dumps({"choices": choices}).encode(), 500 if first == cls.fail else 200
        self.send_response(status)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_vllm():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowVLLM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    SlowVLLM.bodies, SlowVLLM.in_flight, SlowVLLM.most, SlowVLLM.fail = [], 0, 0, None
    # 8 batches of 2 prompts; the first four start together and finish in the order 3, 1, 2, 0
    SlowVLLM.delays = dict(zip(range(0, 16, 2), [0.4, 0.15, 0.25, 0.05, 0.1, 0.2, 0.05, 0.1]))
    yield CompletionsSampler(f"http://127.0.0.1:{server.server_port}", "policy",
                             lambda conv: [int(conv[0]["content"])], [99])
    server.shutdown()


def _starts(side: Path) -> list[int]:
    return [json.loads(x)["start"] for x in side.read_text().splitlines()]


def test_concurrent_requests_keep_prompt_order_seeds_and_the_limit(tmp_path, slow_vllm):
    cfg = VerifierConfig(num_prompts=16, samples_per_prompt=3, batch_prompts=2, seed=5, concurrent_batches=4)
    log = SampleLog(tmp_path / "p.samples.jsonl", key_hash(manifest_key("m", cfg)))
    samples, loaded, sampled = sample_logged(slow_vllm, ModThree(16).examples, cfg, log)
    want = [[f"p{i} s{j} seed{batch_seed(cfg, i - i % 2)}" for j in range(3)] for i in range(16)]
    assert [[s.text for s in g] for g in samples] == want
    assert [[s.n_tokens for s in g] for g in samples] == [[0, 1, 2]] * 16
    assert {b["prompt"][0][0]: b["seed"] for b in SlowVLLM.bodies} == {b: 5 * 100_003 + b for b in range(0, 16, 2)}
    assert 1 < SlowVLLM.most <= 4 and (loaded, sampled) == (0, 8)
    starts = _starts(log.path)  # appended as each finished: completion order
    assert sorted(starts) == list(range(0, 16, 2)) and starts != sorted(starts) and starts.index(6) < starts.index(0)
    assert HFSampler(None, None).workers(cfg) == 1  # HF generate: one batch at a time whatever the setting


def test_failed_request_keeps_the_finished_batches_for_the_rerun(tmp_path, slow_vllm):
    cfg = VerifierConfig(num_prompts=16, samples_per_prompt=3, batch_prompts=2, seed=5, concurrent_batches=4)
    log = SampleLog(tmp_path / "p.samples.jsonl", key_hash(manifest_key("m", cfg)))
    SlowVLLM.fail, SlowVLLM.delays[4] = 4, 0.01  # batch 2 fails at once while batches 0, 1, 3 are in flight
    with pytest.raises(ServerError, match="HTTP 500"):
        sample_logged(slow_vllm, ModThree(16).examples, cfg, log)
    kept = set(_starts(log.path))
    assert {0, 2, 6} <= kept and 4 not in kept  # the batches in flight still reached the side file
    assert len(SlowVLLM.bodies) <= 5  # no new batch after the failure (but one a freed worker took before it)
    SlowVLLM.fail, SlowVLLM.bodies = None, []
    samples, loaded, sampled = sample_logged(slow_vllm, ModThree(16).examples, cfg, log)
    assert sorted(b["prompt"][0][0] for b in SlowVLLM.bodies) == sorted(set(range(0, 16, 2)) - kept)
    assert (loaded, sampled) == (len(kept), 8 - len(kept))
    assert [g[0].text for g in samples] == [f"p{i} s0 seed{batch_seed(cfg, i - i % 2)}" for i in range(16)]


# ---------------------------------------------------------------------------------------------
# the manifest key


def test_concurrent_batches_leaves_the_manifest_key_unchanged():
    folder = REPO / "results" / "h200" / "dpo" / "smollm2"
    committed = read_json(folder / "preferences.manifest.json")
    settings = {k: v for k, v in committed["verifier"].items() if k != "reuse"}
    for n in (1, 4):
        key = manifest_key(committed["model"], VerifierConfig(**settings, concurrent_batches=n))
        assert key == {k: committed[k] for k in ("version", "model", "verifier")}
        assert reusable(folder / "preferences.jsonl", key)  # the committed set stays reusable
    gsm = load_dpo_config(REPO / "configs" / "dpo" / "qwen2.5-coder-1.5b-gsm8k-h200.toml").verifier
    assert (gsm.concurrent_batches, gsm.batch_prompts) == (4, 256)
    assert manifest_key("q", gsm) == manifest_key("q", replace(gsm, concurrent_batches=1))
    assert "concurrent_batches" not in manifest_key("q", gsm)["verifier"]


def test_request_seeds_off_sends_no_seed_and_enters_the_key(tmp_path, slow_vllm):
    cfg = VerifierConfig(num_prompts=4, samples_per_prompt=2, batch_prompts=2, seed=5, request_seeds=False)
    samples, _, _ = sample_logged(slow_vllm, ModThree(4).examples, cfg, None)
    assert [b.get("seed", "absent") for b in SlowVLLM.bodies] == ["absent", "absent"]
    assert samples[0][0].text == "p0 s0 seedNone"
    seeded = replace(cfg, request_seeds=True)
    assert manifest_key("m", cfg)["verifier"]["request_seeds"] is False   # a set drawn without seeds says so
    assert "request_seeds" not in manifest_key("m", seeded)["verifier"]   # seeded: the key sets had before
    assert manifest_key("m", cfg) != manifest_key("m", seeded)
