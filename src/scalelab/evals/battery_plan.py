"""What `scalelab evals battery` runs: the generative tasks with their split, prompt format and token budget, the
multiple-choice tasks lm-eval scores, the task groups, and the settings hash that decides whether a task's stored
result can be kept."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.core import errors
from scalelab.evals import harness
from scalelab.evals.tasks import shared_data_root


class BatteryInputError(errors.DataError, ValueError):
    """A task name, data folder or option the battery cannot use; the message names it and where."""


@dataclass(frozen=True)
class GenSpec:
    """One generative task: answered through the chat endpoint, scored by the task registry's scorer."""
    name: str                                    # the task registry name
    split: str
    max_tokens: int
    options: tuple[tuple[str, Any], ...] = ()    # get_task(name, **options)
    data_folder: str = ""                        # its folder under the data dir; "" = generated from a seed
    strict: bool = False                         # also score the asked-for answer form (mathtasks.strict_correct)
    code: bool = False                           # runs model-written code in the sandbox

    def task_options(self, allow_weak_sandbox: bool) -> dict[str, Any]:
        return {**dict(self.options), **({"allow_weak_sandbox": True} if self.code and allow_weak_sandbox else {})}


# gsm8k and math500 follow the reference protocol (Qwen's boxed-answer system prompt, prompts.py); the code tasks
# the sandboxed tests; ifeval_lite and the tool-call tasks are generated, test split, their default sizes.
GENERATE: dict[str, GenSpec] = {s.name: s for s in (
    GenSpec("gsm8k", "test", 768, (("prompt_format", "qwen_boxed"),), "gsm8k", strict=True),
    GenSpec("math500", "test", 1024, (("prompt_format", "qwen_boxed"),), "math500"),
    GenSpec("humaneval", "test", 512, (), "humaneval", code=True),
    GenSpec("mbpp", "test", 512, (), "mbpp", code=True),
    GenSpec("ifeval_lite", "test", 512),
    GenSpec("toolcall_schema", "test", 256),
    GenSpec("toolcall_args", "test", 256),
)}
MULTIPLE_CHOICE: tuple[str, ...] = tuple(harness.TASKS)
GROUPS: dict[str, tuple[str, ...]] = {"generate": tuple(GENERATE), "mc": MULTIPLE_CHOICE,
                                      "all": (*GENERATE, *MULTIPLE_CHOICE)}


def select_tasks(text: str) -> tuple[str, ...]:
    """'gsm8k,mc' -> the tasks in battery order, each once; groups: generate, mc, all."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = set(GROUPS["all"])
    unknown = [n for n in names if n not in known and n not in GROUPS]
    if unknown or not names:
        raise BatteryInputError(f"--tasks: unknown task(s) {', '.join(unknown) or '(none given)'}; known: "
                                f"{', '.join(GROUPS['all'])}; groups: {', '.join(GROUPS)}")
    chosen = {t for n in names for t in GROUPS.get(n, (n,))}
    return tuple(t for t in GROUPS["all"] if t in chosen)


def default_data_dir() -> Path:
    """$SCALELAB_SHARED_DATA, else ../shared/data beside the project, else ../shared/data from the cwd."""
    root = shared_data_root()
    return root if root.is_dir() or os.environ.get("SCALELAB_SHARED_DATA") else Path("..", "shared", "data")


def check_data(tasks: tuple[str, ...], data_dir: Path) -> None:
    """Every data folder the chosen tasks read is there, before any server starts."""
    needs = [(t, GENERATE[t].data_folder) for t in tasks if t in GENERATE and GENERATE[t].data_folder]
    needs += [(t, harness.TASKS[t].dataset) for t in tasks if t in harness.TASKS]
    if needs and not data_dir.is_dir():
        raise BatteryInputError(f"data dir {data_dir}: not found (tasks {', '.join(t for t, _ in needs)} read "
                                "their data there; pass --data-dir)")
    for task, folder in needs:
        if task in GENERATE and not (data_dir / folder).exists():
            raise BatteryInputError(f"{task}: data folder {data_dir / folder} not found (under --data-dir {data_dir})")


def settings_sha256(settings: dict[str, Any]) -> str:
    """Of everything that decides a task's items and verdicts: a stored result with another hash is redone."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
