"""An inference worker of `swarmrl train local`: it samples groups with the newest
policy and leaves them in the run's spool, as a node would submit them.

It runs the same ``generate_rollouts`` and backends as nodes (proofs off: no one
here needs convincing), reloads the weights whenever the trainer has written a
newer checkpoint, and pauses while the trainer has enough of its files unread,
so nothing piles up. Its tasks are drawn from a seed of (run seed, worker,
counter), like the swarm's scheduler draws a node's, so a restarted worker
continuing from its counter draws new ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_utils import keccak

from swarmrl.cores import take_threads

# Sequences decoded together: on one CPU thread 128 made 35% more tokens/s than 64, and 256
# less than 128 (its longest completion keeps more rows waiting).
GENERATE_BATCH = 128


@dataclass(frozen=True)
class SamplerConfig:
    name: str
    run_dir: Path
    tasks_file: Path
    run: str
    group_size: int
    prompts_per_batch: int
    max_tokens: int
    temperature: float
    top_p: float
    target_len: int
    seed: int
    start_counter: int
    max_pending: int
    threads: int
    backend: str
    device: str | None
    parent_pid: int


def node_address(name: str) -> str:
    """A stable stand-in address for a local worker, where records name their node."""
    return "0x" + keccak(f"swarmrl-local-sampler/{name}".encode())[:20].hex()


def draw_tasks(tasks: list[Any], count: int, seed: int, name: str, counter: int) -> list[Any]:
    """The tasks of one batch, a pure function of (seed, worker, counter)."""
    rng = random.Random(f"{seed}/{name}/{counter}")
    if count <= len(tasks):
        return rng.sample(tasks, count)
    return [rng.choice(tasks) for _ in range(count)]


def run_sampler(config: SamplerConfig, stop: Any) -> None:
    """The worker process's body; returns when ``stop`` is set or its parent is gone."""
    # The parent handles Ctrl-C and tells workers through ``stop``.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    take_threads(config.threads)

    from orchestrator.run_dir import RunDir
    from orchestrator.trainer.feed import Spool
    from swarmrl.cli_options import quiet_transformers
    from swarmrl.files import write_atomically
    from swarmrl.models import load_backend
    from swarmrl.models.backend import SamplingParams
    from swarmrl.models.held import HeldPolicy
    from swarmrl.rollouts.generate import Provenance, batch_seed, generate_rollouts
    from swarmrl.tasks import read_tasks
    from swarmrl.tasks.rewards import task_reward

    quiet_transformers()

    def go_on() -> bool:
        return not stop.is_set() and os.getppid() == config.parent_pid

    tasks = read_tasks(config.tasks_file)
    folder = RunDir(Path(config.run_dir))
    spool = Spool(folder.spool)
    while (step := folder.latest()) is None:
        if not go_on():
            return
        time.sleep(0.05)
    # It never asks for a precision (None: the backend's own), so only steps change.
    policy: HeldPolicy[None] = HeldPolicy(
        lambda model_dir, _precision: load_backend(config.backend, model_dir, device=config.device)
    )
    params = SamplingParams(
        max_tokens=config.max_tokens, temperature=config.temperature, top_p=config.top_p
    )
    node = node_address(config.name)
    # How much it has generated (read for tokens/s), and the counter of its newest batch
    # (a restarted worker goes on past it).
    stats_file = folder.sampler_stats(config.name)
    stats_file.parent.mkdir(parents=True, exist_ok=True)
    stats = _previous_stats(stats_file)
    counter = config.start_counter
    while go_on():
        newest = folder.latest()
        if newest is not None and newest > step:
            step = newest
        backend = policy.hold(folder.step(step), step, None)
        if spool.pending(config.name) >= config.max_pending:
            time.sleep(0.02)
            continue
        batch = draw_tasks(tasks, config.prompts_per_batch, config.seed, config.name, counter)
        began = time.perf_counter()
        records = generate_rollouts(
            backend,
            batch,
            n=config.group_size,
            params=params,
            provenance=Provenance(run=config.run, policy_step=step, node=node),
            seed=batch_seed(config.seed, counter),
            score=task_reward,
            target_for=lambda _speed: config.target_len,
            batch_size=max(config.group_size, GENERATE_BATCH),
        )
        stats["seconds_generating"] += time.perf_counter() - began
        stats["tokens"] += sum(len(r.output_ids) for r in records)
        stats["batches"] += 1
        stats["policy_step"] = step
        stats["counter"] = counter
        spool.put(config.name, counter, records)
        write_atomically(stats_file, json.dumps(stats).encode())
        counter += 1


def _previous_stats(path: Path) -> dict[str, Any]:
    """A restarted worker's totals go on from its predecessor's, so rates stay right."""
    stats: dict[str, Any] = {
        "policy_step": 0,
        "batches": 0,
        "tokens": 0,
        "seconds_generating": 0.0,
        "counter": -1,
    }
    with contextlib.suppress(OSError, ValueError):
        stats.update(json.loads(path.read_text()))
    return stats
