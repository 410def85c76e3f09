"""`scalelab pretrain train`: the run-folder lifecycle around the single-file trainer.

config.toml -> provenance.json -> predictions.json (hash logged, before step 0) -> train (in-process for
one process, torchrun for several) -> results.json -> REPORT.md + figures. Metric sinks mirror metrics.jsonl.
"""
from __future__ import annotations

import os
import subprocess
import sys

from scalelab.core.config import to_dict
from scalelab.core.rundir import RunDir
from scalelab.core.tracking import mirrored_metrics
from scalelab.pretrain import train_gpt
from scalelab.pretrain.config import PretrainConfig
from scalelab.pretrain.predict import write_predictions
from scalelab.pretrain.report import build_report, results_from_run
from scalelab.pretrain.shards import manifest_hash
from scalelab.pretrain.train_gpt import train


def prepare_run_dir(cfg: PretrainConfig, nproc: int) -> RunDir:
    """Write config, provenance and (once per run, never overwritten on resume) the predictions."""
    rd = RunDir(cfg.run_dir).create(cfg)
    data_sha = manifest_hash(cfg.data.dir)
    if not (rd.path / "provenance.json").is_file():
        rd.write_provenance({"data_dir": cfg.data.dir, "data_manifest_sha256": data_sha, "nproc": nproc})
    else:
        rd.log_event("relaunch", data_manifest_sha256=data_sha, nproc=nproc)
    if not (rd.path / "predictions.json").is_file():
        write_predictions(cfg, rd.path, world_size=nproc, hardware_key=cfg.run.gpu)
    return rd


def _torchrun(rd: RunDir, nproc: int) -> None:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           train_gpt.__file__, "--config", str(rd.config_path)]
    proc = subprocess.run(cmd, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited with {proc.returncode}; see {rd.metrics_path} and the log above")


def run_training(cfg: PretrainConfig, nproc: int = 1) -> dict:
    """Train (or resume) the run described by cfg; return results.json's content."""
    rd = prepare_run_dir(cfg, nproc)
    with mirrored_metrics(cfg.run.trackers, rd.path, rd.metrics_path, "scalelab-pretrain", cfg.run.name,
                          to_dict(cfg)):
        if nproc == 1:
            train(cfg)
        else:
            _torchrun(rd, nproc)
    results = results_from_run(rd.path)
    rd.write_results(results)
    report = build_report(rd.path)
    print(f"run folder: {rd.path}\nreport:     {report}")
    return results
