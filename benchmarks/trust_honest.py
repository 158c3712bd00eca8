"""False positives: honest rollouts, sampled every way an honest node samples, judged by
the validator's checks.

Each variation generates honest rollouts with the torch backend (the node's own
path, ``generate_rollouts``) and verifies them with ``verify_rollouts`` in the
precision the validator prefills in, recording each check's distance
(:mod:`swarmrl.rollouts.tolerances`) and what it would have cost the node: a
rejection, or evidence. The variations cover sampling precision (fp32, bf16 on
this CPU), the validator's precision (the run's, and fp32 against bf16 sampling),
greedy and temperature 1, top-p 1 and 0.9, batches of 1 to 64 (a batch of one is
also an unpadded prefill; groups are prefilled right-padded), one and two torch
threads, and completions up to the model's length. Every variation has its own
seed, so a run is repeatable; ``scale`` multiplies the rollouts of each.

A variation's rollouts are handed in as one node's submissions of the orchestrator's
default order size (``prompts_per_assignment`` tasks each) and judged in turn, each
with the colder-sampling sums the earlier ones left, as the validator judges a
node's prefilled submissions: the ``temperature`` distance is the node's
accumulated z, and each submission's own z is kept beside it (worst and mean), so a
shift that bf16 sampling gives every submission, which the sums carry up to
``sqrt((1 + d) / (1 - d))`` times (``d``: ``TEMPERATURE_DECAY``), shows.

What a GPU adds (bf16 kernels of another vendor) is the cross-hardware row: a GPU
generates, this CPU verifies (docs/benchmarks/trust.md says where it was run).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from orchestrator.service.settings import OrchestratorSettings
from swarmrl.models.backend import Precision, SamplingParams, torch_dtype
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.rollouts.checks import Assignment
from swarmrl.rollouts.generate import Provenance, generate_rollouts
from swarmrl.rollouts.records import Rollout
from swarmrl.rollouts.tolerances import (
    NO_SUMS,
    TEMPERATURE,
    TEMPERATURE_DECAY,
    TOLERANCES,
)
from swarmrl.rollouts.verify import Verdict, verify_submission
from swarmrl.tasks import Task
from swarmrl.tasks.rewards import task_reward

NODE = "0x" + "11" * 20
# Tasks per submission: the orchestrator's default order.
ORDER_TASKS: int = OrchestratorSettings.model_fields["prompts_per_assignment"].default
# The longest completion each model's positions leave room for after the longest
# demo prompt (the default model has 512 positions).
LONGEST = {"default": 320, "smollm2": 1024}
# How far the colder-sampling sums carry a shift every submission has: their z tends to
# the per-submission z times this.
CARRIED = math.sqrt((1 + TEMPERATURE_DECAY) / (1 - TEMPERATURE_DECAY))


@dataclass(frozen=True)
class Variation:
    """One way of sampling honestly, and the precision it is verified in."""

    model: str  # a key of the models given to `measure`
    sampled: Precision
    verified: Precision
    temperature: float
    top_p: float
    group: int  # samples per task; a batch holds batch // group tasks
    batch: int
    threads: int
    max_tokens: int
    rollouts: int  # at scale 1
    sampled_on: str = "cpu"  # where the node samples (the validator prefills on the CPU)

    def label(self) -> str:
        top_p = "" if self.top_p == 1 else f" top-p {self.top_p:g}"
        on = "" if self.sampled_on == "cpu" else f" on {self.sampled_on}"
        return (
            f"{self.model}, {self.sampled} sampled{on} / {self.verified} verified, "
            f"T {self.temperature:g}{top_p}, batch {self.batch}, {self.threads} thr, "
            f"{self.max_tokens} tok"
        )


def honest_tasks() -> list[Task]:
    """The task set every honest row draws its tasks from (demo tasks)."""
    from orchestrator.tasks.generators import demo_tasks

    return demo_tasks(2000, seed=24)


def model_dir(name: str, models: Path) -> Path:
    """The model ``name`` ("default" or "smollm2") under ``models``, built or imported
    there if missing (ValueError in one sentence when SmolLM2 is not installed)."""
    from orchestrator.pretrain import build_default_model
    from swarmrl.models import smollm2

    if name == "default":
        return build_default_model(models / "default")
    return smollm2.import_smollm2(models / "smollm2")


def variations(models: Iterable[str]) -> list[Variation]:
    """The variations measured for each model."""
    out = []
    for model in models:
        base = Variation(model, "bf16", "bf16", 1.0, 1.0, 8, 16, 1, 128, 64)
        pairs: list[tuple[Precision, Precision]] = [("bf16", "bf16"), ("bf16", "fp32")]
        for sampled, verified in [*pairs, ("fp32", "fp32")]:
            for temperature, top_p in ((1.0, 1.0), (0.0, 1.0), (1.0, 0.9)):
                out.append(
                    replace(
                        base,
                        sampled=sampled,
                        verified=verified,
                        temperature=temperature,
                        top_p=top_p,
                    )
                )
        longest = LONGEST[model]
        out += [
            replace(base, group=1, batch=1, rollouts=16),  # unpadded, one at a time
            replace(base, batch=64),
            replace(base, threads=2),
            replace(base, max_tokens=longest, rollouts=16),
            replace(base, temperature=0.0, max_tokens=longest, rollouts=16),
        ]
    return out


@dataclass
class Row:
    """What one variation's honest rollouts cost their node."""

    variation: Variation
    rollouts: int = 0
    tokens: int = 0
    rejected: int = 0
    evidence: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # the first reason, counted
    worst: dict[str, float] = field(default_factory=dict)  # per check, the largest distance
    # Each submission's own colder-sampling z (those with a token drawn at random); the
    # node's accumulated z is worst["temperature"].
    submission_z: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def z_mean(self) -> float | None:
        """The mean of the submissions' own z: the shift bf16 sampling gives each."""
        return sum(self.submission_z) / len(self.submission_z) if self.submission_z else None


def measure(
    variation: Variation,
    model_dir: Path,
    tasks: list[Task],
    scale: float,
    backends: dict[tuple[str, Precision], TorchBackend],
) -> Row:
    """Generate and verify one variation's rollouts (backends are kept across calls)."""
    began = time.perf_counter()
    torch.set_num_threads(variation.threads)

    def backend(precision: Precision) -> TorchBackend:
        key = (variation.model, precision)
        if key not in backends:
            backends[key] = TorchBackend(model_dir, device="cpu", dtype=torch_dtype(precision))
        return backends[key]

    chosen = chosen_tasks(variation, tasks, scale)
    records = sample(variation, backend(variation.sampled), chosen)
    row = judge(variation, backend(variation.verified), chosen, records)
    row.seconds = time.perf_counter() - began
    return row


def chosen_tasks(variation: Variation, tasks: list[Task], scale: float) -> list[Task]:
    """The tasks a variation samples at ``scale``, a group each: drawn from its seed, so
    the sampler and a validator elsewhere pick the same ones."""
    count = max(variation.group, round(variation.rollouts * scale))
    seed = hash_seed(variation)
    return [tasks[(seed + i) % len(tasks)] for i in range(math.ceil(count / variation.group))]


def sample(variation: Variation, sampler: TorchBackend, chosen: list[Task]) -> list[Rollout]:
    """The honest node's records for ``chosen``, task by task (the node's own path)."""
    params = SamplingParams(
        max_tokens=variation.max_tokens, temperature=variation.temperature, top_p=variation.top_p
    )
    return generate_rollouts(
        sampler,
        chosen,
        n=variation.group,
        params=params,
        provenance=Provenance(run="trust", policy_step=0, node=NODE),
        seed=hash_seed(variation),
        score=task_reward,
        target_for=lambda _speed: variation.max_tokens,
        batch_size=variation.batch,
    )


def judge(
    variation: Variation, validator: TorchBackend, chosen: list[Task], records: list[Rollout]
) -> Row:
    """Verify ``records`` (sampled for ``chosen``) as the validator judges one node's
    prefilled submissions in turn."""
    row = Row(variation)
    asked = Assignment(
        run="trust",
        node=NODE,
        step=0,
        group_size=variation.group,
        max_tokens=variation.max_tokens,
        temperature=variation.temperature,
        top_p=variation.top_p,
    )
    sums = NO_SUMS  # one node's, over its submissions
    # The records come task by task, a group each. Consecutive tasks of the task set are
    # distinct, so an order never holds a task twice (a long run wraps around the set).
    for first in range(0, len(chosen), ORDER_TASKS):
        order = {t.problem_id: t for t in chosen[first : first + ORDER_TASKS]}
        submission = records[first * variation.group : (first + ORDER_TASKS) * variation.group]
        if {r.problem_id for r in submission} != set(order):
            raise ValueError(f"{variation.label()}: the records are not the chosen tasks'")
        judged = verify_submission(validator, submission, order, asked, task_reward, prior=sums)
        sums = sums.then(judged.temperature)
        if judged.temperature.submissions:
            row.submission_z.append(judged.temperature.z)
        _count(row, submission, judged.verdicts)
    return row


def _count(row: Row, records: list[Rollout], verdicts: list[Verdict]) -> None:
    for record, verdict in zip(records, verdicts, strict=True):
        row.rollouts += 1
        row.tokens += len(record.output_ids)
        for check, distance in verdict.distances.items():
            row.worst[check] = max(row.worst.get(check, -math.inf), distance)
        if not verdict.accepted:
            row.rejected += 1
            row.evidence += verdict.slashable
            row.reasons[verdict.reason] = row.reasons.get(verdict.reason, 0) + 1


def hash_seed(variation: Variation) -> int:
    """A seed of the variation's own: stable across runs and Python processes."""
    import hashlib

    return int.from_bytes(hashlib.sha256(variation.label().encode()).digest()[:4], "big")


def run(
    models: dict[str, Path],
    tasks: list[Task],
    *,
    scale: float = 1.0,
    on_row: Callable[[Row], None] = lambda _row: None,
    results: Path | None = None,
) -> list[Row]:
    """Every variation of every model; ``on_row`` hears each row as it is done.

    With ``results`` (JSON lines), a row measured there before at the same scale is
    taken from it and each new row is appended, so a long run stopped part-way goes on
    where it stopped (a row's seed is its variation's, so it is the same row)."""
    saved = _saved_rows(results, scale) if results is not None else {}
    backends: dict[tuple[str, Precision], TorchBackend] = {}
    threads = torch.get_num_threads()
    rows = []
    try:
        for variation in variations(models):
            row = saved.get(variation.label())
            if row is None:
                row = measure(variation, models[variation.model], tasks, scale, backends)
                if results is not None:
                    with open(results, "a") as f:
                        f.write(json.dumps({"scale": scale, "row": asdict(row)}) + "\n")
            rows.append(row)
            on_row(row)
    finally:
        torch.set_num_threads(threads)
    return rows


def _saved_rows(results: Path, scale: float) -> dict[str, Row]:
    """The rows ``results`` holds at ``scale``, by their variation's label (a line cut
    short by a stop is left out)."""
    rows = {}
    lines = results.read_text().splitlines() if results.exists() else []
    for line in lines:
        try:
            saved = json.loads(line)
            if saved["scale"] != scale:
                continue
            fields = saved["row"]
            row = Row(variation=Variation(**fields.pop("variation")), **fields)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not a row this version wrote: measured again
        rows[row.variation.label()] = row
    return rows


def table(rows: list[Row]) -> str:
    """The false-positive table (markdown): per variation, then per check. The
    ``temperature`` check's worst is the node's accumulated z; each submission's own z
    has a column of its own (worst / mean)."""
    checks = [t.check for t in TOLERANCES]
    lines = [
        "| variation | rollouts | tokens | rejected | evidence | "
        + " | ".join(f"worst {c}" for c in checks)
        + " | submission z (worst / mean) | seconds |",
        "| --- | ---: | ---: | ---: | ---: | "
        + " | ".join("---:" for _ in checks)
        + " | ---: | ---: |",
    ]
    for r in rows:
        worst = " | ".join(f"{r.worst[c]:.3g}" if c in r.worst else "" for c in checks)
        mean = r.z_mean()
        own = "" if mean is None else f"{max(r.submission_z):.3g} / {mean:.3g}"
        lines.append(
            f"| {r.variation.label()} | {r.rollouts} | {r.tokens} | {r.rejected} | "
            f"{r.evidence} | {worst} | {own} | {r.seconds:.0f} |"
        )
    lines += ["", "| check | honest worst | rejects above | evidence above | margin |"]
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    for tolerance in TOLERANCES:
        seen = [r.worst[tolerance.check] for r in rows if tolerance.check in r.worst]
        honest = max(seen, default=0.0)
        evidence = "never" if tolerance.evidence is None else f"{tolerance.evidence:g}"
        margin = ""
        if tolerance.evidence is not None and honest > 0:
            margin = f"{tolerance.evidence / honest:.1f}x"
        # A check these variations never ran (staleness needs an older step) shows so.
        worst = f"{honest:.3g}" if seen else "not run"
        lines.append(
            f"| {tolerance.check} ({tolerance.unit}) | {worst} | {tolerance.reject:g} | "
            f"{evidence} | {margin} |"
        )
    lines += ["", _carried(rows)]
    return "\n".join(lines)


def _carried(rows: list[Row]) -> str:
    """What the colder-sampling sums can carry: the largest mean z per submission (the
    shift honest sampling gives every submission of its variation), times CARRIED."""
    means = [(mean, r) for r in rows if (mean := r.z_mean()) is not None]
    if not means:
        return f"{TEMPERATURE.check}: no submission drew a token at random"
    shift, row = max(means, key=lambda m: m[0])
    count = sum(len(r.submission_z) for r in rows)
    worst = max(z for r in rows for z in r.submission_z)
    return (
        f"{TEMPERATURE.check}: {count} submissions, own z at most {worst:.3g}; the largest "
        f"mean shift, {shift:.3g} ({row.variation.label()}), carried by a node's sums to "
        f"{shift * CARRIED:.3g} (x{CARRIED:.2f}) against the threshold {TEMPERATURE.reject:g}"
    )
