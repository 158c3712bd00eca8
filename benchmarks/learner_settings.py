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

from orchestrator.trainer.recipe import GRPORecipe
from simulation.local_swarm import LEARNING_RECIPE

# The thinking budget every prompt states, in the benchmark and the held-out eval alike.
TARGET_LEN = 128
# The recipe both learners train by (benchmarks/learner_trl.py maps it to TRL's
# arguments): train local's, but lr 3e-4 (its default 1e-4 is slower to rise, further in
# 10 minutes), and steps without end: the wall time ends both runs.
RECIPE = GRPORecipe(lr=3e-4, steps=1_000_000, target_len=TARGET_LEN)
# The recipe the demo's swarm learns by (benchmarks delta and offpolicy train with it): the
# demo's orchestrator settings hold more than the recipe (epochs, backlog), so its keys.
DEMO_RECIPE = GRPORecipe.model_validate(
    {k: v for k, v in LEARNING_RECIPE.items() if k in GRPORecipe.model_fields}
)


@dataclass(frozen=True)
class LearnerSettings:
    recipe: GRPORecipe = RECIPE
    snapshot_every: int = 5  # optimizer steps between saved snapshots


@dataclass(frozen=True)
class Snapshot:
    """A saved policy: after ``step`` optimizer steps and ``seconds`` of training wall
    time (time spent saving snapshots excluded), having used ``samples`` completions."""

    step: int
    seconds: float
    samples: int
    path: Path
