"""A validator's check of a node's rollout file: what `swarmrl rollouts verify` does.

Two steps, so a caller can show who signed the file before the model loads: `read_file`
reads the file, its signature and what was asked for; `judge_file` loads the
validator's model and judges every rollout. A check that cannot be made is a
ValueError (or OSError) in one sentence, and then no rollout is judged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from swarmrl.models.backend import Precision
from swarmrl.rollouts.checks import Assignment
from swarmrl.rollouts.records import Rollout
from swarmrl.rollouts.signing import FileSignature

if TYPE_CHECKING:
    from swarmrl.rollouts.verify import Verdict
    from swarmrl.tasks.format import Task


def assignment(
    rollouts: list[Rollout],
    signature: FileSignature | None,
    n: int | None,
    step: int | None,
    precision: Precision,
) -> Assignment:
    """What the node was asked for: the signed settings, or for an unsigned file the first
    record's (then only their consistency is checked), with --n and --step over either;
    the precision is the run's, which neither states."""
    if signature is not None:
        asked = Assignment(
            run=signature.run,
            node=signature.node,
            step=signature.step,
            group_size=signature.group_size,
            max_tokens=signature.max_tokens,
            temperature=signature.temperature,
            top_p=signature.top_p,
            precision=precision,
        )
    elif n is None:
        raise ValueError(
            "the file is unsigned, so it does not say how many samples per task were asked "
            "for: pass --n (and have nodes sign with `rollouts generate --key`)"
        )
    else:
        first = rollouts[0]
        asked = Assignment(
            run=first.run,
            node=first.node,
            step=first.policy_step,
            group_size=n,
            max_tokens=first.max_tokens,
            temperature=first.temperature,
            top_p=first.top_p,
            precision=precision,
        )
    if n is not None:
        asked = replace(asked, group_size=n)
    if step is not None:
        asked = replace(asked, step=step)
    return asked


@dataclass(frozen=True)
class ReadFile:
    """A rollout file read against the validator's tasks: its records, what was asked
    for, and its signature's standing: who signed it, and `forged` saying why that is not
    the node it names (or not for this deployment)."""

    rollouts: list[Rollout]
    tasks: dict[str, Task]
    asked: Assignment
    digest: bytes
    signature: FileSignature | None
    signer: str | None
    forged: str | None

    def header(self) -> str:
        """The line that says who signed the file, and for what."""
        s = self.signature
        if s is None:
            return f"file 0x{self.digest.hex()}: unsigned; node, run and step are not attested"
        if self.forged:
            return f"file 0x{self.digest.hex()}: BAD SIGNATURE"
        return (
            f"file 0x{self.digest.hex()}: signed by {self.signer} for run {s.run}, step "
            f"{s.step}: {s.group_size} samples per task, temperature "
            f"{s.temperature:g}, top-p {s.top_p:g}, up to {s.max_tokens} tokens"
        )


def read_file(
    file: Path,
    tasks: Path,
    *,
    n: int | None = None,
    step: int | None = None,
    deployment: Path | None = None,
    precision: Precision = "fp32",
) -> ReadFile:
    """Reads `file` and the validator's own task set `tasks`, settles what was asked for
    and checks a signature against `deployment`'s run."""
    from swarmrl.rollouts.records import file_digest, read_rollout_file
    from swarmrl.rollouts.signing import run_domain
    from swarmrl.tasks import read_tasks

    read = read_rollout_file(file)
    records, signature = read.rollouts, read.signature
    if not records:
        raise ValueError(f"{file} holds no rollouts")
    task_set = {t.problem_id: t for t in read_tasks(tasks)}
    asked = assignment(records, signature, n, step, precision)
    digest = file_digest(records)
    forged = signer = None
    if signature is not None:
        domain, _ = run_domain(deployment)
        signer = signature.signer(domain, digest)
        if signer is None or signer.lower() != signature.node.lower():
            forged = (
                f"the file's signature is not by the node it names ({signature.node}), "
                "or not for this deployment"
            )
    return ReadFile(records, task_set, asked, digest, signature, signer, forged)


@dataclass(frozen=True)
class Judged:
    """Every rollout's verdict, in the file's order, and how long judging took."""

    rollouts: list[Rollout]
    verdicts: list[Verdict]
    seconds: float

    @property
    def rejected(self) -> int:
        return sum(not v.accepted for v in self.verdicts)

    def lines(self) -> list[str]:
        """One line per rollout."""
        out = []
        for i, (record, verdict) in enumerate(zip(self.rollouts, self.verdicts, strict=True)):
            where = f"{i:>4} {record.problem_id} #{record.sample}"
            if verdict.accepted:
                out.append(
                    f"{where}: ok  {verdict.chunks} chunks, reward {record.reward:.4f} "
                    f"(task {record.task_reward:g})"
                )
            else:
                out.append(f"{where}: REJECTED  {verdict.reason}")
        return out

    def summary(self) -> str:
        return (
            f"{len(self.rollouts) - self.rejected} of {len(self.rollouts)} rollouts accepted, "
            f"{self.rejected} rejected ({self.seconds:.1f} s)"
        )


def judge_file(
    read: ReadFile, model: Path, *, backend: str = "torch", device: str | None = None
) -> Judged:
    """Loads the validator's model and judges every rollout of `read`: all rejected, with
    the reason, when its signature is forged."""
    from swarmrl.models import load_backend
    from swarmrl.rollouts.verify import Verdict, verify_rollouts
    from swarmrl.tasks.rewards import task_reward

    try:
        engine = load_backend(backend, model, device=device, precision=read.asked.precision)
    except ValueError as e:
        raise ValueError(
            f"the validator's own model is unusable, so no rollout was judged: {e}"
        ) from None
    began = time.perf_counter()
    if read.forged:
        verdicts = [Verdict(False, read.forged) for _ in read.rollouts]
    else:
        verdicts = verify_rollouts(engine, read.rollouts, read.tasks, read.asked, task_reward)
    return Judged(read.rollouts, verdicts, time.perf_counter() - began)
