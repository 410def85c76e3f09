"""Procedurally generated arithmetic: the embedded default task (no data files, any number of examples).

Difficulty knobs: `digits` per operand, the `operations` drawn from (+ - *), and the number of `terms`.
Results follow the usual precedence (* before + and -) and may be negative. Train and test are disjoint by
content (a hash of the expression, tasks.in_holdout), not only by seed. CURRICULUM lists levels from
trivially easy upwards; `curriculum_examples` mixes them for a warm start a weak model can get reward on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scalelab.evals.mathtasks import check_prompt_format, score_numeric
from scalelab.evals.prompts import get_format, render
from scalelab.evals.tasks import Example, Score, chat, check_split, in_holdout, register_task

OPERATIONS = "+-*"
SPLIT_SALT = {"train": 0, "test": 1}  # mixed into the generator seed: the two splits draw independently


@dataclass(frozen=True)
class ArithmeticSpec:
    digits: int = 2
    operations: str = "+"
    terms: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 12:
            raise ValueError(f"arithmetic digits: got {self.digits}; allowed 1..12")
        if not self.operations or set(self.operations) - set(OPERATIONS):
            raise ValueError(f"arithmetic operations: got {self.operations!r}; use a subset of {OPERATIONS!r}")
        if not 2 <= self.terms <= 10:
            raise ValueError(f"arithmetic terms: got {self.terms}; allowed 2..10")


CURRICULUM: tuple[ArithmeticSpec, ...] = (
    ArithmeticSpec(1, "+", 2), ArithmeticSpec(1, "+-", 2), ArithmeticSpec(2, "+", 2),
    ArithmeticSpec(2, "+-", 2), ArithmeticSpec(2, "+-*", 2), ArithmeticSpec(2, "+-*", 3),
    ArithmeticSpec(3, "+-*", 3),
)


def evaluate(numbers: list[int], ops: list[str]) -> int:
    """Value with * binding tighter than + and -: fold products first, then sum signed terms."""
    total, product, sign = 0, numbers[0], 1
    for op, n in zip(ops, numbers[1:]):
        if op == "*":
            product *= n
        else:
            total += sign * product
            product, sign = n, (1 if op == "+" else -1)
    return total + sign * product


def draw(spec: ArithmeticSpec, rng: np.random.Generator) -> tuple[str, int]:
    low = 0 if spec.digits == 1 else 10 ** (spec.digits - 1)  # 2 digits: 10..99, so the knob means what it says
    numbers = [int(x) for x in rng.integers(low, 10 ** spec.digits, size=spec.terms)]
    ops = [str(o) for o in rng.choice(list(spec.operations), size=spec.terms - 1)]
    text = " ".join([str(numbers[0])] + [f"{op} {n}" for op, n in zip(ops, numbers[1:])])
    return text, evaluate(numbers, ops)


def generate(spec: ArithmeticSpec, split: str, n: int, seed: int) -> list[tuple[str, int]]:
    """`n` problems of `split` (duplicates possible when the space is small, e.g. 1-digit sums)."""
    rng = np.random.default_rng([seed, SPLIT_SALT[split], spec.digits, spec.terms, sum(map(ord, spec.operations))])
    out, tries = [], 0
    while len(out) < n:
        tries += 1
        if tries > 1000 * (n + 10):
            raise ValueError(f"{spec}: cannot find {n} {split} problems (the space is too small)")
        text, value = draw(spec, rng)
        if in_holdout(text) == (split == "test"):
            out.append((text, value))
    return out


@register_task("arithmetic")
@dataclass(frozen=True)
class Arithmetic:
    digits: int = 2
    operations: str = "+"
    terms: int = 2
    prompt_format: str = "answer_only"
    default_size: int = 1000  # examples per load() when no limit is given
    name: ClassVar[str] = "arithmetic"
    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    def __post_init__(self) -> None:
        ArithmeticSpec(self.digits, self.operations, self.terms)
        get_format(self.prompt_format)

    @property
    def spec(self) -> ArithmeticSpec:
        return ArithmeticSpec(self.digits, self.operations, self.terms)

    def load(self, split: str, source: str = "", limit: int | None = None, seed: int = 0) -> list[Example]:
        check_split(self.name, split, self.splits)
        return make_examples(self.spec, split, self.default_size if limit is None else limit, seed,
                             self.prompt_format)

    def score(self, example: Example, completion: str) -> Score:
        return score_numeric(example, completion)

    def check_format(self, example: Example, completion: str) -> bool:
        return check_prompt_format(example, completion)


def make_examples(spec: ArithmeticSpec, split: str, n: int, seed: int, prompt_format: str) -> list[Example]:
    fmt = get_format(prompt_format)
    meta = {"prompt_format": fmt.name, "digits": spec.digits, "operations": spec.operations, "terms": spec.terms}
    tag = f"d{spec.digits}{spec.operations}t{spec.terms}"
    return [Example("arithmetic", f"arithmetic/{split}/{tag}/s{seed}/{i}", chat(render(f"What is {text}?", fmt)),
                    str(value), dict(meta))
            for i, (text, value) in enumerate(generate(spec, split, n, seed))]


def curriculum_examples(per_level: int, split: str = "train", seed: int = 0,
                        prompt_format: str = "answer_only",
                        levels: tuple[ArithmeticSpec, ...] = CURRICULUM) -> list[Example]:
    """`per_level` examples of each level, easiest first (shuffle within a stage if the trainer wants)."""
    check_split("arithmetic", split, Arithmetic.splits)
    return [ex for k, spec in enumerate(levels)
            for ex in make_examples(spec, split, per_level, seed + k, prompt_format)]
