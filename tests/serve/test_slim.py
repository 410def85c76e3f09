"""Slim per-request records: each request's SLO verdict recomputes, the full file is named by its sha256, and a
warm-up file is named but not kept."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from scalelab.serve.client import RequestResult
from scalelab.serve.metrics import SLO, meets_slo, request_itl_s
from scalelab.serve.slim import meets_slo_slim, slim_record, slim_run


def _requests(seed: int = 0) -> list[RequestResult]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(60):
        n = int(rng.integers(0, 300))   # 0 gaps (one chunk), <= 100 (judged = max) and > 100 gaps
        gaps = tuple(float(g) for g in rng.lognormal(np.log(0.02), 0.8, n))
        out.append(RequestResult(i, 0.1 * i, float(rng.uniform(0.01, 3.0)), gaps, 5.0, n + 1, 200,
                                 success=i % 17 != 5, error="" if i % 17 != 5 else "StreamError: boom"))
    return out


def _write(tmp_path, results) -> bytes:
    (tmp_path / "requests").mkdir()
    text = "".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in results)
    (tmp_path / "requests" / "vllm-tp1-r6-r0.jsonl").write_text(text)
    return text.encode()


def test_the_judged_gap_and_the_verdict_match_the_full_record():
    slo = SLO(2.0, 0.100)
    for r in _requests():
        d = slim_record(dataclasses.asdict(r), slo.itl_quantile)
        assert "itl_s" not in d and d["gaps"] == len(r.itl_s)
        assert d.get("gap_judged_s", 0.0) == pytest.approx(request_itl_s(r, slo.itl_quantile), abs=1e-5)
        assert meets_slo_slim(d, slo.ttft_s, slo.itl_s) == meets_slo(r, slo)


def test_a_150_gap_request_is_judged_by_its_second_largest_gap():
    gaps = tuple([0.01] * 148 + [0.5, 0.9])  # rank ceil(1 + 0.99 * 149) = 149 of 150: 0.5, not the max 0.9
    d = slim_record(dataclasses.asdict(RequestResult(0, 0.0, 0.1, gaps, 2.0, 151, 10, True)), 0.99)
    assert d["gap_judged_s"] == 0.5


def test_slim_run_names_the_full_files_and_keeps_no_warmup_file(tmp_path):
    results = _requests(1)
    raw = _write(tmp_path, results)
    warm = [dataclasses.replace(r, warmup=True) for r in results[:3]]
    (tmp_path / "requests" / "vllm-tp1-r6-warmup.jsonl").write_text(
        "".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in warm))
    out = slim_run(tmp_path)
    assert not (tmp_path / "requests").exists()
    manifest = json.loads((out / "MANIFEST.json").read_text())
    entry = manifest["files"]["vllm-tp1-r6-r0.jsonl"]
    assert entry["full_sha256"] == hashlib.sha256(raw).hexdigest() and entry["full_bytes"] == len(raw)
    assert entry["records"] == len(results) and manifest["files"]["vllm-tp1-r6-warmup.jsonl"]["records"] == 3
    assert sorted(p.name for p in out.iterdir()) == ["MANIFEST.json", "vllm-tp1-r6-r0.jsonl"]
    lines = (out / "vllm-tp1-r6-r0.jsonl").read_text().splitlines()
    assert [json.loads(x)["request_id"] for x in lines] == [r.request_id for r in results]
    assert all("error" in json.loads(x) for x, r in zip(lines, results) if not r.success)


def test_slim_run_refuses_a_folder_without_requests(tmp_path):
    with pytest.raises(FileNotFoundError, match="requests"):
        slim_run(tmp_path)
