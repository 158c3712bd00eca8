"""Scheduling: an order is a pure function of (run, node, step, counter), so a node
cannot steer what it gets and anyone can redraw it; budgets follow measured speed."""

from __future__ import annotations

import pytest
from eth_utils import to_checksum_address

from orchestrator.service.scheduler import (
    BUDGETS,
    DEADLINE_SHARE,
    MAX_ORDER_SCALE,
    budget_for,
    cooldown,
    draw_order,
    prompts_for,
)
from orchestrator.service.settings import MAX_COOLDOWN_DOUBLINGS
from swarmrl.tasks import Task

TASKS = [
    Task(
        problem_id=f"arith-{i}",
        task_type="math",
        prompt=f"What is {i} + 1?",
        verification_info={"ground_truth": str(i + 1)},
    )
    for i in range(20)
]
RUN = "0x" + "5a" * 32
NODE = "0x" + "ab" * 20
WHERE = {"run": RUN, "node": NODE, "step": 3, "counter": 0}


def draw(tasks=TASKS, prompts=4, budget=128, **where):
    return draw_order(tasks, **{**WHERE, **where}, prompts=prompts, budget=budget)


def test_the_same_inputs_draw_the_same_order():
    first = draw()
    assert draw() == first
    # However the node's address is written: checksummed or not, it is one node.
    assert draw(node=to_checksum_address(NODE)) == first
    assert draw(node=NODE.upper().replace("0X", "0x")) == first


@pytest.mark.parametrize(
    "change",
    [
        {"run": "0x" + "5b" * 32},
        {"node": "0x" + "ac" * 20},
        {"step": 4},
        {"counter": 1},
    ],
    ids=["run", "node", "step", "counter"],
)
def test_each_input_changes_the_draw(change):
    base, changed = draw(), draw(**change)
    assert changed.seed != base.seed
    assert changed.tasks != base.tasks


def test_counters_spread_over_the_task_set():
    """Consecutive orders of one node are not the same few tasks again and again."""
    drawn = {slot.problem_id for counter in range(10) for slot in draw(counter=counter).tasks}
    assert len(drawn) > 10


def test_an_order_holds_distinct_known_tasks_each_with_the_budget():
    order = draw(prompts=5, budget=256)
    names = [slot.problem_id for slot in order.tasks]
    assert len(names) == len(set(names)) == 5
    assert set(names) <= {t.problem_id for t in TASKS}
    assert {slot.budget for slot in order.tasks} == {256}
    assert 0 <= order.seed < 2**64


def test_more_prompts_than_tasks_gives_every_task_once():
    order = draw(tasks=TASKS[:3], prompts=5)
    assert [slot.problem_id for slot in order.tasks] == [t.problem_id for t in TASKS[:3]]


# budget_for: 8 sequences with a 300 s deadline leave 150 s of decoding (the share).
FIT = {"base": 512, "max_tokens": 1024, "sequences": 8, "seconds": 300.0}
SECONDS_OF_DECODING = FIT["seconds"] * DEADLINE_SHARE


@pytest.mark.parametrize("speed", [None, 0.0, -5.0])
def test_an_unknown_speed_gets_the_runs_budget(speed):
    assert budget_for(speed, **FIT) == 512
    assert budget_for(speed, **{**FIT, "base": 100}) == 100


@pytest.mark.parametrize("budget", BUDGETS)
def test_the_longest_budget_that_fits_is_chosen(budget):
    # A hair above the exact speed, so float rounding cannot decide the case.
    just_enough = budget * FIT["sequences"] / SECONDS_OF_DECODING * (1 + 1e-9)
    assert budget_for(just_enough, **FIT) == budget
    slower = just_enough * 0.99
    shorter = [b for b in BUDGETS if b < budget]
    assert budget_for(slower, **FIT) == (shorter[-1] if shorter else BUDGETS[0])


def test_a_fast_node_gets_the_runs_budget_and_never_more():
    assert budget_for(1e9, **FIT) == 512
    assert budget_for(1e9, **{**FIT, "base": 100}) == 100
    # Decoding stops at max_tokens, so any budget costs at most that much.
    assert budget_for(64 * 8 / SECONDS_OF_DECODING, **{**FIT, "max_tokens": 64}) == 512


def test_a_node_too_slow_for_any_budget_gets_the_shortest():
    assert budget_for(0.001, **FIT) == BUDGETS[0]
    assert budget_for(0.001, **{**FIT, "base": 10}) == 10


def test_a_node_abandoning_orders_waits_longer_with_each_one_up_to_a_bound():
    waits = [cooldown(n, limit=3, first=600.0) for n in range(10)]
    # Below the limit nothing, at it the first cooldown, then doubling up to its bound.
    assert waits[:6] == [0.0, 0.0, 0.0, 600.0, 1200.0, 2400.0]
    assert max(waits) == 600.0 * 2**MAX_COOLDOWN_DOUBLINGS == waits[-1]


# prompts_for: a node's order size follows its speed against the swarm's median.


@pytest.mark.parametrize(
    ("speed", "prompts"),
    [
        (100.0, 4),  # the median node: the run's size
        (130.0, 4),  # within the noise of a measurement
        (75.0, 4),
        (150.0, 8),  # past about 1.4x: one doubling
        (400.0, 16),
        (50.0, 2),
        (25.0, 1),
        (1.0, 1),  # never below one prompt
        (1e9, 4 * MAX_ORDER_SCALE),  # never above the cap
    ],
)
def test_an_order_holds_more_prompts_for_a_faster_node_and_fewer_for_a_slower(speed, prompts):
    assert prompts_for(speed, 100.0, base=4) == prompts


@pytest.mark.parametrize(("speed", "median"), [(None, 100.0), (100.0, None), (0.0, 100.0)])
def test_a_node_or_swarm_not_measured_yet_gets_the_runs_size(speed, median):
    assert prompts_for(speed, median, base=4) == 4
