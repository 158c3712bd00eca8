"""`swarmrl demo`, added to `swarmrl` through its entry-point group (swarmrl.cli)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarmrl.cli import Commands


def register(commands: Commands) -> None:
    from simulation.demo.cli import demo

    commands.root.command("demo")(demo)
