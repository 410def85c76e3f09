"""Instruction following with verifiable constraints (in the spirit of IFEval, Zhou et al. 2023; registered
as `ifeval_lite` so it is never mistaken for the benchmark itself): a short writing request plus 1-3
constraints, each checked by a program. Generated from a seed; train and test are
disjoint by content. `Score.partial` is the share of constraints met; `correct` needs all of them.

A constraint is stored in the example as {"kind": name, **params}, so scoring needs nothing but the example.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np

from scalelab.evals.tasks import Example, Score, chat, check_split, in_holdout, register_task

Params = dict[str, Any]

TOPICS = ("tide pools", "the history of the bicycle", "learning to bake bread", "why cats sleep so much",
          "city gardens", "the first day at a new job", "saving energy at home", "a rainy weekend",
          "how bridges carry weight", "keeping a journal", "street food", "night trains")
KEYWORDS = ("river", "lantern", "copper", "harvest", "window", "signal", "maple", "compass", "velvet", "orbit")
BANNED = ("very", "really", "thing", "just", "actually")
ENDINGS = ("that is all for now.", "thank you for reading.", "until next time.")


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9']+", text)


def _bullets(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if re.match(r"\s*(?:[-*•]|\d+[.)])\s+\S", ln)]


@dataclass(frozen=True)
class Constraint:
    kind: str
    sample: Callable[[np.random.Generator], Params]
    describe: Callable[[Params], str]
    check: Callable[[str, Params], bool]


def _draw(rng: np.random.Generator, options: tuple) -> Any:
    return options[int(rng.integers(len(options)))]


CONSTRAINTS: dict[str, Constraint] = {c.kind: c for c in (
    Constraint("bullets", lambda r: {"n": int(r.integers(2, 6))},
               lambda p: f"Answer in exactly {p['n']} bullet points (lines starting with \"- \").",
               lambda t, p: len(_bullets(t)) == p["n"]),
    Constraint("include_word", lambda r: {"word": _draw(r, KEYWORDS)},
               lambda p: f"Include the word \"{p['word']}\".",
               lambda t, p: re.search(rf"\b{re.escape(p['word'])}\b", t, re.IGNORECASE) is not None),
    Constraint("avoid_word", lambda r: {"word": _draw(r, BANNED)},
               lambda p: f"Do not use the word \"{p['word']}\".",
               lambda t, p: re.search(rf"\b{re.escape(p['word'])}\b", t, re.IGNORECASE) is None),
    Constraint("max_words", lambda r: {"n": int(r.choice([40, 60, 80, 120]))},
               lambda p: f"Use no more than {p['n']} words.",
               lambda t, p: 0 < len(_words(t)) <= p["n"]),
    Constraint("end_with", lambda r: {"phrase": _draw(r, ENDINGS)},
               lambda p: f"End your response with the exact phrase \"{p['phrase']}\"",
               lambda t, p: t.strip().endswith(p["phrase"])),
    Constraint("no_commas", lambda r: {}, lambda p: "Do not use any commas.", lambda t, p: "," not in t),
    Constraint("lowercase", lambda r: {}, lambda p: "Write your whole response in lowercase letters.",
               lambda t, p: bool(t.strip()) and t == t.lower()),
    Constraint("title", lambda r: {}, lambda p: "Give it a title wrapped in double angle brackets, like <<title>>.",
               lambda t, p: re.search(r"<<[^<>\n]+>>", t) is not None),
)}


def check(text: str, spec: Params) -> bool:
    params = {k: v for k, v in spec.items() if k != "kind"}
    return CONSTRAINTS[spec["kind"]].check(text, params)


def describe(spec: Params) -> str:
    return CONSTRAINTS[spec["kind"]].describe({k: v for k, v in spec.items() if k != "kind"})


def draw_constraints(rng: np.random.Generator, max_count: int = 3) -> list[Params]:
    kinds = sorted(CONSTRAINTS)
    count = int(rng.integers(1, max_count + 1))
    chosen = [kinds[i] for i in sorted(rng.choice(len(kinds), size=count, replace=False))]
    return [{"kind": k, **CONSTRAINTS[k].sample(rng)} for k in chosen]


@register_task("ifeval_lite")
@dataclass(frozen=True)
class InstructionFollowing:
    max_constraints: int = 3
    default_size: int = 500
    name: ClassVar[str] = "ifeval_lite"
    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    def __post_init__(self) -> None:
        if not 1 <= self.max_constraints <= len(CONSTRAINTS):
            raise ValueError(f"ifeval_lite max_constraints: got {self.max_constraints}; "
                             f"allowed 1..{len(CONSTRAINTS)}")

    def load(self, split: str, source: str = "", limit: int | None = None, seed: int = 0) -> list[Example]:
        check_split(self.name, split, self.splits)
        rng = np.random.default_rng([seed, 3, 0 if split == "train" else 1])
        n = self.default_size if limit is None else limit
        out, tries = [], 0
        while len(out) < n:
            tries += 1
            if tries > 1000 * (n + 10):
                raise ValueError(f"cannot generate {n} {split} ifeval_lite examples")
            specs = draw_constraints(rng, self.max_constraints)
            text = f"Write a short piece about {_draw(rng, TOPICS)}. " + " ".join(describe(s) for s in specs)
            if in_holdout(text) == (split == "test"):
                out.append(Example(self.name, f"ifeval_lite/{split}/s{seed}/{len(out)}", chat(text),
                                   json.dumps(specs), {"constraints": specs}))
        return out

    def score(self, example: Example, completion: str) -> Score:
        specs = example.meta["constraints"]
        failed = [s["kind"] for s in specs if not check(completion, s)]
        met = len(specs) - len(failed)
        reason = f"{met}/{len(specs)} constraints met" + (f"; failed: {', '.join(failed)}" if failed else "")
        return Score(not failed, completion.strip()[:200] or None, reason, partial=met / len(specs))

    def check_format(self, example: Example, completion: str) -> bool:
        """A non-empty plain-text reply (the constraints themselves are the task, not its format)."""
        return bool(completion.strip())
