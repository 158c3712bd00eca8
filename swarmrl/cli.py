"""The `swarmrl` command.

The core's own command groups are added here; each app (the node and wallet, the
orchestrator, the simulation, the benchmarks of a checkout) adds its own through the
entry-point group COMMANDS (pyproject.toml), so that the core imports none of them.

Every failure the user can cause ends in one sentence on stderr and a non-zero
exit: 1 for bad input or a failed check, 2 for a malformed command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points

import typer

import swarmrl

COMMANDS = "swarmrl.commands"  # the entry-point group: name = "module:register"

app = typer.Typer(
    help="swarmrl: decentralized RL of language models on a swarm of volunteer GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: rich markup would swallow "[min, max]" and rich's option table shows
    # flags with a "<bool>" metavar as if they took a value. Sub-apps inherit it.
    rich_markup_mode=None,
)


@dataclass(frozen=True)
class Commands:
    """What an app's `register(commands)` adds its commands to."""

    root: typer.Typer
    # Generating is a node's work and verifying a validator's: one group, two apps.
    rollouts: typer.Typer


def _register() -> None:
    from swarmrl.chain.cli import chain_app  # light: web3 loads inside the commands
    from swarmrl.weights.cli import weights_app  # light: libp2p loads inside the commands

    app.add_typer(chain_app, name="chain")
    app.add_typer(weights_app, name="weights")
    rollouts = typer.Typer(
        help="Generate proven rollouts (a node), or verify a rollout file (a validator).",
        no_args_is_help=True,
    )
    app.add_typer(rollouts, name="rollouts")
    commands = Commands(app, rollouts)
    for entry in entry_points(group=COMMANDS):
        try:
            register = entry.load()
        except ModuleNotFoundError as e:
            if e.name != entry.module.split(".")[0]:
                raise
            continue  # a package this install lacks: the benchmarks outside a checkout
        register(commands)


_register()


def _version(show: bool) -> None:
    if show:
        typer.echo(f"swarmrl {swarmrl.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """swarmrl: decentralized RL of language models on a swarm of volunteer GPUs."""


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except (ValueError, OSError) as e:
        typer.secho(f"error: {e}", err=True, fg=typer.colors.RED)
        raise SystemExit(1) from None
