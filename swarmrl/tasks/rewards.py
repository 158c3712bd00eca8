"""Rewards as INTELLECT-2 computes them: a task reward minus a length penalty.

The task reward is the verifier's verdict for the task's type (binary for math
and code, reasoning-gym's own score otherwise), on the answer after the reasoning
as that type reads it (``swarmrl.tasks.format.answer_text``: INTELLECT-2's types
score a completion whose reasoning never ended 0, as INTELLECT-2 did); the length penalty
(``swarmrl.tasks.length_penalty``, which nodes compute too) pulls a completion's
length towards the thinking budget its node was given; ``choose_target_length``
picks that budget from what the node can actually generate within the
submission window.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Sequence
from typing import Literal

from swarmrl.tasks import code, reasoning_gym
from swarmrl.tasks.format import Task
from swarmrl.tasks.math import ground_truths, verify_math

logger = logging.getLogger(__name__)

MATH_TYPES = ("math", "verifiable_math")
CODE_TYPES = ("code", "prime_rl_code")


def check_verification_info(task: Task) -> None:
    """ValueError, one sentence naming the field, unless the task's verifier can read it."""
    info = task.verification_info
    try:
        if task.task_type in MATH_TYPES:
            ground_truths(info)
        elif task.task_type in CODE_TYPES:
            code.code_tests(info, _layout(task))
        else:
            reasoning_gym.check_info(info)
    except ValueError as e:
        raise ValueError(f"verification_info: {e}") from None


def task_reward(task: Task, completion: str, *, sandboxed_code_only: bool = False) -> float:
    """The verifier's verdict on the completion, in [0, 1].

    ``sandboxed_code_only`` is a node's setting: where the code sandbox is rlimits
    alone, a node runs no model-written program and reports no code reward (0.0),
    saying so once. ValueError when the task's verification_info is malformed.
    """
    if task.task_type in MATH_TYPES:
        verdict = verify_math(completion, task.verification_info, task_type=task.task_type)
        return 1.0 if verdict else 0.0
    if task.task_type in CODE_TYPES:
        if sandboxed_code_only and code.sandbox_kind() != "bubblewrap":
            _say_code_is_unscored()
            return 0.0
        passed = code.verify_code(completion, task.verification_info, layout=_layout(task))
        return 1.0 if passed else 0.0
    return reasoning_gym.score(completion, task.verification_info)


def node_task_reward(task: Task, completion: str) -> float:
    """``task_reward`` as a volunteer's node computes it: model-written code only in a sandbox."""
    return task_reward(task, completion, sandboxed_code_only=True)


def _layout(task: Task) -> Literal["code", "prime_rl_code"]:
    """How a code task spells its tests: ours, or INTELLECT-2's APPS layout."""
    return "prime_rl_code" if task.task_type == "prime_rl_code" else "code"


_warned = threading.Event()


def _say_code_is_unscored() -> None:
    if not _warned.is_set():
        _warned.set()
        logger.warning(
            "bubblewrap is not available: this node runs no model-written code and reports "
            "no code reward (install bubblewrap to score code tasks)"
        )


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
