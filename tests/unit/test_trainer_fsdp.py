"""Two CPU processes sharding the model with FSDP2 over gloo take the same GRPO steps
as one process running ``train_step``: same loss, gradient norm, metrics and weights.

The workers run once for the module and replay a plan of steps: a batch with a NaN
advantage (skipped everywhere), an odd-sized batch (one rank does a micro-batch
fewer and must still join the collectives), and a one-sample batch (one rank has
nothing to train on at all). Rank 0 writes each step's gathered weights as a
checkpoint through ``save_checkpoint``, read back here as an HF model directory.

As in the trainer, rank 0 alone loads the weights; rank 1 builds the model on the meta
device from a directory holding its config alone, and receives its shards from rank 0.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoTokenizer, LlamaForCausalLM

from orchestrator.run_dir import RunDir
from orchestrator.trainer.batch import TokenScorer, completion_logprobs
from orchestrator.trainer.checkpoint import save_checkpoint
from orchestrator.trainer.distributed import data_parallel_step, full_state_dict, shard
from orchestrator.trainer.loss import LossConfig
from orchestrator.trainer.optim import build_optimizer
from orchestrator.trainer.ranks import loopback_interface
from orchestrator.trainer.samples import Sample
from orchestrator.trainer.step import train_step
from swarmrl.models.directory import model_skeleton
from tests.model_fixtures import random_tiny_model

# Two fresh interpreters importing torch and transformers take most of the ~20 s.
pytestmark = pytest.mark.slow

WORLD = 2
SETTINGS = {
    "lr": 2e-5,
    "max_grad_norm": 0.5,
    "temperature": 0.8,
    "micro_batch": 2,
    "async_level": 2,
}
WEIGHT_DECAY = 0.1
LOSS = LossConfig(normalizer=5 * 16)
# (name, sample indices, index whose advantage is NaN or None)
PLAN = [
    ("nan", [0, 1, 2, 3], 1),
    ("odd", [0, 1, 2, 3, 4], None),
    ("one", [3], None),
    ("trainer-ratio", [0, 1, 2, 3, 4], None),
    ("corrections", [0, 1, 2, 3, 4], None),
]
# Steps taken with options beyond the defaults: (extra step arguments, loss config).
OPTIONS = {
    "trainer-ratio": (
        {"ratio_against": "trainer"},
        LossConfig(normalizer=5 * 16, entropy_coef=0.05),
    ),
    # The sampler ratios lie about exp(+-0.15): both corrections act on some tokens.
    "corrections": (
        {"ratio_against": "trainer"},
        LossConfig(normalizer=5 * 16, tis_cap=1.1, icepop_low=0.85, icepop_high=1.2),
    ),
}


def step_args(name: str) -> tuple[LossConfig, dict]:
    extra, loss = OPTIONS.get(name, ({}, LOSS))
    return loss, {**SETTINGS, **extra}


def load(model_dir: Path) -> LlamaForCausalLM:
    """The policy in float64: see ``test_two_ranks_take_the_single_process_step``."""
    return LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float64)


def rank_model(rank: int, root: Path) -> torch.nn.Module:
    """The policy as rank ``rank`` of the trainer builds it: rank 0 loads the weights;
    the others build the model on the meta device from ``config-only/``, which holds
    no weights to read."""
    return (
        load(root / "model") if rank == 0 else model_skeleton(root / "config-only", torch.float64)
    )


def logprobs(model: torch.nn.Module, samples: list[Sample]) -> torch.Tensor:
    with torch.no_grad():
        scores, _ = completion_logprobs(
            model,
            [s.prompt_ids for s in samples],
            [s.output_ids for s in samples],
            SETTINGS["temperature"],
        )
    return scores


def make_samples(model_dir: Path) -> list[Sample]:
    """Prompts and completions of different lengths, non-trivial advantages, and
    sampler log-probabilities off the model's own so that ratios differ from 1
    and some tokens fall outside the clip."""
    gen = torch.Generator().manual_seed(7)
    shapes = [(3, 6), (9, 2), (5, 11), (12, 4), (4, 8)]
    prompts = [torch.randint(4, 100, (p,), generator=gen).tolist() for p, _ in shapes]
    outputs = [torch.randint(4, 100, (o,), generator=gen).tolist() for _, o in shapes]
    model = load(model_dir).eval()
    with torch.no_grad():
        own, _ = completion_logprobs(model, prompts, outputs, SETTINGS["temperature"])
    advantages = [1.0, -0.5, 0.3, -1.2, 0.8]
    # Staleness buckets split between the ranks unevenly; none is empty on the whole batch.
    ages = [0, 2, 1, 0, 2]
    return [
        Sample(
            p, o, (own[b, : len(o)] + 0.15 * torch.randn(len(o), generator=gen)).tolist(), a, age
        )
        for b, (p, o, a, age) in enumerate(zip(prompts, outputs, advantages, ages, strict=True))
    ]


# The step taken again with activation checkpointing: the first applied one ("nan" is
# skipped), so from the initial weights and a fresh optimizer, as on the reference.
RECOMPUTED = "odd"


def batches(samples: list[Sample]) -> list[tuple[str, list[Sample]]]:
    out = []
    for name, indices, nan_at in PLAN:
        batch = [samples[i] for i in indices]
        if nan_at is not None:
            batch[nan_at] = dataclasses.replace(batch[nan_at], advantage=float("nan"))
        out.append((name, batch))
    return out


def worker(rank: int, samples: list[Sample], out: Path) -> None:
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
    dist.init_process_group(
        "gloo",
        init_method=f"file://{out / 'rendezvous'}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    try:
        cpu = torch.device("cpu")
        model = shard(TokenScorer(rank_model(rank, out)), device=cpu)
        # Before any forward pass: FSDP2 leaves the root's parameters unsharded after
        # one without gradients, and the optimizer must hold the shards.
        optimizer = build_optimizer(model, lr=SETTINGS["lr"], weight_decay=WEIGHT_DECAY)
        # As sharded, before any step: the weights as gathered (rank 0's), this rank's
        # buffers and the log-probabilities this rank's forward passes compute.
        loaded = {
            "weights": {k.removeprefix("lm."): v for k, v in full_state_dict(model).items()},
            "buffers": {k: v.clone() for k, v in model.lm.named_buffers()},
            "training": [m.training for m in model.lm.modules()],
            "logprobs": logprobs(model, samples),
        }
        tokenizer = AutoTokenizer.from_pretrained(out / "model")
        results = {}
        for step, (name, batch) in enumerate(batches(samples), start=1):
            loss, options = step_args(name)
            result = data_parallel_step(model, optimizer, batch, loss, **options)
            results[name] = {**dataclasses.asdict(result), "gathered": len(full_state_dict(model))}
            save_checkpoint(out / "run", step, model, optimizer, tokenizer, {}, dtype=torch.float64)
        tied = model.lm.lm_head.weight is model.lm.model.embed_tokens.weight
        # The first applied step once more, from the start, with every decoder layer's
        # activations recomputed in the backward pass.
        recomputing = rank_model(rank, out)
        recomputing.gradient_checkpointing_enable({"use_reentrant": False})
        recomputing = shard(TokenScorer(recomputing), device=cpu)
        optimizer = build_optimizer(recomputing, lr=SETTINGS["lr"], weight_decay=WEIGHT_DECAY)
        loss, options = step_args(RECOMPUTED)
        result = data_parallel_step(
            recomputing, optimizer, dict(batches(samples))[RECOMPUTED], loss, **options
        )
        results["recomputed"] = dataclasses.asdict(result)
        weights = {k.removeprefix("lm."): v for k, v in full_state_dict(recomputing).items()}
        torch.save(
            {"tied": tied, "loaded": loaded, "results": results, "recomputed": weights},
            out / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def weights_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The reference steps in this process, then the same steps on two ranks."""
    root = tmp_path_factory.mktemp("fsdp")
    model_dir = random_tiny_model(root / "model", seed=3)
    (root / "config-only").mkdir()
    shutil.copy(model_dir / "config.json", root / "config-only")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        samples = make_samples(model_dir)
        model = load(model_dir)
        optimizer = build_optimizer(model, lr=SETTINGS["lr"], weight_decay=WEIGHT_DECAY)
        reference = {
            "initial": weights_of(model),
            "buffers": {k: v.clone() for k, v in model.named_buffers()},
            "logprobs": logprobs(model, samples),
        }
        for name, batch in batches(samples):
            loss, options = step_args(name)
            result = train_step(model, optimizer, batch, loss, **options)
            reference[name] = (dataclasses.asdict(result), weights_of(model))
    finally:
        torch.set_num_threads(threads)

    mp.spawn(worker, args=(samples, root), nprocs=WORLD, join=True)
    ranks = [torch.load(root / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    saved = {
        name: weights_of(load(RunDir(root / "run").step(step)))
        for step, (name, _, _) in enumerate(PLAN, start=1)
    }
    return reference, ranks, saved


def assert_same_weights(got: dict, expected: dict, atol: float) -> None:
    assert got.keys() == expected.keys()
    for key, tensor in expected.items():
        torch.testing.assert_close(got[key], tensor, rtol=0, atol=atol, msg=lambda m, k=key: k + m)


def test_rank0s_weights_and_buffers_reach_every_rank(run):
    """Rank 1 built its model without weights or buffers: after sharding, every rank
    computes with the single-process model's weights and buffers, bit for bit, the
    rotary frequencies (in no state dict) included, and so gets its log-probabilities."""
    reference, ranks, _ = run
    assert_same_weights(ranks[0]["loaded"]["weights"], reference["initial"], atol=0)
    assert "model.rotary_emb.inv_freq" in reference["buffers"]
    for r in ranks:
        loaded = r["loaded"]
        assert_same_weights(loaded["buffers"], reference["buffers"], atol=0)
        assert not any(loaded["training"])
        torch.testing.assert_close(loaded["logprobs"], reference["logprobs"], rtol=0, atol=1e-12)


def test_ties_survive_sharding_and_only_rank0_gathers(run):
    _, ranks, _ = run
    assert all(r["tied"] for r in ranks)
    assert ranks[0]["results"]["odd"]["gathered"] > 0
    assert ranks[1]["results"]["odd"]["gathered"] == 0


def test_non_finite_batch_is_skipped_on_every_rank(run):
    reference, ranks, saved = run
    assert reference["nan"][0]["applied"] is False
    # The NaN sits in rank 1's slice: rank 0 skips on the all-reduced verdict alone.
    for r in ranks:
        assert r["results"]["nan"]["applied"] is False
    assert_same_weights(saved["nan"], reference["initial"], atol=0)


@pytest.mark.parametrize("name", ["odd", "one"])
def test_two_ranks_take_the_single_process_step(run, name):
    """Float64 weights, because AdamW's first steps amplify rounding: its update is
    about lr * g / (|g| + eps), as steep as 1 / eps where a gradient is near eps
    (1e-8). In float32 the two summation orders then differ by up to ~2% of lr on a
    handful of such elements; in float64 by ~1e-16, so 1e-11 leaves ample margin
    and still sees any real difference, which would be of the order of lr."""
    expected, _ = run[0][name]
    assert expected["applied"]
    # max_grad_norm is below the norm: the clipped path is the one compared.
    assert expected["grad_norm"] > SETTINGS["max_grad_norm"]
    assert expected["metrics"]["clip_fraction"] > 0
    assert_ranks_took(run, name)


def test_two_ranks_take_the_step_with_the_trainer_ratio_and_an_entropy_bonus(run):
    reference, _, _ = run
    expected, _ = reference["trainer-ratio"]
    assert expected["applied"]
    assert expected["metrics"]["ratio_max"] == pytest.approx(1.0, abs=1e-12)
    assert expected["metrics"]["clip_fraction"] == 0.0
    assert_ranks_took(run, "trainer-ratio")


def test_two_ranks_measure_and_correct_the_mismatch_as_one_process(run):
    """Means by staleness, the ratio's std and its extremes merge exactly across ranks
    (compared key by key in ``assert_ranks_took``), and so do TIS's and IcePop's steps."""
    reference, _, _ = run
    expected, _ = reference["corrections"]
    metrics = expected["metrics"]
    assert expected["applied"]
    assert 0 < metrics["tis_fraction"] < 1
    assert 0 < metrics["icepop_fraction"] < 1
    assert all(metrics[f"tokens_stale{k}"] > 0 for k in range(3))
    assert metrics["mismatch_ratio_std"] > 0
    assert_ranks_took(run, "corrections")


def assert_ranks_took(run, name: str) -> None:
    """Every rank reports the single-process step's loss, norm and metrics, and the
    weights rank 0 saved are the single-process step's."""
    reference, ranks, saved = run
    expected, expected_weights = reference[name]
    for r in ranks:
        got = r["results"][name]
        assert got["applied"]
        assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
        assert got["metrics"] == pytest.approx(expected["metrics"], rel=1e-5, abs=1e-7)
    moved = max((expected_weights[k] - reference["initial"][k]).abs().max() for k in saved[name])
    assert moved > SETTINGS["lr"] / 2
    assert_same_weights(saved[name], expected_weights, atol=1e-11)


def test_two_ranks_recomputing_activations_take_the_single_process_step(run):
    reference, ranks, _ = run
    expected, expected_weights = reference[RECOMPUTED]
    assert PLAN[0][2] is not None  # the plan's first step is skipped: odd is the first taken
    for r in ranks:
        got = r["results"]["recomputed"]
        assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert got["metrics"] == pytest.approx(expected["metrics"], rel=1e-5, abs=1e-7)
    assert_same_weights(ranks[0]["recomputed"], expected_weights, atol=1e-11)
