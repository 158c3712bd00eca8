"""`swarmrl rollouts generate`: the node's work, sampled, proven, scored and signed.

Progress goes to stderr; stdout carries the rollout file's path.
"""

from __future__ import annotations

from pathlib import Path

import typer

from swarmrl.cli_options import (
    BackendName,
    DeploymentFile,
    Device,
    KeystoreDir,
    MaxTokens,
    ModelDir,
    PasswordFile,
    RunPrecision,
    TasksFile,
    Temperature,
    seed_option,
)
from swarmrl.models.backend import Precision


def rollouts_generate(
    model: Path = ModelDir,
    tasks: Path = TasksFile,
    out: Path = typer.Option(..., "--out", help="Output rollout file (.parquet)."),
    n: int = typer.Option(4, "--n", min=1, max=1024, help="Completions per task (the GRPO group)."),
    max_tokens: int = MaxTokens,
    temperature: float = Temperature,
    top_p: float = typer.Option(1.0, "--top-p", max=1.0, help="Nucleus mass kept, in (0, 1]."),
    targets: str = typer.Option(
        "64,128,256", "--targets", help="Thinking budgets to choose from, by measured speed."
    ),
    window: float = typer.Option(
        60.0, "--window", min=0.0, help="Seconds a target may take at the measured speed."
    ),
    seed: int = seed_option("Seed of sampling and target choice."),
    run: str | None = typer.Option(
        None,
        "--run",
        help="Run recorded in every record (default: local; with --key the deployment's run).",
    ),
    step: int = typer.Option(
        0, "--step", min=0, max=2**64 - 1, help="Policy step recorded in every record."
    ),
    node: str | None = typer.Option(
        None, "--node", help="Node address recorded (default: zero; with --key the key's)."
    ),
    key: str | None = typer.Option(
        None,
        "--key",
        help="Keystore name of the node's key: sign the file (EIP-712, for the deployment's "
        "run) with its digest, node, run, step and sampling settings.",
    ),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
    batch_size: int = typer.Option(
        32, "--batch-size", min=1, max=4096, help="Sequences per batch."
    ),
    backend: str = BackendName,
    device: str = Device,
    precision: Precision = RunPrecision,
) -> None:
    """Sample N proven completions per task, score them, and write a rollout file (signed
    with --key)."""
    from swarmrl.rollouts.generate_file import generate_rollout_file

    def on_batch(done: int, total: int, speed: float) -> None:
        typer.echo(f"{done}/{total} rollouts  {speed:.0f} tokens/s", err=True)

    made = generate_rollout_file(
        model=model,
        tasks=tasks,
        out=out,
        n=n,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        targets=targets,
        window=window,
        seed=seed,
        run=run,
        step=step,
        node=node,
        key=key,
        keystore_dir=keystore_dir,
        password_file=password_file,
        deployment=deployment,
        batch_size=batch_size,
        backend=backend,
        device=device,
        precision=precision,
        on_batch=on_batch,
    )
    typer.echo(made.summary(), err=True)
    typer.echo(made.path)
