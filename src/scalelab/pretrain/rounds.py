"""The recipe-variant rounds docs/pretrain.md reads, as the docs manifest lists them: each round is a result folder
(results.json, plus the profiles and tables it names) with a name the write-up cites and a kind that says what its
file holds beyond the variant table. Sections ask for a round by kind, so a new round is a manifest entry."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scalelab.core.jsonio import is_stored, read_json

# What a round's results.json holds, in the order the kinds were introduced; the readings of docs_speed.py use them.
KINDS = ("goal",            # the goal, the first variant table and the first quality check
         "variants",        # further variants, with the ones not finished or refused by validation
         "fp8-tensor",      # per-tensor FP8, its profiles and quality check
         "fp8-row",         # per-row FP8, its profiles, the GEMM table and quality check
         "row-kernels",     # the fused row kernels against their forecast, the quality ablation
         "tuned-launches",  # the tuned launches' profile, the hardware-cast A/B, quality on equal val tokens
         "loader-bf16res")  # the batch loader and the bf16 residual stream against their forecasts


@dataclass(frozen=True)
class Round:
    name: str           # as the write-up cites it
    kind: str           # one of KINDS
    doc: dict           # results.json, each named file's content under <entry>.summary


@dataclass(frozen=True)
class Rounds:
    rounds: tuple[Round, ...]

    def get(self, kind: str) -> dict | None:
        """The results of the round of that kind, or None when the manifest lists none."""
        r = self.round(kind)
        return None if r is None else r.doc

    def round(self, kind: str) -> Round | None:
        if kind not in KINDS:
            raise KeyError(f"round kind {kind!r}: known kinds are {', '.join(KINDS)}")
        return next((r for r in self.rounds if r.kind == kind), None)

    def name(self, kind: str) -> str:
        r = self.round(kind)
        if r is None:
            raise KeyError(f"no round of kind {kind!r} in the manifest")
        return r.name

    def names(self, *kinds: str) -> str:
        """'3-5' for consecutive listed rounds of those kinds (first to last), else their names joined by ', '."""
        got = [r.name for r in self.rounds if r.kind in kinds]
        return f"{got[0]}-{got[-1]}" if len(got) > 1 else (got[0] if got else "")

    def latest(self) -> dict:
        return self.rounds[-1].doc


def load_round(root: Path, folder: Path, name: str, kind: str) -> Round:
    """A round's results.json with the content of each profile or table it names (paths from the repository root)."""
    if kind not in KINDS:
        raise ValueError(f"{folder}: round kind {kind!r} is not one of {', '.join(KINDS)}")
    path = folder / "results.json"
    if not is_stored(path):  # plain or packed (core.recordgz)
        raise FileNotFoundError(f"round {name}: {path} does not exist")
    doc = read_json(path)
    for entry in [*doc.get("profiles", {}).values(), doc.get("gemm")]:
        if isinstance(entry, dict) and "file" in entry:
            entry["summary"] = read_json(root / entry["file"])
    return Round(name, kind, doc)
