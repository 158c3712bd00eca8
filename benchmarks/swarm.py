"""The cost of decentralisation: the whole swarm against `train local`, same machine, same run.

Both train the embedded default model on the same tasks with the same recipe for
the same wall time. `train local` samples with three inference workers that
hand rollouts straight to the trainer; the swarm's three nodes pull every new
checkpoint through the weight broadcast, take signed orders, prove their
rollouts with TOPLOC, sign and submit them over libp2p, and the orchestrator
validates them (rewards always, prefill at the default rate once a node is
trusted) before its trainer sees them. Reported:

- rollouts per second that reach the trainer: accepted by validation (swarm) or
  written by a worker (local), over the same window, and their ratio (goal >= 0.9);
- intake latency p50/p99: a node's submit call, upload to signed receipt;
- validation CPU per rollout (weight loads included) against generation CPU per
  rollout (goal: >= 10x cheaper), over every submission and over those of nodes
  that have earned trust (the steady state: new nodes are prefilled every time);
- the orchestrator's and a node's resident memory at the start and the end of the
  window (flat under a steady stream of submissions);
- where the swarm's CPU went in the window: each program with its child processes
  (the orchestrator's trainer, validator and recorder; everyone's math-verify
  worker), and within the nodes and the validator what generation and validation
  themselves took.

    python -m benchmarks.swarm [--minutes 4]
    or   swarmrl bench swarm
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.load import proc_rss_mib
from orchestrator.pretrain import build_default_model
from orchestrator.run_dir import RunDir
from orchestrator.tasks.generators import demo_tasks
from orchestrator.train_local.cli import recipe_argv
from orchestrator.trainer.metrics import read_metrics
from orchestrator.trainer.recipe import GRPORecipe
from simulation.local_swarm import (
    SWARMRL,
    Swarm,
    make_swarm,
    node_toml,
    orchestrator_addr,
    orchestrator_toml,
    stake_and_init_node,
    wait_for,
)
from swarmrl.models.files import default_models_dir
from swarmrl.tasks import write_tasks

NODES = 3
RECIPE = GRPORecipe(group_size=8, prompts_per_step=4, max_tokens=64, lr=3e-4, steps=100_000)
# The orchestrator's default, and one order per step as one batch per step in local.
PROMPTS_PER_ORDER = 4


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _process_tree_cpu(root: int) -> float:
    """CPU seconds (user + system) used so far by `root` and its live descendants."""
    children: dict[int, list[int]] = {}
    used: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # After the parenthesised name: state, ppid, ... utime (12th), stime (13th).
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        pid = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(pid)
        used[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += used.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def _cpu_by_program(swarm: Swarm) -> dict[str, float]:
    programs = {name: p.pid for name, p in swarm.processes.items()}
    programs["anvil"] = swarm.anvil.pid
    return {name: _process_tree_cpu(pid) for name, pid in programs.items()}


def run_local(model: Path, tasks: Path, out: Path, seconds: float) -> float:
    """Rollouts per second written by `train local`'s workers in the window after its
    first checkpoint is trained on."""
    import subprocess

    args = [
        SWARMRL, "train", "local", "--model", model, "--tasks", tasks, "--out", out,
        "--workers", NODES, "--minutes", seconds / 60, *recipe_argv(RECIPE),
    ]  # fmt: skip
    subprocess.run([str(a) for a in args], check=True, capture_output=True, timeout=seconds + 600)
    folder = RunDir(out)
    rows = read_metrics(folder.metrics)
    batches = 0
    for stats in folder.samplers.glob("*.json"):
        batches += json.loads(stats.read_text())["batches"]
    rollouts = batches * RECIPE.prompts_per_step * RECIPE.group_size
    elapsed: float = rows[-1]["elapsed"]
    return rollouts / max(elapsed, 1e-9)


def run_swarm(model: Path, tasks: Path, root: Path, seconds: float) -> dict[str, Any]:
    swarm = make_swarm(root)
    try:
        keys = [f"node{4 + i}" for i in range(NODES)]
        for i, key in enumerate(keys):
            stake_and_init_node(swarm, 4 + i, key)
        data = root / "orchestrator"
        config = orchestrator_toml(
            swarm,
            root / "orch.toml",
            model=model,
            tasks=tasks,
            data_dir=data,
            prompts_per_assignment=PROMPTS_PER_ORDER,
            **RECIPE.model_dump(),
        )
        log = root / "orchestrator.log"
        orchestrator = swarm.start(
            "orchestrator", [SWARMRL, "orchestrator", "run", "--config", config], log
        )
        addr = wait_for(lambda: orchestrator_addr(log), "the orchestrator", 180, swarm)
        for key in keys:
            node = node_toml(swarm, root / f"{key}.toml", key=key, tasks=tasks, orchestrator=addr)
            swarm.start(key, [SWARMRL, "node", "run", "--config", node], root / f"{key}.log")
        # The window opens with the first step trained, as local's does.
        run_folder = RunDir.of_orchestrator(data)
        wait_for(lambda: read_metrics(run_folder.metrics), "step 1", 600, swarm)
        began = time.monotonic()
        cpu_at_start = _cpu_by_program(swarm)
        costs_at_start = {key: len(_lines(root / key / "costs.jsonl")) for key in keys}
        checks_at_start = len(_lines(data / "validation.jsonl"))
        units_at_start = _units(data)
        rss_start = (proc_rss_mib(orchestrator.pid), proc_rss_mib(swarm.processes[keys[0]].pid))
        time.sleep(seconds)
        elapsed = time.monotonic() - began
        cpu = {k: v - cpu_at_start.get(k, 0.0) for k, v in _cpu_by_program(swarm).items()}
        units = _units(data) - units_at_start
        rss_end = (proc_rss_mib(orchestrator.pid), proc_rss_mib(swarm.processes[keys[0]].pid))
        costs = [c for key in keys for c in _lines(root / key / "costs.jsonl")]
        checks = _lines(data / "validation.jsonl")
        return {
            "rollouts_per_second": units / elapsed,
            "submit_seconds": sorted(c["submit_seconds"] for c in costs),
            "generate_cpu_per_rollout": sum(c["generate_cpu_seconds"] for c in costs)
            / max(1, sum(c["rollouts"] for c in costs)),
            "validate_cpu_per_rollout": _cpu_per_rollout(checks),
            "prefilled": sum(c["prefill"] for c in checks) / max(1, len(checks)),
            "validate_cpu_per_rollout_trusted": _cpu_per_rollout(
                [c for c in checks if c["trusted"]]
            ),
            "rss_start": rss_start,
            "rss_end": rss_end,
            "submissions": len(costs),
            "window": elapsed,
            "cpu": cpu,
            "generation_cpu": sum(
                c["generate_cpu_seconds"]
                for key in keys
                for c in _lines(root / key / "costs.jsonl")[costs_at_start[key] :]
            ),
            "validation_cpu": sum(c["cpu_seconds"] for c in checks[checks_at_start:]),
        }
    finally:
        swarm.stop_all()


def _cpu_per_rollout(checks: list[dict[str, Any]]) -> float:
    cpu: float = sum(c["cpu_seconds"] for c in checks)
    rollouts: int = sum(c["rollouts"] for c in checks)
    return cpu / max(1, rollouts)


def _units(data: Path) -> int:
    import sqlite3

    with sqlite3.connect(f"file:{data / 'ledger.sqlite3'}?mode=ro", uri=True) as db:
        units: int = db.execute("SELECT COALESCE(SUM(units), 0) FROM submissions").fetchone()[0]
        return units


def _percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main(minutes: float = 4.0) -> None:
    model = build_default_model(default_models_dir() / "default")
    with tempfile.TemporaryDirectory(prefix="bench-swarm-") as tmp:
        root = Path(tmp)
        tasks = root / "train.jsonl"
        write_tasks(demo_tasks(4096, seed=1), tasks)
        print(f"each for {minutes:g} min: train local ({NODES} workers), then the swarm")
        local = run_local(model, tasks, root / "local", minutes * 60)
        swarm = run_swarm(model, tasks, root / "swarm", minutes * 60)
    submit = swarm["submit_seconds"]
    ratio = swarm["rollouts_per_second"] / local
    generate = swarm["generate_cpu_per_rollout"]
    cheaper = generate / max(swarm["validate_cpu_per_rollout"], 1e-12)
    trusted = swarm["validate_cpu_per_rollout_trusted"]
    print(f"\n| | train local | swarm ({NODES} nodes) |\n| --- | --- | --- |")
    print(f"| rollouts/s reaching the trainer | {local:.2f} | {swarm['rollouts_per_second']:.2f} "
          f"({ratio:.2f}x) |")  # fmt: skip
    print(f"\nintake latency over {len(submit)} submissions: p50 {_percentile(submit, 0.5):.3f} s, "
          f"p99 {_percentile(submit, 0.99):.3f} s")  # fmt: skip
    print(
        f"CPU per rollout: generation {swarm['generate_cpu_per_rollout'] * 1000:.1f} ms, "
        f"validation {swarm['validate_cpu_per_rollout'] * 1000:.2f} ms "
        f"({cheaper:.1f}x cheaper; {swarm['prefilled']:.0%} of submissions prefilled); "
        f"once nodes are trusted {trusted * 1000:.2f} ms "
        f"({generate / max(trusted, 1e-12):.1f}x cheaper)"
    )
    (o0, n0), (o1, n1) = swarm["rss_start"], swarm["rss_end"]
    print(f"resident memory: orchestrator {o0:.0f} -> {o1:.0f} MiB, node {n0:.0f} -> {n1:.0f} MiB")
    cpu, window = swarm["cpu"], swarm["window"]
    nodes = sum(v for k, v in cpu.items() if k.startswith("node"))
    print(
        f"CPU in the {window:.0f} s window (cores busy): nodes {nodes / window:.2f} (generating "
        f"{swarm['generation_cpu'] / window:.2f}), orchestrator {cpu['orchestrator'] / window:.2f} "
        f"(validating {swarm['validation_cpu'] / window:.2f}), anvil {cpu['anvil'] / window:.2f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0)
    main(parser.parse_args().minutes)
