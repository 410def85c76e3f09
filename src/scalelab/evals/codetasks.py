"""Code generation scored by running the data set's own tests in the sandbox: HumanEval and MBPP.

A completion passes when its program (solution + tests) exits 0 within the limits AND prints a random
marker that the harness appends after the last test. The marker defeats the cheapest reward hack, exiting
early with status 0 (`sys.exit(0)`, `os._exit(0)`) before any assertion runs; code that reads the marker out
of its own interpreter could still forge it, which is why the marker is a per-run random string that
appears nowhere in the prompt.
"""
from __future__ import annotations

import ast
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from scalelab.evals.sandbox import Limits, RunResult, describe, run_python
from scalelab.evals.tasks import (
    DataError, Example, Score, chat, check_split, hub_records, read_records, register_task, require_fields,
    resolve_source, take,
)

FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str, entry_point: str = "") -> str:
    """The code in a completion: the fenced block defining `entry_point` (else the longest block; an
    unterminated fence, as from a truncated generation, runs to the end), or the whole text if unfenced."""
    blocks = FENCE.findall(completion)
    if not blocks:
        return completion
    if entry_point:
        defining = [b for b in blocks if re.search(rf"def\s+{re.escape(entry_point)}\s*\(", b)]
        if defining:
            return defining[-1]
    return max(blocks, key=len)


def defines(code: str, entry_point: str) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point
               for node in ast.walk(tree))


def run_tests(program: str, limits: Limits) -> tuple[bool, RunResult]:
    """(passed, the run): passed = exit 0 and the end-of-tests marker printed."""
    marker = f"scalelab-tests-passed-{secrets.token_hex(12)}"
    result = run_python(f"{program}\n\nprint({marker!r})\n", limits)
    return result.ok and marker in result.stdout, result


def verdict(passed: bool, result: RunResult) -> str:
    """The score's reason, ending in the sandbox layers the run had (so every recorded score says how the
    code it ran was confined)."""
    layers = f" [sandbox: {'+'.join(result.enforced) or 'none'}]"
    if result.reruns:  # the first run was starved at the wall clock; this verdict is the second run's
        layers = " [rerun after a starved first run]" + layers
    if passed:
        return f"passed ({result.wall_s:.2f} s)" + layers
    if result.ok:
        return "failed: exited 0 before the tests finished" + layers
    return f"failed: {result.status}: {result.error}"[:300] + layers


def code_format_ok(completion: str, entry_point: str) -> bool:
    """A fenced python block that parses and defines the function asked for."""
    blocks = FENCE.findall(completion)
    return bool(blocks) and defines(extract_code(completion, entry_point), entry_point)


# ---------------------------------------------------------------------------------------------
# HumanEval


def humaneval_program(example: Example, completion: str) -> str:
    """The prompt (imports, signature) then the completion: a whole function redefines the stub, a bare
    body continues it; then the data set's `check`."""
    meta = example.meta
    code = extract_code(completion, meta["entry_point"])
    return f"{meta['prompt']}\n{code}\n\n{meta['test']}\n\ncheck({meta['entry_point']})\n"


HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Reply with the whole function in one "
                         "```python code block.\n\n```python\n{prompt}```")


@register_task("humaneval")
@dataclass(frozen=True)
class HumanEval:
    timeout_s: float = 10.0
    memory_mb: int = 1024
    allow_weak_sandbox: bool = False  # run completions even where the sandbox has no OS isolation layer
    name: ClassVar[str] = "humaneval"
    splits: ClassVar[tuple[str, ...]] = ("test",)  # 164 problems, evaluation only

    def load(self, split: str, source: str = "", limit: int | None = None, seed: int = 0) -> list[Example]:
        check_split(self.name, split, self.splits)
        resolved = resolve_source(source, "humaneval", "openai/openai_humaneval")
        if resolved.kind == "hub":
            rows = [(f"{resolved.where} row {i}", r) for i, r in enumerate(hub_records(resolved.where, "test"))]
        else:
            path = Path(resolved.where)
            path = path / "HumanEval.jsonl.gz" if path.is_dir() else path
            rows = [(f"{path}: line {i + 1}", r) for i, r in enumerate(read_records(path))]
        return [self._example(row, where) for where, row in take(rows, limit)]

    def _example(self, row: dict[str, Any], where: str) -> Example:
        require_fields(row, ("task_id", "prompt", "canonical_solution", "test", "entry_point"), where)
        meta = {k: row[k] for k in ("prompt", "test", "entry_point")}
        return Example(self.name, row["task_id"], chat(HUMANEVAL_INSTRUCTION.format(prompt=row["prompt"])),
                       row["canonical_solution"], meta)

    def limits(self) -> Limits:
        return Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb, allow_weak_sandbox=self.allow_weak_sandbox)

    def score(self, example: Example, completion: str) -> Score:
        passed, result = run_tests(humaneval_program(example, completion),
                                   self.limits())
        return Score(passed, extract_code(completion, example.meta["entry_point"]), verdict(passed, result))

    def check_format(self, example: Example, completion: str) -> bool:
        return code_format_ok(completion, example.meta["entry_point"])


# ---------------------------------------------------------------------------------------------
# MBPP

# Austin et al. 2021 (the data set's README): 1-10 few-shot prompts, 11-510 test, 511-600 validation,
# 601-974 train. The sanitized subset inherits the same ranges.
MBPP_SPLITS = {"prompt": range(1, 11), "test": range(11, 511), "validation": range(511, 601),
               "train": range(601, 975)}
MBPP_FILES = {"full": "mbpp.jsonl", "sanitized": "sanitized-mbpp.json"}


def mbpp_entry_point(code: str, tests: list[str]) -> str:
    """The function the tests call: the first top-level def of the reference code that they name."""
    names = re.findall(r"^def\s+([A-Za-z_]\w*)\s*\(", code, re.MULTILINE)
    called = " ".join(tests)
    return next((n for n in names if re.search(rf"\b{n}\s*\(", called)), names[0] if names else "")


@register_task("mbpp")
@dataclass(frozen=True)
class MBPP:
    variant: str = "full"  # "full" (974 problems) or "sanitized" (427, hand-checked)
    timeout_s: float = 10.0
    memory_mb: int = 1024
    allow_weak_sandbox: bool = False  # run completions even where the sandbox has no OS isolation layer
    name: ClassVar[str] = "mbpp"
    splits: ClassVar[tuple[str, ...]] = tuple(MBPP_SPLITS)

    def __post_init__(self) -> None:
        if self.variant not in MBPP_FILES:
            raise ValueError(f"mbpp variant {self.variant!r}: allowed: {', '.join(MBPP_FILES)}")

    def _rows(self, split: str, source: str) -> list[tuple[str, dict[str, Any]]]:
        resolved = resolve_source(source, "mbpp", "google-research-datasets/mbpp")
        if resolved.kind == "hub":
            return [(f"{resolved.where} row {i}", r)
                    for i, r in enumerate(hub_records(resolved.where, split, self.variant))]
        path = Path(resolved.where)
        path = path / MBPP_FILES[self.variant] if path.is_dir() else path
        rows = [(f"{path}: row {i + 1}", r) for i, r in enumerate(read_records(path))]
        ids = MBPP_SPLITS[split]
        return [(w, r) for w, r in rows if isinstance(r.get("task_id"), int) and r["task_id"] in ids]

    def load(self, split: str, source: str = "", limit: int | None = None, seed: int = 0) -> list[Example]:
        check_split(self.name, split, self.splits)
        return [self._example(row, where) for where, row in take(self._rows(split, source), limit)]

    def _example(self, row: dict[str, Any], where: str) -> Example:
        require_fields(row, ("task_id", "code", "test_list"), where)
        text = row.get("text") or row.get("prompt")
        if not text:
            raise DataError(f"{where}: no problem statement (field 'text' or 'prompt')")
        tests = list(row["test_list"])
        entry = mbpp_entry_point(row["code"], tests)
        setup = "\n".join([row.get("test_setup_code") or "", *row.get("test_imports", [])]).strip()
        prompt = (f"{text}\nYour code should pass these tests:\n\n" + "\n".join(tests) +
                  "\n\nReply with the Python code in one ```python code block.")
        meta = {"tests": tests, "setup": setup, "entry_point": entry}
        return Example(self.name, f"mbpp/{row['task_id']}", chat(prompt), row["code"], meta)

    def limits(self) -> Limits:
        return Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb, allow_weak_sandbox=self.allow_weak_sandbox)

    def score(self, example: Example, completion: str) -> Score:
        meta = example.meta
        code = extract_code(completion, meta["entry_point"])
        program = f"{code}\n\n{meta['setup']}\n\n" + "\n".join(meta["tests"]) + "\n"
        passed, result = run_tests(program, self.limits())
        return Score(passed, code, verdict(passed, result))

    def check_format(self, example: Example, completion: str) -> bool:
        return code_format_ok(completion, example.meta["entry_point"])


def sandbox_record(task: object) -> dict | None:
    """The sandbox a code task's completions run in (layers, whether OS-isolated), for a run to log beside
    its scores; None for a task that runs no code."""
    return describe(task.limits()).to_dict() if isinstance(task, (HumanEval, MBPP)) else None
