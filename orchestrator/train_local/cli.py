"""`swarmrl train local`: asynchronous GRPO on one machine.

The recipe's options (``--group-size``, ``--lr``, ...) are made from the fields of
``GRPORecipe``, and the trainer's process options (``--nproc-per-node``, ...) from
those of ``TrainerLaunch``: each option's name, type, default, bounds and help are the
field's, so the command line, ``orchestrator.toml`` and the docs cannot disagree.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from orchestrator.trainer.launch import TrainerLaunch
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl.cli_options import BackendName, Device, ModelDir, TasksFile, quiet_transformers
from swarmrl.files import check_output_dir
from swarmrl.settings_toml import SettingError, problem

train_app = typer.Typer(help="Train a policy with asynchronous GRPO.", no_args_is_help=True)


def field_flag(name: str) -> str:
    """The option of a model's field ``name``: ``--group-size`` for group_size."""
    return "--" + name.replace("_", "-")


def recipe_argv(recipe: GRPORecipe) -> list[str]:
    """The options that give `train local` the recipe ``recipe``, every field spelt out."""
    return [arg for name, value in recipe for arg in (field_flag(name), str(value))]


def _field_option(name: str, field: FieldInfo) -> inspect.Parameter:
    """The typer option of one field. Closed bounds become click's range (it refuses what
    is outside and shows the range in the help); open ones are said in the help and
    checked by the model. A bool field is a pair of flags (``--x/--no-x``), so either
    default can be turned over."""
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
    flag = field_flag(name)
    if field.annotation is bool:
        flag = f"{flag}/--no-{flag[2:]}"
    option = typer.Option(field.default, flag, min=low, max=high, help=text)
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=field.annotation
    )


def _model(cls: type[BaseModel], values: dict[str, Any]) -> BaseModel:
    """The model of the options' values; what the model refuses (an open bound, a rule
    between fields) is a bad option value, as click's own range checks are."""
    try:
        return cls(**values)
    except ValidationError as e:
        error = e.errors(include_url=False)[0]
        ctx = error.get("ctx") or {}
        cause = ctx.get("error")
        if isinstance(cause, SettingError):
            hint = [field_flag(key) for key in cause.keys]
            raise typer.BadParameter(str(cause), param_hint=hint) from None
        message = f"{problem(error, ctx)}, got {error['input']!r}"
        raise typer.BadParameter(message, param_hint=[field_flag(str(error["loc"][0]))]) from None


def with_model_options(
    **models: type[BaseModel],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator: ``command`` (its parameters keyword-only) with each parameter named in
    ``models`` replaced, where it stands, by one option per field of its model; the
    options' values reach ``command`` as one model each. typer reads the options from
    the signature, so the models' field names must differ from each other and from the
    command's own parameters."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        params: list[inspect.Parameter] = []
        for param in inspect.signature(command, eval_str=True).parameters.values():
            if param.name in models:
                fields = models[param.name].model_fields
                params += [_field_option(name, field) for name, field in fields.items()]
            else:
                params.append(param)

        def with_models(**values: Any) -> None:
            for param, cls in models.items():
                values[param] = _model(cls, {name: values.pop(name) for name in cls.model_fields})
            command(**values)

        with_models.__doc__ = command.__doc__
        with_models.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return with_models

    return decorate


@train_app.command("local")
@with_model_options(recipe=GRPORecipe, launch=TrainerLaunch)
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
    launch: TrainerLaunch,  # one option per field
    backend: str = BackendName,
    device: str = Device,
) -> None:
    """Train MODEL on TASKS: inference workers sample while the trainer trains.

    Checkpoints go to OUT/checkpoints/step_<n>/, one JSON line per step to
    OUT/metrics.jsonl and the curves to OUT/metrics.png. With --nproc-per-node N the
    trainer is a torchrun job of N processes sharding the policy (FSDP2).
    """
    if launch.nnodes > 1:
        # Its workers, spool and run directory are this machine's; a trainer spanning
        # machines is the orchestrator's (nnodes in orchestrator.toml).
        raise typer.BadParameter(
            "train local trains on this machine only; a trainer on several machines is "
            "`swarmrl orchestrator run`'s (nnodes in orchestrator.toml)",
            param_hint=[field_flag("nnodes")],
        )
    check_output_dir(out)
    from orchestrator.train_local.run import LocalRun, train_local

    quiet_transformers()
    run = LocalRun(
        model=model,
        tasks=tasks,
        out=out,
        recipe=recipe,
        launch=launch,
        minutes=minutes,
        workers=workers,
        backend=backend,
        device=device,
    )
    typer.echo(train_local(run, lambda text: typer.echo(text, err=True)))
