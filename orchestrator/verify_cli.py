"""`swarmrl rollouts verify`: a validator's check of a node's rollout file.

stdout carries who signed the file, one line per rollout and a summary; the exit
status is 1 if any rollout is rejected, or if the check could not be made (then
no rollout is reported as rejected).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from swarmrl.cli_options import BackendName, Device, ModelDir, RunPrecision, quiet_transformers
from swarmrl.models.backend import Precision

ValidatorTasks = typer.Option(
    ...,
    "--tasks",
    help="The validator's own task set (.parquet or .jsonl): each record's task is looked up "
    "here by problem_id, never taken from the record.",
)


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
    from orchestrator.verify_file import judge_file, read_file

    quiet_transformers()
    read = read_file(file, tasks, n=n, step=step, deployment=deployment, precision=precision)
    typer.echo(read.header())
    judged = judge_file(read, model, backend=backend, device=device)
    for line in judged.lines():
        typer.echo(line)
    typer.echo(judged.summary())
    sys.stdout.flush()
    if judged.rejected:
        raise typer.Exit(1)
