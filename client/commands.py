"""The volunteer's commands (a node, its wallet, its rollouts), added to `swarmrl`
through its entry-point group (swarmrl.cli)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarmrl.cli import Commands


def register(commands: Commands) -> None:
    from client.node.cli import node_app
    from client.rollouts import rollouts_generate
    from client.wallet import app as wallet_app

    commands.root.add_typer(node_app, name="node")
    commands.root.add_typer(wallet_app, name="wallet")
    commands.rollouts.command("generate")(rollouts_generate)
