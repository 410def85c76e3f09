"""The battery's multiple-choice half: each task one lm-eval run (scalelab.evals.harness, the local copies of the
data), its result and per-item log-likelihoods kept, its metrics as a summary whose rows carry both lm-eval's
standard error and a 95% interval."""
from __future__ import annotations

from pathlib import Path

from scalelab.core import provenance
from scalelab.evals import harness
from scalelab.evals.battery_records import BatteryFolder, McMetric, McSummary, write_jsonl_gz

# TruthfulQA MC2 scores an item by the normalized probability mass on its true answers (Lin et al. 2022): a mean
# of values in [0, 1], not a share of items right, so its interval is the normal one around the mean.
MEAN_OF_PROBABILITIES = frozenset({"truthfulqa_mc2"})


def device_and_dtype(device: str = "auto", dtype: str = "auto") -> tuple[str, str]:
    """auto: the GPU in bfloat16 (the dtype the reference models are published in) when there is one, else the CPU
    in float32 (bfloat16 matmuls are slow on most CPUs)."""
    if device == "auto":
        import torch  # lazy: torch takes seconds to import, and the CLI's parser is built without it
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    return device, dtype


def mc_summary(result: harness.EvalResult, task: str, settings: dict, sha: str) -> McSummary:
    t = result.task(task)
    return McSummary(task=t.name, n=t.n_examples, num_fewshot=t.num_fewshot,
                     metrics=tuple(McMetric(m.name, m.value, m.stderr) for m in t.metrics), wall_s=result.wall_s,
                     lm_eval_version=result.lm_eval_version, settings=settings, settings_sha256=sha,
                     mean_of_probabilities=task in MEAN_OF_PROBABILITIES)


def save_lm_eval(folder: BatteryFolder, task: str, result: harness.EvalResult) -> None:
    prov = provenance.collect()
    harness.write_eval_json(result, folder.lm_eval(task), {"git_sha": prov["git_sha"], "command": prov["command"]})
    write_jsonl_gz(folder.lm_eval_samples(task),
                   ({"task": name, **item} for name, items in result.samples.items() for item in items))


def run_mc_task(folder: BatteryFolder, task: str, model_folder: str, data_dir: Path, limit: int | None,
                batch_size: int | str, device: str, dtype: str, settings: dict, sha: str) -> McSummary:
    result = harness.run_lm_eval(model_folder, [task], source="local", data_dir=data_dir, limit=limit,
                                 batch_size=batch_size, device=device, dtype=dtype, log_samples=True)
    save_lm_eval(folder, task, result)
    return mc_summary(result, task, settings, sha)
