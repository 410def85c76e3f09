"""The whole `dpo train` lifecycle on a tiny model: verifier set -> predictions -> train -> margins -> results."""
from __future__ import annotations

import hashlib
import math

import pytest

from scalelab.core.rundir import RunDir
from scalelab.dpo.config import load_dpo_config
from scalelab.dpo.run import run_dpo
from scalelab.evals.tasks import Example, Score

pytestmark = pytest.mark.slow


class EvenLengthTask:
    """A stand-in verifier for a random model: a completion is 'correct' when its length is even."""
    name = "even"

    def load(self, split, source="", limit=None, seed=0):
        return [Example("even", f"{split}/{i}", [{"role": "user", "content": f"What is {i} + {i}?"}], "")
                for i in range(limit or 40)]

    def score(self, example, completion):
        return Score(len(completion) % 2 == 0, completion, "")


def test_tiny_run_folder(tiny_model_dir, tmp_path, monkeypatch):
    import scalelab.dpo.run as dpo_run
    monkeypatch.setattr(dpo_run, "get_task", lambda name, **kw: EvenLengthTask())
    cfg = load_dpo_config(None, [
        f"model.name='{tiny_model_dir}'", "model.device='cpu'", f"run.out_dir='{tmp_path}'", "run.name='r'",
        "verifier.task='even'", "verifier.num_prompts=24", "verifier.samples_per_prompt=4",
        "verifier.max_new_tokens=6", "verifier.batch_prompts=12", "data.val_fraction=0.25",
        "train.max_steps=4", "train.batch_size=2", "train.learning_rate=1e-2", "train.max_length=64",
        "lora.rank=4", "margins.every_steps=2", "margins.eval_pairs=6"])
    results = run_dpo(cfg)
    rd = RunDir(tmp_path / "r")

    vset = next(rd.events("verifier_set"))
    assert vset["n_prompts"] == 24 and vset["n_pairs"] > 8 and vset["prompts_informative"] > 4
    data = next(rd.events("data"))
    assert data["n_train"] + data["n_val"] == vset["n_pairs"] and data["n_val"] > 0

    # predictions exist, hashed, before the first optimizer step
    digest = hashlib.sha256((rd.path / "predictions.json").read_bytes()).hexdigest()
    assert next(rd.events("predictions_written"))["sha256"] == digest
    assert rd.read("predictions.json")["written_unix"] < next(rd.events("step"))["time_unix"]
    assert rd.read("predictions.json")["initial_loss"] == pytest.approx(math.log(2))

    margins = list(rd.events("margins"))
    assert [m["step"] for m in margins] == [0, 2, 4]
    assert margins[0]["margin_mean"] == pytest.approx(0.0, abs=1e-6)  # adapter B = 0: policy == reference
    assert margins[-1]["drift_abs_logratio_chosen_nats"] > 0
    assert all(sum(m["hist_counts"]) == m["n_pairs"] == min(6, data["n_val"]) for m in margins)
    assert (rd.path / "figures" / "margins.png").stat().st_size > 1000
    weights = rd.path / "adapter" / "adapter_model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()  # recorded, so the folder names them without them
    assert (rd.path / "adapter" / "adapter_model.safetensors.sha256").read_text() == digest + "\n"
    assert next(rd.events("train_end"))["adapter_sha256"] == digest
    assert (rd.path / "preferences.manifest.json").is_file()

    assert results == rd.read("results.json") | {"predictions": results["predictions"]}
    assert results["steps"] == 4 and results["loss_first"] == pytest.approx(math.log(2), abs=1e-4)
    assert results["heldout_reward_accuracy_last"] == margins[-1]["reward_accuracy"]


@pytest.mark.parametrize("second_start, expected_first_loss", [(None, 0.6), ("ckpt/checkpoint-2", 0.7)])
def test_results_use_events_since_the_last_fresh_start(tmp_path, second_start, expected_first_loss):
    from scalelab.dpo.run import results_from_run
    rd = RunDir(tmp_path)
    rd.path.mkdir(exist_ok=True)
    for resume_from, losses in [(None, [0.7, 0.65]), (second_start, [0.6, 0.5])]:
        rd.log_event("train_start", resume_from=resume_from)
        for i, loss in enumerate(losses):
            rd.log_event("step", step=i + 1, step_s=1.0 + i, peak_memory_gib=1.0)
            rd.log_event("train", step=i + 1, loss=loss)
    r = results_from_run(tmp_path)
    assert (r["loss_first"], r["loss_last"]) == (expected_first_loss, 0.5)


def test_resume_on_changed_data_is_an_error(tmp_path):
    from scalelab.dpo.run import check_same_data
    rd = RunDir(tmp_path)
    rd.log_event("data", sha256="aaa")
    rd.log_event("train_start", resume_from=None)
    rd.log_event("data", sha256="aaa")  # a relaunch logs the data it found, then resumes
    rd.log_event("train_start", resume_from="checkpoints/checkpoint-2")
    check_same_data(rd, {"sha256": "aaa"})
    with pytest.raises(ValueError, match="preference data changed since the run started"):
        check_same_data(rd, {"sha256": "bbb"})
