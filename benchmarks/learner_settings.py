"""What `swarmrl bench learner` holds equal between swarmrl and TRL's GRPOTrainer.

Both learners start from the same weights, train on the same tasks with the same
prompts (the task's prompt with a fixed thinking budget, through the model's chat
template, exactly as ``swarmrl.rollouts.generate.prompt_ids`` builds it), score
completions with the same reward (task reward minus INTELLECT-2's length term),
and take the same optimizer and loss settings. Each saves a snapshot of its
policy every ``snapshot_every`` optimizer steps; every snapshot is evaluated on
the same held-out tasks after both runs, so evaluation costs neither any time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The thinking budget every prompt states, in the benchmark and the held-out eval alike.
TARGET_LEN = 128


@dataclass(frozen=True)
class LearnerSettings:
    group_size: int = 8  # completions per prompt (TRL: num_generations)
    prompts_per_step: int = 16  # groups per optimizer step
    lr: float = 3e-4  # train local defaults to 1e-4: slower to rise, further in 10 minutes
    warmup_steps: int = 5
    weight_decay: float = 0.0
    eps_low: float = 0.2  # TRL: epsilon
    eps_high: float = 0.2  # TRL: epsilon_high
    delta: float = 4.0  # the dual clip on the ratio (TRL: delta)
    max_grad_norm: float = 0.1
    max_completion_tokens: int = 128
    temperature: float = 1.0
    snapshot_every: int = 5  # optimizer steps between saved snapshots
    seed: int = 0


@dataclass(frozen=True)
class Snapshot:
    """A saved policy: after ``step`` optimizer steps and ``seconds`` of training wall
    time (time spent saving snapshots excluded), having used ``samples`` completions."""

    step: int
    seconds: float
    samples: int
    path: Path
