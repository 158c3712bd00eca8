"""Faults: kill -9 at random points of a node, the orchestrator, the trainer and anvil,
each started again, in whole swarms on loopback; then what must hold after them.

Each run is a short swarm of its own (`simulation.local_swarm`: anvil, the deployment,
the orchestrator and three honest nodes as real processes, the default model) with a
fault plan drawn from its seed (`simulation.faults`): every target once in a
random order before any twice, each at a random trainer step plus up to 20 s. After
the last step and the nodes stopped, it checks the promises of issue 24: every
acknowledged submission in the ledger exactly once, work on chain equal to the ledger,
training resumed from the last checkpoint, no partial file taken for a whole one. A
run that stops on its own (a process that exits, a step that never comes) counts too.

The short form (`swarmrl bench trust`) runs three, the long form (``--long``) fifty;
run i's seed is the first seed plus i, so one run replays with ``--runs 1 --seed S``.
Epochs are 20 s here (the demo's 60), so each run records several on chain.

    python -m benchmarks.trust_faults [--runs 3] [--seed S] [--faults 5] [--steps 8]
                                      [--workdir DIR]   (keeps each run's files and logs)
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from simulation.faults import FaultPlan, Faults, Promise, Target
from simulation.local_swarm import (
    HONEST,
    LEARNING_RECIPE,
    SWARMRL,
    make_swarm,
    node_toml,
    orchestrator_addr,
    orchestrator_toml,
    stake_and_init_node,
    wait_for,
)

RUNS = 3
STEPS = 8
FAULTS = len(Target) + 1  # every target, and one of them again
EPOCH_SECONDS = 20  # the validation grace stays the demo's 30 s
# Each node in the pool bonds the slash penalty (50 SRL) of its provider's stake; this
# stake covers its nodes with room to spare.
STAKE, INVALIDATION_WINDOW = 1000, 300
STEP_LIMIT = 900.0  # seconds a step may take to come before the run counts as stopped


@dataclass
class FaultRun:
    plan: FaultPlan
    injected: Counter[Target] = field(default_factory=Counter)
    violations: dict[Promise, list[str]] = field(default_factory=dict)
    stopped: str | None = None  # why the run did not finish, if it did not
    seconds: float = 0.0

    @property
    def broken(self) -> int:
        return sum(map(len, self.violations.values())) + (self.stopped is not None)


def run_once(model: Path, tasks: Path, root: Path, plan: FaultPlan, steps: int) -> FaultRun:
    """One swarm of `steps` trainer steps under `plan`, checked after."""
    result = FaultRun(plan)
    began = time.monotonic()
    swarm = make_swarm(
        root,
        run=f"faults-{plan.seed}",
        keep_chain=True,
        invalidation_window=INVALIDATION_WINDOW,
    )
    try:
        for key, provider in HONEST.items():
            stake_and_init_node(swarm, provider, key, stake=STAKE)
        data = root / "orchestrator"
        config = orchestrator_toml(
            swarm,
            root / "orch.toml",
            model=model,
            tasks=tasks,
            data_dir=data,
            steps=steps,
            gone_after=60,
            **{**LEARNING_RECIPE, "epoch_seconds": EPOCH_SECONDS},
        )
        log = root / "orchestrator.log"

        def start_orchestrator() -> None:
            swarm.start("orchestrator", [SWARMRL, "orchestrator", "run", "--config", config], log)

        start_orchestrator()
        addr = wait_for(lambda: orchestrator_addr(log), "the orchestrator", 180, swarm)
        nodes = {
            key: node_toml(swarm, root / f"{key}.toml", key=key, tasks=tasks, orchestrator=addr)
            for key in HONEST
        }

        def start_node(key: str) -> None:
            swarm.start(key, [SWARMRL, "node", "run", "--config", nodes[key]], root / f"{key}.log")

        for key in nodes:
            start_node(key)
        faults = Faults(
            swarm,
            data,
            log,
            start_orchestrator=start_orchestrator,
            start_node=start_node,
            epoch_seconds=EPOCH_SECONDS,
        )
        try:
            faults.run(plan, limit=STEP_LIMIT)
            faults.wait_for_step(steps, STEP_LIMIT)
        except (AssertionError, RuntimeError) as e:  # no step in time, a process exited
            result.stopped = str(e)
        finally:
            result.injected = faults.seen.injected
        if result.stopped is None:
            time.sleep(5)  # the last submissions in flight land
            for key in nodes:
                swarm.kill(key, 15)
            result.violations = faults.check(nodes)
    finally:
        swarm.stop_all()
    result.seconds = time.monotonic() - began
    return result


def table(runs: list[FaultRun]) -> str:
    injected: Counter[Target] = Counter()
    for run in runs:
        injected.update(run.injected)
    lines = [
        "| runs | faults | " + " | ".join(t.value for t in Target) + " | time |",
        "| --- | --- | " + " | ".join("---" for _ in Target) + " | --- |",
        f"| {len(runs)} | {sum(injected.values())} | "
        + " | ".join(str(injected[t]) for t in Target)
        + f" | {sum(r.seconds for r in runs):.0f} s |",
        "",
        "| after the faults | violations |",
        "| --- | --- |",
    ]
    for promise in Promise:
        lines.append(
            f"| {promise.value} | {sum(len(r.violations.get(promise, [])) for r in runs)} |"
        )
    lines.append(f"| runs that stopped | {sum(r.stopped is not None for r in runs)} |")
    return "\n".join(lines)


def main(
    runs: int = RUNS,
    seed: int | None = None,
    faults: int = FAULTS,
    steps: int = STEPS,
    workdir: Path | None = None,
) -> list[FaultRun]:
    from orchestrator.pretrain import build_default_model
    from orchestrator.tasks.generators import demo_tasks
    from swarmrl.models.files import default_models_dir
    from swarmrl.tasks import write_tasks

    first = secrets.randbelow(2**32) if seed is None else seed
    model = build_default_model(default_models_dir() / "default")
    print(
        f"{runs} run(s) of {steps} trainer steps, 3 honest nodes, the default model; "
        f"{faults} faults each; seeds {first} to {first + runs - 1}",
        flush=True,
    )
    results = []
    with contextlib.ExitStack() as cleanup:
        if workdir is None:
            workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="faults-")))
        tasks = workdir / "train.jsonl"
        write_tasks(demo_tasks(4096, seed=1), tasks)
        for i in range(runs):
            plan = FaultPlan.draw(first + i, count=faults, steps=(2, steps - 2), nodes=list(HONEST))
            root = workdir / f"seed-{plan.seed}"
            root.mkdir(parents=True)
            result = run_once(model, tasks, root, plan, steps)
            results.append(result)
            print(f"  {plan}: {result.broken} violation(s) ({result.seconds:.0f} s)", flush=True)
            for promise, found in result.violations.items():
                for why in found:
                    print(f"    {promise.value}: {why}", flush=True)
            if result.stopped is not None:
                print(f"    stopped: {result.stopped}", flush=True)
    print()
    print("Faults: kill -9 at random points of a node, the orchestrator, the trainer and anvil")
    print()
    print(table(results))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--seed", type=int, default=None, help="the first run's fault seed")
    parser.add_argument("--faults", type=int, default=FAULTS, help="faults per run")
    parser.add_argument("--steps", type=int, default=STEPS, help="trainer steps per run")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the runs here")
    args = parser.parse_args()
    if args.runs < 1 or args.faults < 1 or args.steps < 4:
        parser.error("--runs and --faults must be at least 1, --steps at least 4")
    main(args.runs, args.seed, args.faults, args.steps, args.workdir)
