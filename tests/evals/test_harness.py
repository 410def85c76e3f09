"""lm-eval on local data: our task definitions against lm-eval's own (same requests on the same rows), a real
lm_eval run on a tiny exported GPT-2 checked item by item against the HF model scored directly, MMLU and
TruthfulQA at a tiny limit, the `scalelab pretrain eval` verb, and the errors users meet first."""
from __future__ import annotations

import bz2
import json
import math
import re
from pathlib import Path

import pytest
import torch

from scalelab.evals import harness
from scalelab.evals.harness import TASKS, config_sha256, run_lm_eval
from scalelab.evals.lmeval import utils as task_utils

LIMIT = 20
N_AVAILABLE = {"hellaswag": 10042, "arc_easy": 2376, "piqa": 1838}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lmeval-cache")


# ---------------------------------------------------------------------------------------------
# task definitions: ours vs lm-eval's hub tasks, on the same converted rows

# lm-eval's hub YAML retargeted at our converted rows: only where the data comes from changes, so any
# difference in the requests built is a difference in the task definitions.
_RETARGET = {"dataset_path": "json", "dataset_name": None, "training_split": None}


def _hub_yaml(spec_name: str, subject: str | None = None) -> Path:
    import lm_eval.tasks
    root = Path(lm_eval.tasks.__file__).parent / TASKS[spec_name].hub_dir
    return root / (f"mmlu_{subject}.yaml" if subject else f"{TASKS[spec_name].hub_task}.yaml")


def _retargeted(tmp: Path, name: str, hub_yaml: Path, data_files: dict, **extra) -> None:
    import yaml
    cfg = {"include": str(hub_yaml), "task": name, **_RETARGET, **extra,
           "dataset_kwargs": {"data_files": data_files, "cache_dir": str(tmp / "hf")}}
    if "validation" not in data_files:
        cfg["validation_split"] = None
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(cfg))


def _requests(task, n: int) -> list[tuple]:
    """The (context, continuation) pairs lm-eval would score for ~n items spread over the whole split (all of
    them is minutes of template rendering on a busy CPU; HellaSwag's WikiHow half starts past item 3,000)."""
    step = max(1, len(task.eval_docs) // n)
    task.build_all_requests(samples=list(range(0, len(task.eval_docs), step)))
    return [(i.doc_id, i.idx, i.args) for i in task.instances]


@pytest.fixture(scope="module")
def both_definitions(shared_data, cache, tmp_path_factory):
    """(ours, hub's) TaskManager-loaded pairs for every task, MMLU per subject."""
    from lm_eval.tasks import TaskManager
    specs = list(TASKS.values())
    data, task_dir = harness.prepare_local(specs, shared_data, cache)
    files = {d.name: d for d in data}
    tmp = tmp_path_factory.mktemp("hub-retargeted")
    for name in ("hellaswag", "arc_easy", "arc_challenge", "piqa", "truthfulqa_mc1", "truthfulqa_mc2"):
        d = files[TASKS[name].dataset]
        split = d.rows[0][0]
        _retargeted(tmp, f"hub_{name}", _hub_yaml(name), {split: str(d.file(split))})
    subjects = sorted(stem.removesuffix("_test") for stem, _ in files["mmlu"].rows if stem.endswith("_test"))
    for s in subjects:
        _retargeted(tmp, f"hub_mmlu_{s}", _hub_yaml("mmlu", s),
                    {"test": str(files["mmlu"].file(f"{s}_test")), "dev": str(files["mmlu"].file(f"{s}_dev"))})
    return TaskManager(include_path=[str(task_dir), str(tmp)], include_defaults=False), subjects


@pytest.mark.parametrize("name", ["hellaswag", "arc_easy", "arc_challenge", "piqa", "truthfulqa_mc1",
                                  "truthfulqa_mc2"])
def test_local_task_builds_the_requests_lm_evals_hub_task_builds(both_definitions, name):
    tm, _ = both_definitions
    loaded = tm.load([TASKS[name].local_task, f"hub_{name}"])["tasks"]
    ours, hub = loaded[TASKS[name].local_task], loaded[f"hub_{name}"]
    mine = _requests(ours, 100)
    assert mine == _requests(hub, 100)
    assert len({doc_id for doc_id, _, _ in mine}) >= 100


def test_mmlu_5_shot_requests_match_lm_eval_per_subject(both_definitions):
    tm, subjects = both_definitions
    assert len(subjects) == 57
    for s in subjects:
        loaded = tm.load([f"scalelab_mmlu_{s}", f"hub_mmlu_{s}"])["tasks"]
        ours, hub = loaded[f"scalelab_mmlu_{s}"], loaded[f"hub_mmlu_{s}"]
        hub.set_config(key="num_fewshot", value=5)  # lm-eval's hub template leaves it to the command line
        assert ours.get_config("num_fewshot") == 5
        mine, theirs = _requests(ours, 1), _requests(hub, 1)
        assert mine == theirs, s
        context = mine[0][2][0]
        # the subject line, then five dev exemplars with their answers, then the question
        assert context.startswith(f"The following are multiple choice questions (with answers) about "
                                  f"{s.replace('_', ' ')}.\n\n")
        assert context.count("\nAnswer:") == 6


def test_truthfulqa_mc2_scores_as_lm_evals(both_definitions):
    tm, _ = both_definitions
    loaded = tm.load(["scalelab_truthfulqa_mc2", "hub_truthfulqa_mc2"])["tasks"]
    ours, hub = loaded["scalelab_truthfulqa_mc2"], loaded["hub_truthfulqa_mc2"]
    gen = torch.Generator().manual_seed(0)
    for doc in list(ours.eval_docs)[:20]:
        lls = (-40 * torch.rand(len(doc["mc2_targets"]["choices"]), generator=gen)).tolist()
        results = [(ll, False) for ll in lls]
        assert ours.process_results(doc, results)["acc"] == pytest.approx(hub.process_results(doc, results)["acc"],
                                                                          rel=1e-9)


# ---------------------------------------------------------------------------------------------
# the functions the YAMLs call, against hand-computed values


def test_hellaswag_doc_capitalizes_ctx_b_and_strips_wikihow_markup_as_lm_eval_does():
    doc = {"activity_label": "Health", "ctx_a": "[header] How to rest [title] Lie down. [step] Close your eyes.",
           "ctx_b": "", "endings": ["[title] Breathe slowly.", "Sleep  now.", "a", "b"], "label": "1"}
    out = task_utils._hellaswag_doc(doc)
    assert out["query"] == "Health: How to rest. Lie down. Close your eyes."
    # lm-eval strips before removing markers, so an ending that began with one keeps a leading space
    assert out["choices"][:2] == [" Breathe slowly.", "Sleep now."] and out["gold"] == 1
    anet = {"activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
            "endings": ["w", "x", "y", "z"], "label": "3"}
    assert task_utils._hellaswag_doc(anet)["query"] == "Roof shingle removal: A man is sitting on a roof. He"


def test_truthfulqa_mc2_is_the_normalized_mass_on_true_answers():
    doc = {"mc2_targets": {"labels": [1, 0, 1]}}
    lls = [math.log(0.5), math.log(0.25), math.log(0.25)]
    assert task_utils.truthfulqa_mc2(doc, [(ll, False) for ll in lls])["acc"] == pytest.approx(0.75)
    # log-likelihoods of long answers: exp() of them underflows to 0/0 unless shifted first
    far = task_utils.truthfulqa_mc2({"mc2_targets": {"labels": [1, 0]}}, [(-2000.0, False), (-2001.0, False)])
    assert far["acc"] == pytest.approx(1 / (1 + math.exp(-1)))


def test_config_hash_ignores_machine_paths_but_not_the_definition():
    cfg = {"task": "t", "doc_to_text": "Q: {{q}}", "dataset_kwargs": {"data_files": {"test": "/a/x.jsonl"},
           "cache_dir": "/a/hf"}, "metadata": {"version": 1.0, "config_source": "/a/t.yaml"},
           "fewshot_config": {"process_docs": "<function docs at 0x7f00aa>"}}
    moved = {**cfg, "dataset_kwargs": {"data_files": {"test": "/b/x.jsonl"}, "cache_dir": "/b/hf"},
             "metadata": {"version": 1.0, "config_source": "/b/t.yaml"},
             "fewshot_config": {"process_docs": "<function docs at 0x7f11bb>"}}
    assert config_sha256([cfg]) == config_sha256([moved])
    assert config_sha256([cfg]) != config_sha256([{**cfg, "doc_to_text": "Question: {{q}}"}])
    assert config_sha256([cfg]) != config_sha256([{**cfg, "metadata": {"version": 2.0}}])


# ---------------------------------------------------------------------------------------------
# a real lm_eval run on a tiny exported GPT-2, through `scalelab pretrain eval`


@pytest.fixture(scope="module")
def evaluated_run(shared_data, cache, tmp_path_factory):
    """A run folder with a checkpoint and no export, evaluated by the CLI: (run folder, printed output)."""
    import contextlib
    import io

    from scalelab.cli import main
    from tests.pretrain.test_export import make_run
    run = tmp_path_factory.mktemp("eval") / "run"
    make_run(run, "model.block_size=256")  # random weights; 256 positions hold every item scored below
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["pretrain", "eval", str(run), "--tasks", "hellaswag,arc_easy,piqa", "--limit", str(LIMIT),
                   "--data-dir", str(shared_data), "--cache-dir", str(cache), "--log-samples"])
    assert rc == 0
    return run, out.getvalue()


def test_cli_exports_the_run_writes_eval_json_and_logs_an_event(evaluated_run):
    run, printed = evaluated_run
    assert (run / "hf" / "model.safetensors").is_file()  # exported first: the run had only a checkpoint
    result = json.loads((run / "eval.json").read_text())
    assert result["source"] == "local" and result["limit"] == LIMIT and result["lm_eval_version"] == "0.4.13"
    assert set(result["provenance"]) == {"git_sha", "command"} and result["provenance"]["git_sha"]
    assert [t["name"] for t in result["tasks"]] == ["hellaswag", "arc_easy", "piqa"]
    for t in result["tasks"]:
        assert t["n_examples"] == LIMIT and t["n_available"] == N_AVAILABLE[t["name"]] and t["num_fewshot"] == 0
        assert [m["name"] for m in t["metrics"]] == ["acc", "acc_norm"]
        assert all(0.0 <= m["value"] <= 1.0 and m["stderr"] > 0 for m in t["metrics"])
        assert re.fullmatch(r"[0-9a-f]{64}", t["config_sha256"])
    assert {d["name"] for d in result["data"]} == {"hellaswag", "arc_easy", "piqa"}
    event = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert event["event"] == "eval" and event["file"] == str(run / "eval.json")
    assert event["metrics"]["piqa"] == {m["name"]: m["value"] for m in result["tasks"][2]["metrics"]}
    assert re.search(r"^hellaswag\s+acc\s+0\.\d{4}\s+±0\.\d{4}\s+20/10042\s+0$", printed, re.M)


def _local_items(shared_data: Path, name: str, n: int) -> list[tuple[str, list[str], int]]:
    """(context, choices, gold) for the first n items, read from the local files by the tasks' published
    prompt formats, without the converters."""
    if name == "hellaswag":
        text = bz2.decompress((shared_data / "hellaswag/hellaswag_val_full.txt.bz2").read_bytes()).decode()
        lines, items = text.split("\n"), []
        for k in range(n):
            header, gold, *endings = lines[6 * k:6 * k + 6]
            assert "[" not in header + "".join(endings) and "  " not in header  # nothing for the clean-up to do
            head, _, tail = header.rpartition(". ")  # ActivityNet: the sentence to complete starts lower-case
            items.append((f"{head}. {tail.capitalize()}", endings, int(gold)))
        return items
    path = shared_data / "llmfoundry_icl" / f"{name}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()[:n]]
    return [(r["query"].removesuffix("\n") + "\nAnswer:", r["choices"], r["gold"]) for r in rows]


@torch.no_grad()
def _choice_logliks(model, tok, context: str, choices: list[str]) -> list[float]:
    """Summed log p(" " + choice | context) per choice, each scored on its own unpadded sequence."""
    ctx = tok(context)["input_ids"]
    out = []
    for choice in choices:
        cont = tok(" " + choice)["input_ids"]
        ids = torch.tensor([ctx + cont])
        assert ids.shape[1] <= model.config.n_positions  # no truncation in play
        # position len(ctx)-1+j predicts continuation token j
        logp = torch.log_softmax(model(ids).logits[0, len(ctx) - 1:-1].float(), dim=-1)  # (len(cont), vocab)
        out.append(logp[torch.arange(len(cont)), torch.tensor(cont)].sum().item())
    return out


@pytest.fixture(scope="module")
def hf_model(evaluated_run):
    from transformers import AutoTokenizer, GPT2LMHeadModel
    run, _ = evaluated_run
    return GPT2LMHeadModel.from_pretrained(run / "hf").eval(), AutoTokenizer.from_pretrained(run / "hf")


@pytest.mark.parametrize("name", ["hellaswag", "arc_easy", "piqa"])
def test_acc_and_acc_norm_equal_the_hf_model_scored_directly(evaluated_run, hf_model, shared_data, name):
    run, _ = evaluated_run
    model, tok = hf_model
    samples = sorted((json.loads(line) for line in (run / "eval_samples.jsonl").read_text().splitlines()
                      if json.loads(line)["task"] == name), key=lambda s: s["doc_id"])
    assert [s["doc_id"] for s in samples] == list(range(LIMIT))
    acc, acc_norm = [], []
    for (context, choices, gold), sample in zip(_local_items(shared_data, name, LIMIT), samples):
        lls = _choice_logliks(model, tok, context, choices)
        assert sample["loglikelihoods"] == pytest.approx(lls, abs=2e-3)
        acc.append(float(max(range(len(lls)), key=lls.__getitem__) == gold))
        # acc_norm: log-likelihood per character of the choice (lm-eval's multiple_choice definition)
        per_char = [ll / len(c) for ll, c in zip(lls, choices)]
        acc_norm.append(float(max(range(len(lls)), key=per_char.__getitem__) == gold))
        assert (sample["acc"], sample["acc_norm"]) == (acc[-1], acc_norm[-1])
    result = json.loads((run / "eval.json").read_text())
    task = next(t for t in result["tasks"] if t["name"] == name)
    values = {m["name"]: m["value"] for m in task["metrics"]}
    assert values["acc"] == pytest.approx(sum(acc) / LIMIT)
    assert values["acc_norm"] == pytest.approx(sum(acc_norm) / LIMIT)


def test_mmlu_5_shot_and_truthfulqa_at_a_tiny_limit(evaluated_run, shared_data, cache):
    run, _ = evaluated_run
    r = run_lm_eval(run / "hf", ["mmlu", "truthfulqa_mc1", "truthfulqa_mc2"], data_dir=shared_data, limit=1,
                    cache_dir=cache, log_samples=True)
    mmlu = r.task("mmlu")
    assert (mmlu.n_examples, mmlu.n_available, mmlu.num_fewshot) == (57, 14042, 5)  # limit is per subject
    assert [c.name for c in mmlu.subtasks] == ["mmlu_stem", "mmlu_other", "mmlu_social_sciences", "mmlu_humanities"]
    subjects = [s for c in mmlu.subtasks for s in c.subtasks]
    assert len(subjects) == 57 and sum(c.n_examples for c in mmlu.subtasks) == 57
    # every question weighs the same: the overall score is the mean over the 57 subjects' single items
    assert mmlu.metric("acc").value == pytest.approx(sum(s.metric("acc").value for s in subjects) / 57)
    for name in ("truthfulqa_mc1", "truthfulqa_mc2"):
        t = r.task(name)
        assert (t.n_examples, t.n_available, t.num_fewshot) == (1, 790, 0)
        assert 0.0 <= t.metric("acc").value <= 1.0
    first = json.loads((shared_data / "truthfulqa/mc_task.json").read_text())[0]
    labels = list(first["mc2_targets"].values())
    lls = r.samples["truthfulqa_mc2"][0]["loglikelihoods"]
    assert len(lls) == len(labels) == 13
    p = [math.exp(ll - max(lls)) for ll in lls]
    mass = sum(pi for pi, y in zip(p, labels) if y == 1) / sum(p)
    assert r.task("truthfulqa_mc2").metric("acc").value == pytest.approx(mass)
    mc1 = r.samples["truthfulqa_mc1"][0]
    assert mc1["acc"] == float(mc1["loglikelihoods"].index(max(mc1["loglikelihoods"])) == 0)


# ---------------------------------------------------------------------------------------------
# request_cache: requests built once, token ids kept per tokenizer; the same items, and read the second time


def test_token_cached_lm_encodes_pairs_as_lm_eval_does(evaluated_run):
    from lm_eval.models.huggingface import HFLM

    from scalelab.evals.tokencache import TokenCachedHFLM
    run, _ = evaluated_run
    lm = TokenCachedHFLM(pretrained=str(run / "hf"), device="cpu", batch_size=1)
    prefix = lm.tokenizer.decode(lm.prefix_token_id)
    pairs = [("Question: 2 + 2 =\nAnswer:", " 4"), ("Answer:", " A"), ("The sky is  ", "blue"),  # spaces move
             (f"{prefix}Starts with the prefix token.", " yes"), ("Ünïcode — ok", " ✓"), ("a", "")]
    # HFLM._encode_pair is lm-eval's own (TemplateLM's), one tok_encode per string
    assert lm.encode_pairs(pairs) == {p: HFLM._encode_pair(lm, *p) for p in pairs}


def test_pair_table_merges_and_keys_by_both_strings(tmp_path):
    from scalelab.evals.tokencache import PairTable, merge_into, pair_digest
    a = {pair_digest("ctx", " A"): ([1, 2, 3], [4]), pair_digest("ctx", " B"): ([1, 2, 3], [5])}
    b = {pair_digest("other", ""): ([7], []), pair_digest("ct", "x A"): ([1, 2], [9, 4])}
    path = tmp_path / "tokens-x.npz"
    assert merge_into(path, a) == 2 and merge_into(path, b) == 4  # a second writer adds to the first's
    table = PairTable.read(path)
    assert dict(table.items()) == {**a, **b}
    assert len(table.ctx_off) - 1 == 3  # the two choices of "ctx" share one stored context
    assert table.get(pair_digest("ctx", " C")) is None


def test_request_cache_gives_the_same_items_and_the_second_run_reads_it(evaluated_run, shared_data, cache,
                                                                        tmp_path, monkeypatch):
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.models.huggingface import HFLM

    from scalelab.evals.tokencache import TokenCachedHFLM
    run, _ = evaluated_run
    kw = {"data_dir": shared_data, "cache_dir": cache, "limit": 1, "log_samples": True}
    with monkeypatch.context() as m:  # lm-eval's own tokenization: one encode per string, every pair
        m.setattr(TokenCachedHFLM, "loglikelihood", HFLM.loglikelihood)
        m.setattr(TokenCachedHFLM, "_encode_pair", HFLM._encode_pair)
        plain = run_lm_eval(run / "hf", ["mmlu"], **kw)
    first = run_lm_eval(run / "hf", ["mmlu"], request_cache=tmp_path / "rc", **kw)
    folder = Path(first.request_cache)
    built = harness.requests_manifest(folder)["requests"]
    assert len(built) == 57 and sum(built.values()) == 4 * 14042  # every question of every subject, 4 choices
    assert first.tokens["encoded"] == first.tokens["pairs"] == 4 * 57 and first.tokens["read"] == 0

    def refuse(*args, **kwargs):
        raise AssertionError("built or encoded again, though the request cache holds it")

    # the second run renders no prompt and encodes no string: requests and token ids come from the folder
    monkeypatch.setattr(ConfigurableTask, "fewshot_context", refuse)
    monkeypatch.setattr(TokenCachedHFLM, "encode_strings", refuse)
    second = run_lm_eval(run / "hf", ["mmlu"], request_cache=tmp_path / "rc", **kw)
    assert second.request_cache == first.request_cache
    assert second.tokens["read"] == second.tokens["pairs"] == 4 * 57 and second.tokens["encoded"] == 0
    assert plain.samples == first.samples == second.samples and len(plain.samples) == 57
    # lm-eval found each task's requests under the file name build_requests gave them: it wrote none itself
    assert len(list(folder.glob("*.pickle"))) == 57


def test_request_cache_key_follows_what_decides_the_requests(shared_data, cache):
    specs = [TASKS["truthfulqa_mc1"]]
    _, task_dir = harness.prepare_local(specs, shared_data, cache)
    tm = harness.task_manager(specs, "local", task_dir)
    (task,) = harness.load_tasks(tm, specs, "local", {})
    key = harness.requests_key({"t": task}, 1234)
    assert harness.requests_key({"t": task}, 1234) == key
    assert harness.requests_key({"t": task}, 1235) != key  # another few-shot seed
    assert key["definitions_sha256"] == harness.definitions_sha256() and key["lm_eval"] == "0.4.13"
    task.set_config(key="description", value="Answer truthfully.\n\n")
    assert harness.requests_key({"t": task}, 1234) != key


def test_concurrent_builders_build_the_requests_once(shared_data, cache, tmp_path, monkeypatch):
    """Three builders over one folder (as battery processes over one sweep): one builds while the others
    wait on the lock, and all get the folder whole; no temporary folder is left."""
    from concurrent.futures import ThreadPoolExecutor

    from lm_eval.api.task import Task
    specs = [TASKS["truthfulqa_mc1"]]
    _, task_dir = harness.prepare_local(specs, shared_data, cache)
    leaves = []
    for _ in range(3):  # task objects of their own, as separate processes have
        tm = harness.task_manager(specs, "local", task_dir)
        leaves.append(tm.load(harness.load_tasks(tm, specs, "local", {}))["tasks"])
    built, real = [], Task.build_all_requests

    def counting(self, **kwargs):
        built.append(self.config.task)
        return real(self, **kwargs)

    monkeypatch.setattr(Task, "build_all_requests", counting)
    with ThreadPoolExecutor(3) as pool:
        folders = list(pool.map(lambda tasks: harness.build_requests(tasks, 1234, tmp_path), leaves))
    assert len(set(folders)) == 1 and built == ["scalelab_truthfulqa_mc1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".locks", folders[0].name]
    assert harness.requests_manifest(folders[0])["requests"] == {"scalelab_truthfulqa_mc1": sum(
        len(item["mc1_targets"]) for item in json.loads((shared_data / "truthfulqa/mc_task.json").read_text()))}


# ---------------------------------------------------------------------------------------------
# hub names and errors


def test_hub_source_runs_lm_evals_own_task_definitions():
    import lm_eval.tasks
    specs = list(TASKS.values())
    tm = harness.task_manager(specs, "hub", None)
    root = Path(lm_eval.tasks.__file__).parent
    for s in specs:
        assert harness.lm_eval_name(s, "hub") == s.name == s.hub_task
        assert tm.task_index[s.hub_task].yaml_path.is_relative_to(root)


def test_errors_name_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="unknown task.*hellaswagg.*known: hellaswag"):
        harness.resolve_tasks(["hellaswagg"])
    with pytest.raises(ValueError, match="TASK=N"):
        harness.parse_fewshot(["mmlu:5"])
    with pytest.raises(FileNotFoundError, match="no config.json"):
        run_lm_eval(tmp_path, ["piqa"], data_dir=tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="needs data_dir"):
        run_lm_eval(tmp_path, ["piqa"])
    with pytest.raises(ValueError, match="num_fewshot given for mmlu"):
        run_lm_eval(tmp_path, ["piqa"], data_dir=tmp_path, num_fewshot={"mmlu": 5})
    with pytest.raises(ValueError, match="request_cache needs source='local'"):
        run_lm_eval(tmp_path, ["piqa"], source="hub", request_cache=tmp_path)


def test_few_shot_override_of_a_zero_shot_task_is_refused(shared_data, cache):
    specs = [TASKS["truthfulqa_mc1"]]
    _, task_dir = harness.prepare_local(specs, shared_data, cache)
    tm = harness.task_manager(specs, "local", task_dir)
    with pytest.raises(ValueError, match="truthfulqa_mc1: defined zero-shot"):
        harness.load_tasks(tm, specs, "local", {"truthfulqa_mc1": 3})
    (task,) = harness.load_tasks(tm, specs, "local", {"truthfulqa_mc1": 0})
    assert task.get_config("num_fewshot") == 0


def test_lm_evals_continuation_assert_becomes_an_error_that_says_what_to_do(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"n_positions": 128}))

    def score(continuation_enc, max_length=128):  # the check lm-eval's HFLM makes, and how it words it
        assert len(continuation_enc) <= max_length

    with pytest.raises(AssertionError) as caught:
        score(list(range(140)))
    err = harness.explain_assertion(caught.value, tmp_path)
    assert isinstance(err, harness.ChoiceTooLongError) and "128-token context" in str(err)
    other = AssertionError("something else")
    assert harness.explain_assertion(other, tmp_path) is other


def test_cli_reports_input_errors_in_one_line(tmp_path, capsys):
    from scalelab.cli import main
    (tmp_path / "config.json").write_text("{}")
    assert main(["pretrain", "eval", str(tmp_path), "--tasks", "hellaswg"]) == 2
    assert "unknown task(s) hellaswg; known: hellaswag" in capsys.readouterr().err
    assert main(["pretrain", "eval", str(tmp_path / "nowhere")]) == 2
    assert "neither a run folder (config.toml + checkpoint.pt) nor an HF model folder" in capsys.readouterr().err


def test_peft_adapter_is_applied(evaluated_run, hf_model, shared_data, cache, tmp_path):
    """A LoRA adapter with non-zero weights (peft's default init would be a no-op) changes every score, and
    lm-eval's scores equal the adapted model's scored directly."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import GPT2LMHeadModel
    run, _ = evaluated_run
    _, tok = hf_model
    torch.manual_seed(0)
    lora = LoraConfig(r=4, target_modules=["c_attn"], init_lora_weights=False, fan_in_fan_out=True)
    get_peft_model(GPT2LMHeadModel.from_pretrained(run / "hf"), lora).save_pretrained(tmp_path / "adapter")
    r = run_lm_eval(run / "hf", ["piqa"], data_dir=shared_data, limit=3, cache_dir=cache,
                    peft_path=tmp_path / "adapter", log_samples=True)
    adapted = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(run / "hf"), tmp_path / "adapter").eval()
    base = [json.loads(line) for line in (run / "eval_samples.jsonl").read_text().splitlines()]
    base = {s["doc_id"]: s["loglikelihoods"] for s in base if s["task"] == "piqa"}
    samples = sorted(r.samples["piqa"], key=lambda s: s["doc_id"])
    for (context, choices, _), sample in zip(_local_items(shared_data, "piqa", 3), samples, strict=True):
        assert sample["loglikelihoods"] == pytest.approx(_choice_logliks(adapted, tok, context, choices), abs=2e-3)
        assert all(abs(a - b) > 1e-2 for a, b in zip(sample["loglikelihoods"], base[sample["doc_id"]]))
    assert r.peft_path == str(tmp_path / "adapter")
