"""`swarmrl demo`: the whole loop on one machine, or one scene of it."""

from __future__ import annotations

from pathlib import Path

import typer

DEMO_OUT = Path("demo")


def demo(
    scenes: list[str] = typer.Option(
        [],
        "--scene",
        help="Show one part instead of the whole loop: toploc, chain, shards, swarm, rollouts "
        "(repeat for more).",
    ),
    out: Path = typer.Option(DEMO_OUT, "--out", help="Where the report, plot and logs go."),
    max_steps: int = typer.Option(
        50, "--max-steps", min=1, max=10_000, help="Stop training here if the reward has not risen."
    ),
    check_every: int = typer.Option(
        10, "--check-every", min=1, max=10_000, help="Policy steps between held-out evaluations."
    ),
    rise: float = typer.Option(
        0.03, "--rise", min=0.0, max=1.0, help="Held-out reward gain that ends training early."
    ),
) -> None:
    """Run a whole local swarm on the embedded defaults: anvil, an orchestrator that trains,
    three honest nodes and a cheater, until the held-out reward has clearly risen."""
    if scenes:
        from simulation.demo.scenes import run_scenes

        run_scenes(scenes)
        return
    from simulation.demo.loop import LoopConfig, run
    from simulation.local_swarm import SwarmError
    from swarmrl.files import check_output_dir

    check_output_dir(out)
    try:
        report = run(LoopConfig(out=out, max_steps=max_steps, check_every=check_every, rise=rise))
    except KeyboardInterrupt:
        typer.echo("interrupted: every process the demo started is stopped", err=True)
        raise typer.Exit(130) from None
    except SwarmError as e:  # a step failed (anvil, a command, a process, a wait): its log named
        typer.secho(f"error: {e}", err=True, fg=typer.colors.RED)
        raise typer.Exit(1) from None
    if not report.rose or report.processes_left:
        raise typer.Exit(1)
