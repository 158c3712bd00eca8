"""`swarmrl rollouts verify`: a validator's check of a node's rollout file.

stdout carries who signed the file, one line per rollout and a summary; the exit
status is 1 if any rollout is rejected, or if the check could not be made (then
no rollout is reported as rejected).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import typer

from swarmrl.cli_options import BackendName, Device, ModelDir, RunPrecision, quiet_transformers
from swarmrl.models.backend import Precision
from swarmrl.rollouts.checks import Assignment
from swarmrl.rollouts.records import Rollout
from swarmrl.rollouts.signing import FileSignature

ValidatorTasks = typer.Option(
    ...,
    "--tasks",
    help="The validator's own task set (.parquet or .jsonl): each record's task is looked up "
    "here by problem_id, never taken from the record.",
)


def _assignment(
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


def rollouts_verify(
    file: Path = typer.Argument(..., help="A rollout file (.parquet)."),
    model: Path = ModelDir,
    tasks: Path = ValidatorTasks,
    n: int | None = typer.Option(
        None,
        "--n",
        min=1,
        max=1 << 20,
        help="Samples per task asked for (default: what the node signed; needed if unsigned).",
    ),
    step: int | None = typer.Option(
        None,
        "--step",
        min=0,
        max=2**64 - 1,
        help="Policy step asked for (default: what the node signed).",
    ),
    deployment: Path | None = typer.Option(
        None,
        "--deployment",
        help="The deployment a signed file is checked against (default: $SWARMRL_DEPLOYMENT, "
        "else the one `chain up` wrote).",
    ),
    backend: str = BackendName,
    device: str = Device,
    precision: Precision = RunPrecision,
) -> None:
    """Check a node's rollout file against the validator's own tasks, model and the signed
    (or given) settings: signature, task data, groups, TOPLOC proofs, sampling, rewards.

    Prints the signer, one line per rollout and a summary; exits 1 if any is rejected.
    """
    from swarmrl.models import load_backend
    from swarmrl.rollouts.records import file_digest, read_rollout_file
    from swarmrl.rollouts.signing import run_domain
    from swarmrl.rollouts.verify import Verdict, verify_rollouts
    from swarmrl.tasks import read_tasks
    from swarmrl.tasks.rewards import task_reward

    quiet_transformers()
    read = read_rollout_file(file)
    records, signature = read.rollouts, read.signature
    if not records:
        raise ValueError(f"{file} holds no rollouts")
    task_set = {t.problem_id: t for t in read_tasks(tasks)}
    asked = _assignment(records, signature, n, step, precision)
    digest = file_digest(records)
    forged = None
    if signature is None:
        typer.echo(f"file 0x{digest.hex()}: unsigned; node, run and step are not attested")
    else:
        domain, _ = run_domain(deployment)
        signer = signature.signer(domain, digest)
        if signer is None or signer.lower() != signature.node.lower():
            forged = (
                f"the file's signature is not by the node it names ({signature.node}), "
                "or not for this deployment"
            )
            typer.echo(f"file 0x{digest.hex()}: BAD SIGNATURE")
        else:
            typer.echo(
                f"file 0x{digest.hex()}: signed by {signer} for run {signature.run}, step "
                f"{signature.step}: {signature.group_size} samples per task, temperature "
                f"{signature.temperature:g}, top-p {signature.top_p:g}, up to "
                f"{signature.max_tokens} tokens"
            )
    try:
        engine = load_backend(backend, model, device=device, precision=asked.precision)
    except ValueError as e:
        raise ValueError(
            f"the validator's own model is unusable, so no rollout was judged: {e}"
        ) from None
    began = time.perf_counter()
    if forged:
        verdicts = [Verdict(False, forged) for _ in records]
    else:
        verdicts = verify_rollouts(engine, records, task_set, asked, task_reward)
    rejected = 0
    for i, (record, verdict) in enumerate(zip(records, verdicts, strict=True)):
        where = f"{i:>4} {record.problem_id} #{record.sample}"
        if verdict.accepted:
            typer.echo(
                f"{where}: ok  {verdict.chunks} chunks, reward {record.reward:.4f} "
                f"(task {record.task_reward:g})"
            )
        else:
            rejected += 1
            typer.echo(f"{where}: REJECTED  {verdict.reason}")
    seconds = time.perf_counter() - began
    typer.echo(
        f"{len(records) - rejected} of {len(records)} rollouts accepted, "
        f"{rejected} rejected ({seconds:.1f} s)"
    )
    sys.stdout.flush()
    if rejected:
        raise typer.Exit(1)
