"""`scalelab dpo train`: the run-folder lifecycle around TRL.

config.toml -> provenance.json -> preference data (loaded, or sampled and graded for the verifier set)
-> predictions.json (hash logged, before step 0) -> train with margin tracking -> adapter/ (safetensors)
-> figures/margins.png -> results.json -> regression battery (when battery.enabled) -> REPORT.md.
Metric sinks mirror metrics.jsonl.
"""
from __future__ import annotations

import copy
import hashlib
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from scalelab.core.config import config_from_dict, to_dict
from scalelab.core.hfmodel import load_causal_lm, sha256_file
from scalelab.core.jsonio import read_bytes, read_json, stored, write_json
from scalelab.core.provenance import folder_provenance
from scalelab.core.rundir import RunDir
from scalelab.core.tracking import mirrored_metrics
from scalelab.dpo import sweep_report
from scalelab.dpo.battery import run_battery, summary_line
from scalelab.dpo.config import DpoConfig
from scalelab.dpo.data import PreferencePair, load_pairs, skip_reasons, split_by_hash, split_by_prompt, subsample
from scalelab.dpo.export import WEIGHTS, push_folder, write_base_record, write_weights_sha
from scalelab.dpo.predict import ModelShape, predict, write_predictions
from scalelab.dpo.report import write_run_report
from scalelab.dpo.runfiles import results_from_run, this_training
from scalelab.dpo.samplers import HFSampler, Sampler, server_sampler
from scalelab.dpo.sweep_plan import PlannedRun, planned_runs
from scalelab.dpo.verifier_pairs import (build_verifier_set, manifest_key, manifest_path, reusable, sample_log_for,
                                         write_verifier_set)
from scalelab.evals.tasks import get_task

# ---------------------------------------------------------------------------------------------
# data


@dataclass(frozen=True)
class PreparedData:
    train: list[PreferencePair]
    val: list[PreferencePair]
    info: dict = field(default_factory=dict)   # source, path, rows read, skipped, sha256, verifier summary


def _print_sampling(done: int, total: int) -> None:
    print(f"sampling: {done}/{total} prompts", flush=True)


def make_sampler(cfg: DpoConfig, load_model: Callable[[], tuple]) -> Sampler:
    """HF generate on the loaded model, or the vLLM server at verifier.sampler_url."""
    model, tokenizer = load_model()
    v = cfg.verifier
    if not v.sampler_url:
        return HFSampler(model, tokenizer)
    return server_sampler(v.sampler_url, v.sampler_model or cfg.model.name, model, tokenizer)


def verifier_jsonl(cfg: DpoConfig, rd: RunDir, load_model: Callable[[], tuple]) -> tuple[Path, dict]:
    """The verifier-built set for this config: reused when its manifest matches, else sampled (resuming from the
    side file of a build cut short: dpo.sample_log) and written."""
    path = Path(cfg.data.path) if cfg.data.path else rd.path / "preferences.jsonl"
    key = manifest_key(cfg.model.name, cfg.verifier)
    if not (cfg.verifier.reuse and reusable(path, key)):
        task = get_task(cfg.verifier.task, **cfg.verifier.task_options)
        pairs, summary = build_verifier_set(make_sampler(cfg, load_model), task, cfg.verifier,
                                            on_batch=_print_sampling, log=sample_log_for(path, key))
        write_verifier_set(path, pairs, summary, key)
        rd.log_event("verifier_set", path=str(path), **asdict(summary))
    manifest = read_json(manifest_path(path))
    digest = hashlib.sha256(read_bytes(path)).hexdigest()  # of the plain content, also once it is gzipped
    return stored(path) or path, {"verifier": manifest["summary"], "sha256": digest}


def prepare_data(cfg: DpoConfig, rd: RunDir, load_model: Callable[[], tuple]) -> PreparedData:
    d, info = cfg.data, {"source": cfg.data.source}
    if d.source == "verifier":
        path, extra = verifier_jsonl(cfg, rd, load_model)
        loaded, info = load_pairs("pairs", str(path), strict=d.strict), {**info, "path": str(path), **extra}
    else:
        loaded = load_pairs(d.source, d.path, d.split, d.subset, strict=d.strict)
        info["path"] = d.path or "(hub default)"
        if d.path and Path(d.path).is_file():
            info["sha256"] = sha256_file(d.path)
    if not loaded.pairs:
        raise ValueError(f"no preference pairs from source {d.source!r} ({info['path']})")
    pairs = subsample(loaded.pairs, d.max_pairs, d.seed)
    train, val = (split_by_hash(pairs, d.val_fraction) if d.val_split == "hash"
                  else split_by_prompt(pairs, d.val_fraction, d.seed))
    info |= {"rows_read": loaded.rows_read, "skipped": loaded.n_skipped, "skipped_first": loaded.skipped[:5],
             "skipped_by_reason": skip_reasons(loaded.skipped), "n_pairs": len(pairs), "n_train": len(train),
             "n_val": len(val), "val_split": d.val_split}
    return PreparedData(train, val, info)


# ---------------------------------------------------------------------------------------------
# model facts for the predictions


def model_shape(model, cfg: DpoConfig):
    import torch  # lazy: torch takes seconds to import, and this module is used without it
    targets = set(cfg.lora.target_modules)
    lora = sum(cfg.lora.rank * (m.in_features + m.out_features) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets)
    from scalelab.dpo.train import memory_in_use_bytes  # lazy: imports transformers' Trainer stack (peft with it)
    p = next(model.parameters())
    if p.device.type == "cpu":  # safetensors are memory-mapped: page the weights in so the RSS counts them
        with torch.no_grad():
            for q in model.parameters():
                q.sum()
    text = model.config.get_text_config()
    return ModelShape(sum(q.numel() for q in model.parameters()), lora, text.hidden_size,
                      text.num_hidden_layers, p.element_size(), memory_in_use_bytes(p.device.type))


def mean_sequence_tokens(tokenizer, pairs: list[PreferencePair], max_length: int, sample: int = 64) -> float:
    from scalelab.dpo.margins import tokenize_pair  # lazy: imports transformers' Trainer stack (peft with it)
    lengths = []
    for p in pairs[:sample]:
        t = tokenize_pair(tokenizer, p.to_trl())
        lengths += [min(len(t.prompt_ids) + len(t.chosen_ids), max_length),
                    min(len(t.prompt_ids) + len(t.rejected_ids), max_length)]
    return float(statistics.fmean(lengths)) if lengths else float(max_length)


# ---------------------------------------------------------------------------------------------
# the run


def prepare_run_dir(cfg: DpoConfig) -> RunDir:
    rd = RunDir(cfg.run_dir).create(cfg)
    if not (rd.path / "provenance.json").is_file():
        rd.write_provenance({"model": cfg.model.name, "loss": cfg.train.loss})
    else:
        rd.log_event("relaunch")
    return rd


def _predict(cfg: DpoConfig, rd: RunDir, model, tokenizer, data: PreparedData, resuming: bool) -> None:
    from scalelab.dpo.train import LOSSES  # lazy: imports transformers' Trainer stack (peft with it)
    if resuming and (rd.path / "predictions.json").is_file():  # a resumed run keeps its original predictions
        return
    seq = mean_sequence_tokens(tokenizer, data.train, cfg.train.max_length)
    device = next(model.parameters()).device.type
    write_predictions(rd, predict(cfg, model_shape(model, cfg), seq, len(data.train), device,
                                  LOSSES[cfg.train.loss].uses_reference))


def _callbacks(cfg: DpoConfig, rd: RunDir, model, tokenizer, data: PreparedData) -> list:
    from scalelab.dpo.margins import MarginCallback  # lazy: imports transformers' Trainer stack (peft with it)
    from scalelab.dpo.train import RunLogCallback
    eval_pairs = (data.val or data.train)[:cfg.margins.eval_pairs]
    rd.log_event("margins_subset", split="val" if data.val else "train", n_pairs=len(eval_pairs))
    margins = MarginCallback([p.to_trl() for p in eval_pairs], tokenizer, cfg.train.beta, rd.log_event,
                             cfg.margins.every_steps, cfg.margins.bins, cfg.margins.batch_pairs, cfg.train.max_length)
    return [RunLogCallback(rd, next(model.parameters()).device.type), margins]


def check_same_data(rd: RunDir, info: dict) -> None:
    """Resuming on other data than the run started with is an error."""
    before = [e.get("sha256") for e in this_training(rd, "data", include_start_data=True)]
    if before and before[0] != info.get("sha256"):
        raise ValueError(f"{rd.path}: preference data changed since the run started (sha256 {before[0]} -> "
                         f"{info.get('sha256')}); start a new run (another run.name) or set train.resume = false")


def train_run(cfg: DpoConfig, rd: RunDir) -> dict:
    from scalelab.dpo.margins import plot_margins  # lazy: imports transformers' Trainer stack (peft with it)
    from scalelab.dpo.train import TrainerInputs, build_trainer, resume_point, save_adapter, train
    t0 = time.perf_counter()
    model, tokenizer = load_causal_lm(cfg.model.name, cfg.model.dtype, cfg.model.device,
                                      cfg.model.cache_dir or None, cfg.model.trust_remote_code)
    data = prepare_data(cfg, rd, lambda: (model, tokenizer))
    rd.log_event("data", **data.info)
    checkpoint = resume_point(rd.path / "checkpoints", cfg.train.resume)
    if checkpoint:
        check_same_data(rd, data.info)
    _predict(cfg, rd, model, tokenizer, data, resuming=checkpoint is not None)
    rd.log_event("train_start", setup_s=time.perf_counter() - t0, resume_from=checkpoint)
    inputs = TrainerInputs(model, tokenizer, [p.to_trl() for p in data.train], cfg, rd.path / "checkpoints",
                           tuple(_callbacks(cfg, rd, model, tokenizer, data)))
    trainer = build_trainer(inputs)
    train(trainer, checkpoint)
    adapter_bytes = save_adapter(trainer, rd.path / "adapter")
    write_base_record(rd.path / "adapter", cfg.model.name)
    digest = write_weights_sha(rd.path / "adapter")
    rd.log_event("train_end", wall_s=time.perf_counter() - t0, adapter_bytes=adapter_bytes, adapter_sha256=digest)
    plot_margins(this_training(rd, "margins"), rd.figures / "margins.png")
    if cfg.hub.push:
        pushed = push_folder(rd.path / "adapter", cfg.hub.repo_id, cfg.hub.private, cfg.hub.endpoint)
        rd.log_event("hub_push", repo_id=pushed.repo_id, url=pushed.url)
    return {"trainer": trainer, "data": data}


def run_dpo(cfg: DpoConfig) -> dict:
    """Train (or resume) the run described by cfg; return results.json's content."""
    rd = prepare_run_dir(cfg)
    with mirrored_metrics(cfg.run.trackers, rd.path, rd.metrics_path, "scalelab-dpo", cfg.run.name, to_dict(cfg)):
        train_run(cfg, rd)
    results = results_from_run(rd.path)
    rd.write_results(results)
    print(format_results(results))
    finish_run(cfg, rd)
    return results


def finish_run(cfg: DpoConfig, rd: RunDir) -> None:
    """The regression battery when enabled (dpo.battery), then REPORT.md from the folder."""
    if cfg.battery.enabled:
        print(f"battery: {summary_line(run_battery(cfg, rd.path))}")
    print(f"report: {write_run_report(rd.path)}")


# ---------------------------------------------------------------------------------------------
# results (from the run folder alone)


def format_results(r: dict) -> str:
    p = r.get("predictions") or {}
    fmt = lambda v, f="{:.3f}": "-" if v is None else f.format(v)  # noqa: E731
    return "\n".join([
        f"loss              {fmt(r['loss_first'])} -> {fmt(r['loss_last'])}   (predicted start "
        f"{fmt(p.get('initial_loss'))})",
        f"held-out reward accuracy {fmt(r['heldout_reward_accuracy_first'])} -> "
        f"{fmt(r['heldout_reward_accuracy_last'])}   (predicted {fmt(p.get('heldout_reward_accuracy'))})",
        f"held-out margin   {fmt(r['heldout_margin_mean_first'])} -> {fmt(r['heldout_margin_mean_last'])}",
        f"step time         {fmt(r['step_s_median'], '{:.2f}')} s median   (predicted "
        f"{fmt(p.get('step_s'), '{:.2f}')})",
        f"peak memory       {fmt(r['peak_memory_gib'], '{:.2f}')} GiB   (predicted "
        f"{fmt(p.get('peak_memory_gib'), '{:.2f}')})",
        f"wall              {fmt(r['wall_s'], '{:.0f}')} s, {r['steps']} steps, adapter "
        f"{fmt(r['adapter_bytes'] and r['adapter_bytes'] / 2**20, '{:.1f}')} MiB"])


# ---------------------------------------------------------------------------------------------
# sweeps: one run per (loss, beta), sharing one preference set


def _sweep_config(cfg: DpoConfig, planned: PlannedRun, sweep_name: str) -> DpoConfig:
    root = Path(cfg.run.out_dir) / sweep_name
    d = copy.deepcopy(to_dict(cfg))
    d["train"] |= {"loss": planned.loss, "beta": planned.beta, "learning_rate": planned.learning_rate}
    d["run"] |= {"out_dir": str(root), "name": planned.name}
    if cfg.data.source == "verifier" and not cfg.data.path:
        d["data"]["path"] = str(root / "preferences.jsonl")
    return config_from_dict(DpoConfig, d, origin=f"sweep {sweep_name}")


def sweep_configs(cfg: DpoConfig, betas: list[float], losses: list[str], sweep_name: str) -> list[DpoConfig]:
    """Configs of a sweep under <out_dir>/<sweep_name>/<loss>-beta<beta>; a verifier set is built once."""
    return [_sweep_config(cfg, PlannedRun(loss, beta, cfg.train.learning_rate), sweep_name)
            for loss in losses for beta in betas]


def planned_configs(cfg: DpoConfig, sweep_name: str) -> list[DpoConfig]:
    """The configs of cfg's [sweep] table (dpo.sweep_plan): each loss at its own parameters and lr."""
    return [_sweep_config(cfg, planned, sweep_name) for planned in planned_runs(cfg)]


def trained(run_dir: Path) -> bool:
    """A run whose training ended and whose results were written."""
    return (run_dir / "results.json").is_file() and (run_dir / "adapter" / WEIGHTS).is_file()


def run_sweep(cfg: DpoConfig, betas: list[float], losses: list[str], sweep_name: str,
              skip_trained: bool = False) -> list[dict]:
    """One run per (loss, beta) of the lists, in turn (run_configs)."""
    return run_configs(cfg, sweep_configs(cfg, betas, losses, sweep_name), sweep_name, skip_trained)


def run_configs(cfg: DpoConfig, configs: list[DpoConfig], sweep_name: str, skip_trained: bool = False) -> list[dict]:
    """Run every config of the sweep in turn; <sweep>/sweep.json keeps one summary row per run, so a later
    invocation into the same folder (say IPO and ORPO after the DPO betas) adds its rows beside the earlier ones.
    skip_trained: a run that already finished (results.json and adapter) keeps its results and is not retrained.
    Then the sweep's REPORT.md and selection.json (dpo.sweep_report: the run the [selection] rule chooses)."""
    sweep = Path(cfg.run.out_dir) / sweep_name
    index = sweep / "sweep.json"
    earlier = read_json(index)["runs"] if index.is_file() else []
    rows = []
    for c in configs:
        done = skip_trained and trained(c.run_dir)
        r = read_json(c.run_dir / "results.json") if done else run_dpo(c)
        if done:
            print(f"{c.run.name}: trained, skipped")
        rows.append({"run": c.run.name, "loss": c.train.loss, "beta": c.train.beta,
                     "provenance": folder_provenance(c.run_dir),
                     **{k: v for k, v in r.items() if k != "predictions"}})
        names = {row["run"] for row in rows}
        write_json(index, {"runs": [row for row in earlier if row["run"] not in names] + rows})
    print(f"sweep report: {sweep_report.write_sweep_report(sweep)}")
    return rows
