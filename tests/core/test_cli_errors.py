"""The CLI's error contract, tried as a new user meets it: a truncated shard and a missing model folder end in
one line naming the file on stderr and exit status 2; `--debug` gives the traceback instead."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scalelab.cli import main
from scalelab.core.config import ConfigError
from scalelab.core.errors import DataError, ModelError, ScalelabError
from scalelab.core.hfmodel import ModelNotFoundError
from scalelab.pretrain.shards import ShardError, write_shard

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def truncated_data(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "data"
    d.mkdir()
    write_shard(d / "train_000000.bin", np.arange(5000) % 300)
    write_shard(d / "val_000000.bin", np.arange(2000) % 300)
    (d / "manifest.json").write_text(json.dumps({"source": "test"}))
    shard = d / "train_000000.bin"
    shard.write_bytes(shard.read_bytes()[:-100])  # 50 tokens short of what the header says
    return shard


def pretrain_args(shard: Path) -> list[str]:
    return ["pretrain", "train", "--config", str(REPO / "configs/pretrain/tiny-cpu.toml"),
            "--set", f"data.dir={shard.parent}", "--set", f"run.out_dir={shard.parent.parent / 'runs'}",
            "--set", "train.max_steps=2", "--set", "data.val_tokens=1024"]


def dpo_args(tmp_path: Path) -> list[str]:
    return ["dpo", "train", "--config", str(REPO / "configs/dpo/tiny-cpu.toml"),
            "--set", "model.name=/nonexistent/model-folder", "--set", f"run.out_dir={tmp_path / 'runs'}"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err
    assert len(lines) == 1, err
    return lines[0]


def test_a_truncated_shard_is_one_line_naming_the_file(truncated_data, capsys):
    assert main(pretrain_args(truncated_data)) == 2
    line = one_error_line(capsys)
    assert line.startswith("scalelab: data error: ") and str(truncated_data) in line
    assert "10924 bytes" in line  # 256 x 4 header bytes + 4950 x 2 token bytes left after the cut


def test_a_missing_model_folder_is_one_line_naming_the_path(tmp_path, capsys):
    assert main(dpo_args(tmp_path)) == 2
    line = one_error_line(capsys)
    assert line.startswith("scalelab: model error: ") and "/nonexistent/model-folder" in line


def test_debug_gives_the_traceback(truncated_data, tmp_path):
    with pytest.raises(ShardError, match="truncated or corrupt"):
        main(["--debug", *pretrain_args(truncated_data)])
    with pytest.raises(ModelNotFoundError, match="/nonexistent/model-folder"):
        main(["--debug", *dpo_args(tmp_path)])


def test_config_errors_keep_their_line_and_their_builtin_base(tmp_path, capsys):
    assert main(["dpo", "train", "--config", str(REPO / "configs/dpo/tiny-cpu.toml"),
                 "--set", "optim.no_such_field=1", "--set", f"run.out_dir={tmp_path}"]) == 2
    assert one_error_line(capsys).startswith("scalelab: config error: ")
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, ScalelabError)
    assert issubclass(ShardError, DataError) and issubclass(ShardError, ValueError)
    assert issubclass(ModelNotFoundError, ModelError) and issubclass(ModelNotFoundError, FileNotFoundError)


def test_other_exceptions_are_bugs_and_keep_their_traceback(monkeypatch):
    import scalelab.dpo.commands as commands

    def broken(args):
        raise KeyError("a bug")
    monkeypatch.setattr(commands, "_train", broken)
    with pytest.raises(KeyError):
        main(["dpo", "train", "--config", str(REPO / "configs/dpo/tiny-cpu.toml")])
