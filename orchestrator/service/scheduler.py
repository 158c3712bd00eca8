"""Which work a node gets: drawn, never chosen.

An order's tasks, seed and budgets are a pure function of (run, node, policy
step, counter): a node cannot steer what it is given, and anyone holding the
task set can redraw an order and see that it was fair. The one exception is
an order that expired unanswered: its tasks go to the next order of another
node (seed and budgets still that order's own), so a node that drops work
cannot make the run skip its tasks. An order's size and budgets follow the node's
measured speed, as INTELLECT-2's do: more prompts for a node faster than the swarm's
median, fewer for a slower one, so each order takes its node about as long and every
node stays busy, whoever asks first; the run's budget for a node fast enough to meet
the deadline with it, shorter ones for a slow node (or one that lies low), so every
order fits its deadline while the task distribution stays the run's.

A node that takes orders and leaves them to expire holds their tasks hostage until
each deadline: after ``abandon_limit`` in a row it gets no new order for a
cooldown that doubles with each further one (``MAX_COOLDOWN_DOUBLINGS`` times at most), so it
holds at most one order per cooldown. An answered order starts the count over, and
the limit is at least 2, so an honest node that loses one order to a crash keeps
working.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from eth_utils import keccak

from orchestrator.service.settings import MAX_COOLDOWN_DOUBLINGS
from swarmrl.tasks import Task
from swarmrl.work.assign import Slot

# The shorter thinking budgets a slow node's order may state, shortest first.
BUDGETS = (64, 128, 256, 512)
# An order should take at most this share of its deadline at the node's speed.
DEADLINE_SHARE = 0.5
# The most prompts a fast node's order holds, in multiples of the run's prompts per
# order: a GPU thirty times a laptop's speed gets eight times its prompts, not thirty,
# so one node's lost order costs the run a bounded share of a step.
MAX_ORDER_SCALE = 8


@dataclass(frozen=True)
class Draw:
    tasks: list[Slot]
    seed: int


def draw_order(
    tasks: Sequence[Task],
    *,
    run: str,
    node: str,
    step: int,
    counter: int,
    prompts: int,
    budget: int,
    taken_over: Sequence[str] | None = None,
) -> Draw:
    """The tasks (each with ``budget``) and sampling seed of one order; the tasks are
    ``taken_over`` (an expired order's problem ids) when given."""
    key = keccak(f"{run}/{node.lower()}/{step}/{counter}".encode())
    seed = int.from_bytes(keccak(key + b"/seed")[:8], "big")
    if taken_over is not None:
        return Draw([Slot(problem_id=p, budget=budget) for p in taken_over], seed)
    rng = random.Random(key)
    chosen = rng.sample(list(tasks), prompts) if prompts <= len(tasks) else tasks
    return Draw([Slot(problem_id=t.problem_id, budget=budget) for t in chosen], seed)


def prompts_for(speed: float | None, median: float | None, *, base: int) -> int:
    """Prompts in a node's next order: the run's ``base`` for a node of about the swarm's
    median speed (or one not measured yet), doubled for each doubling of its speed above
    the median and halved for each halving below it, from 1 to ``MAX_ORDER_SCALE`` x
    ``base``. So every order takes its node about as long as the median node's, and a
    fast node is kept as busy as a slow one. Rounded in powers of two, so nodes within
    about 1.4x of the median, a measurement's noise, all get ``base``."""
    if speed is None or median is None or speed <= 0 or median <= 0:
        return base
    doublings = round(math.log2(speed / median))
    scaled = base << doublings if doublings >= 0 else base >> -doublings
    return max(1, min(MAX_ORDER_SCALE * base, scaled))


def budget_for(
    speed: float | None, *, base: int, max_tokens: int, sequences: int, seconds: float
) -> int:
    """The thinking budget of a node's next order: ``base`` (the run's), or the longest
    shorter one of ``BUDGETS`` whose sequences the node decodes within its share of the
    deadline at ``speed`` tokens/s. A budget states a length in the prompt; decoding
    stops at ``max_tokens`` whatever it says, so that bounds the cost of any budget."""
    if speed is None or speed <= 0:
        return base
    choices = sorted({b for b in BUDGETS if b < base} | {base})
    affordable = speed * seconds * DEADLINE_SHARE
    fitting = [b for b in choices if min(b, max_tokens) * sequences <= affordable]
    return fitting[-1] if fitting else choices[0]


def cooldown(abandoned: int, *, limit: int, first: float) -> float:
    """Seconds a node that left its last ``abandoned`` orders unanswered in a row waits
    for a new one after the last one's deadline: none below ``limit``, ``first`` at it,
    doubling with each order it leaves after, ``MAX_COOLDOWN_DOUBLINGS`` times at most."""
    if abandoned < limit:
        return 0.0
    return float(first * 2 ** min(abandoned - limit, MAX_COOLDOWN_DOUBLINGS))
