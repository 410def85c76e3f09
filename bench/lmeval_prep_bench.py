#!/usr/bin/env python
"""Where run_lm_eval's time goes outside the model's forwards, on full MMLU 5-shot: task loading, request
building, tokenization, model load, scoring. The forwards are replaced by constant answers (the per-item
scores are then meaningless; only the preparation is timed).

    OMP_NUM_THREADS=1 python bench/lmeval_prep_bench.py --data-dir ../shared/data --out /tmp/lmeval-prep.json
    python bench/lmeval_prep_bench.py --model <HF folder, e.g. SmolLM2's> --data-dir ../shared/data

Three runs in this one process, each a fresh run_lm_eval: without a request cache, with an empty one (the
first model of a battery: it builds the requests and encodes them), and with the same one again (every later
model: both read); a limit-1 run before them converts the data. Without --model, a 2-layer random GPT-2 with
GPT-2's tokenizer (from --data-dir's gpt2_tokenizer/) is made in the work folder.
"""
from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections import defaultdict
from pathlib import Path

# (class or module, attribute): the phases timed; nested ones count inside their callers too
PHASES = [("lm_eval.api.task:Task", "build_all_requests"), ("lm_eval.api.task:ConfigurableTask", "download"),
          ("lm_eval.models.huggingface:HFLM", "__init__"),
          ("scalelab.evals.tokencache:TokenCachedHFLM", "prepare"),
          ("lm_eval.api.task:ConfigurableTask", "process_results"),
          ("scalelab.evals.harness", "load_tasks"), ("scalelab.evals.harness", "build_requests"),
          ("lm_eval.evaluator", "evaluate")]


def _owner(spec: str):
    import importlib
    module, _, cls = spec.partition(":")
    m = importlib.import_module(module)
    return getattr(m, cls) if cls else m


def instrument(totals: dict[str, float]) -> None:
    """Wrap each phase so that its wall time adds up in `totals`, and stub the forwards."""
    from lm_eval.models.huggingface import HFLM
    for spec, name in PHASES:
        owner = _owner(spec)
        fn = getattr(owner, name)
        label = f"{spec.rpartition(':')[2] or spec.rpartition('.')[2]}.{name}"

        @functools.wraps(fn)
        def timed(*args, _fn=fn, _label=label, **kwargs):
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                totals[_label] += time.perf_counter() - t0
        setattr(owner, name, timed)
    # the forwards: one constant (log-likelihood, is-greedy) per request, in request order
    HFLM._loglikelihood_tokens = lambda self, requests, disable_tqdm=False, **kw: [(-1.0, False)] * len(requests)


def tiny_model(out: Path, data_dir: Path) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from scalelab.core.hfio import write_tokenizer
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=2048)).save_pretrained(out)
    write_tokenizer(out, 2048, data_dir / "gpt2_tokenizer")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, required=True, help="the shared data folder (mmlu/, gpt2_tokenizer/)")
    p.add_argument("--model", type=Path, help="HF model folder; default: a tiny random GPT-2")
    p.add_argument("--tasks", default="mmlu")
    p.add_argument("--limit", type=int, default=None, help="items per (sub)task; default: all")
    p.add_argument("--work", type=Path, help="folder for the converted data and the request cache; default: temp")
    p.add_argument("--out", type=Path, help="write the timings here (JSON)")
    args = p.parse_args(argv)

    from scalelab.core.jsonio import write_json
    from scalelab.evals.harness import run_lm_eval
    work = args.work or Path(tempfile.mkdtemp(prefix="lmeval-prep-"))
    model = args.model or tiny_model(work / "tiny-gpt2", args.data_dir)
    totals: dict[str, float] = defaultdict(float)
    instrument(totals)
    # converts the data and fills the datasets library's cache, which every run below then finds
    run_lm_eval(model, args.tasks, data_dir=args.data_dir, cache_dir=work / "data", limit=1)
    rows = []
    for label, cache in [("no cache", None), ("cache, first", work / "requests"), ("cache, again", work / "requests")]:
        totals.clear()
        t0 = time.perf_counter()
        r = run_lm_eval(model, args.tasks, data_dir=args.data_dir, cache_dir=work / "data", limit=args.limit,
                        log_samples=True, request_cache=cache)
        rows.append({"run": label, "total_s": time.perf_counter() - t0, "tokens": r.tokens,
                     "phases_s": {k: round(v, 2) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}})
        print(f"{label:13s} {rows[-1]['total_s']:7.1f} s   " + "  ".join(
            f"{k} {v:.1f}" for k, v in rows[-1]["phases_s"].items()), flush=True)
    if args.out:
        write_json(args.out, {"model": str(model), "tasks": args.tasks, "limit": args.limit, "runs": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
