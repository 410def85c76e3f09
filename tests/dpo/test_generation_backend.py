"""battery.generation_backend without a server: the config field, the record-key rule (hf keys as before the
field existed, vllm keys apart), backend selection and the records each backend writes, the check that vllm can
start, the vLLM server's command line, and the reply parsing and its errors."""
from __future__ import annotations

import dataclasses
import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scalelab.core.config import ConfigError
from scalelab.core.engines import EngineError, RunningServer, build_command
from scalelab.dpo import battery as bat
from scalelab.dpo.config import BatteryConfig, load_dpo_config
from scalelab.dpo.generate import Generation, greedy_generate
from scalelab.dpo.generate_vllm import (Completion, DecodeSettings, ServerPlan, VllmGenerationError, VllmGenerator,
                                        VllmMissingError, completion_body, decode_settings, max_lora_rank,
                                        parse_completion, require_vllm)
from tests.dpo import test_battery
from tests.dpo.test_battery import GEN_ONLY, make_run

REPO = Path(__file__).resolve().parents[2]
FIXED = ["model.name='smollm2-135m-instruct'", "model.device='cpu'", "model.dtype='float32'",
         "battery.data_dir='/data'"]
# part-record file names of this config as measured before generation_backend existed: hf must keep them
HF_NAMES = {"mmlu": ("mmlu-27eb44c0b092.json", "mmlu-9a2192bc2e68.json"),
            "truthfulqa": ("truthfulqa-30ed23cf0045.json", "truthfulqa-4f4c10f7ab3f.json"),
            "own": ("own-ca562bf0e06a.json", "own-f41d45ed2926.json"),
            "target": ("target-622eb6aaa3a2.json", "target-c1a3aecab99e.json"),
            "mtbench": ("mtbench-c800185f9111.json", "mtbench-a9508f1d76ba.json")}
# the keys of a generated part's record, of one of its examples, and of battery.json, before the field existed
RECORD_KEYS = {"part", "kind", "side", "spec", "model", "adapter_sha256", "examples", "scores", "wall_s"}
EXAMPLE_KEYS = {"task", "id", "correct", "partial", "strict", "n_tokens", "hit_limit", "completion", "reason"}
BATTERY_KEYS = ["version", "run", "base_model", "adapter_sha256", "base_cache", "config", "target", "parts", "wall_s",
                "comparisons", "mtbench", "mtbench_max_drop", "lengths", "evidence"]
counted = test_battery.counted  # the fixture: measurements per (side, part), MT-Bench's judge stubbed

# ---------------------------------------------------------------------------------------------
# config and record keys


def record_names(backend: str) -> dict[str, tuple[str, str]]:
    cfg = load_dpo_config(None, [*FIXED, f"battery.generation_backend='{backend}'"])
    tuned = bat.Side("tuned", Path("/runs/r/battery/tuned"), cfg, Path("/runs/r/adapter"), "ab" * 32)
    base = bat.Side("base", Path("/runs/battery-base/x"), cfg)
    return {p.name: (tuned.part_path(p).name, base.part_path(p).name) for p in bat.plan(cfg)}


def test_record_keys_hf_unchanged_vllm_apart():
    assert load_dpo_config(None, FIXED).battery.generation_backend == "hf"
    assert record_names("hf") == HF_NAMES
    vllm = record_names("vllm")
    for part in ("mmlu", "truthfulqa"):  # lm-eval parts do not generate: one record for both backends
        assert vllm[part] == HF_NAMES[part]
    for part in ("own", "target", "mtbench"):
        assert set(vllm[part]).isdisjoint(HF_NAMES[part])
    cfg = load_dpo_config(None, [*FIXED, "battery.generation_backend='vllm'"])
    assert {p.name: p.spec.get("generation_backend") for p in bat.plan(cfg)} == {
        "mmlu": None, "truthfulqa": None, "own": "vllm", "target": "vllm", "mtbench": "vllm"}


def test_backend_field_validation_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"battery\.generation_backend.*'sglang'.*allowed values: 'hf', 'vllm'"):
        load_dpo_config(None, ["battery.generation_backend='sglang'"])
    bad = tmp_path / "bad.toml"
    bad.write_text('[battery]\ngeneration_backend = "VLLM"\n')
    with pytest.raises(ConfigError, match=r"battery\.generation_backend.*'VLLM'"):
        load_dpo_config(bad, [])
    for name in ("qwen2.5-coder-1.5b-gsm8k-h200", "qwen2.5-coder-1.5b-hh-h200"):
        assert load_dpo_config(REPO / "configs" / "dpo" / f"{name}.toml", []).battery.generation_backend == "vllm"

# ---------------------------------------------------------------------------------------------
# backend selection and the records on the tiny model (a stand-in for the server: HF's own greedy tokens)


class FakeVllm:
    """vllm_generator's stand-in: answers with HF greedy on the side's merged model, so every score must equal
    the hf run's; records each call and whether it was closed."""

    def __init__(self, side: bat.Side, load, calls: list):
        self.side, self.load, self.calls, self.closed, self._model = side, load, calls, False, None

    def generate(self, conversations, max_new_tokens, batch_size, what="generation"):
        self.calls.append((self.side.name, max_new_tokens, batch_size, what))
        self._model = self._model or self.load(self.side.cfg, self.side.adapter)
        return greedy_generate(*self._model, conversations, max_new_tokens, batch_size)

    def engine_record(self) -> dict:
        return {"backend": "vllm", "version": "fake", "served_model": self.side.name}

    def close(self) -> None:
        self.closed = True


def read_records(battery: dict, part: str) -> dict[str, dict]:
    return {s: json.loads(Path(battery["parts"][part][s]).read_text()) for s in ("base", "tuned")}


def test_hf_records_keep_their_keys_and_vllm_records_score_the_same(tiny_model_dir, tmp_path, counted,
                                                                    monkeypatch):
    cfg, run = make_run(tmp_path, "r", tiny_model_dir, GEN_ONLY)
    hf = bat.run_battery(cfg, run)
    assert list(hf) == BATTERY_KEYS and "generation_backend" not in hf["config"]
    assert set(hf["config"]) == {f.name for f in dataclasses.fields(BatteryConfig)} - {"generation_backend"}
    for part in ("target", "own"):
        for rec in read_records(hf, part).values():
            assert set(rec) == RECORD_KEYS and "generation_backend" not in rec["spec"]
            assert all(set(e) == EXAMPLE_KEYS for e in rec["examples"])
    assert all("engine" not in r for r in read_records(hf, "mtbench").values())

    # vllm: the HF model is never loaded by the battery, each side gets its generator, closed at the side's end
    calls: list = []
    fakes: list[FakeVllm] = []
    load = bat.load_model
    monkeypatch.setattr(bat, "load_model", lambda *a: pytest.fail("vllm backend loaded the HF model"))

    def fake_generator(side: bat.Side) -> FakeVllm:
        fakes.append(FakeVllm(side, load, calls))
        return fakes[-1]
    monkeypatch.setattr(bat, "vllm_generator", fake_generator)
    monkeypatch.setattr(bat, "require_vllm", lambda python, what: None)
    counted.clear()
    vcfg = dataclasses.replace(cfg, battery=dataclasses.replace(cfg.battery, generation_backend="vllm"))
    vl = bat.run_battery(vcfg, run)
    assert counted == Counter({(s, p): 1 for s in ("base", "tuned") for p in ("target", "own", "mtbench")})
    assert [f.side.name for f in fakes] == ["tuned", "base"] and all(f.closed for f in fakes)
    assert ("tuned", 6, 2, "battery part target, tuned side") in calls  # max_new_tokens, gen_batch_size
    assert ("base", 5, 2, "battery part mtbench, base side") in calls   # mtbench_max_new_tokens
    assert vl["config"]["generation_backend"] == "vllm"
    for part in ("target", "own", "mtbench"):
        for s in ("base", "tuned"):
            assert vl["parts"][part][s] != hf["parts"][part][s]
        for s, rec in read_records(vl, part).items():
            assert rec["spec"]["generation_backend"] == "vllm"
            assert rec["engine"] == {"backend": "vllm", "version": "fake", "served_model": s}
    for part in ("target", "own"):  # the same tokens: per-item records and scores as hf's
        for s in ("base", "tuned"):
            v, h = read_records(vl, part)[s], read_records(hf, part)[s]
            assert v["examples"] == h["examples"] and v["scores"] == h["scores"]
    assert vl["comparisons"] == hf["comparisons"] and vl["lengths"] == hf["lengths"]

    # each backend finds its own records again: nothing is measured twice, nor reused across backends
    counted.clear()
    bat.run_battery(vcfg, run)
    monkeypatch.setattr(bat, "load_model", load)
    assert bat.run_battery(cfg, run)["parts"] == hf["parts"]
    assert counted == Counter()


def test_vllm_that_cannot_start_fails_before_any_part(tiny_model_dir, tmp_path, counted, monkeypatch):
    cfg, run = make_run(tmp_path, "r", tiny_model_dir, ["battery.generation_backend='vllm'", *GEN_ONLY])
    monkeypatch.setenv("SCALELAB_VLLM_PYTHON", str(tmp_path / "no-venv" / "bin" / "python"))
    with pytest.raises(VllmMissingError, match=r"battery.generation_backend='vllm' \(parts to measure: base "
                                               r"target, base own, base mtbench, tuned target.*no-venv/bin/python"):
        bat.run_battery(cfg, run)
    assert counted == Counter()


def test_require_vllm_names_the_python_and_what_wanted_it(tmp_path):
    require_vllm(sys.executable, "x", module="json")  # importable: no error
    with pytest.raises(VllmMissingError, match=rf"battery part own: no_such_module_here is not importable by "
                                               rf"{sys.executable}.*SCALELAB_VLLM_PYTHON"):
        require_vllm(sys.executable, "battery part own", module="no_such_module_here")
    with pytest.raises(VllmMissingError, match=r"part x: cannot run the python meant to start vLLM, .*/nope"):
        require_vllm(str(tmp_path / "nope"), "part x")

# ---------------------------------------------------------------------------------------------
# the server's command line and its replies


def adapter_folder(tmp_path: Path, r: int, pattern: dict | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": r, "rank_pattern": pattern or {}}))
    return tmp_path


def test_server_command_serves_the_adapter_as_tuned(tmp_path):
    adapter = adapter_folder(tmp_path / "adapter", 4, {"q_proj": 12})
    cmd = build_command(ServerPlan(Path("/m"), tmp_path / "log", adapter, "bfloat16").engine_spec(8123))
    flags = dict(zip(cmd, cmd[1:]))
    assert flags["--lora-modules"] == f"tuned={adapter}" and "--enable-lora" in cmd
    assert flags["--max-lora-rank"] == "16"  # rank_pattern's 12, padded to a rank vLLM accepts
    assert flags["--generation-config"] == "vllm" and flags["--dtype"] == "bfloat16"
    assert flags["--served-model-name"] == "base" and "--trust-remote-code" not in cmd
    base = build_command(ServerPlan(Path("/m"), tmp_path / "log", trust_remote_code=True).engine_spec(8123))
    assert "--enable-lora" not in base and "--lora-modules" not in base and "--trust-remote-code" in base
    assert (max_lora_rank(1), max_lora_rank(8), max_lora_rank(9), max_lora_rank(512)) == (1, 8, 16, 512)
    with pytest.raises(VllmGenerationError, match="LoRA rank 513 is above"):
        max_lora_rank(513)
    with pytest.raises(VllmGenerationError, match="adapter_config.json"):
        ServerPlan(Path("/m"), tmp_path / "log", tmp_path / "missing").engine_spec(8123)


@pytest.mark.parametrize("share, flag", [(0.0, None), (0.2, "0.2")])
def test_the_battery_server_takes_its_memory_share_and_records_keep_their_keys(tiny_model_dir, tmp_path, share,
                                                                               flag):
    """vLLM's default share (0.9) would leave nothing for a training run or a second battery process on the GPU;
    the share sizes the KV cache only, so a record measured at one share is reused at another."""
    cfg, run = make_run(tmp_path, "r", tiny_model_dir, [*GEN_ONLY, "battery.generation_backend='vllm'",
                                                        f"battery.vllm_gpu_memory_utilization={share}"])
    side = bat.Side("tuned", run / "battery" / "tuned", cfg, run / "adapter", "ab" * 32)
    cmd = build_command(bat.vllm_generator(side).plan.engine_spec(8123))
    assert dict(zip(cmd, cmd[1:])).get("--gpu-memory-utilization") == flag
    default = dataclasses.replace(cfg, battery=dataclasses.replace(cfg.battery, vllm_gpu_memory_utilization=0.0))
    part = bat.plan(cfg)[0]
    assert side.part_path(part) == dataclasses.replace(side, cfg=default).part_path(part)


def test_a_memory_share_above_one_is_refused():
    with pytest.raises(ConfigError, match="vllm_gpu_memory_utilization"):
        load_dpo_config(None, ["battery.vllm_gpu_memory_utilization=1.5"])


class FakeTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def reply(ids, finish):
    return {"choices": [{"token_ids": ids, "finish_reason": finish}]}


def test_parse_completion_cuts_at_stop_and_reads_the_limit_as_hf_does():
    assert parse_completion(reply([5, 6, 2], "stop"), [2, 3], 4) == Completion((5, 6), False)
    assert parse_completion(reply([5, 6], "stop"), [2, 3], 4) == Completion((5, 6), False)  # stop id left out
    assert parse_completion(reply([5, 6, 7, 3], "stop"), [2, 3], 4) == Completion((5, 6, 7), False)  # last slot
    assert parse_completion(reply([5, 6, 7, 8], "length"), [2], 4) == Completion((5, 6, 7, 8), True)
    assert Completion((5, 6, 7, 8), True).generation(FakeTokenizer()) == Generation("5 6 7 8", 4, True)
    with pytest.raises(ValueError, match="token_ids"):
        parse_completion({"choices": [{"text": "hi", "finish_reason": "stop"}]}, [2], 4)
    with pytest.raises(ValueError, match="finish_reason is 'abort'"):
        parse_completion(reply([5], "abort"), [2], 4)
    with pytest.raises(ValueError, match="'length' after 2 of max_new_tokens=4 tokens.*max_model_len"):
        parse_completion(reply([5, 6], "length"), [2], 4)  # the context, not the cap: HF would not stop there
    with pytest.raises(ValueError, match="not a list of token ids"):
        parse_completion(reply([5, True], "stop"), [2], 4)
    body = completion_body("tuned", [1, 2], 7, DecodeSettings((2, 3), 1.1))
    assert (body["model"], body["prompt"], body["max_tokens"], body["temperature"]) == ("tuned", [1, 2], 7, 0.0)
    assert body["stop_token_ids"] == [2, 3] and body["repetition_penalty"] == 1.1 and body["return_token_ids"]


def copy_model_config(src: Path, dst: Path, **generation) -> Path:
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    gc = json.loads((src / "generation_config.json").read_text())
    (dst / "generation_config.json").write_text(json.dumps({**gc, **generation}))
    return dst


def test_decode_settings_are_hf_stop_ids(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalelab.core.hfgen import stop_token_ids
    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    settings = decode_settings(tiny_model_dir, tok)
    assert list(settings.stops) == stop_token_ids(model, tok) and settings.repetition_penalty == 1.0
    two = copy_model_config(tiny_model_dir, tmp_path / "two", eos_token_id=[tok.eos_token_id, 7],
                            repetition_penalty=1.1)
    assert decode_settings(two, tok) == DecodeSettings(tuple(sorted({tok.eos_token_id, 7})), 1.1)
    for i, (field, value) in enumerate([("no_repeat_ngram_size", 3), ("num_beams", 4)]):
        folder = copy_model_config(tiny_model_dir, tmp_path / f"m{i}", **{field: value})
        with pytest.raises(VllmGenerationError, match=rf"generation_config.json sets {field}"):
            decode_settings(folder, tok)


class Garbage(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        payload = b'{"choices": []}' if self.path == "/v1/completions" else b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_server_that_cannot_start_names_the_part(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer
    plan = ServerPlan(tiny_model_dir, tmp_path / "log", python=str(tmp_path / "no-python"), ready_timeout_s=5)
    gen = VllmGenerator(plan, AutoTokenizer.from_pretrained(tiny_model_dir))
    with pytest.raises(EngineError, match=rf"battery part target, tuned side: no vLLM server for {tiny_model_dir}: "
                                          r".*no-python"):
        gen.generate([[{"role": "user", "content": "Hi"}]], 4, 2, what="battery part target, tuned side")
    assert gen.url == ""


def test_bad_reply_names_url_and_part(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        gen = VllmGenerator(ServerPlan(tiny_model_dir, tmp_path / "log"), AutoTokenizer.from_pretrained(tiny_model_dir))
        gen._server = RunningServer(url=url).__enter__()  # an existing server: nothing is launched
        with pytest.raises(VllmGenerationError, match=rf"battery part own, base side: malformed reply .*"
                                                      rf"{url}/v1/completions"):
            gen.generate([[{"role": "user", "content": "Hi"}]], 4, 2, what="battery part own, base side")
    finally:
        httpd.shutdown()
        httpd.server_close()
