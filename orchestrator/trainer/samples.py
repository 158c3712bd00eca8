"""From rollout records to GRPO samples: groups, their advantages, and what gets dropped.

A group is the ``G`` completions one sampler drew for one task with one seed at
one policy step (``sample`` 0 to G-1, in order, as ``generate_rollouts`` writes
them). A group becomes training samples only if its *task* rewards differ (the
online filter) and it is fresh enough: sampled at most ``async_level`` policy
steps before the step being trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from orchestrator.trainer.loss import group_advantages, keeps_group
from orchestrator.trainer.recipe import AdvantageScale
from swarmrl.rollouts.records import Rollout


@dataclass(frozen=True)
class Sample:
    """One completion as the loss reads it; ``staleness`` is how many optimizer steps
    the policy has taken between sampling it and the step that trains on it."""

    prompt_ids: list[int]
    output_ids: list[int]
    sampler_logprobs: list[float]
    advantage: float
    staleness: int


@dataclass(frozen=True)
class Group:
    """The completions of one task drawn together, with the policy step they came from."""

    records: tuple[Rollout, ...]

    @property
    def policy_step(self) -> int:
        return self.records[0].policy_step

    @property
    def problem_id(self) -> str:
        return self.records[0].problem_id

    def task_rewards(self) -> list[float]:
        return [r.task_reward for r in self.records]

    def teaches(self) -> bool:
        """Whether the group's task rewards differ; a group that all solved or all
        failed has zero advantage on every completion once the length term is gone."""
        return keeps_group(torch.tensor(self.task_rewards()))

    def samples(self, scale: AdvantageScale, trainer_step: int) -> list[Sample]:
        """The group's completions with their advantages (full rewards, centred), for
        training step ``trainer_step`` (the step the trainer is at before the update)."""
        rewards = torch.tensor([r.reward for r in self.records], dtype=torch.float64)
        advantages = group_advantages(rewards, scale).tolist()
        age = staleness(trainer_step, self)
        return [
            Sample(list(r.prompt_ids), list(r.output_ids), list(r.logprobs), a, age)
            for r, a in zip(self.records, advantages, strict=True)
        ]


def split_groups(records: Sequence[Rollout], group_size: int) -> list[Group]:
    """The groups of a rollout file, in order; ValueError if the records do not form
    whole groups of ``group_size`` (a group cut short or out of order is unusable)."""
    if group_size < 2:
        raise ValueError(f"a group holds at least 2 completions, not {group_size}")
    if len(records) % group_size:
        raise ValueError(f"{len(records)} records do not make groups of {group_size}")
    groups = []
    for start in range(0, len(records), group_size):
        members = tuple(records[start : start + group_size])
        first = members[0]
        key = (first.node, first.problem_id, first.seed, first.policy_step, first.prompt_ids)
        for i, r in enumerate(members):
            if (r.node, r.problem_id, r.seed, r.policy_step, r.prompt_ids) != key:
                raise ValueError(f"record {start + i} does not belong to its group's task")
            if r.sample != i:
                raise ValueError(f"record {start + i} is sample {r.sample}, expected {i}")
        groups.append(Group(members))
    return groups


def staleness(trainer_step: int, group: Group) -> int:
    """How many optimizer steps the policy has taken since the group was sampled."""
    return trainer_step - group.policy_step
