"""`swarmrl model`, `swarmrl tasks` and `swarmrl rollouts`: what a coordinator,
a validator or a curious volunteer runs by hand, and what the daemons call.

Progress goes to stderr; stdout carries the results a script reads (a model's
path, one line per verified rollout and a summary).
"""

from __future__ import annotations

import random
import re
import sys
import time
from pathlib import Path

import typer

model_app = typer.Typer(help="Build or import a policy model.", no_args_is_help=True)
tasks_app = typer.Typer(
    help="Task datasets: the demo's generators and the filter.", no_args_is_help=True
)
rollouts_app = typer.Typer(
    help="Generate proven rollouts, or verify a rollout file.", no_args_is_help=True
)

ZERO_ADDRESS = "0x" + "00" * 20
ModelDir = typer.Option(..., "--model", help="The policy: an HF model directory (safetensors).")
BackendName = typer.Option("torch", "--backend", help="Inference backend: torch or vllm.")
Device = typer.Option(None, "--device", help="torch device (default: cuda if present, else cpu).")
TasksFile = typer.Option(..., "--tasks", help="Tasks: .parquet or .jsonl.")
MaxTokens = typer.Option(256, "--max-tokens", min=1, help="Longest completion, in tokens.")
Temperature = typer.Option(1.0, "--temperature", min=0.0, help="Sampling temperature (0: greedy).")


def _err(text: str) -> None:
    typer.echo(text, err=True)


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


# -- model ----------------------------------------------------------------------


@model_app.command("init")
def model_init(
    out: Path = typer.Option(
        None, "--out", help="Where to write it (default: the models dir's 'default')."
    ),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the weights and training data."),
) -> None:
    """Build the embedded default policy: a tiny Llama pre-trained on the demo tasks."""
    from orchestrator.pretrain import Recipe, build_default_model
    from swarmrl.models.files import default_models_dir

    _quiet_transformers()
    recipe = Recipe(seed=seed)
    out = out or default_models_dir() / "default"
    began = time.perf_counter()

    def progress(step: int, loss: float) -> None:
        if step % 100 == 0 or step == recipe.steps:
            _err(f"step {step}/{recipe.steps}  loss {loss:.3f}")

    path = build_default_model(out, recipe, progress=progress)
    _err(f"ready in {time.perf_counter() - began:.0f} s")
    typer.echo(path)


@model_app.command("import-smollm2")
def model_import_smollm2(
    out: Path = typer.Option(
        None, "--out", help="Where to write it (default: the models dir's 'smollm2-135m')."
    ),
) -> None:
    """Convert SmolLM2-135M-Instruct from its PyPI GGUF to safetensors, offline."""
    from swarmrl.models.files import default_models_dir
    from swarmrl.models.smollm2 import import_smollm2

    _quiet_transformers()
    typer.echo(import_smollm2(out or default_models_dir() / "smollm2-135m"))


# -- tasks ----------------------------------------------------------------------


@tasks_app.command("generate")
def tasks_generate(
    out: Path = typer.Option(..., "--out", help="Output file: .parquet or .jsonl."),
    n: int = typer.Option(64, "--n", min=1, help="How many tasks."),
    seed: int = typer.Option(0, "--seed", min=0, help="Generator seed."),
) -> None:
    """Write demo tasks (arithmetic and two-step word problems)."""
    from orchestrator.tasks.generators import demo_tasks
    from swarmrl.tasks import write_tasks

    write_tasks(demo_tasks(n, seed=seed), out)
    typer.echo(out)


@tasks_app.command("filter")
def tasks_filter(
    model: Path = ModelDir,
    tasks: Path = TasksFile,
    out: Path = typer.Option(..., "--out", help="Kept tasks, with their solve rates."),
    k: int = typer.Option(8, "--k", min=1, help="Samples per task."),
    low: float = typer.Option(0.0, "--min", min=0.0, max=1.0, help="Lowest solve rate kept."),
    high: float = typer.Option(0.9, "--max", min=0.0, max=1.0, help="Highest solve rate kept."),
    max_tokens: int = MaxTokens,
    temperature: float = Temperature,
    seed: int = typer.Option(0, "--seed", min=0),
    backend: str = BackendName,
    device: str = Device,
) -> None:
    """Keep the tasks whose solve rate by MODEL (k samples each) lies in [min, max]."""
    from orchestrator.tasks.filter import filter_tasks
    from swarmrl.models import load_backend
    from swarmrl.models.backend import SamplingParams
    from swarmrl.tasks import read_tasks, write_tasks

    if low > high:
        raise ValueError(f"--min {low} is above --max {high}")
    _quiet_transformers()
    items = read_tasks(tasks)
    engine = load_backend(backend, model, device=device)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    kept = filter_tasks(engine, items, k=k, band=(low, high), params=params, seed=seed)
    write_tasks(kept, out)
    _err(f"kept {len(kept)} of {len(items)} tasks with solve rate in [{low:g}, {high:g}]")
    typer.echo(out)


# -- rollouts -------------------------------------------------------------------


def _parse_targets(text: str) -> tuple[int, ...]:
    try:
        targets = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ValueError(f"--targets must be comma-separated token counts, got {text!r}") from None
    if not targets or min(targets) < 1:
        raise ValueError(f"--targets must be positive token counts, got {text!r}")
    return targets


@rollouts_app.command("generate")
def rollouts_generate(
    model: Path = ModelDir,
    tasks: Path = TasksFile,
    out: Path = typer.Option(..., "--out", help="Output rollout file (.parquet)."),
    n: int = typer.Option(4, "--n", min=1, help="Completions per task (the GRPO group)."),
    max_tokens: int = MaxTokens,
    temperature: float = Temperature,
    top_p: float = typer.Option(1.0, "--top-p", max=1.0, help="Nucleus mass kept, in (0, 1]."),
    targets: str = typer.Option(
        "64,128,256", "--targets", help="Thinking budgets to choose from, by measured speed."
    ),
    window: float = typer.Option(
        60.0, "--window", min=0.0, help="Seconds a target may take at the measured speed."
    ),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of sampling and target choice."),
    run: str = typer.Option("local", "--run", help="Run id recorded in every record."),
    step: int = typer.Option(0, "--step", min=0, help="Policy step recorded in every record."),
    node: str = typer.Option(ZERO_ADDRESS, "--node", help="Node address recorded."),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="Sequences per batch."),
    backend: str = BackendName,
    device: str = Device,
) -> None:
    """Sample N proven completions per task, score them, and write a rollout file."""
    from orchestrator.tasks.rewards import choose_target_length, task_reward
    from swarmrl.models import load_backend
    from swarmrl.models.backend import SamplingParams
    from swarmrl.rollouts.generate import Provenance, generate_rollouts
    from swarmrl.rollouts.records import file_digest, write_rollouts
    from swarmrl.tasks import read_tasks

    if out.suffix != ".parquet":
        raise ValueError(f"{out}: rollouts are written as .parquet files")
    if not re.fullmatch(r"0x[0-9a-fA-F]{40}", node):
        raise ValueError(f"--node must be a 0x-prefixed 20-byte address, got {node!r}")
    if window <= 0:
        raise ValueError(f"--window must be positive, got {window}")
    if not 1 <= len(run) <= 128:
        raise ValueError("--run must be 1 to 128 characters")
    budgets = _parse_targets(targets)
    _quiet_transformers()
    items = read_tasks(tasks)
    engine = load_backend(backend, model, device=device)
    rng = random.Random(seed)

    def target_for(speed: float | None) -> int:
        if speed is None:
            return min(budgets)
        return choose_target_length(budgets, speed, window, rng)

    def on_batch(done: int, total: int, speed: float) -> None:
        _err(f"{done}/{total} rollouts  {speed:.0f} tokens/s")

    records = generate_rollouts(
        engine,
        items,
        n=n,
        params=SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p),
        provenance=Provenance(run=run, policy_step=step, node=node),
        seed=seed,
        score=task_reward,
        target_for=target_for,
        batch_size=batch_size,
        on_batch=on_batch,
    )
    write_rollouts(records, out)
    solved = sum(r.task_reward > 0 for r in records)
    _err(f"{len(records)} rollouts, {solved} solved; file digest 0x{file_digest(records).hex()}")
    typer.echo(out)


@rollouts_app.command("verify")
def rollouts_verify(
    file: Path = typer.Argument(..., help="A rollout file (.parquet)."),
    model: Path = ModelDir,
    backend: str = BackendName,
    device: str = Device,
) -> None:
    """Check every record: prefill its TOPLOC proofs and recompute its rewards.

    Prints one line per rollout and a summary; exits 1 if any is rejected.
    """
    from orchestrator.tasks.rewards import task_reward
    from swarmrl.models import load_backend
    from swarmrl.rollouts.records import read_rollouts
    from swarmrl.rollouts.verify import verify_rollout

    _quiet_transformers()
    records = read_rollouts(file)
    engine = load_backend(backend, model, device=device)
    rejected = 0
    began = time.perf_counter()
    for i, record in enumerate(records):
        verdict = verify_rollout(engine, record, task_reward)
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
