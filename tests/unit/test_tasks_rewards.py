"""Task rewards, the length penalty on top, and the thinking-budget choice."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.tasks.generators import demo_solution, demo_tasks
from swarmrl.tasks import Task, read_tasks
from swarmrl.tasks.rewards import choose_target_length, task_reward

CODE_TASK = Task(
    problem_id="code-1",
    task_type="code",
    prompt="Read n and print 2n.",
    verification_info={"tests": [{"stdin": "4\n", "stdout": "8\n"}]},
)
MATH_TASK = demo_tasks(1, seed=0)[0]


def test_math_reward_is_binary():
    assert task_reward(MATH_TASK, demo_solution(MATH_TASK)) == 1.0
    assert task_reward(MATH_TASK, r"\boxed{-1}") == 0.0
    assert task_reward(MATH_TASK, "") == 0.0


def test_code_reward_runs_the_program():
    assert task_reward(CODE_TASK, "```python\nprint(2 * int(input()))\n```") == 1.0
    assert task_reward(CODE_TASK, "```python\nprint(2 + int(input()))\n```") == 0.0


# Rows of INTELLECT-2's dataset as published (tests/data).
INTELLECT2 = {
    t.problem_id: t
    for t in read_tasks(Path(__file__).parents[1] / "data" / "intellect2_tasks.jsonl")
}
SUM_PROGRAM = "```python\nn = int(input())\nprint(sum(map(int, input().split())))\n```"


def test_intellect2_rows_score_0_when_the_reasoning_never_ended():
    """INTELLECT-2's verifiers read the answer after </think> only: a completion that never
    closed its reasoning scores 0, however right the answer in it."""
    math_row, code_row = INTELLECT2["intellect2_math_1"], INTELLECT2["prime_rl_code_1"]
    assert task_reward(math_row, r"<think>12 + 30 = 42</think> \boxed{42}") == 1.0
    assert task_reward(math_row, r"<think>12 + 30 = 42, so \boxed{42}") == 0.0
    assert task_reward(math_row, r"\boxed{42}") == 0.0
    assert task_reward(code_row, f"<think>sum them</think>\n{SUM_PROGRAM}") == 1.0
    assert task_reward(code_row, f"<think>sum them\n{SUM_PROGRAM}") == 0.0
    # Our own types keep reading all of a completion without </think>.
    ours = math_row.model_copy(update={"task_type": "math"})
    assert task_reward(ours, r"\boxed{42}") == 1.0
    our_code = Task(
        problem_id="sum",
        task_type="code",
        prompt=code_row.prompt,
        verification_info={"tests": [{"stdin": "3\n1 2 3\n", "stdout": "6\n"}]},
    )
    assert task_reward(our_code, SUM_PROGRAM) == 1.0


def test_intellect2_rows_read_the_answer_before_a_second_think_end():
    """INTELLECT-2 reads what follows the first </think>, up to a second one; ours reads
    what follows the last."""
    row = INTELLECT2["intellect2_math_1"]
    twice = r"<think>a</think> \boxed{42} </think> \boxed{7}"
    assert task_reward(row, twice) == 1.0
    assert task_reward(row.model_copy(update={"task_type": "math"}), twice) == 0.0


@pytest.mark.parametrize(
    "task",
    [
        MATH_TASK.model_copy(update={"verification_info": {"answer": "3"}}),
        CODE_TASK.model_copy(update={"verification_info": {"tests": "none"}}),
    ],
    ids=["math", "code"],
)
def test_malformed_verification_info_is_a_value_error(task):
    with pytest.raises(ValueError, match="verification_info"):
        task_reward(task, r"\boxed{3}")


# --- thinking budgets ---------------------------------------------------------------------


def test_feasible_targets_are_drawn_uniformly():
    rng = random.Random(0)
    # 100 tokens/s for 30 s: 1000 and 3000 fit (3000 exactly), 4000 and 8000 do not.
    draws = Counter(
        choose_target_length([8000, 1000, 3000, 4000], 100.0, 30.0, rng) for _ in range(4000)
    )
    assert set(draws) == {1000, 3000}
    assert abs(draws[1000] - draws[3000]) < 300


def test_a_slow_node_gets_the_smallest_target():
    assert choose_target_length([2000, 500, 1000], 1.0, 10.0, random.Random(0)) == 500


def test_the_choice_is_reproducible_from_the_rng():
    def draws(seed: int) -> list[int]:
        rng = random.Random(seed)
        return [choose_target_length([1, 2, 3, 4, 5], 10.0, 1.0, rng) for _ in range(50)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)
    # duplicates and order in the configured set do not change the draw
    rng_a, rng_b = random.Random(3), random.Random(3)
    a = [choose_target_length([5, 1, 3, 3], 10.0, 1.0, rng_a) for _ in range(20)]
    b = [choose_target_length([1, 3, 5], 10.0, 1.0, rng_b) for _ in range(20)]
    assert a == b


@pytest.mark.parametrize(
    ("targets", "tokens_per_s", "window_s"),
    [
        ([], 10.0, 1.0),
        ([0, 10], 10.0, 1.0),
        ([-5], 10.0, 1.0),
        ([1.5], 10.0, 1.0),
        ([True], 10.0, 1.0),
        ([10], 0.0, 1.0),
        ([10], -1.0, 1.0),
        ([10], float("nan"), 1.0),
        ([10], float("inf"), 1.0),
        ([10], 10.0, 0),
        ([10], 10.0, float("inf")),
    ],
)
def test_choose_target_length_validates(targets, tokens_per_s, window_s):
    with pytest.raises(ValueError, match="must"):
        choose_target_length(targets, tokens_per_s, window_s, random.Random(0))


@given(
    targets=st.lists(st.integers(1, 100_000), min_size=1, max_size=8),
    tokens_per_s=st.floats(0.01, 10_000),
    window_s=st.floats(0.01, 10_000),
    seed=st.integers(0, 2**32),
)
def test_the_choice_is_a_target_and_feasible_when_possible(targets, tokens_per_s, window_s, seed):
    chosen = choose_target_length(targets, tokens_per_s, window_s, random.Random(seed))
    assert chosen in targets
    if any(t / tokens_per_s <= window_s for t in targets):
        assert chosen / tokens_per_s <= window_s
    else:
        assert chosen == min(targets)
