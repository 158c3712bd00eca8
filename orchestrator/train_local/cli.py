"""`swarmrl train local`: asynchronous GRPO on one machine."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from swarmrl.cli_options import (
    BackendName,
    Device,
    ModelDir,
    TasksFile,
    quiet_transformers,
    seed_option,
)
from swarmrl.files import check_output_dir

train_app = typer.Typer(help="Train a policy with asynchronous GRPO.", no_args_is_help=True)


@train_app.command("local")
def train_local_command(
    model: Path = ModelDir,
    tasks: Path = TasksFile,
    out: Path = typer.Option(
        ..., "--out", help="The run directory (checkpoints, metrics); reuse it to continue."
    ),
    steps: int = typer.Option(
        100, "--steps", min=1, max=1_000_000, help="Stop after this many steps."
    ),
    minutes: float = typer.Option(
        None,
        "--minutes",
        min=0.0,
        max=525_600.0,
        help="Stop after this many minutes (default: no limit).",
    ),
    async_level: int = typer.Option(
        2, "--async-level", min=0, max=64, help="Train on samples at most this many steps old."
    ),
    group_size: int = typer.Option(
        8, "--group-size", min=2, max=1024, help="Completions per task."
    ),
    prompts_per_step: int = typer.Option(
        16, "--prompts-per-step", min=1, max=4096, help="Groups per optimizer step."
    ),
    workers: int = typer.Option(
        None,
        "--workers",
        min=1,
        max=64,
        help="Inference worker processes (default: half the cores, at least 2).",
    ),
    lr: float = typer.Option(1e-4, "--lr", min=0.0, max=1.0, help="Peak learning rate."),
    warmup_steps: int = typer.Option(
        5, "--warmup-steps", min=0, max=1_000_000, help="Steps of linear warm-up."
    ),
    max_grad_norm: float = typer.Option(
        0.1, "--max-grad-norm", min=0.0, max=1e6, help="Gradient norm clip."
    ),
    advantage_scale: Literal["none", "std"] = typer.Option(
        "none", "--advantage-scale", help="none (reward minus group mean) or std (also / std)."
    ),
    ratio_against: Literal["sampler", "trainer"] = typer.Option(
        "sampler",
        "--ratio-against",
        help="The ratio's denominator: sampler (the log-probabilities the tokens were drawn "
        "with) or trainer (recomputed before the update, as INTELLECT-2 did).",
    ),
    kl_coef: float = typer.Option(
        0.0,
        "--kl-coef",
        min=0.0,
        max=1000.0,
        help="Weight of a KL term (k3) to the starting model.",
    ),
    entropy_coef: float = typer.Option(
        0.0, "--entropy-coef", min=0.0, max=1000.0, help="Weight of an entropy bonus."
    ),
    max_tokens: int = typer.Option(
        128, "--max-tokens", min=1, max=65_536, help="Longest completion."
    ),
    target_len: int = typer.Option(
        128, "--target-len", min=1, max=65_536, help="Thinking budget stated in prompts."
    ),
    seed: int = seed_option("Seed of sampling and of the task order."),
    backend: str = BackendName,
    device: str = Device,
) -> None:
    """Train MODEL on TASKS: inference workers sample while the trainer trains.

    Checkpoints go to OUT/checkpoints/step_<n>/, one JSON line per step to
    OUT/metrics.jsonl and the curves to OUT/metrics.png.
    """
    check_output_dir(out)
    from orchestrator.train_local.run import LocalRun, train_local
    from orchestrator.trainer.loop import TrainerSettings

    quiet_transformers()
    settings = TrainerSettings(
        steps=steps,
        async_level=async_level,
        group_size=group_size,
        prompts_per_step=prompts_per_step,
        lr=lr,
        warmup_steps=warmup_steps,
        max_grad_norm=max_grad_norm,
        advantage_scale=advantage_scale,
        ratio_against=ratio_against,
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
        max_tokens=max_tokens,
        seed=seed,
    )
    run = LocalRun(
        model=model,
        tasks=tasks,
        out=out,
        settings=settings,
        minutes=minutes,
        workers=workers,
        target_len=target_len,
        backend=backend,
        device=device,
    )
    typer.echo(train_local(run, lambda text: typer.echo(text, err=True)))
