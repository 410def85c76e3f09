"""Preference pairs: one record type, loaders by registry name, a by-prompt validation split, jsonl I/O.

A pair is a prompt (chat messages) and two single-message assistant responses, the format TRL's
preference trainers take as "conversational, explicit prompt":

    PreferencePair(prompt=[{"role": "user", "content": "2+2?"}],
                   chosen=[{"role": "assistant", "content": "4"}],
                   rejected=[{"role": "assistant", "content": "5"}], source="verifier:arithmetic", id="...")

Sources (hub id or local path in the same format):
    ultrafeedback  HuggingFaceH4/ultrafeedback_binarized: chosen/rejected are full message lists whose last
                   message differs; local .jsonl(.gz) / .parquet with the same columns
    hh-rlhf        Anthropic/hh-rlhf: chosen/rejected are whole "\\n\\nHuman: … \\n\\nAssistant: …" dialogues;
                   local .jsonl(.gz) files or a folder of them
    pairs          our own jsonl (PreferencePair records), e.g. the verifier-built set
A malformed row raises MalformedRow naming its file and line; with strict=False it is skipped and counted.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from scalelab.core.jsonio import open_text

Message = dict[str, str]
ROLES = ("system", "user", "assistant")


class MalformedRow(ValueError):
    """A preference row that cannot become a pair; the message starts with 'file:line:'."""


@dataclass(frozen=True)
class PreferencePair:
    prompt: list[Message]
    chosen: list[Message]
    rejected: list[Message]
    source: str
    id: str
    meta: dict = field(default_factory=dict)  # e.g. the verifier set's token counts; {} = none

    @property
    def prompt_key(self) -> str:
        """Identity of the prompt: pairs sharing it go to the same split."""
        return json.dumps(self.prompt, sort_keys=True, ensure_ascii=False)

    @property
    def question_key(self) -> str:
        """The question a pair answers: its user turns' text, whatever system prompt or format asked it."""
        return "\n\n".join(m["content"].strip() for m in self.prompt if m["role"] == "user")

    def to_record(self) -> dict:
        """The jsonl record; an empty meta is left out, so sets written before it existed hash the same."""
        record = asdict(self)
        if not record["meta"]:
            del record["meta"]
        return record

    def to_trl(self) -> dict:
        return {"prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected}


@dataclass(frozen=True)
class LoadResult:
    pairs: list[PreferencePair]
    rows_read: int
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file:line, reason)

    @property
    def n_skipped(self) -> int:
        return len(self.skipped)


# ---------------------------------------------------------------------------------------------
# messages


def _message(obj: Any) -> Message:
    if not isinstance(obj, dict) or obj.get("role") not in ROLES or not isinstance(obj.get("content"), str):
        raise ValueError(f"not a chat message with role in {ROLES} and string content: {str(obj)[:80]!r}")
    return {"role": obj["role"], "content": obj["content"]}


def _messages(obj: Any, what: str) -> list[Message]:
    if isinstance(obj, str):
        return [{"role": "assistant", "content": obj}]
    if not isinstance(obj, list) or not obj:
        raise ValueError(f"'{what}' is not a non-empty list of messages")
    return [_message(m) for m in obj]


def _response(messages: list[Message], what: str) -> list[Message]:
    last = messages[-1]
    if last["role"] != "assistant":
        raise ValueError(f"'{what}' has no final assistant turn (last role: {last['role']})")
    if not last["content"].strip():
        raise ValueError(f"'{what}' has an empty final assistant response")
    return [last]


# ---------------------------------------------------------------------------------------------
# HH-RLHF dialogues (Bai et al. 2022)

HH_TURN = re.compile(r"\n\n(Human|Assistant):")
HH_ROLES = {"Human": "user", "Assistant": "assistant"}


def split_dialogue(text: str) -> list[Message]:
    """'\\n\\nHuman: a\\n\\nAssistant: b' -> [user a, assistant b]; contents stripped of surrounding space."""
    parts = HH_TURN.split(text)
    if parts[0].strip():
        raise ValueError(f"text before the first '\\n\\nHuman:' turn: {parts[0][:60]!r}")
    if len(parts) < 3:
        raise ValueError("no '\\n\\nHuman:' or '\\n\\nAssistant:' turn")
    return [{"role": HH_ROLES[role], "content": content.strip()}
            for role, content in zip(parts[1::2], parts[2::2])]


def hh_pair(row: dict, source: str, pair_id: str) -> PreferencePair:
    """Shared turns become the prompt; each dialogue's final assistant turn is its response."""
    chosen, rejected = (split_dialogue(_string(row, k)) for k in ("chosen", "rejected"))
    c_resp, r_resp = _response(chosen, "chosen"), _response(rejected, "rejected")
    if chosen[:-1] != rejected[:-1]:
        turn = next(i for i, (a, b) in enumerate(zip(chosen[:-1] + [{}], rejected[:-1] + [{}])) if a != b)
        raise ValueError(f"chosen and rejected dialogues differ before their final turn (turn {turn + 1})")
    if not chosen[:-1]:
        raise ValueError("no prompt turns before the final assistant response")
    return PreferencePair(chosen[:-1], c_resp, r_resp, source, pair_id)


def _string(row: dict, key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise ValueError(f"field '{key}' is missing or not a string")
    return value


# ---------------------------------------------------------------------------------------------
# conversational rows (UltraFeedback-binarized, TRL's formats, our own jsonl)


def _check_prompt_text(text: Any, prompt: list[Message]) -> None:
    """UltraFeedback-binarized also gives the prompt as a string: it must be the conversations' last user turn,
    else the row pairs answers to some other question."""
    if not isinstance(text, str):
        return
    users = [m["content"] for m in prompt if m["role"] == "user"]
    if not users or users[-1].strip() != text.strip():
        raise ValueError(f"'prompt' is not the conversations' last user turn: {text[:60]!r}")


def conversational_pair(row: dict, source: str, pair_id: str) -> PreferencePair:
    """Explicit prompt (prompt = message list) or implicit (chosen/rejected = whole conversations)."""
    chosen, rejected = _messages(row.get("chosen"), "chosen"), _messages(row.get("rejected"), "rejected")
    if isinstance(row.get("prompt"), list):
        prompt = _messages(row["prompt"], "prompt")
    else:
        if chosen[:-1] != rejected[:-1]:
            raise ValueError("chosen and rejected conversations differ before their final message")
        prompt = chosen[:-1]
        _check_prompt_text(row.get("prompt"), prompt)
    if not prompt:
        raise ValueError("no prompt messages")
    pid = str(row.get("id") or row.get("prompt_id") or pair_id)
    meta = row.get("meta") if isinstance(row.get("meta"), dict) else {}
    return PreferencePair(prompt, _response(chosen, "chosen"), _response(rejected, "rejected"),
                          str(row.get("source") or source), pid, meta)


# ---------------------------------------------------------------------------------------------
# rows from files or the hub: (where, row) with where = "file:line"

ROW_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.xz", ".parquet")


def _open_text(path: Path):
    """By the file's suffix (core.jsonio): a committed verifier set (a dpo run's preferences.jsonl, which
    dpo.run hands here by its stored name) may be gzipped or xz-packed."""
    return open_text(path)


def _iter_file(path: Path) -> Iterator[tuple[str, dict | str]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # lazy: pyarrow only for parquet data
        for i, row in enumerate(pq.read_table(path).to_pylist(), 1):
            yield f"{path}:{i}", row
        return
    with _open_text(path) as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                yield f"{path}:{i}", line


def iter_local_rows(path: str | Path) -> Iterator[tuple[str, dict | str]]:
    """Rows of one file, or of every data file in a folder (sorted); jsonl rows come as raw lines."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith(ROW_SUFFIXES))
        if not files:
            raise FileNotFoundError(f"{path}: no {', '.join(ROW_SUFFIXES)} files")
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(f"preference data not found: {path}")
    for f in files:
        yield from _iter_file(f)


def iter_hub_rows(hub_id: str, split: str, subset: str = "") -> Iterator[tuple[str, dict]]:
    from datasets import load_dataset  # lazy: datasets is optional (the hub extra; trl brings it)
    ds = load_dataset(hub_id, data_dir=subset or None, split=split)
    for i, row in enumerate(ds, 1):
        yield f"{hub_id}{'/' + subset if subset else ''}[{split}]:{i}", row


# ---------------------------------------------------------------------------------------------
# registry


@dataclass(frozen=True)
class PreferenceSource:
    name: str
    hub_id: str                  # '' = local only
    default_split: str
    parse: Callable[[dict, str, str], PreferencePair]


SOURCES: dict[str, PreferenceSource] = {s.name: s for s in [
    PreferenceSource("ultrafeedback", "HuggingFaceH4/ultrafeedback_binarized", "train_prefs", conversational_pair),
    PreferenceSource("hh-rlhf", "Anthropic/hh-rlhf", "train", hh_pair),
    PreferenceSource("pairs", "", "train", conversational_pair),
]}


def _is_local(path: str) -> bool:
    """A path unless it has the hub's owner/name form and no such file exists here."""
    if not path:
        return False
    return (Path(path).exists() or path.startswith((".", "/", "~")) or path.endswith(ROW_SUFFIXES)
            or path.count("/") != 1)


def _rows(src: PreferenceSource, path: str, split: str, subset: str) -> Iterator[tuple[str, dict | str]]:
    if _is_local(path):
        return iter_local_rows(path)
    hub_id = path or src.hub_id
    if not hub_id:
        raise FileNotFoundError(f"source {src.name!r} needs a local path (data.path)")
    return iter_hub_rows(hub_id, split or src.default_split, subset)


def _parse_row(src: PreferenceSource, where: str, row: dict | str) -> PreferencePair:
    try:
        if isinstance(row, str):
            row = json.loads(row)
        if not isinstance(row, dict):
            raise ValueError("row is not a JSON object")
        return src.parse(row, src.name, where.rsplit("/", 1)[-1])
    except json.JSONDecodeError as e:
        raise MalformedRow(f"{where}: invalid JSON: {e.msg}") from None
    except ValueError as e:
        raise MalformedRow(f"{where}: {e}") from None


def load_pairs(source: str, path: str = "", split: str = "", subset: str = "", strict: bool = True) -> LoadResult:
    """Every pair of a registered source; strict=False skips malformed rows and lists them in `skipped`."""
    if source not in SOURCES:
        raise KeyError(f"unknown preference source {source!r}; known: {', '.join(SOURCES)}")
    src, pairs, skipped, n = SOURCES[source], [], [], 0
    for where, row in _rows(src, path, split, subset):
        n += 1
        try:
            pairs.append(_parse_row(src, where, row))
        except MalformedRow as e:
            if strict:
                raise
            skipped.append((where, str(e)[len(where) + 2:]))
    return LoadResult(pairs, n, skipped)


# ---------------------------------------------------------------------------------------------
# subsets, splits, files


def subsample(pairs: list[PreferencePair], n: int, seed: int) -> list[PreferencePair]:
    """n pairs chosen by a seeded permutation, kept in file order; n = 0 or n >= len keeps all."""
    if n <= 0 or n >= len(pairs):
        return list(pairs)
    keep = np.sort(np.random.default_rng(seed).permutation(len(pairs))[:n])
    return [pairs[i] for i in keep]


def split_by_prompt(pairs: list[PreferencePair], val_fraction: float,
                    seed: int) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, val): whole prompts go to val (seeded), so no validation prompt is seen in training."""
    keys = list(dict.fromkeys(p.prompt_key for p in pairs))
    n_val = int(round(val_fraction * len(keys)))
    if val_fraction > 0 and len(keys) > 1:
        n_val = min(max(n_val, 1), len(keys) - 1)
    order = np.random.default_rng(seed).permutation(len(keys))
    val_keys = {keys[i] for i in order[:n_val]}
    return [p for p in pairs if p.prompt_key not in val_keys], [p for p in pairs if p.prompt_key in val_keys]


def hash_fraction(key: str) -> float:
    """A string's place in [0, 1): the first 8 bytes of its sha256 as a fraction of 2**64."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2 ** 64


def split_by_hash(pairs: list[PreferencePair], val_fraction: float) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, val): a question is held out when the hash of its text falls below val_fraction. Unlike a
    seeded split, the side a question lands on depends on nothing else (no seed, order, subset size or other
    questions), so a verifier set grown or rebuilt with another seed never moves a held-out question into
    training, and every run of a sweep holds out the same questions."""
    val = [p for p in pairs if hash_fraction(p.question_key) < val_fraction]
    keys = {p.question_key for p in val}
    return [p for p in pairs if p.question_key not in keys], val


def skip_reasons(skipped: list[tuple[str, str]]) -> dict[str, int]:
    """Skipped rows counted by reason, the parenthesized and after-colon details taken out ("... differ before
    their final turn (turn 3)" and "(turn 5)" count together), so a report states what each kind of fault cost."""
    out: dict[str, int] = {}
    for _, reason in skipped:
        kind = re.sub(r"\s*\([^)]*\)", "", reason).split(": ", 1)[0]
        out[kind] = out.get(kind, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def write_pairs_jsonl(path: str | Path, pairs: list[PreferencePair]) -> Path:
    """One PreferencePair record per line (readable back with load_pairs('pairs', path))."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps(p.to_record(), ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path
