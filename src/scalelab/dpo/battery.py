"""The regression battery: the base model and base + adapter on the same held-out examples, one part at a time.

    mmlu         lm-eval, 5-shot (Hendrycks et al. 2021), per-question correctness kept for a paired CI; with
                 battery.mmlu_base_full the base runs every item and a subset row pairs on its items
                 (dpo.mmlu_pairing)
    truthfulqa   lm-eval MC1 (right / wrong) and MC2 (probability mass on the true answers) (Lin et al. 2022)
    own          greedy generation + each task's programmatic checker (tool-call schema, arguments, IFEval-lite);
                 all own tasks share generate calls (sorted by prompt length), as decoding steps dominate on CPU
    target       the task the run was tuned for, on its held-out split; numeric tasks asked for a marked answer
                 (GSM8K's \\boxed{}) also get the reference protocol's strict column, target_strict
    mtbench      two-turn answers judged 1-10 by an LLM (Zheng et al. 2023); "not measured" without a judge, or
                 with one that failed battery.judge_check (dpo.judge_check)

The generated parts (own, target, mtbench) decode with battery.generation_backend: hf = transformers generate on
the base with the adapter merged (dpo.generate), vllm = one vLLM server per side with the adapter on its LoRA path
(dpo.generate_vllm). Both send the same prompt ids (chat template) and score the same way; a vllm record's spec
names the backend (so the two never share a record) and its "engine" entry the server that answered. hf records
and battery.json keep the keys they had before the choice existed.

Files (each part's record is written when the part finishes, so a rerun resumes at part granularity):
    <run parent>/battery-base/<model key>/<part>-<spec hash>.json   the base side, shared by every run of a
                                                                    sweep (the spec holds every setting
                                                                    that decides the measurement)
    <run>/battery/tuned/<part>-<spec hash>.json                     the tuned side (spec + adapter sha256;
                                                                    the sha256 recorded beside the weights
                                                                    stands for them where they are absent)
    <run>/battery/battery.json                                      comparisons, lengths, evidence bar
    <side folder>/vllm-<side>-<pid>.log                             the vLLM server's log (backend vllm)
    <folder>/.locks/<part>-<hash>.lock                              held while that record is measured, so
                                                                    processes over one sweep never measure a
                                                                    shared base part twice
    <run parent>/battery-base/lm-eval-requests/                     lm-eval's requests and token ids, built
                                                                    once for both sides of every run
                                                                    (evals.harness request_cache)
Events "battery_part" and "battery_end" go to the run's metrics.jsonl.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from scalelab.core.config import to_dict
from scalelab.core.filelock import file_lock
from scalelab.core.hfmodel import (load_causal_lm, load_tokenizer, materialize, resolve_device, resolve_dtype,
                                   sha256_file)
from scalelab.core.models import cache_root
from scalelab.core.jsonio import is_stored, read_json, write_json
from scalelab.core.rundir import RunDir
from scalelab.dpo import battery_stats as stats
from scalelab.dpo.config import DpoConfig
from scalelab.dpo.export import WEIGHTS, recorded_weights_sha
from scalelab.dpo.generate import Conversation, Generation, greedy_generate
from scalelab.dpo.generate_vllm import ServerPlan, VllmGenerator, require_vllm
from scalelab.dpo.judge_check import judge_gate, read_check
from scalelab.dpo.mmlu_pairing import pair_mmlu
from scalelab.evals import mtbench
from scalelab.evals.harness import result_dict, run_lm_eval
from scalelab.evals.mathtasks import ASKED_MARKER, strict_correct
from scalelab.evals.mmlu_subset import SUBSET_RECORD, cached_subset
from scalelab.evals.tasks import get_task, shared_data_root

BATTERY_VERSION = 1

# ---------------------------------------------------------------------------------------------
# the plan: which parts, and what decides each one's measurement


@dataclass(frozen=True)
class Part:
    name: str             # file stem: mmlu, truthfulqa, target, own, mtbench
    kind: str             # lm_eval | generation | mtbench
    spec: dict            # settings that decide the base side's numbers


def data_root(cfg: DpoConfig) -> Path:
    return Path(cfg.battery.data_dir) if cfg.battery.data_dir else shared_data_root()


def eval_device_dtype(cfg: DpoConfig) -> tuple[str, str]:
    """('cpu' | 'cuda', 'float32' | 'bfloat16' | ...): the battery's override, else the model section's."""
    device = resolve_device(cfg.battery.device or cfg.model.device)
    dtype = resolve_dtype(cfg.battery.dtype or cfg.model.dtype, device)
    return device.type, str(dtype).removeprefix("torch.")


def target_task(cfg: DpoConfig) -> tuple[str, dict]:
    name = cfg.battery.target_task or cfg.verifier.task
    return name, dict(cfg.verifier.task_options) if name == cfg.verifier.task else {}


def _lm_eval_parts(cfg: DpoConfig, root: str) -> dict[str, Callable[[], list[Part]]]:
    b = cfg.battery
    lm = {"source": b.source, "data_dir": root, "batch_size": b.lm_eval_batch_size}
    subset = {"mmlu_subset": b.mmlu_subset} if b.mmlu_subset else {}  # absent when off: old records keep their keys
    return {"mmlu": lambda: [Part("mmlu", "lm_eval", {**lm, "tasks": ["mmlu"], "limit": b.mmlu_limit,
                                                      "num_fewshot": {"mmlu": b.mmlu_fewshot}, **subset})],
            "truthfulqa": lambda: [Part("truthfulqa", "lm_eval", {**lm, "tasks": ["truthfulqa_mc1", "truthfulqa_mc2"],
                                                                  "limit": b.truthfulqa_limit})]}


def backend_spec(cfg: DpoConfig) -> dict:
    """The generation backend's entry of a generated part's spec: absent for hf, so the records measured before
    the choice existed keep their keys; present for vllm, whose greedy tokens may differ from hf's by numerics,
    so its records never stand in for hf's (or the other way round)."""
    backend = cfg.battery.generation_backend
    return {} if backend == "hf" else {"generation_backend": backend}


def _generated_parts(cfg: DpoConfig, root: str) -> dict[str, Callable[[], list[Part]]]:
    b = cfg.battery
    gen = {"max_new_tokens": b.max_new_tokens, "batch_size": b.gen_batch_size, "seed": b.seed, **backend_spec(cfg)}
    name, options = target_task(cfg)
    mtbench = {"data_dir": str(Path(root) / "mt_bench"), "limit": b.mtbench_limit,
               "max_new_tokens": b.mtbench_max_new_tokens, "batch_size": b.gen_batch_size,
               "judge_url": b.judge_url, "judge_model": b.judge_model, **judge_gate(b.judge_check),
               **backend_spec(cfg)}
    own = [{"task": t, "options": {}} for t in b.own_tasks]
    return {"target": lambda: [Part("target", "generation", {**gen, "tasks": [{"task": name, "options": options}],
                                                            "split": b.target_split, "n": b.target_n})],
            "own": lambda: [Part("own", "generation", {**gen, "tasks": own, "split": "test", "n": b.own_n})],
            "mtbench": lambda: [Part("mtbench", "mtbench", mtbench)]}


def plan(cfg: DpoConfig) -> list[Part]:
    """The parts of battery.parts, in that order."""
    root = str(data_root(cfg))
    makers = {**_lm_eval_parts(cfg, root), **_generated_parts(cfg, root)}
    return [p for name in cfg.battery.parts for p in makers[name]()]


def base_config(cfg: DpoConfig) -> DpoConfig:
    """The config of the base side: with battery.mmlu_base_full its MMLU runs on every item (measured once for
    all rows of a sweep, and restricted to a subset row's items when compared), else the run's own."""
    b = cfg.battery
    if not (b.mmlu_base_full and b.mmlu_subset):
        return cfg
    return dataclasses.replace(cfg, battery=dataclasses.replace(b, mmlu_subset=0))


def _sha(obj: Any, n: int = 16) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


def model_key(cfg: DpoConfig) -> dict:
    device, dtype = eval_device_dtype(cfg)
    return {"model": cfg.model.name, "device": device, "dtype": dtype}


def base_cache_dir(cfg: DpoConfig, run_dir: Path) -> Path:
    """Beside the run folder, so the runs of one sweep (<sweep>/<run>) share it."""
    return Path(run_dir).resolve().parent / "battery-base" / _sha(model_key(cfg))


def request_cache_dir(cfg: DpoConfig, run_dir: Path) -> Path | None:
    """<sweep>/battery-base/lm-eval-requests: shared by both sides and every run of the sweep, as requests are
    text (the same for any model) and token ids are kept per tokenizer. None when off, or for hub data, whose
    content is not pinned. Not part of any record's key: the results are the same with or without it."""
    if not cfg.battery.lm_eval_request_cache or cfg.battery.source != "local":
        return None
    return Path(run_dir).resolve().parent / "battery-base" / "lm-eval-requests"

# ---------------------------------------------------------------------------------------------
# the two sides


@dataclass
class Side:
    """Where one side's part records live, and its generator (battery.generation_backend: the HF model, or a
    vLLM server), loaded on first need."""
    name: str                           # base | tuned
    folder: Path
    cfg: DpoConfig
    adapter: Path | None = None
    adapter_sha256: str | None = None
    request_cache: Path | None = None   # lm-eval parts: request_cache_dir
    _model: tuple | None = field(default=None, repr=False)
    _vllm: VllmGenerator | None = field(default=None, repr=False)

    def part_path(self, part: Part) -> Path:
        key = {**part.spec, **model_key(self.cfg), "adapter_sha256": self.adapter_sha256}
        return self.folder / f"{part.name}-{_sha(key, 12)}.json"

    def model(self) -> tuple:
        if self._model is None:
            self._model = load_model(self.cfg, self.adapter)
        return self._model

    def vllm(self) -> VllmGenerator:
        if self._vllm is None:
            self._vllm = vllm_generator(self)
        return self._vllm

    def engine(self) -> dict:
        """The record entry naming the vLLM server that generated ({} for hf, whose records predate it)."""
        record = self._vllm.engine_record() if self._vllm is not None else {}
        return {"engine": record} if record else {}

    def generate(self, conversations: list[Conversation], max_new_tokens: int, batch_size: int,
                 part: str) -> list[Generation]:
        """greedy_generate on the chosen backend; `part` names the battery part in a server's errors."""
        if self.cfg.battery.generation_backend == "vllm":
            return self.vllm().generate(conversations, max_new_tokens, batch_size,
                                        what=f"battery part {part}, {self.name} side")
        model, tokenizer = self.model()
        return greedy_generate(model, tokenizer, conversations, max_new_tokens, batch_size)

    def release(self) -> None:
        """Frees the generator: the HF model, or the vLLM server (stopped)."""
        self._model = None
        if self._vllm is not None:
            self._vllm.close()
            self._vllm = None


def load_model(cfg: DpoConfig, adapter: Path | None) -> tuple:
    """(model, tokenizer); with an adapter, base + LoRA merged (W + (alpha / r) B A, Hu et al. 2021)."""
    device, dtype = eval_device_dtype(cfg)
    model, tokenizer = load_causal_lm(cfg.model.name, dtype, device, cfg.model.cache_dir or None,
                                      cfg.model.trust_remote_code)
    if adapter is not None:
        from peft import PeftModel  # lazy: peft is optional (the tune extra)
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().eval()
    return model, tokenizer


def vllm_python() -> str:
    """The interpreter that starts the vLLM servers: $SCALELAB_VLLM_PYTHON (a venv of its own), else this one."""
    return os.environ.get("SCALELAB_VLLM_PYTHON") or sys.executable


def vllm_generator(side: Side) -> VllmGenerator:
    """The side's vLLM server (started on the first request): the base model folder, with the adapter on
    vLLM's LoRA path for the tuned side, and the tokenizer the HF path loads for the same model."""
    folder, (_, dtype) = model_folder(side.cfg), eval_device_dtype(side.cfg)
    trust = side.cfg.model.trust_remote_code
    share = side.cfg.battery.vllm_gpu_memory_utilization
    plan = ServerPlan(folder, side.folder / f"vllm-{side.name}-{os.getpid()}.log", side.adapter, dtype,
                      vllm_python(), trust_remote_code=trust,
                      extra_flags={"gpu-memory-utilization": share} if share else {})
    release_cuda_cache()
    return VllmGenerator(plan, load_tokenizer(str(folder), None, trust))


def release_cuda_cache() -> None:
    """Hands this process's cached CUDA blocks (lm-eval's model ran here) back to the driver: vLLM refuses to
    start when less than its share of the GPU is free."""
    import gc

    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def require_backend(sides: dict[str, Side], plans: dict[str, list[Part]]) -> None:
    """With generation_backend vllm: checked before any part runs (lm-eval parts can take hours), that the
    servers can start, when some generated part is still to be measured."""
    pending = [f"{s.name} {p.name}" for s in sides.values() for p in plans[s.name]
               if p.kind != "lm_eval" and s.cfg.battery.generation_backend == "vllm" and not is_stored(s.part_path(p))]
    if pending:
        require_vllm(vllm_python(), f"battery.generation_backend='vllm' (parts to measure: {', '.join(pending)})")


def model_folder(cfg: DpoConfig) -> Path:
    """A local HF folder of the base model for lm-eval: the cached GGUF conversion, the folder, or a hub snapshot."""
    where = materialize(cfg.model.name, cfg.model.cache_dir or None)
    if Path(where).is_dir():
        return Path(where)
    from huggingface_hub import snapshot_download  # lazy: the hub client only for hub ids
    return Path(snapshot_download(where, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt",
                                                         "*.tiktoken"]))


def adapter_sha256(adapter: Path) -> str:
    """Of the weights; where they are absent, the sha256 recorded when they were saved (dpo.export), so a run
    folder that travelled without its weights still finds its tuned records."""
    weights = adapter / WEIGHTS
    if weights.is_file():
        return sha256_file(weights)
    recorded = recorded_weights_sha(adapter)
    if recorded is None:
        raise FileNotFoundError(f"{weights}: no adapter weights; train the run first (scalelab dpo train)")
    return recorded


def require_weights(side: Side, part: Part) -> None:
    """A record that must be measured needs the weights its sha256 names, not only the name."""
    if side.adapter is not None and not (side.adapter / WEIGHTS).is_file():
        raise FileNotFoundError(
            f"{side.adapter / WEIGHTS}: absent, and the {side.name} side's {part.name} record for the weights of "
            f"sha256 {side.adapter_sha256} is not stored; retrain the run (scalelab dpo train) to measure it "
            "(records are keyed by the new weights' sha256)")

# ---------------------------------------------------------------------------------------------
# measuring one part on one side


def measure_lm_eval(part: Part, side: Side) -> dict:
    s, (device, dtype) = part.spec, eval_device_dtype(side.cfg)
    data_dir = s["data_dir"]
    if s.get("mmlu_subset"):
        data_dir = cached_subset(data_dir, s["mmlu_subset"], cache_root(side.cfg.model.cache_dir or None))
    r = run_lm_eval(model_folder(side.cfg), s["tasks"], source=s["source"], data_dir=data_dir,
                    limit=s["limit"] or None, batch_size=s["batch_size"], device=device, dtype=dtype,
                    num_fewshot=s.get("num_fewshot"), peft_path=side.adapter, log_samples=True,
                    request_cache=side.request_cache)
    scores = {}
    for task in s["tasks"]:
        # MMLU's samples come per subject (mmlu_anatomy, ...): one question = one paired example
        names = [k for k in r.samples if k == task or (task == "mmlu" and k.startswith("mmlu_"))]
        scores[task] = {"metric": "acc", "binary": task != "truthfulqa_mc2",
                        "values": {f"{k}/{x['doc_id']}": x["acc"] for k in sorted(names) for x in r.samples[k]}}
    tasks = {t.name: {"acc": t.metric("acc").value, "stderr": t.metric("acc").stderr, "n": t.n_examples,
                      "n_available": t.n_available, "num_fewshot": t.num_fewshot} for t in r.tasks}
    # the subset's row map travels with the record, so a full run can be restricted to it from the records alone
    subset = {"subset": read_json(Path(data_dir) / "mmlu" / SUBSET_RECORD)} if s.get("mmlu_subset") else {}
    return {"scores": scores, "lm_eval": tasks, "eval": result_dict(r), **subset}


def generation_examples(part: Part) -> list[tuple[Any, Any]]:
    """(task, example) for every task of the part, `n` examples of its split each."""
    s, out = part.spec, []
    for t in s["tasks"]:
        task = get_task(t["task"], **t["options"])
        examples = task.load(s["split"], limit=s["n"], seed=s["seed"])
        if not examples:
            raise ValueError(f"battery part {part.name}: task {t['task']!r} gave no {s['split']} examples")
        out += [(task, ex) for ex in examples]
    return out


STRICT_TASKS = ("gsm8k", "arithmetic")  # numeric gold answers, which mathtasks.strict_correct compares


def strict_of(example: Any, completion: str) -> bool | None:
    """The reference protocol's strict column (the answer only where the prompt asked for it: the last \\boxed{}
    or the '####' line) for numeric tasks whose prompt asks for such a marker; None for every other example."""
    if example.task not in STRICT_TASKS or example.meta.get("prompt_format") not in ASKED_MARKER:
        return None
    return strict_correct(example, completion)


def measure_generation(part: Part, side: Side) -> dict:
    """One greedy_generate over every example of the part; per example its score (and the strict reading where
    the prompt asked for an answer marker), length and limit flag."""
    s, pairs = part.spec, generation_examples(part)
    gens = side.generate([ex.prompt for _, ex in pairs], s["max_new_tokens"], s["batch_size"], part.name)
    rows = []
    for (task, ex), g in zip(pairs, gens):
        sc = task.score(ex, g.text)
        rows.append({"task": task.name, "id": ex.id, "correct": bool(sc.correct), "partial": sc.partial,
                     "strict": strict_of(ex, g.text), "n_tokens": g.n_tokens, "hit_limit": g.hit_limit,
                     "completion": g.text, "reason": sc.reason})
    scores = {}
    for t in s["tasks"]:
        mine = [r for r in rows if r["task"] == t["task"]]
        name = "target" if part.name == "target" else t["task"]
        scores[name] = {"metric": "correct", "binary": True, "task": t["task"], "split": s["split"],
                        "values": {r["id"]: float(r["correct"]) for r in mine}}
        if part.name == "target" and mine and all(r["strict"] is not None for r in mine):
            scores["target_strict"] = {"metric": "strict", "binary": True, "task": t["task"], "split": s["split"],
                                       "values": {r["id"]: float(r["strict"]) for r in mine}}
    return {"examples": rows, "scores": scores, **side.engine()}


def recording_generate(side: Side, max_new_tokens: int, batch_size: int, log: Path) -> Callable:
    """An MT-Bench GenerateFn on the side's generator that appends each reply's length to `log` (jsonl)."""

    def generate(conversations: list[list[dict]]) -> list[str]:
        gens = side.generate(conversations, max_new_tokens, batch_size, "mtbench")
        with open(log, "a") as f:
            for c, g in zip(conversations, gens):
                f.write(json.dumps({"conversation_sha": _sha(c), "n_tokens": g.n_tokens,
                                    "hit_limit": g.hit_limit}) + "\n")
        return [g.text for g in gens]
    return generate


def measure_mtbench(part: Part, side: Side) -> dict:
    s, b = part.spec, side.cfg.battery
    if s.get("judge_check"):
        check = read_check(s["judge_check"])
        if not check["capable"]:  # the judge could not tell GPT-4's answers from the base's: nothing to judge
            r = mtbench.not_measured(f"{check['status']}: {check['reason']}", s["judge_model"], {})
            return {"result": mtbench.result_dict(r), "lengths": [], "files": ""}
    out = side.folder / f"{side.part_path(part).stem}-files"
    out.mkdir(parents=True, exist_ok=True)
    log = out / "lengths.jsonl"
    judge = mtbench.JudgeConfig(url=s["judge_url"], model=s["judge_model"], api_key_env=b.judge_api_key_env)
    r = mtbench.run_mtbench(recording_generate(side, s["max_new_tokens"], s["batch_size"], log), s["data_dir"], judge,
                    limit=s["limit"] or None, out_dir=out)
    lengths = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    return {"result": mtbench.result_dict(r), "lengths": lengths, "files": str(out), **side.engine()}


MEASURE: dict[str, Callable[[Part, Side], dict]] = {
    "lm_eval": measure_lm_eval, "generation": measure_generation, "mtbench": measure_mtbench}


def part_lock(path: Path) -> contextlib.AbstractContextManager[float]:
    """Exclusive lock on one part record, held while it is measured, so battery processes running at once over
    one sweep (e.g. one per GPU) measure a shared base part once: the others wait, then reuse the record.
    Yields the seconds spent waiting. The lock files live in <folder>/.locks/."""
    return file_lock(path.parent / ".locks" / f"{path.stem}.lock")


def run_part(part: Part, side: Side, rd: RunDir) -> dict:
    """The part's record: reused when its file exists (same spec, model and adapter), else measured and saved."""
    path = side.part_path(part)
    with part_lock(path) as waited_s:
        if is_stored(path):  # plain, or gzipped in a committed folder
            record = read_json(path)
            rd.log_event("battery_part", side=side.name, part=part.name, reused=True, path=str(path),
                         waited_s=round(waited_s, 3))
            return record
        require_weights(side, part)
        if part.kind == "lm_eval":
            side.release()  # lm-eval loads its own copy of the model
        t0 = time.perf_counter()
        record = {"part": part.name, "kind": part.kind, "side": side.name, "spec": part.spec,
                  "model": model_key(side.cfg), "adapter_sha256": side.adapter_sha256,
                  **MEASURE[part.kind](part, side), "wall_s": time.perf_counter() - t0}
        write_json(path, record)
    rd.log_event("battery_part", side=side.name, part=part.name, reused=False, path=str(path),
                 wall_s=record["wall_s"])
    print(f"battery: {side.name:5s} {part.name:22s} {record['wall_s']:7.1f} s", flush=True)
    return record

# ---------------------------------------------------------------------------------------------
# the whole battery


SIDES = ("base", "tuned", "both")


def run_battery(cfg: DpoConfig, run_dir: str | Path, side: str = "both") -> dict | None:
    """Evaluate base and base + <run>/adapter on every planned part; write and return battery.json.

    side="base" measures only the base side (no adapter needed, so it can start while the runs still train);
    side="tuned" only base + adapter. Either returns None: battery.json needs both sides, which a later
    side="both" call assembles from the saved records (reusing them)."""
    if side not in SIDES:
        raise ValueError(f"battery side {side!r}; allowed: {', '.join(SIDES)}")
    run_dir = Path(run_dir)
    plans, rd = {"base": plan(base_config(cfg)), "tuned": plan(cfg)}, RunDir(run_dir)
    requests = request_cache_dir(cfg, run_dir)
    sides = {"base": Side("base", base_cache_dir(cfg, run_dir), base_config(cfg), request_cache=requests)}
    if side != "base":
        adapter = run_dir / "adapter"
        sides["tuned"] = Side("tuned", run_dir / "battery" / "tuned", cfg, adapter, adapter_sha256(adapter),
                              request_cache=requests)
    if side == "tuned":
        del sides["base"]
    require_backend(sides, plans)
    t0 = time.perf_counter()
    rd.log_event("battery_start", parts=[p.name for p in plans["tuned"]],
                 base_cache=str(base_cache_dir(cfg, run_dir)),
                 request_cache=None if requests is None else str(requests), side=side)
    records = {}
    # tuned first: when a base-only process runs beside this one, its records are likely ready by the time
    # this side is done (each part waits on the other's lock rather than measuring twice)
    for s in sorted(sides.values(), key=lambda s: s.name != "tuned"):
        s.folder.mkdir(parents=True, exist_ok=True)
        try:
            # lm-eval parts first: our generation model is loaded only after them, never beside lm-eval's copy
            for part in sorted(plans[s.name], key=lambda p: p.kind != "lm_eval"):
                records[(s.name, part.name)] = run_part(part, s, rd)
        finally:
            s.release()  # also on a failure: a vLLM server runs in its own session and outlives this process
    if side != "both":
        rd.log_event("battery_side_end", side=side, wall_s=time.perf_counter() - t0)
        return None
    battery = summarize(cfg, run_dir, plans, records, sides)
    write_json(run_dir / "battery" / "battery.json", battery)
    rd.log_event("battery_end", verdict=battery["evidence"]["verdict"], wall_s=time.perf_counter() - t0)
    return battery


def subset_of(cfg: DpoConfig, record: dict) -> dict | None:
    """The subset record (evals.mmlu_subset) of an MMLU part record that ran a subset, else None."""
    n = (record.get("spec") or {}).get("mmlu_subset")
    if not n:
        return None
    if "subset" in record:
        return record["subset"]
    # a record measured before the row map was kept: the subset is a function of the data, so rebuild it
    folder = cached_subset(record["spec"]["data_dir"], n, cache_root(cfg.model.cache_dir or None))
    return read_json(folder / "mmlu" / SUBSET_RECORD)


def paired_values(cfg: DpoConfig, part: Part, row: str, base: dict, tuned: dict) -> tuple[dict, dict, dict]:
    """(base values, tuned values, extra row fields) on the examples both sides are compared on."""
    bv, tv = base["scores"][row]["values"], tuned["scores"][row]["values"]
    if part.name != "mmlu":
        return bv, tv, {}
    p = pair_mmlu(bv, tv, subset_of(cfg, base), subset_of(cfg, tuned))
    return p.base, p.tuned, p.row_fields()


def summarize(cfg: DpoConfig, run_dir: Path, plans: dict[str, list[Part]], records: dict,
              sides: dict[str, Side]) -> dict:
    """battery.json from the part records of both sides (plans: side -> its parts, same names on both)."""
    b, parts = cfg.battery, plans["tuned"]
    comparisons: dict[str, dict] = {}
    for part in parts:
        base, tuned = records[("base", part.name)], records[("tuned", part.name)]
        for row, sc in base.get("scores", {}).items():
            if row not in tuned.get("scores", {}):  # a row added since the other side's record was measured
                continue
            bv, tv, extra = paired_values(cfg, part, row, base, tuned)
            comparisons[row] = {**stats.comparison_row(row, part.name, sc["metric"], bv, tv, sc["binary"],
                                                       b.bootstrap_resamples, b.seed),
                                **{k: sc[k] for k in ("task", "split") if k in sc}, **extra}
    mt = mtbench_block(records.get(("base", "mtbench")), records.get(("tuned", "mtbench")))
    by_name = {s: {p.name: p for p in plans[s]} for s in sides}
    out = {"version": BATTERY_VERSION, "run": run_dir.name, "base_model": cfg.model.name,
           "adapter_sha256": sides["tuned"].adapter_sha256, "base_cache": str(sides["base"].folder),
           "config": config_record(cfg), "target": dict(zip(("task", "options"), target_task(cfg))),
           "parts": {p.name: {s: str(sides[s].part_path(by_name[s][p.name])) for s in sides} for p in parts},
           "wall_s": {p.name: {s: records[(s, p.name)].get("wall_s") for s in sides} for p in parts},
           "comparisons": comparisons, "mtbench": mt, "mtbench_max_drop": b.mtbench_max_drop,
           "lengths": lengths_from_records(parts, records, mt["status"] == stats.MEASURED)}
    return {**out, "evidence": stats.evidence_block(out)}


def config_record(cfg: DpoConfig) -> dict:
    """battery.json's copy of the battery settings; generation_backend only when not hf, as backend_spec."""
    out = to_dict(cfg.battery)
    if cfg.battery.generation_backend == "hf":
        del out["generation_backend"]
    return out


def mtbench_block(base: dict | None, tuned: dict | None) -> dict:
    """MT-Bench base vs tuned; measured only when both sides were."""
    if base is None or tuned is None:
        return {"status": "not measured", "reason": "part not run (battery.parts)"}
    rb, rt = base["result"], tuned["result"]
    if rb["status"] != stats.MEASURED or rt["status"] != stats.MEASURED:
        why = rb["reason"] if rb["status"] != stats.MEASURED else f"tuned: {rt['reason']}"
        return {"status": "not measured", "reason": why, "judge_model": rb.get("judge_model", "")}
    return {"status": stats.MEASURED, "reason": "", "judge_model": rb["judge_model"],
            "n_questions": rb["n_questions"], "base_mean": rb["mean"], "tuned_mean": rt["mean"],
            "delta": rt["mean"] - rb["mean"], "base_turn1": rb["mean_turn1"], "tuned_turn1": rt["mean_turn1"],
            "base_turn2": rb["mean_turn2"], "tuned_turn2": rt["mean_turn2"],
            "base_per_category": rb["per_category"], "tuned_per_category": rt["per_category"],
            "n_parse_failed": {"base": rb["n_parse_failed"], "tuned": rt["n_parse_failed"]}}


def _by_source(part: Part, examples: list[dict]) -> dict[str, list[stats.LengthRecord]]:
    out: dict[str, list[stats.LengthRecord]] = {}
    for r in examples:
        source = "target" if part.name == "target" else r["task"]
        out.setdefault(source, []).append(stats.LengthRecord(r["n_tokens"], r["hit_limit"]))
    return out


def lengths_from_records(parts: list[Part], records: dict, mtbench_measured: bool) -> dict:
    """Generated-response lengths of own + target parts (and MT-Bench answers when it was measured)."""
    per: dict[str, dict[str, list]] = {"base": {}, "tuned": {}}
    paired: tuple[list[int], list[int]] = ([], [])
    for part in parts:
        if part.kind == "generation":
            for side in per:
                per[side] |= _by_source(part, records[(side, part.name)]["examples"])
            tuned = {(r["task"], r["id"]): r["n_tokens"] for r in records[("tuned", part.name)]["examples"]}
            for r in records[("base", part.name)]["examples"]:
                paired[0].append(r["n_tokens"])
                paired[1].append(tuned[(r["task"], r["id"])])
        elif part.kind == "mtbench" and mtbench_measured:
            for side in per:
                per[side]["mtbench"] = [stats.LengthRecord(r["n_tokens"], r["hit_limit"])
                                        for r in records[(side, part.name)]["lengths"]]
    return stats.lengths_block(per["base"], per["tuned"], paired)


def summary_line(battery: dict) -> str:
    """One line: target delta with CI, MMLU delta, length ratio, verdict."""
    rows, ratio = battery["comparisons"], (battery.get("lengths") or {}).get("ratio")
    parts = []
    if "target" in rows:
        t = rows["target"]
        parts.append(f"target {100 * t['delta']:+.1f} pts [{100 * t['ci_low']:+.1f}, {100 * t['ci_high']:+.1f}]")
    if "mmlu" in rows:
        parts.append(f"MMLU {100 * rows['mmlu']['delta']:+.1f} pts")
    if ratio is not None:
        parts.append(f"length x{ratio:.2f}")
    return ", ".join(parts + [f"evidence {battery['evidence']['verdict']}"])
