"""Typed config loading: defaults, TOML, --set overrides, and errors that name the field and what is allowed."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from scalelab.core.config import (ConfigError, config_hash, dump_toml, format_description, load_config, param,
                                   parse_override, section)
from scalelab.pretrain.config import PretrainConfig, load_pretrain_config


def test_defaults_then_file_then_overrides(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[model]\nn_layer = 6\nn_embd = 192\n[optim]\nlr = 2e-4\n[run]\ntrackers = ["tensorboard"]\n')
    cfg = load_pretrain_config(f, ["model.n_layer=8", "schedule.kind=wsd", "run.name=abc"])
    assert cfg.model.n_layer == 8          # --set beats the file
    assert cfg.model.n_embd == 192         # file beats the default
    assert cfg.model.n_head == 4           # default
    assert cfg.optim.lr == 2e-4 and cfg.schedule.kind == "wsd" and cfg.run.name == "abc"
    assert cfg.run.trackers == ["tensorboard"]


def test_round_trip_through_toml(tmp_path):
    cfg = load_pretrain_config(None, ["optim.lr=5e-4", "train.compile=true"])
    dump_toml(cfg, tmp_path / "r.toml")
    again = load_config(PretrainConfig, tmp_path / "r.toml")
    assert again == cfg and config_hash(again) == config_hash(cfg)


@pytest.mark.parametrize("override, message", [
    ("model.n_layr=2", "unknown config field 'model.n_layr' .*fields of 'model': bias, block_size"),
    ("schedule.kind=linear", "'schedule.kind'.*got 'linear'; allowed values: 'cosine', 'wsd', 'constant'"),
    ("optim.lr=-1", "'optim.lr'.*got -1.0; must be > 0.0"),
    ("train.max_steps=1.5", "'train.max_steps'.*got 1.5; expected an integer"),
    ("train.compile=yes", "'train.compile'.*got 'yes'; expected true or false"),
    ("model.n_embd=130", "'model.n_embd': 130 is not divisible by model.n_head=4"),
    ("run.trackers=[\"mlflow\"]", "'run.trackers': 'mlflow' is not a tracker"),
    ("optim.beta2=1.5", "'optim.beta2'.*must be <= 1.0"),
])
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_pretrain_config(None, [override])


def test_bad_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nn_layer = 'four'\n")
    with pytest.raises(ConfigError, match=r"'model.n_layer' \(.*bad.toml\): got 'four'; expected an integer"):
        load_pretrain_config(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("[model\n")
    with pytest.raises(ConfigError, match="broken.toml is not valid TOML"):
        load_pretrain_config(broken)
    with pytest.raises(ConfigError, match="config file not found"):
        load_pretrain_config(tmp_path / "missing.toml")
    section = tmp_path / "section.toml"
    section.write_text("model = 3\n")
    with pytest.raises(ConfigError, match="'model'.*expected a table of fields"):
        load_pretrain_config(section)


def test_parse_override_values():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=3e-4") == (["a"], 3e-4)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("name=my-run") == (["name"], "my-run")  # not TOML: a bare string
    assert parse_override('l=["x", "y"]') == (["l"], ["x", "y"])
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_override("novalue")


def test_grad_accum_must_divide():
    cfg = load_pretrain_config(None, ["train.micro_batch_size=4", "model.block_size=16",
                                      "train.total_batch_tokens=256"])
    assert cfg.grad_accum(1) == 4 and cfg.grad_accum(2) == 2 and cfg.grad_accum(4) == 1
    with pytest.raises(ConfigError, match="not a multiple of"):
        cfg.grad_accum(3)



@dataclass
class _Inner:
    rate: float = param(0.5, "how fast")


@dataclass
class _Outer:
    inner: _Inner = section(_Inner)
    long_name: int = param(3, "a count")


def test_format_description_lines_up_every_leaf_under_the_longest_name():
    lines = format_description(_Outer).split("\n")
    assert lines[0].startswith("inner.rate ") and lines[0].endswith("default=0.5")
    assert lines[1] == " " * len("inner.rate") + " how fast"
    assert lines[2].startswith("long_name  ") and lines[2].endswith("default=3")
    assert lines[3] == " " * len("inner.rate") + " a count"
