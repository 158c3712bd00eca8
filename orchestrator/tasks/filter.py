"""The offline filter: keep tasks a model solves sometimes, but not always.

INTELLECT-2 dropped problems its starting policy always or never solved: their
GRPO groups have no reward variance, so they teach nothing. The solve rate is
measured with ``k`` samples per task, without proofs (nobody checks them here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from orchestrator.tasks.rewards import task_reward
from swarmrl.models.backend import Backend, SamplingParams
from swarmrl.models.checkpoint import encode_prompt
from swarmrl.rollouts.generate import batch_seed
from swarmrl.tasks import Task, budget_prompt

# The budget stated in prompts while measuring (the demo's middle target).
FILTER_TARGET = 128


def solve_rates(
    backend: Backend,
    tasks: Sequence[Task],
    *,
    k: int,
    params: SamplingParams,
    seed: int = 0,
    batch_size: int = 32,
    score: Callable[[Task, str], float] = task_reward,
) -> list[float]:
    """The fraction of ``k`` samples that solve each task."""
    per_batch = max(1, batch_size // k)
    rates = []
    for batch, start in enumerate(range(0, len(tasks), per_batch)):
        chunk = tasks[start : start + per_batch]
        prompts = [
            encode_prompt(backend.tokenizer, budget_prompt(t.prompt, FILTER_TARGET)) for t in chunk
        ]
        sampling = dataclasses.replace(params, seed=batch_seed(seed, batch))
        completions = backend.generate(
            [p for p in prompts for _ in range(k)], sampling, prove=False
        )
        for i, task in enumerate(chunk):
            group = completions[i * k : (i + 1) * k]
            rates.append(sum(score(task, c.text) > 0 for c in group) / k)
    return rates


def filter_tasks(
    backend: Backend,
    tasks: Sequence[Task],
    *,
    k: int,
    band: tuple[float, float],
    params: SamplingParams,
    seed: int = 0,
) -> list[Task]:
    """The tasks whose solve rate lies in ``band`` (inclusive), with it recorded."""
    low, high = band
    rates = solve_rates(backend, tasks, k=k, params=params, seed=seed)
    return [
        task.model_copy(update={"solve_rate": rate})
        for task, rate in zip(tasks, rates, strict=True)
        if low <= rate <= high
    ]
