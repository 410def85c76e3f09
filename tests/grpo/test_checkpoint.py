"""The checkpoint holds data, never code: JSON for the state, a weights-only tensor file for the tensors."""
from __future__ import annotations

import json
import math

import pytest
import torch

from scalelab.grpo.checkpoint import (CHECKPOINT, CheckpointError, find_checkpoint, load_checkpoint, load_state,
                                      save_checkpoint)
from scalelab.grpo.types import RolloutBatch
from scalelab.grpo.staleness import StalenessPipeline


def trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    model[1].bias.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1, betas=(0.9, 0.95))
    for _ in range(2):
        model(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def queued() -> StalenessPipeline:
    pipe = StalenessPipeline(1)
    # -0.1 + -0.2 is not -0.3 in binary floats: the JSON round trip must keep every bit
    pipe.put(3, RolloutBatch(((1, 2),), ((3, 4),), ("ab",), ((-0.1 + -0.2, -math.pi),), (True,), 12.5, 2, "hf"))
    pipe.taken = [(0, 0), (1, 0), (2, 1)]
    return pipe


def test_a_checkpoint_round_trips_weights_optimizer_and_queue_exactly(tmp_path):
    model, opt = trained()
    path = tmp_path / CHECKPOINT
    save_checkpoint(path, model, opt, 3, queued(), "cfg-hash", {"plans": {3: [0, [5, 1]]}, "world_size": 2})
    fresh, fresh_opt = trained(seed=1)  # other weights, other moments
    pipe = StalenessPipeline(1)
    step, cfg_hash, loop = load_checkpoint(path, fresh, fresh_opt, pipe)
    assert (step, cfg_hash, loop) == (3, "cfg-hash", {"plans": {3: [0, [5, 1]]}, "world_size": 2})
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        if a.requires_grad:
            assert torch.equal(a, b), name
    assert not torch.equal(model[1].bias, fresh[1].bias)  # frozen: not in the checkpoint
    want, got = opt.state_dict(), fresh_opt.state_dict()
    assert sorted(got["state"]) == sorted(want["state"]) == [0, 1, 2]  # int keys, as the optimizer maps them
    for k in want["state"]:
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(want["state"][k][field], got["state"][k][field])
    assert got["param_groups"][0]["betas"] == (0.9, 0.95)
    assert pipe.pending[3] == queued().pending[3] and pipe.taken == [(0, 0), (1, 0), (2, 1)]
    assert pipe.pending[3].logprobs[0][0] == -0.1 + -0.2


def test_a_new_checkpoint_replaces_the_old_tensor_file(tmp_path):
    model, opt = trained()
    path = tmp_path / CHECKPOINT
    save_checkpoint(path, model, opt, 2, StalenessPipeline(0), "h")
    save_checkpoint(path, model, opt, 4, StalenessPipeline(0), "h")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4.pt", CHECKPOINT]
    assert json.loads(path.read_text())["tensors"] == "checkpoint-4.pt"
    assert load_state(path)["next_step"] == 4


class WritesAMarker:
    """What a hostile checkpoint would hold: unpickling it calls `exec`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('code ran')",)


def test_a_tensor_file_that_would_run_code_is_refused(tmp_path):
    control = tmp_path / "control"
    torch.save({"t0": WritesAMarker(control)}, tmp_path / "control.pt")
    torch.load(tmp_path / "control.pt", weights_only=False)  # the payload is real: a plain unpickle runs it
    assert control.read_text() == "code ran"

    marker = tmp_path / "marker"
    evil = tmp_path / "checkpoint-3.pt"
    torch.save({"t0": WritesAMarker(marker)}, evil)
    (tmp_path / CHECKPOINT).write_text(json.dumps({"format": 2, "tensors": evil.name,
                                                   "state": {"next_step": 3, "w": {"__tensor__": "t0"}}}))
    with pytest.raises(CheckpointError, match=rf"{evil}: refused, not a plain tensor file"):
        load_state(tmp_path / CHECKPOINT)
    assert not marker.exists()


def test_the_tensor_file_is_looked_up_beside_the_json_only(tmp_path):
    outside = tmp_path / "elsewhere.pt"
    torch.save({"t0": torch.ones(1)}, outside)
    run = tmp_path / "run"
    run.mkdir()
    (run / CHECKPOINT).write_text(json.dumps({"format": 2, "tensors": "../elsewhere.pt", "state": {}}))
    with pytest.raises(CheckpointError, match=rf"{run / 'elsewhere.pt'}: not found"):
        load_state(run / CHECKPOINT)


def test_an_old_pickled_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    assert find_checkpoint(tmp_path) is None
    (tmp_path / "checkpoint.pt").write_bytes(b"old")
    with pytest.raises(CheckpointError, match=rf"{tmp_path / 'checkpoint.pt'}: a pickled checkpoint"):
        find_checkpoint(tmp_path)
