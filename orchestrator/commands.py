"""The coordinator's commands (the orchestrator, its model, tasks, evaluation, local
training and a validator's verify), added to `swarmrl` through its entry-point group
(swarmrl.cli)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarmrl.cli import Commands


def register(commands: Commands) -> None:
    from orchestrator.cli import eval_command, model_app, tasks_app  # light: torch loads later
    from orchestrator.service.cli import orchestrator_app
    from orchestrator.train_local.cli import train_app
    from orchestrator.verify_cli import rollouts_verify

    commands.root.add_typer(orchestrator_app, name="orchestrator")
    commands.root.add_typer(model_app, name="model")
    commands.root.add_typer(tasks_app, name="tasks")
    commands.rollouts.command("verify")(rollouts_verify)
    commands.root.command("eval")(eval_command)
    commands.root.add_typer(train_app, name="train")
