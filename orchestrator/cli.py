"""`swarmrl model`, `swarmrl tasks` and `swarmrl eval`:
what a coordinator or a validator runs by hand, and what the daemons call.

Progress goes to stderr; stdout carries the results a script reads (a model's
path, one line per checked completion, a table of figures).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from swarmrl.cli_options import (
    BackendName,
    Device,
    MaxTokens,
    ModelDir,
    TasksFile,
    Temperature,
    quiet_transformers,
    seed_option,
)
from swarmrl.files import check_output_dir

model_app = typer.Typer(help="Build or import a policy model.", no_args_is_help=True)
tasks_app = typer.Typer(
    help="Task datasets: generate (demo, reasoning-gym), check completions, filter.",
    no_args_is_help=True,
)


def _err(text: str) -> None:
    typer.echo(text, err=True)


# -- model ----------------------------------------------------------------------


@model_app.command("init")
def model_init(
    out: Path = typer.Option(
        None, "--out", help="Where to write it (default: the models dir's 'default')."
    ),
    seed: int = seed_option("Seed of the weights and training data."),
    from_scratch: bool = typer.Option(
        False, "--from-scratch", help="Train it here (minutes) rather than copy the shipped build."
    ),
) -> None:
    """Write the embedded default policy: a tiny Llama pre-trained on the demo tasks.

    Seed 0's is shipped and copied in a moment; another seed, or --from-scratch, trains
    it here: minutes on a CPU, with progress and the time left on stderr.
    """
    from swarmrl.models.files import default_models_dir

    out = out or default_models_dir() / "default"
    check_output_dir(out)
    from orchestrator.pretrain import Progress, Recipe, build_default_model, trains

    quiet_transformers()
    recipe = Recipe(seed=seed)
    training = trains(out, recipe, from_scratch=from_scratch)
    if training:
        _err(f"pre-training the default model into {out}: preparing its training data")
    began = time.perf_counter()
    path = build_default_model(
        out, recipe, progress=Progress(recipe.steps, _err), from_scratch=from_scratch
    )
    if training:
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

    out = out or default_models_dir() / "smollm2-135m"
    check_output_dir(out)
    from swarmrl.models.smollm2 import import_smollm2

    quiet_transformers()
    typer.echo(import_smollm2(out))


# -- tasks ----------------------------------------------------------------------


@tasks_app.command("generate")
def tasks_generate(
    out: Path = typer.Option(..., "--out", help="Output file: .parquet or .jsonl."),
    n: int = typer.Option(64, "--n", min=1, max=100_000, help="How many tasks."),
    seed: int = seed_option("Generator seed."),
    source: str = typer.Option(
        "demo",
        "--source",
        help="demo (arithmetic and word problems, what the default model learnt), or "
        "reasoning-gym:<dataset>(,<dataset>...) with basic_arithmetic, chain_sum, "
        "letter_counting.",
    ),
) -> None:
    """Write tasks: the demo's own, or reasoning-gym's (procedural, offline)."""
    from orchestrator.tasks.generators import demo_tasks
    from swarmrl.tasks import check_task_output, reasoning_gym, write_tasks

    datasets = None if source == "demo" else reasoning_gym.parse_source(source)
    check_task_output(out)
    if datasets is None:
        tasks = demo_tasks(n, seed=seed)
    else:
        tasks = reasoning_gym.generate(datasets, n, seed)
    write_tasks(tasks, out)
    typer.echo(out)


@tasks_app.command("check")
def tasks_check(
    tasks: Path = TasksFile,
    completions: Path = typer.Option(
        ...,
        "--completions",
        help='JSON lines: {"problem_id": ..., "completion": ...} per line.',
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON document instead of lines."),
) -> None:
    """Score given completions with their tasks' verifiers: one line each and a summary.

    How a dataset author checks that reference solutions pass and wrong ones fail,
    and how anyone reproduces a node's or a validator's verdict.
    """
    import json

    from swarmrl.tasks import read_tasks
    from swarmrl.tasks.completions import read_completions
    from swarmrl.tasks.rewards import task_reward

    by_id = {t.problem_id: t for t in read_tasks(tasks)}
    items = read_completions(completions, known=by_id)
    results: list[dict[str, object]] = []
    rewards: list[float] = []
    for line, problem_id, text in items:
        reward = task_reward(by_id[problem_id], text)
        results.append({"line": line, "problem_id": problem_id, "reward": reward})
        rewards.append(reward)
        if not as_json:
            verdict = "pass" if reward >= 1.0 else "partial" if reward > 0 else "fail"
            typer.echo(f"{line:>5} {problem_id}: {verdict}  reward {reward:g}")
    passed = sum(reward >= 1.0 for reward in rewards)
    mean = sum(rewards) / len(rewards)
    summary = {"completions": len(results), "passed": passed, "mean_reward": mean}
    if as_json:
        typer.echo(json.dumps({"results": results, "summary": summary}))
    else:
        typer.echo(f"{passed} of {len(results)} completions pass; mean reward {mean:.4f}")


@tasks_app.command("filter")
def tasks_filter(
    model: Path = ModelDir,
    tasks: Path = TasksFile,
    out: Path = typer.Option(..., "--out", help="Kept tasks, with their solve rates."),
    k: int = typer.Option(8, "--k", min=1, max=1024, help="Samples per task."),
    low: float = typer.Option(0.0, "--min", min=0.0, max=1.0, help="Lowest solve rate kept."),
    high: float = typer.Option(0.9, "--max", min=0.0, max=1.0, help="Highest solve rate kept."),
    max_tokens: int = MaxTokens,
    temperature: float = Temperature,
    seed: int = seed_option("Sampling seed (same seed, same solve rates)."),
    backend: str = BackendName,
    device: str = Device,
) -> None:
    """Keep the tasks whose solve rate by MODEL (k samples each) lies in [min, max]."""
    from swarmrl.tasks import check_task_output, read_tasks, write_tasks

    if low > high:
        raise ValueError(f"--min {low} is above --max {high}")
    check_task_output(out)
    items = read_tasks(tasks)
    # torch loads here, once every cheap check has passed.
    from orchestrator.tasks.filter import filter_tasks
    from swarmrl.models import load_backend
    from swarmrl.models.backend import SamplingParams

    quiet_transformers()
    engine = load_backend(backend, model, device=device)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    kept = filter_tasks(engine, items, k=k, band=(low, high), params=params, seed=seed)
    write_tasks(kept, out)
    _err(f"kept {len(kept)} of {len(items)} tasks with solve rate in [{low:g}, {high:g}]")
    typer.echo(out)


# -- eval -----------------------------------------------------------------------


def eval_command(
    model: Path = ModelDir,
    tasks: Path = TasksFile,
    n: int = typer.Option(4, "--n", min=1, max=1024, help="Samples per task."),
    max_tokens: int = MaxTokens,
    temperature: float = Temperature,
    seed: int = seed_option("Sampling seed (same seed, same figures)."),
    batch_size: int = typer.Option(
        32, "--batch-size", min=1, max=4096, help="Sequences per batch."
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON document instead of a table."),
    backend: str = BackendName,
    device: str = Device,
) -> None:
    """Measure a policy on a task set: mean reward (pass@1), pass@k, length, per type.

    Seeded: the same model, tasks and seed give the same figures on the same machine.
    """
    import json

    from swarmrl.tasks import read_tasks

    items = read_tasks(tasks)
    # torch loads here, once every cheap check has passed.
    from orchestrator.evaluate import evaluate
    from swarmrl.models import load_backend
    from swarmrl.models.backend import SamplingParams

    quiet_transformers()
    engine = load_backend(backend, model, device=device)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    with typer.progressbar(length=len(items) * n, label="sampling", file=sys.stderr) as bar:
        done_so_far = 0

        def on_batch(done: int, _total: int, _speed: float) -> None:
            nonlocal done_so_far
            bar.update(done - done_so_far)
            done_so_far = done

        result = evaluate(
            engine, items, n=n, params=params, seed=seed, batch_size=batch_size, on_batch=on_batch
        )
    if as_json:
        typer.echo(json.dumps(result.as_dict()))
        return
    typer.echo(f"tasks          {result.tasks} x {result.samples_per_task} samples")
    typer.echo(f"mean reward    {result.mean_reward:.4f}  (pass@1 estimate)")
    for k, value in result.pass_at.items():
        typer.echo(f"pass@{k:<9} {value:.4f}")
    typer.echo(f"mean length    {result.mean_length:.1f} tokens")
    width = max(map(len, result.by_type))
    for task_type, score in result.by_type.items():
        typer.echo(f"  {task_type:<{width}}  {score.mean_reward:.4f} over {score.tasks} tasks")
