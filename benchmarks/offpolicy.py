"""The off-policy corrections, ablated: does our recipe need TIS or IcePop?

Arms train the embedded default model with `train local` on the same demo tasks, with
the same seed and the demo's recipe (``DEMO_RECIPE``: group size 8, 8 prompts a step,
64 tokens, lr 3e-4 after 5 warm-up steps, async level 2), each for the same number of
optimizer steps (a step budget, so the machine's load does not change what is
compared), and differ only in the corrections:

1. default: the PPO ratio against the sampler's log-probabilities, no correction;
2. the default again: workers are processes sampling with the newest checkpoint, so
   which policy a group was sampled with depends on timing and two runs of one seed
   see different batches; how far the two defaults land apart is the noise between
   runs, which the evaluation's standard error does not hold;
3. the ratio against the trainer's own log-probabilities, recomputed (INTELLECT-2's
   way): with one optimizer step per batch that ratio is 1, so nothing sees how far
   the sampler's policy was; this is what TIS corrects;
4. as 3, with truncated importance sampling at cap 2;
5. as 1, with IcePop masking tokens whose trainer / sampler ratio is outside [0.5, 2].

The held-out evaluation of ``benchmarks.learner``'s tasks (64 demo tasks from a seed no
arm trains on; 16 samples each at temperature 1 and the recipe's length, seed 0) is
taken once before training and after each arm. A change's standard error is that of
the mean of per-task differences (before and after, or arm and default, are paired by
task).

From each step's metrics row: the mismatch between the sampler's and the trainer's
log-probabilities of the trained tokens (KL per token, overall and by staleness, and
the ratio's spread), the fraction of tokens TIS truncated or IcePop masked, and the
trainer's compute per step (the machine's load included).

    python -m benchmarks.offpolicy [--steps 40]
    or   swarmrl bench offpolicy
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.learner import HELD_OUT_SEED, TRAIN_SEED
from benchmarks.learner_settings import DEMO_RECIPE
from orchestrator.evaluate import sample_and_score
from orchestrator.pretrain import build_default_model
from orchestrator.tasks.generators import demo_tasks
from orchestrator.train_local.run import LocalRun, train_local
from orchestrator.trainer.metrics import read_metrics
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl.cli_options import quiet_transformers
from swarmrl.models.backend import SamplingParams
from swarmrl.models.files import default_models_dir
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.tasks import write_tasks
from swarmrl.tasks.format import Task

# benchmarks.learner's held-out tasks, but 16 samples each, not 4: with 4 the standard
# error of a change (0.03 in a 30-step pilot) was as large as the change itself.
HELD_OUT_TASKS, SAMPLES_PER_TASK, EVAL_SEED = 64, 16, 0
# A difference counts as one when it is more than this many standard errors.
SIGNIFICANT_SE = 2.0


@dataclass(frozen=True)
class Arm:
    name: str
    changes: Mapping[str, object]  # recipe fields that differ from the base recipe

    def recipe(self, base: GRPORecipe, steps: int) -> GRPORecipe:
        # Validated anew (model_copy would not), so an arm cannot be an invalid recipe.
        return GRPORecipe.model_validate({**base.model_dump(), **self.changes, "steps": steps})


DEFAULT = Arm("default", {})
# The default run again: how far apart two runs of one recipe land, as the workers'
# timing decides which policy each batch is sampled with. The evaluation's standard
# error does not hold that spread.
AGAIN = Arm("default, again", {})
ARMS = (
    DEFAULT,
    AGAIN,
    Arm("vs trainer", {"ratio_against": "trainer"}),
    Arm("vs trainer + TIS 2", {"ratio_against": "trainer", "tis_cap": 2.0}),
    Arm("IcePop [0.5, 2]", {"icepop_low": 0.5, "icepop_high": 2.0}),
)


@dataclass(frozen=True)
class ArmResult:
    arm: Arm
    rows: list[dict[str, Any]]  # the run's metrics.jsonl
    held_out: list[float]  # each held-out task's mean reward after training


@dataclass(frozen=True)
class Mismatch:
    """An arm's off-policy figures over all its steps, per trained token."""

    kl: float
    kl_by_staleness: list[float | None]  # None: no token of that staleness
    tokens_by_staleness: list[int]
    ratio_std: float  # the mean over steps of each step's std
    ratio_min: float
    ratio_max: float
    tis_fraction: float
    icepop_fraction: float
    step_seconds: float  # the trainer's compute per step, waiting for rollouts excluded


def mismatch(rows: Sequence[Mapping[str, Any]]) -> Mismatch:
    """The figures of a run's metrics rows. Means are weighted by tokens, so a step of
    few tokens weighs what its tokens do."""
    if not rows:
        raise ValueError("a run without steps has no mismatch")
    by_age: list[int] = [sum(r["tokens_by_staleness"][k] for r in rows) for k in _ages(rows)]
    tokens = sum(by_age)

    def per_token(key: str) -> float:
        total: float = sum(r[key] * sum(r["tokens_by_staleness"]) for r in rows)
        return total / max(tokens, 1)

    return Mismatch(
        kl=per_token("mismatch_kl"),
        kl_by_staleness=[
            sum(r["mismatch_kl_by_staleness"][k] * r["tokens_by_staleness"][k] for r in rows) / n
            if n
            else None
            for k, n in enumerate(by_age)
        ],
        tokens_by_staleness=by_age,
        ratio_std=statistics.fmean(r["mismatch_ratio_std"] for r in rows),
        ratio_min=min(r["mismatch_ratio_min"] for r in rows),
        ratio_max=max(r["mismatch_ratio_max"] for r in rows),
        tis_fraction=per_token("tis_fraction"),
        icepop_fraction=per_token("icepop_fraction"),
        step_seconds=statistics.fmean(r["seconds_training"] for r in rows),
    )


def _ages(rows: Sequence[Mapping[str, Any]]) -> range:
    return range(len(rows[0]["tokens_by_staleness"]))


def paired_change(after: Sequence[float], before: Sequence[float]) -> tuple[float, float]:
    """The mean of per-task differences and its standard error."""
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.inf
    return statistics.fmean(diffs), se


def task_rewards(
    model: Path, tasks: Sequence[Task], recipe: GRPORecipe, samples: int
) -> list[float]:
    """Each task's mean reward over ``samples`` completions, sampled as
    ``benchmarks.learner`` evaluates (the recipe's length and temperature, fixed seed)."""
    import torch

    # train local leaves one thread to the trainer; evaluation runs alone.
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    backend = TorchBackend(model, device="cpu")
    params = SamplingParams(max_tokens=recipe.max_tokens, temperature=recipe.temperature)
    records = sample_and_score(backend, tasks, n=samples, params=params, seed=EVAL_SEED)
    return [
        statistics.fmean(r.task_reward for r in records[i * samples : (i + 1) * samples])
        for i in range(len(tasks))
    ]


def ablate(
    model: Path,
    train_tasks: Sequence[Task],
    held_out: Sequence[Task],
    base: GRPORecipe,
    steps: int,
    root: Path,
    *,
    arms: Sequence[Arm] = ARMS,
    samples: int = SAMPLES_PER_TASK,
    workers: int | None = None,
) -> tuple[list[float], list[ArmResult]]:
    """Held-out per-task rewards before training, and each arm trained ``steps`` steps
    from ``model`` in its own folder under ``root``."""
    tasks_file = root / "train.jsonl"
    write_tasks(list(train_tasks), tasks_file)
    before = task_rewards(model, held_out, base, samples)
    results = []
    for i, arm in enumerate(arms):
        out = root / f"arm{i}"
        run = LocalRun(
            model=model,
            tasks=tasks_file,
            out=out,
            recipe=arm.recipe(base, steps),
            run="bench",
            workers=workers,
            device="cpu",
        )
        began = time.monotonic()
        last = train_local(run, say=lambda text: None)
        seconds = time.monotonic() - began
        rows = read_metrics(run.folder.metrics)
        print(f"{arm.name}: {len(rows)} steps in {seconds:.0f} s", flush=True)
        results.append(ArmResult(arm, rows, task_rewards(last, held_out, base, samples)))
    return before, results


def report(before: Sequence[float], results: Sequence[ArmResult]) -> None:
    """The table of every arm's figures, then the verdict they give."""
    start = statistics.fmean(before)
    print(f"\nheld-out reward before training: {start:.4f}")
    default = results[0]
    ages = _ages(default.rows)
    head = ["arm", "held-out after", "change (se)", "vs default (se)", "mismatch KL"]
    head += [f"KL stale {k}" for k in ages]
    head += ["ratio std", "ratio min", "ratio max", "TIS truncated", "IcePop masked", "s/step"]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    figures = {r.arm.name: mismatch(r.rows) for r in results}
    for r in results:
        m = figures[r.arm.name]
        change, se = paired_change(r.held_out, before)
        vs = "" if r is default else _signed(*paired_change(r.held_out, default.held_out))
        cells = [r.arm.name, f"{statistics.fmean(r.held_out):.4f}", _signed(change, se), vs]
        cells += [f"{m.kl:.2e}"] + [_kl(kl) for kl in m.kl_by_staleness]
        cells += [f"{m.ratio_std:.4f}", f"{m.ratio_min:.3f}", f"{m.ratio_max:.3f}"]
        cells += [f"{m.tis_fraction:.2%}", f"{m.icepop_fraction:.2%}", f"{m.step_seconds:.2f}"]
        print("| " + " | ".join(cells) + " |")
    print()
    print(verdict(before, results))


def verdict(before: Sequence[float], results: Sequence[ArmResult]) -> str:
    """One paragraph: which corrections changed the held-out reward beyond noise, how
    large the mismatch they correct was, and where it comes from. ``results[0]`` is the
    default arm's."""
    default = results[0]
    m = mismatch(default.rows)
    rise, rise_se = paired_change(default.held_out, before)
    said = [
        f"In {len(default.rows)} steps the default arm's held-out reward moved by "
        f"{_signed(rise, rise_se)}."
    ]
    spread = 0.0
    for r in results:
        if r.arm == AGAIN:
            d, se = paired_change(r.held_out, default.held_out)
            spread = abs(d)
            said.append(
                f"Run again, it landed {_signed(d, se)} from itself: the spread between "
                "runs, which the evaluation's standard error does not hold."
            )
    against = [
        (r, *paired_change(r.held_out, default.held_out)) for r in results[1:] if r.arm != AGAIN
    ]
    beyond = {r.arm.name: _apart(d, se) and abs(d) > spread for r, d, se in against}
    apart = [x for x in against if beyond[x[0].arm.name]]
    alike = [x for x in against if not beyond[x[0].arm.name]]
    if alike:
        said.append(
            f"Within {SIGNIFICANT_SE:g} standard errors of the default's after as many steps, "
            f"or no further than its repeat: {_arms(alike)}."
        )
    if apart:
        said.append(
            f"More than {SIGNIFICANT_SE:g} standard errors from it and further than its "
            f"repeat: {_arms(apart)}."
        )
    fresh = m.kl_by_staleness[0]
    stale = [(k, kl) for k, kl in enumerate(m.kl_by_staleness) if k and kl is not None]
    said.append(
        f"The default arm's mismatch: KL {m.kl:.1e} per token, ratio std {m.ratio_std:.3f} "
        f"per step, every ratio in [{m.ratio_min:.2f}, {m.ratio_max:.2f}]. The sampler and "
        "the trainer run the same weights in fp32 on the same CPU, so "
        + (
            "no token was sampled with the trainer's current policy"
            if fresh is None
            else f"on tokens sampled with the trainer's current policy it is {_kl(fresh)} "
            "(rounding only)"
        )
        + (
            f" and {'all of it' if fresh is None else 'the rest'} comes from staleness alone: "
            + ", ".join(f"{_kl(kl)} at {k} step{'s' * (k > 1)} old" for k, kl in stale)
            + "."
            if stale
            else "; no step trained on stale tokens."
        )
    )
    figures = [(r.arm.name, mismatch(r.rows)) for r in results]
    touched = [f"TIS truncated {f.tis_fraction:.2%} of {n}" for n, f in figures if f.tis_fraction]
    touched += [
        f"IcePop masked {f.icepop_fraction:.2%} of {n}" for n, f in figures if f.icepop_fraction
    ]
    if touched:
        said.append(f"Of the tokens trained on, {'; '.join(touched)}.")
    gains = any(d > 0 for _, d, _ in apart)
    said.append(
        "On this setup the recipe "
        + ("gains from a correction (above)." if gains else "does not need them.")
        + " A bf16 sampler on a GPU against an fp32 trainer adds a mismatch at every "
        "staleness, fresh tokens included; that figure is not measured here."
    )
    return " ".join(said)


def _arms(found: Sequence[tuple[ArmResult, float, float]]) -> str:
    return ", ".join(f"{r.arm.name} ({_signed(d, se)})" for r, d, se in found)


def _apart(diff: float, se: float) -> bool:
    return abs(diff) > SIGNIFICANT_SE * se


def _signed(value: float, se: float) -> str:
    return f"{value:+.4f} ({se:.4f})"


def _kl(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def main(steps: int = 40) -> None:
    import torch

    quiet_transformers()  # checkpoints' progress bars, one per step
    model = build_default_model(default_models_dir() / "default")
    held_out = demo_tasks(HELD_OUT_TASKS, seed=HELD_OUT_SEED)
    print(
        f"training {len(ARMS)} arms of {steps} steps each from the default model, "
        f"{len(os.sched_getaffinity(0))} cores, torch {torch.__version__}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-offpolicy-") as tmp:
        before, results = ablate(
            model, demo_tasks(4096, seed=TRAIN_SEED), held_out, DEMO_RECIPE, steps, Path(tmp)
        )
    report(before, results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    main(parser.parse_args().steps)
