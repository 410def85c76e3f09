"""bench/grpo_rollout_bench.py's emulated response lengths: the drawn lengths, the useful-token accounting of each
engine (hand-checked with scripted engines, no vLLM), the tiny CPU run, and the gpu_grpo.sh variant kinds."""
from __future__ import annotations

import json
import math
import subprocess
import types
from dataclasses import replace
from pathlib import Path

import pytest

from scalelab.core.jsonio import read_json
from scalelab.grpo.completions import repeat_prompts
from scalelab.grpo.types import RolloutBatch, SamplingParams
from tests.bench_script import load_bench

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_bench("grpo_rollout_bench")


# ---------------------------------------------------------------------------------------------
# drawing the lengths


def test_lognormal_lengths_are_seeded_bounded_and_have_the_asked_mean(bench):
    spec = bench.LengthSpec("lognormal", 256.0, 0.6)
    wide = bench.draw_lengths(spec, 20_000, 10**6, seed=0)
    assert wide == bench.draw_lengths(spec, 20_000, 10**6, seed=0)
    assert wide != bench.draw_lengths(spec, 20_000, 10**6, seed=1)
    mu = math.log(256) - 0.6 ** 2 / 2  # E[L] = exp(mu + sigma^2 / 2) = 256; median exp(mu) = 213.9
    stats = bench.length_stats(wide, 10**6)
    assert abs(stats.mean - 256) < 0.02 * 256 and abs(stats.p50 - math.exp(mu)) < 0.03 * math.exp(mu)
    capped = bench.draw_lengths(spec, 20_000, 512, seed=0)
    assert min(capped) >= 1 and max(capped) == 512
    # clipped: drawn >= 511.5 (rounds to >= 512); P = 1 - Phi((ln 511.5 - mu) / sigma) = 0.074
    p_cap = 0.5 * math.erfc((math.log(511.5) - mu) / 0.6 / math.sqrt(2))
    assert abs(bench.length_stats(capped, 512).at_cap_frac - p_cap) < 0.01
    tiny = bench.draw_lengths(bench.LengthSpec("lognormal", 2.0, 2.0), 1_000, 64, seed=0)
    assert min(tiny) == 1 and max(tiny) == 64  # both ends clipped


def test_length_stats_by_hand(bench):
    s = bench.length_stats((1, 2, 3, 10), cap=10)
    # mean 16/4; p90: position 0.9 * 3 = 2.7 between 3 and 10 -> 3 + 0.7 * 7; padded 4 x 10
    assert (s.mean, s.p50, s.max, s.max_over_mean, s.useful_tokens, s.padded_tokens, s.at_cap_frac) == \
        (4.0, 2.5, 10, 2.5, 16, 40, 0.25)
    assert s.p90 == pytest.approx(7.9)


def test_fixed_lengths_are_the_cap_and_the_default(bench):
    assert bench.draw_lengths(bench.LengthSpec("fixed"), 8, 16, seed=3) == (16,) * 8
    assert bench.parse_args(["--out", "x.json"]).length_spec == bench.LengthSpec("fixed")


def test_file_lengths_are_resampled_with_the_seed(bench, tmp_path):
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps([10, 20, 30]))
    spec = bench.parse_lengths(f"file:{path}", 256.0, 0.6)
    assert spec == bench.LengthSpec("file", path=str(path), source=(10, 20, 30))
    assert spec.params() == {"path": str(path), "source_count": 3}
    drawn = bench.draw_lengths(spec, 600, 25, seed=0)
    assert set(drawn) == {10, 20, 25} and drawn == bench.draw_lengths(spec, 600, 25, seed=0)
    assert drawn != bench.draw_lengths(spec, 600, 25, seed=1)
    assert abs(bench.length_stats(drawn, 25).at_cap_frac - 1 / 3) < 0.07  # 30 -> the cap 25


@pytest.mark.parametrize("content", ["[]", "{\"a\": 1}", "[3, -1]", "[3, \"x\"]", "[3, NaN]", "[3, Infinity]",
                                     "not json"])
def test_bad_length_files_name_the_file(bench, tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="bad.json"):
        bench.parse_lengths(f"file:{path}", 256.0, 0.6)


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "uniform"], "allowed: fixed, lognormal, file:PATH"),
    (["--lengths", "file"], "allowed: fixed, lognormal, file:PATH"),
    (["--lengths", "file:/nonexistent/lengths.json"], "/nonexistent/lengths.json"),
    (["--lengths", "lognormal", "--length-mean", "0"], "--length-mean > 0 and --length-sigma >= 0 (got 0, 0.6)"),
    (["--lengths", "lognormal", "--length-sigma", "-1"], "(got 256, -1)")])
def test_bad_length_options_stop_before_any_model_loads(bench, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.parse_args(argv + ["--out", "x.json"])
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# the engines' accounting


def test_length_requests_one_per_sequence_group_major_with_the_engines_seeds(bench):
    reqs = bench.length_requests([[5, 6], [7]], 2, (3, 1, 4, 2), seed=10)
    assert [(r.prompt_ids, r.max_tokens, r.seed) for r in reqs] == [
        ((5, 6), 3, 10), ((5, 6), 1, 11), ((7,), 4, 10), ((7,), 2, 11)]
    with pytest.raises(ValueError, match="3 lengths for 4 sequences"):
        bench.length_requests([[5, 6], [7]], 2, (3, 1, 4), seed=10)


def batch_of(rows, comps, engine, ms):
    return RolloutBatch(tuple(rows), tuple(comps), tuple("t" * len(c) for c in comps),
                        tuple(tuple(-0.5 for _ in c) for c in comps), (False,) * len(rows), ms, 0, engine)


def test_keep_first_cuts_rows_to_their_lengths_by_hand(bench):
    b = batch_of([(0,)] * 3, [(1, 2, 3, 4), (5, 6, 7, 8), (9,)], "hf", 1.0)
    kept = bench.keep_first(b, (2, 4, 3), decode=lambda ids: "d" + "".join(map(str, ids)))
    assert kept.completion_ids == ((1, 2), (5, 6, 7, 8), (9,))  # row 3 stopped early: kept as it is
    assert kept.logprobs == ((-0.5, -0.5), (-0.5,) * 4, (-0.5,))
    assert kept.texts == ("d12", "tttt", "t") and kept.num_tokens == 7
    # HF's static batch: 3 rows x its longest (4); vLLM: only what it decoded
    assert bench.computed_tokens(b) == 3 * 4 and bench.computed_tokens(replace(b, engine="vllm_colocated")) == 9


class ScriptedHF:
    """HF generate's shape without a model: every row runs to max_new_tokens (no EOS), in a scripted time."""
    name = "hf"

    def __init__(self, ms):
        self.ms, self.asked = ms, []

    def generate(self, prompts, params):
        self.asked.append(params.max_new_tokens)
        rows = repeat_prompts(prompts, params.n)
        return batch_of(rows, [tuple(range(params.max_new_tokens))] * len(rows), self.name, self.ms)


def test_engines_count_the_useful_tokens_by_hand(bench, monkeypatch, tmp_path):
    """2 prompts x 2 samples, lengths 3, 1, 4, 2: useful 10 tokens. HF runs all 4 rows to 4 tokens (16 computed)
    in 2 s -> 5 tokens/s; vLLM gets one request per sequence, max_tokens = L_i, and 10 tokens in 1 s -> 10/s."""
    hf, requests = ScriptedHF(ms=2000.0), []

    def vllm_lengths(engine, reqs, params):
        requests.append([(r.prompt_ids, r.max_tokens, r.seed) for r in reqs])
        return batch_of([r.prompt_ids for r in reqs], [tuple(range(r.max_tokens)) for r in reqs], engine.name,
                        1000.0)

    vllm = types.SimpleNamespace(name="vllm_colocated")
    monkeypatch.setattr(bench, "build", lambda name, *a, **k: hf if name == "hf" else vllm)
    monkeypatch.setattr(bench, "vllm_generate_lengths", vllm_lengths)
    args = types.SimpleNamespace(repeats=2, hf_logprobs="keep", profile="", trace_steps=False,
                                 engines=["hf", "vllm_colocated"], length_spec=bench.LengthSpec("lognormal"))
    tokenizer = types.SimpleNamespace(decode=lambda ids, skip_special_tokens: "x" * len(ids))
    params = SamplingParams(n=2, max_new_tokens=16, seed=7)
    engines, _, batch, _ = bench.measure_engines(None, tokenizer, [[5, 6], [7]], params, (3, 1, 4, 2), args, tmp_path)
    assert hf.asked == [4, 4, 4]  # warm-up + 2 repeats, each the batch's longest target, not the cap 16
    h, v = engines["hf"], engines["vllm_colocated"]
    assert (h.completion_tokens, h.computed_tokens, h.tokens_per_s) == (10, 16, 5.0)
    assert (v.completion_tokens, v.computed_tokens, v.tokens_per_s) == (10, 10, 10.0)
    assert requests[0] == [((5, 6), 3, 7), ((5, 6), 1, 8), ((7,), 4, 7), ((7,), 2, 8)] and len(requests) == 3
    assert batch.lengths == (3, 1, 4, 2)  # the update's batch: the last vLLM one


def test_hf_logits_that_do_not_fit_are_refused(bench):
    bench.check_hf_memory(1024, 512, 49_152, free_bytes=140 * 10**9)  # 103 GB of 126 usable: runs
    with pytest.raises(SystemExit, match="206 GB of logits"):
        bench.check_hf_memory(1024, 1024, 49_152, free_bytes=140 * 10**9)


# ---------------------------------------------------------------------------------------------
# the tiny CPU run (HF only)


def test_tiny_bench_emulates_lognormal_lengths(bench, tmp_path, capsys):
    out = tmp_path / "lognormal.json"
    assert bench.main(["--tiny", "--lengths", "lognormal", "--length-mean", "8", "--length-sigma", "0.6",
                       "--no-sync", "--no-update", "--out", str(out)]) == 0
    r = read_json(out)
    lengths = bench.draw_lengths(bench.LengthSpec("lognormal", 8.0, 0.6), 8, 16, seed=0)
    stats = bench.length_stats(lengths, 16)
    assert r["lengths"] == {"mode": "lognormal", "params": {"mean": 8.0, "sigma": 0.6}, "seed": 0, "emulated": True,
                            "mean": stats.mean, "p50": stats.p50, "p90": stats.p90, "max": stats.max,
                            "max_over_mean": stats.max_over_mean, "useful_tokens": sum(lengths),
                            "padded_tokens": 8 * max(lengths), "at_cap_frac": stats.at_cap_frac}
    hf = r["engines"]["hf"]
    # rows are cut to L_i (a row may stop earlier on a stop token the tiny model samples by chance); HF's batch
    # is 8 rows x its longest, which is at most the longest target
    assert hf["completion_tokens"] <= sum(lengths) and hf["computed_tokens"] % 8 == 0
    assert hf["completion_tokens"] <= hf["computed_tokens"] <= 8 * max(lengths)
    assert hf["tokens_per_s"] == pytest.approx(hf["completion_tokens"] / (hf["median_ms"] / 1e3))
    assert "lengths EMULATED (lognormal: mean 8.0, sigma 0.6; seed 0" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# bench/gpu_grpo.sh variant kinds


def variant_args(name: str, new: int = 256) -> subprocess.CompletedProcess:
    """variant_new + variant_args from the script, run alone (the script itself would start the setup)."""
    script = ROOT / "bench" / "gpu_grpo.sh"
    code = (f'NEW={new}; eval "$(sed -n \'/^variant_new()/,/^}}/p; /^variant_args()/,/^}}/p\' {script})"; '
            f'variant_args {name}')
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True)


def test_gpu_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu_grpo.sh")]).returncode == 0


@pytest.mark.parametrize("name, new, lengths", [
    ("64x16-flat-graphs-lognormal", 512, "lognormal"), ("32x8-flat-graphs-lognormal1024", 1024, "lognormal"),
    ("32x8-dict", 256, "fixed")])
def test_variant_kinds_give_flags_the_bench_accepts(bench, name, new, lengths):
    run = variant_args(name)
    assert run.returncode == 0, run.stderr
    flags = run.stdout.split()
    args = bench.parse_args(flags + ["--max-model-len", str(max(new + 256, 1024)), "--out", "x.json"])
    assert args.max_new_tokens == new and args.length_spec.mode == lengths
    if lengths == "lognormal":
        assert args.length_spec == bench.LengthSpec("lognormal", 256.0, 0.6)
    assert args.cudagraph_max == (args.prompts * args.group if "graphs" in name else 0)


@pytest.mark.parametrize("name", ["32x8-lognormal", "32x8-flat-lognormal0", "32x8-flat-lognormalx"])
def test_bad_variant_kinds_are_refused(name):
    run = variant_args(name)
    assert run.returncode == 2 and f"variant {name}" in run.stderr
