"""lm-evaluation-harness on a local HF model folder, with the evaluation sets read offline or from the hub.

    source="hub"    lm-eval's own tasks (hellaswag, arc_easy, piqa, mmlu, truthfulqa_mc1/mc2), data from the hub
    source="local"  our definitions of the same tasks (scalelab/evals/lmeval/*.yaml) on the local copies,
                    converted to hub-schema jsonl by scalelab.evals.localdata

Local runs go through a folder of "binding" YAMLs, one per task file of ours: each includes the packaged
definition and points its data_files at the converted copies in the cache. The packaged YAMLs cannot name
the files themselves, as the cache lives wherever the user keeps it; the bindings are content-addressed,
so `lm_eval --include_path <EvalResult.task_dir> --tasks scalelab_hellaswag ...` reproduces a run by hand.

Requests are text, the same for every model evaluated on the same task spec, so with `request_cache` they
are built once (lm-eval's own request cache, in a folder keyed by everything that decides them) and their
token ids are kept per tokenizer (scalelab.evals.tokencache): the second model skips both.

    <request_cache>/requests-<sha16>/requests-<task>-<n>shot-....pickle   lm-eval's, every item of each task
    <request_cache>/requests-<sha16>/manifest.json                        the key, counts, build time
    <request_cache>/requests-<sha16>/tokens-<tokenizer sha16>.npz         token ids of the pairs scored so far
    <request_cache>/.locks/                                               held while a folder is built

    run_lm_eval(model, tasks, ...) -> EvalResult      measure (lm_eval.simple_evaluate on lm-eval's HF model)
    write_eval_json(result, path), write_samples(...)  save
    format_eval(result) -> str                          render
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Sequence

from scalelab.core import errors
from scalelab.core.filelock import file_lock
from scalelab.core.jsonio import read_json, write_json
from scalelab.evals import localdata

Source = Literal["local", "hub"]
SOURCES: tuple[str, ...] = ("local", "hub")
PACKAGE_TASK_DIR = Path(__file__).with_name("lmeval")


class EvalInputError(errors.DataError, ValueError):
    """A task name, option or input folder the evaluation cannot use; the message says which and why."""


@dataclass(frozen=True)
class TaskSpec:
    name: str                          # what users ask for; results are reported under it
    hub_task: str                      # lm-eval's own task or group
    local_task: str                    # ours (lmeval/), on the converted local copy
    dataset: str                       # the localdata set the local task reads
    hub_dir: str                       # the folder under lm_eval/tasks/ that defines hub_task
    metrics: tuple[str, ...]           # reported metrics (lm-eval's names, filter "none")
    num_fewshot: int | None = None     # None: the task's own setting


TASKS: dict[str, TaskSpec] = {s.name: s for s in (
    TaskSpec("hellaswag", "hellaswag", "scalelab_hellaswag", "hellaswag", "hellaswag", ("acc", "acc_norm")),
    TaskSpec("arc_easy", "arc_easy", "scalelab_arc_easy", "arc_easy", "arc", ("acc", "acc_norm")),
    TaskSpec("arc_challenge", "arc_challenge", "scalelab_arc_challenge", "arc_challenge", "arc", ("acc", "acc_norm")),
    TaskSpec("piqa", "piqa", "scalelab_piqa", "piqa", "piqa", ("acc", "acc_norm")),
    # 5-shot, the setting MMLU is reported in (Hendrycks et al. 2021); lm-eval's hub group defaults to 0.
    TaskSpec("mmlu", "mmlu", "scalelab_mmlu", "mmlu", "mmlu/default", ("acc",), num_fewshot=5),
    TaskSpec("truthfulqa_mc1", "truthfulqa_mc1", "scalelab_truthfulqa_mc1", "truthfulqa", "truthfulqa", ("acc",)),
    TaskSpec("truthfulqa_mc2", "truthfulqa_mc2", "scalelab_truthfulqa_mc2", "truthfulqa", "truthfulqa", ("acc",)),
)}


@dataclass(frozen=True)
class Metric:
    name: str                          # lm-eval's metric name: acc, acc_norm (mc2's mass is also "acc")
    value: float
    stderr: float | None               # lm-eval's standard error of the mean; None when it reports none


@dataclass(frozen=True)
class TaskResult:
    name: str                          # ours: hellaswag, mmlu, ...; a subtask: lm-eval's name
    lm_eval_task: str                  # the task or group lm-eval ran
    metrics: tuple[Metric, ...]
    n_examples: int                    # scored (after --limit)
    n_available: int                   # in the evaluation split
    num_fewshot: int
    config_sha256: str                 # of lm-eval's resolved task config(s), data file paths left out
    subtasks: tuple["TaskResult", ...] = ()   # a group's members (MMLU's 57 subjects)

    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(f"{self.name}: no metric {name!r}; has {', '.join(m.name for m in self.metrics)}")


@dataclass(frozen=True)
class EvalResult:
    model_path: str
    peft_path: str | None
    source: str
    limit: int | None
    tasks: tuple[TaskResult, ...]
    data: tuple[localdata.ConvertedData, ...]   # local runs: what each converted set was made from
    task_dir: str | None                         # local runs: the binding YAMLs lm-eval indexed
    lm_eval_version: str
    transformers_version: str
    torch_version: str
    dtype: str
    device: str
    batch_size: int | str
    wall_s: float
    request_cache: str | None = None             # the requests folder read (None: requests built in the run)
    tokens: dict = field(default_factory=dict)   # pairs scored, read from the token file, encoded; seconds
    samples: dict[str, list[dict]] = field(default_factory=dict, compare=False, repr=False)

    def task(self, name: str) -> TaskResult:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(f"no task {name!r} in this result; has {', '.join(t.name for t in self.tasks)}")


# ---------------------------------------------------------------------------------------------
# task specs


def resolve_tasks(names: str | Sequence[str]) -> list[TaskSpec]:
    """Specs for task names (a sequence, or one comma-separated string), refusing unknown and repeated ones."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise EvalInputError(f"unknown task(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(TASKS)}")
    if len(set(names)) != len(names):
        raise EvalInputError(f"task list {list(names)} names a task twice")
    return [TASKS[n] for n in names]


def parse_fewshot(items: Sequence[str]) -> dict[str, int]:
    """["mmlu=0", "hellaswag=10"] -> {"mmlu": 0, "hellaswag": 10}."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise EvalInputError(f"--num-fewshot {item!r}: expected TASK=N, e.g. mmlu=5")
        out[name.strip()] = int(value)
    return out


# ---------------------------------------------------------------------------------------------
# local task bindings


def _read_yaml_keys(path: Path) -> dict:
    """A task YAML as plain data, its includes merged under it (as lm-eval merges them); `!function`
    references stay text, as only the task/group keys and data_files are read here."""
    import yaml  # lazy: PyYAML comes with lm-eval, not as a dependency of its own

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    cfg = yaml.load(path.read_text(), Loader=Loader)  # noqa: S506 (SafeLoader plus one scalar tag)
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a YAML mapping")
    includes = cfg.pop("include", [])
    merged: dict = {}
    for inc in [includes] if isinstance(includes, str) else includes:
        merged.update(_read_yaml_keys(path.parent / inc))
    return {**merged, **cfg}


def _binding(path: Path, converted: Mapping[str, localdata.ConvertedData], hf_cache: Path) -> dict | None:
    """The binding for one packaged YAML; None for a task whose data set was not converted (not requested)."""
    cfg = _read_yaml_keys(path)
    if "group" in cfg:
        return {"include": str(path)}
    if "task" not in cfg:
        return None  # a template, reached through the include of the tasks that use it
    kwargs = dict(cfg.get("dataset_kwargs") or {})
    files = kwargs.get("data_files") or {}
    if not files:
        raise ValueError(f"{path}: task {cfg['task']} names no dataset_kwargs.data_files")
    bound = {}
    for split, rel in files.items():
        name, _, stem = str(rel).partition("/")
        if name not in converted:
            return None
        target = converted[name].file(stem.removesuffix(".jsonl"))
        if not target.is_file():
            raise FileNotFoundError(f"{path}: task {cfg['task']} reads {rel}, which the {name} converter did not "
                                    f"write (in {converted[name].folder})")
        bound[split] = str(target)
    # cache_dir: the datasets library's arrow copies (and process_docs results) stay beside our converted
    # files instead of in ~/.cache/huggingface, and go when this cache is cleared.
    return {"include": str(path), "dataset_kwargs": {**kwargs, "data_files": bound, "cache_dir": str(hf_cache)}}


def bind_local_tasks(converted: Mapping[str, localdata.ConvertedData], cache_dir: Path) -> Path:
    """<cache>/tasks-<sha16>/: one binding per packaged group YAML and per task YAML whose data is converted."""
    import yaml  # lazy: PyYAML comes with lm-eval, not as a dependency of its own
    bindings = {}
    for path in sorted(PACKAGE_TASK_DIR.rglob("*.yaml")):
        b = _binding(path.resolve(), converted, cache_dir.resolve() / "hf-datasets")
        if b is not None:
            bindings[path.relative_to(PACKAGE_TASK_DIR).as_posix()] = yaml.safe_dump(b, sort_keys=True)
    # Keyed by the bindings' text, which names the packaged YAMLs and the converted files by path: another
    # data version or install location gets its own folder; the definitions themselves are read live.
    texts = "".join(f"{k}\n{v}" for k, v in sorted(bindings.items()))
    target = cache_dir / f"tasks-{hashlib.sha256(texts.encode()).hexdigest()[:16]}"
    if not target.is_dir():
        localdata.write_folder(target, bindings)
    return target


# ---------------------------------------------------------------------------------------------
# lm-eval task objects


def task_manager(specs: Sequence[TaskSpec], source: Source, task_dir: Path | None):
    """A TaskManager that indexes only the folders the requested tasks live in: lm-eval's full index reads
    ~15,000 YAML files (about a minute on a busy CPU), for seven tasks."""
    import lm_eval.tasks  # lazy: lm-eval is heavy to import and needed only to evaluate
    from lm_eval.tasks import TaskManager
    if source == "local":
        return TaskManager(include_path=str(task_dir), include_defaults=False)
    root = Path(lm_eval.tasks.__file__).parent
    dirs = sorted({str(root / s.hub_dir) for s in specs if (root / s.hub_dir).is_dir()})
    tm = TaskManager(include_path=dirs, include_defaults=False) if dirs else None
    if tm is None or any(s.hub_task not in tm.all_tasks for s in specs):
        tm = TaskManager()  # this lm-eval version keeps them elsewhere
    return tm


def lm_eval_name(spec: TaskSpec, source: Source) -> str:
    return spec.local_task if source == "local" else spec.hub_task


def load_tasks(tm, specs: Sequence[TaskSpec], source: Source, fewshot: Mapping[str, int]) -> list:
    """The Task (or Group) object per spec, each leaf task's num_fewshot set: the override, else the spec's."""
    objects = []
    for spec in specs:
        name = lm_eval_name(spec, source)
        if name not in tm.all_tasks:
            raise KeyError(f"lm-eval has no task or group {name!r} (for {spec.name}, source={source}); "
                           "a YAML it could not parse is skipped silently, so check the definition")
        loaded = tm.load([name])
        n = fewshot.get(spec.name, spec.num_fewshot)
        for task in loaded["tasks"].values():
            if n is not None and n != task.get_config("num_fewshot"):
                if task.get_config("num_fewshot") == 0 and n > 0:
                    # A YAML that pins 0 carries its examples in the prompt (TruthfulQA's primer); lm-eval's
                    # --num_fewshot skips such tasks with a warning, an explicit per-task request is refused.
                    raise EvalInputError(f"{spec.name}: defined zero-shot (its prompt holds its examples); "
                                     f"num_fewshot={n} refused")
                task.set_config(key="num_fewshot", value=n)
        groups = loaded.get("groups", {})
        objects.append(groups[name] if name in groups else loaded["tasks"][name])
    return objects


# ---------------------------------------------------------------------------------------------
# lm-eval's results -> records

_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _portable(cfg: dict) -> dict:
    """A task config less what differs between machines running the same definition on the same data: the
    paths of the converted files (their content is pinned by ConvertedData.source_sha256), of the datasets
    cache and of the YAML, and the memory addresses in printed function objects."""
    cfg = json.loads(_ADDRESS.sub("", json.dumps(cfg, sort_keys=True, default=str)))
    for key in ("data_files", "cache_dir"):
        cfg.get("dataset_kwargs", {}).pop(key, None)
    cfg.get("metadata", {}).pop("config_source", None)
    return cfg


def config_sha256(configs: Sequence[dict]) -> str:
    text = json.dumps([_portable(c) for c in configs], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _reported_name(lm_name: str) -> str:
    # Subtasks are reported under lm-eval's hub names (mmlu_anatomy), whichever source ran them.
    return lm_name.removeprefix("scalelab_")


def _leaves(raw: dict, name: str) -> list[str]:
    children = raw.get("group_subtasks", {}).get(name)
    return [name] if children is None else [leaf for c in children for leaf in _leaves(raw, c)]


def _metrics(raw: dict, lm_name: str, names: Sequence[str]) -> tuple[Metric, ...]:
    row = raw["results"][lm_name]
    missing = [n for n in names if f"{n},none" not in row]
    if missing:
        raise KeyError(f"lm-eval reported no {', '.join(missing)} for {lm_name}; it reported {sorted(row)}")
    out = []
    for n in names:
        stderr = row.get(f"{n}_stderr,none")  # "N/A" when it could not compute one (e.g. a single example)
        out.append(Metric(n, float(row[f"{n},none"]), float(stderr) if isinstance(stderr, (int, float)) else None))
    return tuple(out)


def task_result(raw: dict, lm_name: str, metrics: Sequence[str], name: str | None = None) -> TaskResult:
    """One task or group from simple_evaluate's output; a group's counts are its leaves' sums."""
    leaves, counts = _leaves(raw, lm_name), raw["n-samples"]
    children = raw.get("group_subtasks", {}).get(lm_name, [])
    return TaskResult(name=name or _reported_name(lm_name), lm_eval_task=lm_name,
                      metrics=_metrics(raw, lm_name, metrics),
                      n_examples=sum(int(counts[t]["effective"]) for t in leaves),
                      n_available=sum(int(counts[t]["original"]) for t in leaves),
                      num_fewshot=max(int(raw["n-shot"][t]) for t in leaves),
                      config_sha256=config_sha256([raw["configs"][t] for t in leaves]),
                      subtasks=tuple(task_result(raw, c, metrics) for c in children))


def _samples(raw: dict, metrics: Sequence[str]) -> dict[str, list[dict]]:
    """Per scored item: the choices' summed log-likelihoods (lm-eval's filtered responses) and its metrics."""
    out = {}
    for lm_name, items in raw.get("samples", {}).items():
        out[_reported_name(lm_name)] = [
            {"doc_id": int(s["doc_id"]), "target": s["target"],
             "loglikelihoods": [float(r[0]) for r in s["filtered_resps"]],
             **{m: float(s[m]) for m in metrics if m in s}} for s in items]
    return out


# ---------------------------------------------------------------------------------------------
# request cache

# Part of the request-cache key: bump it when what a requests folder holds changes.
REQUESTS_FORMAT = 1
REQUESTS_MANIFEST = "manifest.json"
# How simple_evaluate is asked to build requests (its defaults, given explicitly): build_requests builds with
# the same, as lm-eval's cache file name records them and a run looks up only the name it would write.
# Without a chat template, multi-turn few-shot changes no text.
REQUEST_ARGS: dict[str, Any] = {"system_instruction": None, "apply_chat_template": False,
                                "fewshot_as_multiturn": True}


def fewshot_seed() -> int:
    """The seed of each task's few-shot sampler: lm-eval's default, passed to simple_evaluate explicitly so
    that requests built ahead of it (build_requests) draw the same exemplars."""
    from lm_eval.defaults import DEFAULT_OTHER_SEED  # lazy: lm-eval is heavy to import and needed only to evaluate
    return DEFAULT_OTHER_SEED


def definitions_sha256() -> str:
    """Of our packaged task definitions, every YAML and Python file: lm-eval's resolved config names a
    `!function` by name only, so an edit to its body has to change the request-cache key by itself."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_TASK_DIR.rglob("*")):
        if path.suffix in (".yaml", ".py") and path.is_file():
            h.update(f"{path.relative_to(PACKAGE_TASK_DIR).as_posix()}\n".encode() + path.read_bytes() + b"\0")
    return h.hexdigest()


def requests_key(leaves: Mapping[str, Any], seed: int) -> dict:
    """What decides the requests lm-eval builds for these leaf tasks: each one's resolved config (num_fewshot
    set; its data files are the converted copies, whose paths carry their content's sha256), our definitions'
    files, the few-shot seed, and the lm-eval and datasets versions that read them. No model or tokenizer:
    requests are text (token ids are keyed apart, by tokenizer). lm-eval's own cache file name holds only the
    task name and shot count, hence this folder level."""
    import datasets  # lazy: datasets is optional (the hub extra; trl brings it)
    import lm_eval  # lazy: lm-eval is heavy to import and needed only to evaluate
    configs = {name: json.loads(_ADDRESS.sub("", json.dumps(t.dump_config(), sort_keys=True, default=str)))
               for name, t in sorted(leaves.items())}
    return {"format": REQUESTS_FORMAT, "lm_eval": lm_eval.__version__, "datasets": datasets.__version__,
            "definitions_sha256": definitions_sha256(), "fewshot_seed": seed, "request_args": REQUEST_ARGS,
            "tasks": configs}


@contextlib.contextmanager
def lm_eval_cache_path(folder: Path) -> Iterator[None]:
    """Point lm-eval's request cache at `folder` meanwhile. Its location is a module global, read from
    LM_HARNESS_CACHE_PATH once at import (default: inside the installed package), so this sets the global."""
    from lm_eval.caching import cache  # lazy: lm-eval is heavy to import and needed only to evaluate
    before = cache.PATH
    cache.PATH = str(folder)
    try:
        yield
    finally:
        cache.PATH = before


def build_requests(leaves: Mapping[str, Any], seed: int, root: str | Path) -> Path:
    """<root>/requests-<sha16>/: lm-eval's request cache for these leaf tasks, every item of each (as lm-eval
    caches them; a run with a limit reads the first ones). Built by the first process to get here, in a
    temporary folder renamed into place under a lock: processes over one cache (a battery's sides, several
    batteries on one host) wait for it and never read a file being written."""
    root = Path(root)
    key = requests_key(leaves, seed)
    folder = root / f"requests-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}"
    if folder.is_dir():
        return folder
    with file_lock(root / ".locks" / f"{folder.name}.lock"):
        if folder.is_dir():
            return folder
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))  # root exists: the lock made it
        counts = {}
        with lm_eval_cache_path(tmp):
            for name, task in sorted(leaves.items()):
                task.set_fewshot_seed(seed=seed)  # as simple_evaluate does before it builds requests
                task.build_all_requests(cache_requests=True, rewrite_requests_cache=True, chat_template=None,
                                        tokenizer_name="", **REQUEST_ARGS)
                counts[name] = len(task.instances)
        write_json(tmp / REQUESTS_MANIFEST, {"key": key, "requests": counts, "build_s": time.perf_counter() - t0})
        os.rename(tmp, folder)
    return folder


def requests_manifest(folder: str | Path) -> dict:
    return read_json(Path(folder) / REQUESTS_MANIFEST)


# ---------------------------------------------------------------------------------------------
# measure


def prepare_local(specs: Sequence[TaskSpec], data_dir: str | Path | None,
                  cache_dir: str | Path | None) -> tuple[tuple[localdata.ConvertedData, ...], Path]:
    """Convert the data sets the tasks read (once per source sha256) and bind our task YAMLs to them."""
    if data_dir is None:
        raise EvalInputError("source='local' needs data_dir: the shared data folder (e.g. ../shared/data)")
    if not Path(data_dir).is_dir():
        raise FileNotFoundError(f"data dir {data_dir}: not found (source='local' reads the evaluation sets there)")
    cache = Path(cache_dir) if cache_dir else localdata.default_cache_dir()
    converted = {s.dataset: localdata.convert(s.dataset, data_dir, cache) for s in specs}
    return tuple(converted.values()), bind_local_tasks(converted, cache)


def _model_args(model_path: Path, dtype: str, peft_path: str | Path | None) -> dict[str, Any]:
    # trust_remote_code stays False: the folder is loaded by transformers' own classes, never its code.
    args: dict[str, Any] = {"pretrained": str(model_path), "dtype": dtype, "trust_remote_code": False}
    if peft_path is not None:
        if not (Path(peft_path) / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{peft_path}: no adapter_config.json (expected a peft adapter folder)")
        args["peft"] = str(peft_path)
    return args


def _model_folder(model_path: str | Path) -> Path:
    """A folder as given, or a registry name's cached folder (core.models; fetched on first use)."""
    from scalelab.core.models import registry, resolve
    return Path(resolve(str(model_path))) if str(model_path) in registry() else Path(model_path)


def _check_inputs(model_path: Path, source: str, specs: Sequence[TaskSpec], fewshot: Mapping[str, int],
                  limit: int | None, request_cache: str | Path | None = None) -> None:
    if source not in SOURCES:
        raise EvalInputError(f"source {source!r}: expected one of {', '.join(SOURCES)}")
    if request_cache is not None and source != "local":
        raise EvalInputError("request_cache needs source='local': hub data is not pinned by content, so built "
                             "requests could outlive the data they were built from")
    if not (model_path / "config.json").is_file():
        raise FileNotFoundError(f"{model_path}: no config.json (expected an HF model folder, "
                                "e.g. an exported run's hf/)")
    if limit is not None and limit < 1:
        raise EvalInputError(f"limit {limit}: must be >= 1 (or None for every item)")
    stray = sorted(set(fewshot) - {s.name for s in specs})
    if stray:
        raise EvalInputError(f"num_fewshot given for {', '.join(stray)}, which is not among the tasks run")


class ChoiceTooLongError(EvalInputError):
    """A choice has more tokens than the model's context: lm-eval cannot score it (it asserts)."""


def explain_assertion(e: AssertionError, model_path: Path) -> Exception:
    """lm-eval's bare `assert len(continuation_enc) <= self.max_length` as an error that says what to do;
    any other assertion is returned as it was."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames or "continuation_enc" not in (frames[-1].line or ""):
        return e
    cfg = json.loads((model_path / "config.json").read_text())
    context = cfg.get("n_positions") or cfg.get("max_position_embeddings") or "?"
    return ChoiceTooLongError(
        f"{model_path}: a choice is longer than the model's {context}-token context, and lm-eval cannot score it "
        f"(in GPT-2 tokens, PIQA's longest solution is 246, HellaSwag's longest ending 87). Leave the task out, "
        f"score fewer items (--limit), or evaluate a model with a longer context.")


def run_lm_eval(model_path: str | Path, tasks: str | Sequence[str], source: Source = "local",
                data_dir: str | Path | None = None, limit: int | None = None, batch_size: int | str = 8,
                device: str = "cpu", dtype: str = "float32", num_fewshot: Mapping[str, int] | None = None,
                peft_path: str | Path | None = None, cache_dir: str | Path | None = None,
                log_samples: bool = False, request_cache: str | Path | None = None) -> EvalResult:
    """Evaluate an HF model folder (or a registry name's folder) on `tasks` (names in TASKS) through
    lm_eval.simple_evaluate.

    request_cache: a folder where the requests (and, per tokenizer, their token ids) are kept for every later
    run with the same task spec; source="local" only. The per-item results are the same with or without."""
    import lm_eval  # lazy: lm-eval is heavy to import and needed only to evaluate
    import torch  # lazy: torch takes seconds to import, and this module is used without it
    import transformers  # lazy: transformers takes seconds to import

    from scalelab.evals.tokencache import TokenCachedHFLM  # lazy: tokencache imports lm_eval
    model_path, specs, fewshot = _model_folder(model_path), resolve_tasks(tasks), dict(num_fewshot or {})
    _check_inputs(model_path, source, specs, fewshot, limit, request_cache)
    data, task_dir = prepare_local(specs, data_dir, cache_dir) if source == "local" else ((), None)
    tm = task_manager(specs, source, task_dir)
    objects = load_tasks(tm, specs, source, fewshot)
    start, seed = time.perf_counter(), fewshot_seed()
    requests = None if request_cache is None else build_requests(tm.load(objects)["tasks"], seed, request_cache)
    # lm-eval's HF model ("hf"), built as simple_evaluate builds it from a name; only how loglikelihood pairs
    # are tokenized differs (each distinct string once, batched; kept beside the requests when cached)
    lm = TokenCachedHFLM.create_from_arg_obj(
        {**_model_args(model_path, dtype, peft_path), "token_cache": None if requests is None else str(requests)},
        {"batch_size": batch_size, "device": device})
    try:
        with lm_eval_cache_path(requests) if requests is not None else contextlib.nullcontext():
            raw = lm_eval.simple_evaluate(model=lm, tasks=objects, task_manager=tm, limit=limit,
                                          batch_size=batch_size, device=device, log_samples=log_samples,
                                          cache_requests=requests is not None, fewshot_random_seed=seed,
                                          **REQUEST_ARGS)
    except AssertionError as e:
        raise explain_assertion(e, model_path) from e
    wall = time.perf_counter() - start
    metrics = sorted({m for s in specs for m in s.metrics})
    return EvalResult(
        model_path=str(model_path), peft_path=None if peft_path is None else str(peft_path), source=source,
        limit=limit, tasks=tuple(task_result(raw, lm_eval_name(s, source), s.metrics, s.name) for s in specs),
        data=data, task_dir=None if task_dir is None else str(task_dir),
        lm_eval_version=str(raw.get("lm_eval_version") or lm_eval.__version__),
        transformers_version=transformers.__version__, torch_version=torch.__version__, dtype=dtype,
        device=device, batch_size=batch_size, wall_s=wall, request_cache=None if requests is None else str(requests),
        tokens=dict(lm.token_stats), samples=_samples(raw, metrics) if log_samples else {})


# ---------------------------------------------------------------------------------------------
# save and render


def result_dict(r: EvalResult) -> dict:
    d = asdict(r)
    d.pop("samples")  # per-item records go to their own file (write_samples)
    return d


def write_eval_json(r: EvalResult, path: str | Path, provenance: dict | None = None) -> Path:
    """The result as JSON; `provenance` (git sha, command) is stored beside it when given, so the file names the
    code and command that made it even when read apart from its folder."""
    write_json(path, {**result_dict(r), **({"provenance": provenance} if provenance else {})})
    return Path(path)


def write_samples(r: EvalResult, path: str | Path) -> Path:
    """One JSON line per scored item: {"task", "doc_id", "target", "loglikelihoods", <metrics>}."""
    lines = [json.dumps({"task": task, **item}) + "\n" for task, items in r.samples.items() for item in items]
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(lines))
    tmp.replace(path)
    return path


def _rows(t: TaskResult) -> list[str]:
    rows = []
    for i, m in enumerate(t.metrics):
        stderr = "" if m.stderr is None else f"±{m.stderr:.4f}"
        head = (t.name, f"{t.n_examples}/{t.n_available}", str(t.num_fewshot)) if i == 0 else ("", "", "")
        rows.append(f"{head[0]:16s} {m.name:9s} {m.value:7.4f} {stderr:>8s} {head[1]:>12s} {head[2]:>5s}")
    return rows


def format_eval(r: EvalResult) -> str:
    where = f"local copies ({r.task_dir})" if r.source == "local" else "hub"
    lines = [f"{r.model_path}{f' + {r.peft_path}' if r.peft_path else ''}: lm-eval {r.lm_eval_version}, "
             f"data from {where}, {r.wall_s:.1f} s",
             f"{'task':16s} {'metric':9s} {'value':>7s} {'stderr':>8s} {'n/of':>12s} {'shots':>5s}"]
    for t in r.tasks:
        lines += _rows(t)
    return "\n".join(lines)
