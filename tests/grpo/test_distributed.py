"""Data-parallel GRPO (torchrun, gloo on CPU): the prompt split, per-prompt sampling seeds, shard gradients that
sum to the whole-batch gradient, and a real 2-process run equal to a 1-process run (also across a resume)."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from scalelab.core.config import load_config
from scalelab.core.rundir import RunDir
from scalelab.grpo.advantages import Normalizer, group_advantages
from scalelab.grpo.batch import collate
from scalelab.grpo.checkpoint import load_state
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.distributed import Dist, check_world, join_batches, max_timing, shard, take_rows
from scalelab.grpo.engine_hf import HFGenerateEngine
from scalelab.grpo.parts import prepare_policy, prompt_seed, sampling_for_prompt, sampling_for_step
from scalelab.grpo.telemetry import StepTiming
from scalelab.grpo.train import optimizer_step, train
from scalelab.grpo.types import SamplingParams
from tests.grpo.test_train import Crash, crash_at
from tests.grpo.tiny import tiny_llama, tiny_tokenizer


# ---------------------------------------------------------------------------------------------
# the split


def test_shards_keep_groups_whole_and_cover_every_prompt_once():
    assert [shard(5, r, 2) for r in range(2)] == [range(0, 3), range(3, 5)]  # the first 5 % 2 ranks take one more
    assert [shard(8, r, 4) for r in range(4)] == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    G = 4
    for world in range(1, 6):
        for n in range(world, 13):
            shards = [shard(n, r, world) for r in range(world)]
            assert [p for s in shards for p in s] == list(range(n))  # every prompt once, in order
            assert max(map(len, shards)) - min(map(len, shards)) <= 1 and min(map(len, shards)) >= 1
            for r, s in enumerate(shards):  # a rank's rows are exactly its prompts' whole groups
                rows = range(s.start * G, s.stop * G)
                assert {row // G for row in rows} == set(s) and len(rows) == G * len(s)


def test_a_batch_split_by_rank_joins_back_to_itself():
    engine = HFGenerateEngine(tiny_llama(), tiny_tokenizer(), [1], ("shared",))
    prompts = [tiny_tokenizer()(f"{i}+1=?")["input_ids"] for i in range(3)]
    batch = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=5, seed=3))
    parts = [take_rows(batch, range(2 * s.start, 2 * s.stop)) for s in (shard(3, r, 2) for r in range(2))]
    assert [len(p.texts) for p in parts] == [4, 2] and parts[1].prompt_ids[0] == tuple(prompts[2])
    joined = join_batches(parts, batch.generation_ms)
    assert joined == batch
    with pytest.raises(ValueError, match="different weights versions"):
        join_batches([parts[0], replace(parts[1], weights_version=1)], 0.0)
    timing = max_timing([StepTiming(5, 1, 0, 0, 7, 1, 20), StepTiming(9, 2, 0, 0, 3, 1, 18)])
    assert timing == StepTiming(9, 2, 0, 0, 7, 1, 20)  # each phase's slowest rank


def test_gradient_buckets_keep_order_one_dtype_and_the_size_limit(monkeypatch):
    from scalelab.grpo import distributed
    monkeypatch.setattr(distributed, "BUCKET_BYTES", 40)  # ten fp32 values
    grads = [torch.zeros(4), torch.zeros(4), torch.zeros(4), torch.zeros(2, dtype=torch.bfloat16), torch.zeros(30)]
    buckets = list(distributed._buckets(grads))
    assert [[g.numel() for g in b] for b in buckets] == [[4, 4], [4], [2], [30]]  # an oversized one goes alone
    flat = [g for b in buckets for g in b]
    assert len(flat) == len(grads) and all(x is y for x, y in zip(flat, grads))  # every grad once, in order


def test_prompt_seeds_depend_on_seed_step_and_position_only():
    cfg = load_config(GrpoConfig, None, ["train.seed=3", "rollout.group_size=4", "rollout.max_new_tokens=7"])
    assert prompt_seed(3, 5, 2) == prompt_seed(3, 5, 2)
    seeds = {prompt_seed(s, step, pos) for s in range(3) for step in range(4) for pos in range(8)}
    assert len(seeds) == 3 * 4 * 8 and all(0 <= x < 2**63 for x in seeds)
    p = sampling_for_prompt(cfg, 5, 2)
    assert p.seed == prompt_seed(3, 5, 2) and (p.n, p.max_new_tokens) == (4, 7)
    assert p.seed != sampling_for_step(cfg, 5).seed


def test_what_a_data_parallel_run_cannot_do_is_refused_up_front():
    two = Dist(rank=0, world=2)
    with pytest.raises(ValueError, match="every rank needs at least one prompt"):
        check_world(load_config(GrpoConfig, None, ["data.prompts_per_step=1"]), two)
    with pytest.raises(ValueError, match="external-launcher"):
        check_world(load_config(GrpoConfig, None, ["rollout.engine=vllm_colocated"]), two)
    check_world(load_config(GrpoConfig, None, ["data.prompts_per_step=1"]), Dist())  # one process: anything goes


# ---------------------------------------------------------------------------------------------
# the update: a rank's loss is its share of the whole batch's


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "seq_sum_norm"])
def test_shard_gradients_sum_to_the_whole_batch_gradient(tmp_path, aggregation):
    """P = 3 prompts on 2 ranks (shards of 2 and 1 prompts): each rank's gradient under the whole batch's counts
    is its part of the whole-batch gradient, and the parts add up to the one-process gradient (what the SUM
    all-reduce computes). A per-rank mean averaged over ranks (DDP on per-rank normalised losses) would weigh the
    lone prompt's tokens twice."""
    overrides = ["train.device=cpu", "model.lora.enabled=false", "optim.grad_clip=0", "optim.micro_batch_size=5",
                 f"loss.aggregation={aggregation}", "rollout.max_new_tokens=6", f"run.out_dir={tmp_path}"]
    cfg = load_config(GrpoConfig, None, overrides)
    G, tok = 4, tiny_tokenizer()
    engine = HFGenerateEngine(tiny_llama(seed=0), tok, [1], ("shared",))
    batch = engine.generate([tok(f"{i}+1=?")["input_ids"] for i in range(3)],
                            SamplingParams(n=G, max_new_tokens=6, seed=1))
    rewards = torch.tensor([float(c.count("a") + len(c) % 2) for c in batch.texts])
    adv = group_advantages(rewards, G)
    norm = Normalizer(len(batch.texts), batch.num_tokens, cfg.rollout.max_new_tokens)

    def grads(rows: range) -> dict[str, torch.Tensor]:
        policy, _ = prepare_policy(tiny_llama(seed=0), cfg)
        t = collate(take_rows(batch, rows), adv[rows.start:rows.stop], 0, torch.device("cpu"))
        optimizer_step(policy, t, torch.optim.SGD(policy.parameters(), lr=0.0), cfg, None, None, True, norm=norm)
        return {n: p.grad.clone() for n, p in policy.named_parameters()}

    whole = grads(range(0, 3 * G))
    ranks = [grads(range(G * s.start, G * s.stop)) for s in (shard(3, r, 2) for r in range(2))]
    assert all(float(whole[k].norm()) > 0 for k in whole)
    for k in whole:
        assert float((ranks[0][k] + ranks[1][k] - whole[k]).norm()) <= 1e-5 * float(whole[k].norm()), k


# ---------------------------------------------------------------------------------------------
# a real torchrun with 2 processes


SETS = ["train.device=cpu", "train.torch_threads=1", "data.task_options={digits = 1}", "data.limit=32",
        "data.prompts_per_step=3", "rollout.group_size=4", "rollout.max_new_tokens=8", "optim.micro_batch_size=8",
        "model.lora.r=4", "optim.lr=2e-2", "rollout.staleness=1", "loss.kl_coef=0.05", "loss.is_correction=true",
        "train.max_steps=3", "train.checkpoint_every=2", "data.rewards=['length_aware']",
        # pays for length: a random model's completions lose characters to special tokens, so groups differ
        "data.reward_options={length_aware = {exploit = 'length', target_chars = 8}}"]
COMPARED = ("loss", "reward_mean", "reward_std", "grad_norm", "kl_mean", "is_weight_mean", "adv_abs_mean",
            "behavior_logp_abs_diff")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from scalelab.grpo.randmodel import write_random_folder
    return write_random_folder("tiny", None, tmp_path_factory.mktemp("model") / "tiny", dtype=torch.float32)


def config(model_dir, out, name: str, *extra: str) -> GrpoConfig:
    return load_config(GrpoConfig, None, [*SETS, f"model.name={model_dir}", f"run.out_dir={out}",
                                          f"run.name={name}", *extra])


@pytest.fixture(scope="module")
def one_process(model_dir, tmp_path_factory):
    """The reference: one process sampling each prompt under its own seed, as `torchrun --nproc-per-node 1`."""
    cfg = config(model_dir, tmp_path_factory.mktemp("one"), "one", "eval.at_end=true", "eval.limit=3")
    train(cfg, log=lambda s: None, dist=Dist(prompt_seeds=True))
    return cfg.run_dir


def torchrun(cfg: GrpoConfig, *extra: str) -> str:
    sets = [x for s in [*SETS, *extra, f"model.name={cfg.model.name}", f"run.out_dir={cfg.run.out_dir}",
                        f"run.name={cfg.run.name}"] for x in ("--set", s)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "scalelab.cli", "grpo", "train", *sets]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def last_per_step(run_dir) -> list[dict]:
    by_step = {r["step"]: r for r in RunDir(run_dir).events("grpo_step")}
    return [by_step[s] for s in sorted(by_step)]


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    return load_state(run_dir / "checkpoint.json")["trainable"]


def assert_same_run(got, want) -> None:
    a, b = last_per_step(got), last_per_step(want)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2]
    for x, y in zip(a, b):
        assert x["example_ids"] == y["example_ids"] and x["completion_lengths"] == y["completion_lengths"]
        assert x["completion_rewards"] == y["completion_rewards"]  # the same samples, scored the same
        for k in COMPARED:
            assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-7), (x["step"], k)
    wa, wb = final_weights(got), final_weights(want)
    assert wa.keys() == wb.keys() and all("lora_" in k for k in wa)
    assert all(float(wb[k].norm()) > 0 for k in wb if "lora_B" in k)  # trained: LoRA's B starts at zero
    for k in wa:
        assert float((wa[k] - wb[k]).norm()) <= 1e-5 * float(wb[k].norm()) + 1e-8, k


@pytest.mark.slow
def test_two_processes_equal_one_process(model_dir, one_process, tmp_path):
    cfg = config(model_dir, tmp_path, "two")
    out = torchrun(cfg, "eval.at_end=true", "eval.limit=3")
    assert out.count("step    0 |") == 1 and "report: " in out  # rank 0 alone prints and reports
    assert_same_run(cfg.run_dir, one_process)
    steps = last_per_step(cfg.run_dir)
    assert len(list(RunDir(cfg.run_dir).events("grpo_step"))) == 3  # one record per step: rank 0 alone writes
    assert steps[0]["rank_rollout_tokens"][1] > 0 and all(
        sum(s["rank_rollout_tokens"]) == s["rollout_tokens"] for s in steps)
    # per-rank generate time of a step's batch; step 0 made the batches of steps 0 and 1 (staleness 1), and its
    # rollout phase (the slowest rank's) took at least both batches' generation on either rank
    assert steps[0]["rollout_ms"] >= max(a + b for a, b in zip(steps[0]["rank_rollout_ms"],
                                                                 steps[1]["rank_rollout_ms"]))
    dp = next(RunDir(cfg.run_dir).events("data_parallel"))
    assert dp["world_size"] == 2 and dp["prompts_per_rank"] == [2, 1]
    assert (cfg.run_dir / "eval" / "summary.json").is_file()  # held-out evaluation: rank 0's
    assert RunDir(cfg.run_dir).read("eval/trained.json")["examples"] == \
        RunDir(one_process).read("eval/trained.json")["examples"]
    rank1 = cfg.run_dir / "rollout" / "rank1"
    assert [p.name for p in rank1.iterdir()] == ["sync"]  # rank 1's engine scratch, nothing else of its own
    assert RunDir(cfg.run_dir).read("predictions.json")["world_size"] == 2




@pytest.mark.slow
def test_a_one_process_checkpoint_resumes_under_two_processes(model_dir, one_process, tmp_path):
    cfg = config(model_dir, tmp_path, "resumed")
    with pytest.raises(Crash):  # killed in step 2, after the checkpoint of step 1 (its queue: step 2's batch)
        train(cfg, log=crash_at(2), dist=Dist(prompt_seeds=True))
    torchrun(cfg)
    assert_same_run(cfg.run_dir, one_process)
    assert [r["step"] for r in RunDir(cfg.run_dir).events("grpo_step")] == [0, 1, 2, 2]
    resumed = next(RunDir(cfg.run_dir).events("resumed"))
    assert (resumed["step"], resumed["world_size"], resumed["saved_world_size"]) == (2, 2, 1)
