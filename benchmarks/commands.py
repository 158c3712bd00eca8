"""`swarmrl bench`: the benchmarks against their named references, one command each
(benchmarks/BENCHMARKS.md). Added to `swarmrl` through its entry-point group from a
source checkout, where this package is (it ships in no wheel)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from swarmrl.cli import Commands

bench_app = typer.Typer(
    help="Benchmarks against their named references (run from a source checkout).",
    no_args_is_help=True,
)

BENCHMARKS = (
    "toploc",
    "shards",
    "broadcast",
    "delta",
    "inference",
    "learner",
    "swarm",
    "trust",
    "trainer",
    "offpolicy",
    "load",
    "chain",
)


def register(commands: Commands) -> None:
    commands.root.add_typer(bench_app, name="bench")


def _run_benchmark(name: str, *args: object) -> None:
    importlib.import_module(f"benchmarks.{name}").main(*args)


@bench_app.command("toploc")
def bench_toploc(
    runs: int = typer.Option(21, min=9, max=1000, help="Timed runs per figure (median)."),
) -> None:
    """TOPLOC build and verify vs. toploc 0.1.6 (1024 x 4096 bf16, k = 128)."""
    _run_benchmark("toploc", runs)


@bench_app.command("shards")
def bench_shards(
    runs: int = typer.Option(5, min=1, max=1000, help="Timed runs per figure (median)."),
) -> None:
    """Checkpoint shard hashing throughput vs. the blake3 PyPI package."""
    _run_benchmark("shards", runs)


@bench_app.command("broadcast")
def bench_broadcast(
    runs: int = typer.Option(3, min=1, max=1000, help="Runs per figure (median)."),
) -> None:
    """Weight broadcast to 1 and 8 nodes vs. shardcast 0.3.2 (1 GiB, loopback)."""
    _run_benchmark("broadcast", runs)


@bench_app.command("delta")
def bench_delta(
    smollm2_steps: int = typer.Option(
        4, "--smollm2-steps", min=2, max=1000, help="Training steps of SmolLM2-135M."
    ),
    default_steps: int = typer.Option(
        4, "--default-steps", min=2, max=10_000, help="Training steps of the default model."
    ),
    runs: int = typer.Option(5, min=1, max=1000, help="Timed runs per codec figure (median)."),
    nodes: int = typer.Option(
        1000, min=10, max=100_000, help="Nodes the broadcast simulation reaches."
    ),
    skip_learner: bool = typer.Option(False, "--skip-learner", help="Leave out the training."),
    skip_codec: bool = typer.Option(False, "--skip-codec", help="Leave out the codec's speed."),
    skip_sim: bool = typer.Option(False, "--skip-sim", help="Leave out the simulation."),
    skip_anchor: bool = typer.Option(
        False, "--skip-anchor", help="Simulate the delta alone, not the full version."
    ),
) -> None:
    """What a policy step ships: delta / full bytes over real training (SmolLM2-135M in
    bf16 at lr 1e-6, the default model), encode and apply vs. BLAKE3, and the time to
    reach 1,000 nodes, full vs. delta (simulated)."""
    flags = {
        "--skip-learner": skip_learner,
        "--skip-codec": skip_codec,
        "--skip-sim": skip_sim,
        "--skip-anchor": skip_anchor,
    }
    argv = ["--smollm2-steps", str(smollm2_steps), "--default-steps", str(default_steps)]
    argv += ["--runs", str(runs), "--nodes", str(nodes)]
    argv += [flag for flag, given in flags.items() if given]
    _run_benchmark("delta", argv)


@bench_app.command("inference")
def bench_inference(
    runs: int = typer.Option(5, min=1, max=1000, help="Timed runs per figure (median)."),
) -> None:
    """Rollout tokens/s vs. transformers generate(), proof overhead, prefill cost (CPU)."""
    _run_benchmark("inference", runs)


@bench_app.command("learner")
def bench_learner(
    minutes: float = typer.Option(
        10.0, "--minutes", min=0.5, max=600.0, help="Training time of each."
    ),
    target: float = typer.Option(
        0.12, "--target", min=0.0, max=1.0, help="The held-out reward whose time is compared."
    ),
) -> None:
    """`train local` vs. TRL's GRPOTrainer: held-out reward against wall time (CPU)."""
    _run_benchmark("learner", minutes, target)


@bench_app.command("swarm")
def bench_swarm(
    minutes: float = typer.Option(
        4.0, "--minutes", min=0.5, max=600.0, help="Measured time of each."
    ),
) -> None:
    """The whole swarm (3 nodes) vs. `train local` (3 workers): rollouts/s, intake
    latency, validation vs. generation CPU, memory (CPU)."""
    _run_benchmark("swarm", minutes)


@bench_app.command("trust")
def bench_trust(
    scale: float = typer.Option(
        1.0, "--scale", min=0.05, max=10_000.0, help="Honest rollouts of each variation, scaled."
    ),
    long: bool = typer.Option(
        False,
        "--long",
        help=(
            "The long form: 330,000 honest rollouts, 1,000,000 fuzz inputs and 50 fault "
            "runs (hours)."
        ),
    ),
) -> None:
    """What validation costs honest nodes (rollouts sampled every way a node samples,
    judged by the validator's defaults) and cheaters (every cheat against intake and
    the validator), what hostile bytes do to every decoder, and what kill -9 of a
    node, the orchestrator, the trainer or anvil loses (CPU)."""
    _run_benchmark("trust", scale, long)


@bench_app.command("trainer")
def bench_trainer(
    steps: int = typer.Option(3, "--steps", min=1, max=1000, help="Timed steps per figure."),
    skip_smollm2: bool = typer.Option(False, "--skip-smollm2", help="Leave out SmolLM2-135M."),
) -> None:
    """The trainer's step time and peak memory per rank, 1 and 2 ranks (FSDP2, gloo),
    with and without activation checkpointing, on the default model and SmolLM2-135M;
    the output head's memory, chunked vs. whole logits, at a 152k vocabulary (CPU)."""
    _run_benchmark("trainer", steps, skip_smollm2)


@bench_app.command("offpolicy")
def bench_offpolicy(
    steps: int = typer.Option(40, "--steps", min=2, max=10_000, help="Training steps per arm."),
) -> None:
    """The off-policy corrections, ablated: `train local` with none, truncated importance
    sampling and IcePop, same seed; held-out reward before and after and the
    sampler/trainer mismatch of each (CPU)."""
    _run_benchmark("offpolicy", steps)


@bench_app.command("load")
def bench_load(
    nodes: int = typer.Option(200, "--nodes", min=1, max=100_000, help="Simulated nodes."),
    minutes: float = typer.Option(
        2.0, "--minutes", min=0.1, max=600.0, help="Measured time, after the nodes joined."
    ),
    processes: int = typer.Option(
        2, "--processes", min=1, max=256, help="Worker processes the nodes are spread over."
    ),
    rate: float | None = typer.Option(
        None,
        "--rate",
        min=0.01,
        max=1e6,
        help="Submissions/s offered by all nodes together (default: as fast as orders allow).",
    ),
    flood_heartbeats: float = typer.Option(
        0.0,
        "--flood-heartbeats",
        min=0.0,
        max=1e6,
        help="Also a phase where one joined peer sends this many heartbeat requests/s.",
    ),
    slow_uploads: bool = typer.Option(
        False,
        "--slow-uploads",
        help="Also a phase where one joined peer holds as many uploads open as it can, "
        "trickling their bytes.",
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write every figure here too."),
    profile: Path | None = typer.Option(
        None, "--profile", help="py-spy's raw samples of the orchestrator, written here."
    ),
) -> None:
    """The control plane under load: N simulated nodes (real keys, joins, heartbeats,
    orders, signed uploads, receipts) against a real orchestrator's intake on loopback;
    submissions/s, a probe node's latencies, the orchestrator's CPU and memory, and
    every receipt checked against the ledger (CPU)."""
    from swarmrl.files import check_output_path

    for out in (json_out, profile):
        if out is not None:
            check_output_path(out)  # refused now, not after minutes of measuring
    argv = ["--nodes", str(nodes), "--minutes", str(minutes), "--processes", str(processes)]
    if rate is not None:
        argv += ["--rate", str(rate)]
    if flood_heartbeats > 0:
        argv += ["--flood-heartbeats", str(flood_heartbeats)]
    if slow_uploads:
        argv.append("--slow-uploads")
    if json_out is not None:
        argv += ["--json", str(json_out)]
    if profile is not None:
        argv += ["--profile", str(profile)]
    _run_benchmark("load", argv)


@bench_app.command("chain")
def bench_chain(
    nodes: str = typer.Option(
        "10,100,1000", "--nodes", help="Swarm sizes, comma-separated, each 1 to 10,000 nodes."
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write every figure here too."),
) -> None:
    """Recording an epoch on chain: N nodes set up on a real anvil, epoch 0 written to a
    real ledger and recorded by the orchestrator's recorder; transactions per epoch, gas
    per node, a slash vote and one provider's claim (CPU)."""
    from swarmrl.files import check_output_path

    if json_out is not None:
        check_output_path(json_out)  # refused now, not after minutes of measuring
    argv = ["--nodes", nodes]
    if json_out is not None:
        argv += ["--json", str(json_out)]
    _run_benchmark("chain", argv)


@bench_app.command("all")
def bench_all() -> None:
    """Every benchmark, one after the other, with default settings."""
    for name in BENCHMARKS:
        _run_benchmark(name)
        typer.echo()
