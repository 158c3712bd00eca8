"""Rewards as INTELLECT-2 computes them: a binary task reward minus a length penalty.

The task reward is the verifier's verdict; the length penalty (``swarmrl.tasks.length_penalty``,
which nodes compute too) pulls a completion's length towards the thinking budget its node was
given; ``choose_target_length`` picks that budget from what the node can actually generate
within the submission window.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from orchestrator.tasks.code_verifier import verify_code
from orchestrator.tasks.math_verifier import verify_math
from swarmrl.tasks import Task


def task_reward(task: Task, completion: str) -> float:
    """1.0 when the task's verifier accepts the completion, else 0.0.

    ValueError when the task's verification_info is malformed.
    """
    if task.task_type == "math":
        ok = verify_math(completion, task.verification_info)
    else:
        ok = verify_code(completion, task.verification_info)
    return 1.0 if ok else 0.0


def choose_target_length(
    targets: Sequence[int], tokens_per_s: float, window_s: float, rng: random.Random
) -> int:
    """A thinking budget the node can generate within ``window_s``, uniformly at random.

    When even the smallest target is too long for the node, it gets the smallest.
    """
    if not targets:
        raise ValueError("targets must hold at least one target length")
    if any(isinstance(t, bool) or not isinstance(t, int) or t <= 0 for t in targets):
        raise ValueError(f"target lengths must be positive integers, not {list(targets)!r}")
    for name, value in (("tokens_per_s", tokens_per_s), ("window_s", window_s)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(f"{name} must be a positive finite number, not {value!r}")
    # Sorted and distinct, so that the draw depends only on the set of targets and the rng.
    options = sorted(set(targets))
    feasible = [t for t in options if t / tokens_per_s <= window_s]
    return rng.choice(feasible) if feasible else options[0]
