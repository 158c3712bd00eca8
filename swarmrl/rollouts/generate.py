"""Tasks in, proven and scored rollout records out.

Each task gets a group of ``n`` completions (GRPO compares a completion with its
siblings). Prompts state a thinking budget chosen per task by ``target_for``,
which sees the speed measured so far: INTELLECT-2 gives faster nodes longer
targets. Groups are sampled together in batches of about ``batch_size``
sequences; each batch draws from its own seed, derived from the caller's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from eth_utils import keccak

from swarmrl.models.backend import Backend, SamplingParams
from swarmrl.models.directory import encode_prompt
from swarmrl.rollouts.records import Rollout
from swarmrl.tasks import Task, budget_prompt, length_penalty


@dataclass(frozen=True)
class Provenance:
    """Whose rollouts these are, for which run and policy step."""

    run: str
    policy_step: int
    node: str


def prompt_ids(tokenizer: Any, prompt: str, target_len: int) -> list[int]:
    """A task's prompt with its thinking budget, as the policy reads it; validators
    rebuild it with this same function."""
    return encode_prompt(tokenizer, budget_prompt(prompt, target_len))


class PromptIds:
    """`prompt_ids` with ``tokenizer``, each prompt and budget tokenised once: the samples
    of a group share their prompt, so a checker of a file of groups tokenises a prompt
    once per group, not once per sample. Kept for one file's records, so it holds only
    the prompts of that file."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._ids: dict[tuple[str, int], list[int]] = {}

    def __call__(self, prompt: str, target_len: int) -> list[int]:
        key = (prompt, target_len)
        if (ids := self._ids.get(key)) is None:
            ids = self._ids[key] = prompt_ids(self.tokenizer, prompt, target_len)
        return ids


def batch_seed(seed: int, batch: int) -> int:
    """The sampling seed of one batch: a hash, so neighbouring seeds share nothing."""
    return int.from_bytes(keccak(f"{seed}/{batch}".encode())[:8], "big")


def groups_per_batch(n: int, batch_size: int) -> int:
    """How many tasks' groups of ``n`` are sampled in one batch of about ``batch_size``."""
    return max(1, batch_size // n)


def generate_rollouts(
    backend: Backend,
    tasks: Sequence[Task],
    *,
    n: int,
    params: SamplingParams,
    provenance: Provenance,
    seed: int,
    score: Callable[[Task, str], float],
    target_for: Callable[[float | None], int],
    batch_size: int = 32,
    first_batch: int = 0,
    on_batch: Callable[[int, int, float], None] | None = None,
) -> list[Rollout]:
    """``n`` sealed records per task, in task order.

    ``score`` is the task reward of a completion's text; ``on_batch`` hears
    (records so far, total, tokens/s of the batch). ``first_batch`` numbers the first
    batch: ``tasks`` that start at a batch boundary of a longer list, numbered as there,
    draw the seeds that list's batches draw, so a list split among workers on batch
    boundaries samples what it would whole.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    per_batch = groups_per_batch(n, batch_size)
    total = len(tasks) * n
    speed: float | None = None
    records: list[Rollout] = []
    for batch, start in enumerate(range(0, len(tasks), per_batch), start=first_batch):
        chunk = tasks[start : start + per_batch]
        targets = [target_for(speed) for _ in chunk]
        prompts = [
            prompt_ids(backend.tokenizer, t.prompt, target)
            for t, target in zip(chunk, targets, strict=True)
        ]
        sampling = dataclasses.replace(params, seed=batch_seed(seed, batch))
        began = time.perf_counter()
        completions = backend.generate([p for p in prompts for _ in range(n)], sampling)
        elapsed = time.perf_counter() - began
        speed = sum(len(c.output_ids) for c in completions) / max(elapsed, 1e-9)
        for i, completion in enumerate(completions):
            task, target = chunk[i // n], targets[i // n]
            task_reward = score(task, completion.text)
            penalty = length_penalty(target, len(completion.output_ids))
            records.append(
                Rollout(
                    run=provenance.run,
                    policy_step=provenance.policy_step,
                    node=provenance.node,
                    problem_id=task.problem_id,
                    task_type=task.task_type,
                    prompt=task.prompt,
                    verification_info=task.row()["verification_info"],
                    seed=seed,
                    sample=i % n,
                    temperature=float(params.temperature),
                    top_p=float(params.top_p),
                    max_tokens=params.max_tokens,
                    target_len=target,
                    prompt_ids=completion.prompt_ids,
                    output_ids=completion.output_ids,
                    logprobs=completion.logprobs,
                    finish_reason=completion.finish_reason,
                    task_reward=task_reward,
                    length_penalty=penalty,
                    reward=task_reward - penalty,
                    proofs=completion.proofs,
                ).sealed()
            )
        if on_batch is not None:
            on_batch(len(records), total, speed)
    return records
