"""`swarmrl train local`: asynchronous GRPO on one machine.

The recipe's options (``--group-size``, ``--lr``, ...) are made from the fields of
``GRPORecipe``: each option's name, type, default, bounds and help are the field's,
so the command line, ``orchestrator.toml`` and the README cannot disagree.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from annotated_types import Ge, Gt, Le, Lt
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from orchestrator.trainer.recipe import GRPORecipe
from swarmrl.cli_options import BackendName, Device, ModelDir, TasksFile, quiet_transformers
from swarmrl.files import check_output_dir
from swarmrl.settings_toml import SettingError, problem

train_app = typer.Typer(help="Train a policy with asynchronous GRPO.", no_args_is_help=True)


def recipe_flag(name: str) -> str:
    """The option of the recipe's field ``name``: ``--group-size`` for group_size."""
    return "--" + name.replace("_", "-")


def recipe_argv(recipe: GRPORecipe) -> list[str]:
    """The options that give `train local` the recipe ``recipe``, every field spelt out."""
    return [arg for name, value in recipe for arg in (recipe_flag(name), str(value))]


def _recipe_option(name: str, field: FieldInfo) -> inspect.Parameter:
    """The typer option of one field. Closed bounds become click's range (it refuses what
    is outside and shows the range in the help); open ones are said in the help and
    checked by the model."""
    low: float | None = None
    high: float | None = None
    said = []
    for rule in field.metadata:
        if isinstance(rule, Ge) and isinstance(rule.ge, int | float):
            low = rule.ge
        elif isinstance(rule, Le) and isinstance(rule.le, int | float):
            high = rule.le
        elif isinstance(rule, Gt):
            said.append(f"more than {rule.gt:g}")
        elif isinstance(rule, Lt):
            said.append(f"less than {rule.lt:g}")
    text = " ".join((field.description or "").split())
    if said:
        words = ", ".join(said)
        text = f"{text} {words[:1].upper()}{words[1:]}."
    option = typer.Option(field.default, recipe_flag(name), min=low, max=high, help=text)
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=field.annotation
    )


def _recipe(values: dict[str, Any]) -> GRPORecipe:
    """The recipe of the options' values; what the model refuses (an open bound, a rule
    between fields) is a bad option value, as click's own range checks are."""
    try:
        return GRPORecipe(**values)
    except ValidationError as e:
        error = e.errors(include_url=False)[0]
        ctx = error.get("ctx") or {}
        cause = ctx.get("error")
        if isinstance(cause, SettingError):
            hint = [recipe_flag(key) for key in cause.keys]
            raise typer.BadParameter(str(cause), param_hint=hint) from None
        message = f"{problem(error, ctx)}, got {error['input']!r}"
        raise typer.BadParameter(message, param_hint=[recipe_flag(str(error["loc"][0]))]) from None


def with_recipe_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` (its parameters keyword-only) with its ``recipe`` parameter replaced,
    where it stands, by one option per field of GRPORecipe; the options' values reach
    ``command`` as one recipe. typer reads the options from the signature."""
    fields = GRPORecipe.model_fields
    params: list[inspect.Parameter] = []
    for param in inspect.signature(command, eval_str=True).parameters.values():
        if param.name == "recipe":
            params += [_recipe_option(name, field) for name, field in fields.items()]
        else:
            params.append(param)

    def with_recipe(**values: Any) -> None:
        recipe = _recipe({name: values.pop(name) for name in fields})
        command(**values, recipe=recipe)

    with_recipe.__doc__ = command.__doc__
    with_recipe.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return with_recipe


@train_app.command("local")
@with_recipe_options
def train_local_command(
    *,
    model: Path = ModelDir,
    tasks: Path = TasksFile,
    out: Path = typer.Option(
        ..., "--out", help="The run directory (checkpoints, metrics); reuse it to continue."
    ),
    minutes: float = typer.Option(
        None,
        "--minutes",
        min=0.0,
        max=525_600.0,
        help="Stop after this many minutes (default: no limit).",
    ),
    workers: int = typer.Option(
        None,
        "--workers",
        min=1,
        max=64,
        help="Inference worker processes (default: half the cores, at least 2).",
    ),
    recipe: GRPORecipe,  # one option per field
    backend: str = BackendName,
    device: str = Device,
) -> None:
    """Train MODEL on TASKS: inference workers sample while the trainer trains.

    Checkpoints go to OUT/checkpoints/step_<n>/, one JSON line per step to
    OUT/metrics.jsonl and the curves to OUT/metrics.png.
    """
    check_output_dir(out)
    from orchestrator.train_local.run import LocalRun, train_local

    quiet_transformers()
    run = LocalRun(
        model=model,
        tasks=tasks,
        out=out,
        recipe=recipe,
        minutes=minutes,
        workers=workers,
        backend=backend,
        device=device,
    )
    typer.echo(train_local(run, lambda text: typer.echo(text, err=True)))
