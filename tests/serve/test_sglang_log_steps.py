"""bench/sglang_log_steps.py: the mean step of each decode-log interval, split by whether prompt chunks rode along."""
from __future__ import annotations

import pytest

from tests.bench_script import load_bench

steps = load_bench("sglang_log_steps")

LOG = """\
[2026-12-06 19:52:27] Prefill batch, #new-seq: 1, #new-token: 427, #cached-token: 0, token usage: 0.05, #running-req: 93, #queue-req: 0, cuda graph: True, input throughput (token/s): 10774.18
[2026-12-06 19:52:27] INFO:     127.0.0.1:51450 - "POST /v1/completions HTTP/1.1" 200 OK
[2026-12-06 19:52:28] Decode batch, #running-req: 100, #token: 63981, token usage: 0.07, cuda graph: True, gen throughput (token/s): 10000.00, #queue-req: 3
[2026-12-06 19:52:29] Decode batch, #running-req: 40, #token: 3981, token usage: 0.01, cuda graph: True, gen throughput (token/s): 8000.00, #queue-req: 0
[2026-12-06 19:52:30] Prefill batch, #new-seq: 2, #new-token: 100, #cached-token: 0, token usage: 0.05, #running-req: 41, #queue-req: 0, cuda graph: True, input throughput (token/s): 1.0
[2026-12-06 19:52:30] Prefill batch, #new-seq: 1, #new-token: 50, #cached-token: 0, token usage: 0.05, #running-req: 43, #queue-req: 0, cuda graph: True, input throughput (token/s): 1.0
[2026-12-06 19:52:31] Decode batch, #running-req: 50, #token: 3981, token usage: 0.01, cuda graph: True, gen throughput (token/s): 2500.00, #queue-req: 0
[2026-12-06 19:52:32] Decode batch, #running-req: 0, #token: 0, token usage: 0.00, cuda graph: True, gen throughput (token/s): 0.00, #queue-req: 0
"""


def test_each_interval_gets_its_step_and_the_prompt_tokens_inside_it():
    ivs = steps.intervals(LOG.splitlines())
    # 100 running at 10,000 tok/s: 10 ms a step, 427 prompt tokens before it; 40 at 8,000: 5 ms, none;
    # 50 at 2,500: 20 ms, 150 prompt tokens; the idle interval (0 tok/s) is skipped
    assert [(i.running, i.queued, i.step_ms, i.prefill_tokens) for i in ivs] == [
        (100, 3, 10.0, 427), (40, 0, 5.0, 0), (50, 0, 20.0, 150)]
    bands = {b["running"]: b for b in steps.by_band(ivs)}
    assert bands["32-63"] == {"running": "32-63", "intervals": 2, "decode_alone": 1,
                              "step_ms_decode_alone_median": 5.0, "step_ms_with_prefill_median": 20.0,
                              "prefill_tokens_per_interval_mean": 75}
    assert bands["64-127"]["step_ms_decode_alone_median"] is None and bands["64-127"]["intervals"] == 1


def test_a_batch_line_missing_its_field_is_named_by_line():
    bad = ["[t] Decode batch, #running-req: 5, #token: 9"]
    with pytest.raises(ValueError, match="line 1: a batch line without the field 'gen throughput"):
        steps.intervals(bad)


def test_the_written_file_names_its_log_by_sha256_and_its_command(tmp_path):
    import hashlib
    import json
    log = tmp_path / "server.log"
    log.write_text(LOG)
    assert steps.main([str(log), "--out", str(tmp_path / "steps.json")]) == 0
    doc = json.loads((tmp_path / "steps.json").read_text())
    assert doc["intervals"] == 3 and doc["provenance"]["git_sha"] and "command" in doc["provenance"]
    assert doc["provenance"]["log_sha256"] == hashlib.sha256(LOG.encode()).hexdigest()
