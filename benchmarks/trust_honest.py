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

What a GPU adds (bf16 kernels of another vendor) is the cross-hardware row: a GPU
generates, this CPU verifies (benchmarks/BENCHMARKS.md says where it was run).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from swarmrl.models.backend import Precision, SamplingParams, torch_dtype
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.rollouts.checks import Assignment
from swarmrl.rollouts.generate import Provenance, generate_rollouts
from swarmrl.rollouts.tolerances import TOLERANCES
from swarmrl.rollouts.verify import verify_rollouts
from swarmrl.tasks import Task
from swarmrl.tasks.rewards import task_reward

NODE = "0x" + "11" * 20


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

    def label(self) -> str:
        top_p = "" if self.top_p == 1 else f" top-p {self.top_p:g}"
        return (
            f"{self.model}, {self.sampled} sampled / {self.verified} verified, "
            f"T {self.temperature:g}{top_p}, batch {self.batch}, {self.threads} thr, "
            f"{self.max_tokens} tok"
        )


def variations(models: Iterable[str], long_tokens: dict[str, int]) -> list[Variation]:
    """The variations measured for each model (``long_tokens``: its longest completion)."""
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
        longest = long_tokens[model]
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
    seconds: float = 0.0


def measure(
    variation: Variation,
    model_dir: Path,
    tasks: list[Task],
    scale: float,
    backends: dict[tuple[str, Precision], TorchBackend],
) -> Row:
    """Generate and verify one variation's rollouts (backends are kept across calls)."""
    began = time.perf_counter()
    row = Row(variation)
    torch.set_num_threads(variation.threads)

    def backend(precision: Precision) -> TorchBackend:
        key = (variation.model, precision)
        if key not in backends:
            backends[key] = TorchBackend(model_dir, device="cpu", dtype=torch_dtype(precision))
        return backends[key]

    sampler, validator = backend(variation.sampled), backend(variation.verified)
    count = max(variation.group, round(variation.rollouts * scale))
    n_tasks = math.ceil(count / variation.group)
    seed = hash_seed(variation)
    chosen = [tasks[(seed + i) % len(tasks)] for i in range(n_tasks)]
    params = SamplingParams(
        max_tokens=variation.max_tokens, temperature=variation.temperature, top_p=variation.top_p
    )
    records = generate_rollouts(
        sampler,
        chosen,
        n=variation.group,
        params=params,
        provenance=Provenance(run="trust", policy_step=0, node=NODE),
        seed=seed,
        score=task_reward,
        target_for=lambda _speed: variation.max_tokens,
        batch_size=variation.batch,
    )
    asked = Assignment(
        run="trust",
        node=NODE,
        step=0,
        group_size=variation.group,
        max_tokens=variation.max_tokens,
        temperature=variation.temperature,
        top_p=variation.top_p,
    )
    verdicts = verify_rollouts(
        validator, records, {t.problem_id: t for t in chosen}, asked, task_reward
    )
    for record, verdict in zip(records, verdicts, strict=True):
        row.rollouts += 1
        row.tokens += len(record.output_ids)
        for check, distance in verdict.distances.items():
            row.worst[check] = max(row.worst.get(check, 0.0), distance)
        if not verdict.accepted:
            row.rejected += 1
            row.evidence += verdict.slashable
            row.reasons[verdict.reason] = row.reasons.get(verdict.reason, 0) + 1
    row.seconds = time.perf_counter() - began
    return row


def hash_seed(variation: Variation) -> int:
    """A seed of the variation's own: stable across runs and Python processes."""
    import hashlib

    return int.from_bytes(hashlib.sha256(variation.label().encode()).digest()[:4], "big")


def run(
    models: dict[str, Path],
    tasks: list[Task],
    *,
    scale: float = 1.0,
    long_tokens: dict[str, int],
    on_row: Callable[[Row], None] = lambda _row: None,
) -> list[Row]:
    """Every variation of every model; ``on_row`` hears each row as it is done."""
    backends: dict[tuple[str, Precision], TorchBackend] = {}
    threads = torch.get_num_threads()
    rows = []
    try:
        for variation in variations(models, long_tokens):
            rows.append(measure(variation, models[variation.model], tasks, scale, backends))
            on_row(rows[-1])
    finally:
        torch.set_num_threads(threads)
    return rows


def table(rows: list[Row]) -> str:
    """The false-positive table (markdown): per variation, then per check."""
    checks = [t.check for t in TOLERANCES]
    lines = [
        "| variation | rollouts | tokens | rejected | evidence | "
        + " | ".join(f"worst {c}" for c in checks)
        + " | seconds |",
        "| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in checks) + " | ---: |",
    ]
    for r in rows:
        worst = " | ".join(f"{r.worst[c]:.3g}" if c in r.worst else "" for c in checks)
        lines.append(
            f"| {r.variation.label()} | {r.rollouts} | {r.tokens} | {r.rejected} | "
            f"{r.evidence} | {worst} | {r.seconds:.0f} |"
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
    return "\n".join(lines)
