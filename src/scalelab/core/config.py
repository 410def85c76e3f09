"""Typed configuration: defaults in code, then a TOML file, then `--set key=value` overrides.

A job's config is a tree of dataclasses. Every leaf is declared with `param(...)`, which carries its help
text and its constraints (range, allowed values). Loading validates every value up front and raises
`ConfigError` naming the dotted field, where the value came from, and what is allowed.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import tomli_w

from scalelab.core.errors import ScalelabError

T = TypeVar("T")


class ConfigError(ScalelabError, ValueError):
    """A config value is unknown, of the wrong type, or outside its allowed range."""

    kind = "config error"


def param(default: Any, help: str, *, ge: float | None = None, gt: float | None = None,
          le: float | None = None, choices: tuple | None = None) -> Any:
    """Declare a config leaf with its help text and constraints (checked at load time)."""
    meta = {"help": help, "ge": ge, "gt": gt, "le": le, "choices": choices}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls: type[T]) -> T:
    """Declare a nested config section whose defaults are `cls()`."""
    return dataclasses.field(default_factory=cls)


# ---------------------------------------------------------------------------------------------
# coercion of one value to a declared type


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            type(None): "none (omit the key)"}.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: got {value!r}; allowed values: {', '.join(map(repr, allowed))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: got {value!r}; expected {_type_name(tp)}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: got {value!r}; expected {_type_name(tp)}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Any:
        return value
    raise ConfigError(f"{where}: got {value!r}; expected {_type_name(tp)}")


def _check_constraints(value: Any, meta: typing.Mapping, where: str) -> None:
    if value is None:
        return
    checks = [("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
              ("le", lambda v, b: v <= b, "<=")]
    for key, ok, sym in checks:
        bound = meta.get(key)
        if bound is not None and not ok(value, bound):
            raise ConfigError(f"{where}: got {value!r}; must be {sym} {bound}")
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{where}: got {value!r}; allowed values: {', '.join(map(repr, choices))}")


# ---------------------------------------------------------------------------------------------
# building a dataclass tree from nested dicts


def _build(cls: type[T], data: dict, origin: str, prefix: str = "") -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        name = f"{prefix}{unknown[0]}"
        raise ConfigError(f"unknown config field '{name}' ({origin}); "
                          f"fields of '{prefix.rstrip('.') or 'top level'}': {', '.join(sorted(fields))}")
    kwargs = {}
    for name, f in fields.items():
        tp, where = hints[name], f"config field '{prefix}{name}' ({origin})"
        if dataclasses.is_dataclass(tp):
            sub = data.get(name, {})
            if not isinstance(sub, dict):
                raise ConfigError(f"{where}: expected a table of fields, got {sub!r}")
            kwargs[name] = _build(tp, sub, origin, f"{prefix}{name}.")
        elif name in data:
            kwargs[name] = _coerce(data[name], tp, where)
            _check_constraints(kwargs[name], f.metadata, where)
    return cls(**kwargs)


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=3` -> (["a", "b"], 3). The value is read as TOML when it parses, else as a bare string."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value (e.g. optim.lr=3e-4)")
    key, raw = text.split("=", 1)
    key, raw = key.strip(), raw.strip()
    if not key:
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def _nest(path: list[str], value: Any) -> dict:
    out: dict = {path[-1]: value}
    for p in reversed(path[:-1]):
        out = {p: out}
    return out


def read_toml(path: str | Path, what: str = "config file") -> dict:
    """A TOML file as a dict, or a ConfigError that names the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {path} is not valid TOML: {e}") from None


def load_config(cls: type[T], path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> T:
    """Defaults of `cls`, updated by the TOML file at `path`, then by each `key=value` override."""
    data: dict = {}
    origin = "defaults"
    if path is not None:
        data = read_toml(path)
        origin = str(path)
        _build(cls, data, origin)  # report file errors against the file before overrides apply
    for text in overrides:
        keys, value = parse_override(text)
        data = _merge(data, _nest(keys, value))
    if overrides:
        origin = f"{origin} + --set"
    cfg = _build(cls, data, origin)
    _validate_tree(cfg)
    return cfg


def _validate_tree(cfg: Any) -> None:
    """Run each section's own cross-field `validate()` (children first)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            _validate_tree(value)
    check = getattr(cfg, "validate", None)
    if callable(check):
        check()


def config_from_dict(cls: type[T], data: dict, origin: str = "dict") -> T:
    cfg = _build(cls, data, origin)
    _validate_tree(cfg)
    return cfg


# ---------------------------------------------------------------------------------------------
# output


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def _drop_none(d: dict) -> dict:
    # TOML has no null: a None leaf is written as an absent key, which loads back as the default None.
    return {k: _drop_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}


def dump_toml(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(tomli_w.dumps(_drop_none(to_dict(cfg))))


def config_hash(cfg: Any) -> str:
    return hashlib.sha256(json.dumps(to_dict(cfg), sort_keys=True).encode()).hexdigest()[:16]


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted name, type, default, help) for every leaf: the source of `--help-config`."""
    rows = []
    hints = typing.get_type_hints(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows += describe(tp, f"{prefix}{f.name}.")
        else:
            rows.append((f"{prefix}{f.name}", _type_name(tp), getattr(defaults, f.name), f.metadata.get("help", "")))
    return rows


def format_description(cls: type) -> str:
    """`scalelab <job> config`: every leaf field as "name  type  default=..." with its help on the next line,
    the name column as wide as the longest name."""
    rows = describe(cls)
    width = max(len(name) for name, *_ in rows)
    return "\n".join(f"{name:{width}s} {tp:34s} default={default!r}\n{'':{width}s} {help_text}"
                     for name, tp, default, help_text in rows)


def add_config_args(p: argparse.ArgumentParser, job: str, example: str) -> None:
    """--config FILE and repeatable --set KEY=VALUE: the same two options on every job's config-taking verbs."""
    p.add_argument("--config", help=f"TOML config (named configs live in configs/{job}/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a config field, e.g. --set {example} (repeatable)")
