"""Where the verifier set's sampling time goes on a vLLM server: the same prompts of a DPO config's [verifier]
(its task, split, k, temperature, top_p, max_new_tokens, batch_prompts) under several server and request
settings, each variant run twice in A B B A order within a server, medians reported.

    python bench/verifier_sampling_ab.py --config configs/dpo/qwen2.5-coder-1.5b-gsm8k-h200.toml \\
        --model-dir DIR --prompts 512 --variants seeded@1024,seeded@2048,unseeded@2048,seeded@2048x4 \\
        --gpu-memory-utilization 0.5 --out results.json

A variant is SEEDING@MAX_NUM_SEQS[xINFLIGHT]:
    seeding        seeded: each request carries its own seed, as dpo.samplers.CompletionsSampler sends (vLLM then
                   draws every seeded sequence's noise with its own generator, one row at a time:
                   vllm/v1/sample/ops/topk_topp_sampler.py random_sample); unseeded: the server's seed only
    max_num_seqs   the server's --max-num-seqs (one server per distinct value, started in the order given)
    inflight       requests of batch_prompts prompts in flight at once (default 1, the sampler's old behaviour)

Per run: wall seconds, generated tokens and tokens/s, sequences that hit max_new_tokens, and the share graded
correct (the same for every variant within noise, or a setting changed what is sampled). Not a unit test: the
figures are hardware measurements; the row order and the parsing are tested with a stand-in server.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from gpu_dpo_real import server_spec  # noqa: E402
from scalelab.core.engines import RunningServer  # noqa: E402
from scalelab.core.http import post_json  # noqa: E402
from scalelab.core.provenance import collect  # noqa: E402
from scalelab.dpo.config import VerifierConfig, load_dpo_config  # noqa: E402
from scalelab.dpo.samplers import batch_seed, batch_starts, completions_body, render_ids, until_stop  # noqa: E402

SERVED = "base"


@dataclass(frozen=True)
class Variant:
    seeded: bool
    max_num_seqs: int
    inflight: int = 1

    @property
    def name(self) -> str:
        return f"{'seeded' if self.seeded else 'unseeded'}@{self.max_num_seqs}x{self.inflight}"


def parse_variant(text: str) -> Variant:
    """SEEDING@MAX_NUM_SEQS[xINFLIGHT], e.g. seeded@2048x4; ValueError naming the text otherwise."""
    try:
        seeding, rest = text.strip().split("@")
        seqs, _, inflight = rest.partition("x")
        if seeding not in ("seeded", "unseeded"):
            raise ValueError
        v = Variant(seeding == "seeded", int(seqs), int(inflight or 1))
    except ValueError:
        raise ValueError(f"variant {text!r}: expected SEEDING@MAX_NUM_SEQS[xINFLIGHT], SEEDING seeded or "
                         "unseeded, e.g. seeded@2048x4") from None
    if v.max_num_seqs < 1 or v.inflight < 1:
        raise ValueError(f"variant {text!r}: max_num_seqs and inflight must be >= 1")
    return v


def schedule(variants: Sequence[Variant], repeats: int = 2) -> list[tuple[int, list[Variant]]]:
    """One group per server setting, in first-seen order; within a group the variants in A B B A order
    (forward, then backward, `repeats` passes), so a slow drift weighs on every variant alike."""
    groups: dict[int, list[Variant]] = {}
    for v in variants:
        if v not in groups.setdefault(v.max_num_seqs, []):
            groups[v.max_num_seqs].append(v)
    return [(seqs, [v for r in range(repeats) for v in (vs if r % 2 == 0 else vs[::-1])])
            for seqs, vs in groups.items()]


@dataclass(frozen=True)
class Run:
    variant: str
    wall_s: float
    sequences: int
    tokens: int
    hit_limit: int
    correct: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]             # token ids, chat template applied
    grade: Callable[[int, str], bool]    # prompt index, completion text -> correct
    decode: Callable[[list[int]], str]
    stops: set[int]
    cfg: VerifierConfig                  # k, temperature, top_p, max_new_tokens, batch_prompts, seed


def measure(url: str, w: Workload, v: Variant, post: Callable = post_json) -> Run:
    """Every prompt once under variant `v`: the sampler's own requests (dpo.samplers.completions_body, each
    batch's batch_seed unless unseeded), batch_prompts x k sequences each, v.inflight at a time."""
    cfg = replace(w.cfg, request_seeds=v.seeded)
    k, size = cfg.samples_per_prompt, cfg.batch_prompts

    def one(b: int) -> tuple[int, int, int, int]:
        body = completions_body(SERVED, w.prompts[b:b + size], cfg, batch_seed(cfg, b))
        choices = sorted(post(url + "/v1/completions", body, 1800.0).get("choices") or [], key=lambda c: c["index"])
        want = len(body["prompt"]) * k
        if len(choices) != want:
            raise RuntimeError(f"{url}: batch at prompt {b}: asked for {want} completions, got {len(choices)}")
        toks = [until_stop(c["token_ids"], w.stops) for c in choices]
        right = sum(w.grade(b + i // k, w.decode(t)) for i, t in enumerate(toks))
        return len(toks), sum(map(len, toks)), sum(len(t) >= cfg.max_new_tokens for t in toks), right

    t0 = time.perf_counter()
    with ThreadPoolExecutor(v.inflight) as pool:
        parts = list(pool.map(one, batch_starts(len(w.prompts), cfg)))
    wall = time.perf_counter() - t0
    seqs, tokens, hit, right = (sum(p[i] for p in parts) for i in range(4))
    return Run(v.name, round(wall, 3), seqs, tokens, hit, right)


def summarize(runs: Sequence[Run]) -> list[dict]:
    """One row per variant: the median of its runs' tokens/s and wall, the spread, and the graded share."""
    rows = []
    for name in dict.fromkeys(r.variant for r in runs):
        mine = [r for r in runs if r.variant == name]
        tps = [r.tokens_per_s for r in mine]
        rows.append({"variant": name, "runs": len(mine), "median_tokens_per_s": round(statistics.median(tps), 1),
                     "min_tokens_per_s": round(min(tps), 1), "max_tokens_per_s": round(max(tps), 1),
                     "median_wall_s": round(statistics.median(r.wall_s for r in mine), 2),
                     "mean_tokens_per_sequence": round(sum(r.tokens for r in mine) / sum(r.sequences for r in mine), 1),
                     "hit_limit_share": round(sum(r.hit_limit for r in mine) / sum(r.sequences for r in mine), 4),
                     "correct_share": round(sum(r.correct for r in mine) / sum(r.sequences for r in mine), 4)})
    base = rows[0]["median_tokens_per_s"] if rows else 0.0
    for r in rows:
        r["vs_first"] = round(r["median_tokens_per_s"] / base, 3) if base else None
    return rows


def parse_predictions(text: str) -> dict[str, float]:
    """VARIANT=RATIO,... (each ratio: predicted tokens/s over the first variant's), variant names normalized."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, eq, ratio = item.partition("=")
        try:
            variant, value = parse_variant(name).name, float(ratio)
        except ValueError:
            raise ValueError(f"prediction {item!r}: expected VARIANT=RATIO, e.g. unseeded@2048=2.5") from None
        if not eq or value <= 0:
            raise ValueError(f"prediction {item!r}: expected VARIANT=RATIO with a ratio > 0")
        out[variant] = value
    return out


def beside(rows: list[dict], predicted: dict[str, float]) -> list[dict]:
    """Each row with its predicted ratio to the first variant (None where none was written) and measured/predicted."""
    out = []
    for r in rows:
        want = predicted.get(r["variant"])
        ok = want is not None and r["vs_first"] is not None
        out.append({**r, "predicted_vs_first": want,
                    "measured_over_predicted": round(r["vs_first"] / want, 3) if ok else None})
    return out


def workload(config: Path, model_dir: str, n_prompts: int) -> Workload:
    """The config's verifier prompts (the first n of its chosen examples), rendered and graded as the set's."""
    from scalelab.dpo.generate_vllm import decode_settings
    from scalelab.dpo.verifier_pairs import choose_examples
    from scalelab.evals.tasks import get_task
    from transformers import AutoTokenizer
    v = load_dpo_config(config).verifier
    task = get_task(v.task, **v.task_options)
    examples = choose_examples(task, v)[:n_prompts]
    tok = AutoTokenizer.from_pretrained(model_dir)
    stops = set(decode_settings(Path(model_dir), tok).stops)
    return Workload([render_ids(tok, ex.prompt) for ex in examples],
                    lambda i, text: bool(task.score(examples[i], text.strip()).correct),
                    lambda ids: tok.decode(ids, skip_special_tokens=True), stops, v)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, required=True, help="a DPO config whose [verifier] sets the sampling")
    p.add_argument("--model-dir", required=True, help="the base model's HF folder (what the server loads)")
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--variants", default="seeded@1024,seeded@2048,unseeded@2048,seeded@2048x4")
    p.add_argument("--repeats", type=int, default=2, help="passes over a group's variants (A B B A at 2)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/sampling-ab-logs"))
    p.add_argument("--predict", default="", help="VARIANT=RATIO,...: tokens/s over the first variant's, "
                   "written to --out before the first server starts")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    variants = [parse_variant(t) for t in a.variants.split(",")]
    predicted = parse_predictions(a.predict)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_name("predictions.json").write_text(json.dumps({"predicted_vs_first": predicted, "first":
                                                               variants[0].name, "written_unix": time.time()},
                                                              indent=1) + "\n")
    w = workload(a.config, a.model_dir, a.prompts)
    runs: list[Run] = []
    a.log_dir.mkdir(parents=True, exist_ok=True)
    for seqs, order in schedule(variants, a.repeats):
        spec = server_spec(a.model_dir, SERVED, a.port, a.gpu_memory_utilization, a.max_model_len,
                           max_num_seqs=seqs)
        with RunningServer(spec, a.log_dir / f"vllm-{seqs}.log", ready_timeout_s=900) as server:
            # warm-up, not recorded: one batch (CUDA graphs captured, the system prompt in the prefix cache)
            measure(server.url, replace(w, prompts=w.prompts[:w.cfg.batch_prompts]), order[0])
            for v in order:
                runs.append(measure(server.url, w, v))
                print(json.dumps(asdict(runs[-1]) | {"tokens_per_s": round(runs[-1].tokens_per_s, 1)}), flush=True)
    rows = beside(summarize(runs), predicted)
    a.out.write_text(json.dumps({"config": str(a.config), "prompts": len(w.prompts), "k": w.cfg.samples_per_prompt,
                                 "batch_prompts": w.cfg.batch_prompts, "max_tokens": w.cfg.max_new_tokens, "rows": rows,
                                 "runs": [asdict(r) for r in runs], "command": " ".join(sys.argv),
                                 "provenance": collect()}, indent=1) + "\n")
    for r in rows:
        print(f"{r['variant']:22s} {r['median_tokens_per_s']:>10,.0f} tok/s  x{r['vs_first']}  "
              f"(predicted x{r['predicted_vs_first']})  wall {r['median_wall_s']} s  correct "
              f"{r['correct_share']:.3f}  hit {r['hit_limit_share']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
