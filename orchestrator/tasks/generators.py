"""The demo's own math tasks: small arithmetic and two-step word problems.

Task ``i`` of a family is a pure function of ``(seed, i)``: its random stream is seeded by its
problem id, so ids are stable (``arith-{seed}-{i}`` names the same task whatever ``n`` is) and
``demo_solution`` can rebuild a task from its id to check that this module made it.

``demo_solution`` writes the worked solution the tiny character-level demo model is
pre-trained on: a few short ASCII lines that compute the answer, ending in ``\\boxed{...}``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from swarmrl.tasks import Task

ARITH_PREFIX = "arith"
REASON_PREFIX = "reason"

_ID = re.compile(rf"({ARITH_PREFIX}|{REASON_PREFIX})-(-?\d+)-(\d+)")


def arithmetic_tasks(n: int, seed: int) -> list[Task]:
    """``n`` tasks like "What is 47 + 38?" with +, - and * on one- or two-digit operands."""
    _check_args(n, seed)
    return [_arithmetic_task(seed, i) for i in range(n)]


def reasoning_tasks(n: int, seed: int) -> list[Task]:
    """``n`` two-step word problems ("Ana has 7 apples. She buys 3 bags of 4 apples. ...")."""
    _check_args(n, seed)
    return [_reasoning_task(seed, i) for i in range(n)]


def demo_tasks(n: int, seed: int) -> list[Task]:
    """``n`` tasks, half arithmetic (rounded up) and half word problems, shuffled by ``seed``."""
    _check_args(n, seed)
    tasks = arithmetic_tasks((n + 1) // 2, seed) + reasoning_tasks(n // 2, seed)
    random.Random(f"demo-{seed}").shuffle(tasks)
    return tasks


def demo_solution(task: Task) -> str:
    """A short worked solution to a task this module generated; ValueError for any other."""
    m = _ID.fullmatch(task.problem_id)
    if m is None:
        raise ValueError(f"task {task.problem_id!r} is not a demo task")
    family, seed, i = m.group(1), int(m.group(2)), int(m.group(3))
    make = _arithmetic_task if family == ARITH_PREFIX else _reasoning_task
    own = make(seed, i)
    if (task.task_type, task.prompt, task.verification_info) != (
        own.task_type,
        own.prompt,
        own.verification_info,
    ):
        raise ValueError(f"task {task.problem_id!r} differs from the demo task of that id")
    lines = _arithmetic_lines(own) if family == ARITH_PREFIX else _reasoning_lines(own)
    answer = own.verification_info["ground_truth"]
    return "\n".join([*lines, f"\\boxed{{{answer}}}"])


def _check_args(n: int, seed: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"the task count must be a non-negative integer, not {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"the seed must be an integer, not {seed!r}")


def _math_task(problem_id: str, prompt: str, answer: int) -> Task:
    return Task(
        problem_id=problem_id,
        task_type="math",
        prompt=prompt,
        verification_info={"ground_truth": str(answer)},
    )


# --- arithmetic ---------------------------------------------------------------------------


def _arithmetic_operands(problem_id: str) -> tuple[int, str, int]:
    rng = random.Random(problem_id)
    op = rng.choice("+-*")
    # Half one-digit, which a short pre-training masters, half two-digit, which it does
    # not: the mix leaves the initial policy a solve rate RL can raise.
    top = 9 if rng.random() < 0.5 else 99
    if op == "+":
        return rng.randint(1, top), op, rng.randint(1, top)
    if op == "-":
        a = rng.randint(1, top)
        return a, op, rng.randint(1, a)  # never negative: the tiny model has no sign steps
    return rng.randint(2, top), op, rng.randint(2, 9)  # one-digit multiplier keeps it small


def _arithmetic_task(seed: int, i: int) -> Task:
    problem_id = f"{ARITH_PREFIX}-{seed}-{i}"
    a, op, b = _arithmetic_operands(problem_id)
    answer = a + b if op == "+" else a - b if op == "-" else a * b
    return _math_task(problem_id, f"What is {a} {op} {b}?", answer)


def _digits(x: int) -> list[int]:
    """Least significant first, as the columns are worked."""
    return [int(c) for c in reversed(str(x))]


def _arithmetic_lines(task: Task) -> list[str]:
    a, op, b = _arithmetic_operands(task.problem_id)
    steps = {"+": _addition_steps, "-": _subtraction_steps, "*": _multiplication_steps}[op](a, b)
    return [*steps, f"{a}{op}{b}={task.verification_info['ground_truth']}."]


def _column_step(expr: str, value: int, last: bool) -> str:
    if last:
        return f"{expr}={value}."
    if value >= 10:
        return f"{expr}={value}, write {value % 10} carry {value // 10}."
    return f"{expr}={value}, write {value}."


def _addition_steps(a: int, b: int) -> list[str]:
    da, db = _digits(a), _digits(b)
    width = max(len(da), len(db))
    steps, carry = [], 0
    for k in range(width):
        terms = [d[k] for d in (da, db) if k < len(d)] + ([carry] if carry else [])
        value = sum(terms)
        if len(terms) == 1:
            steps.append(f"bring down {value}.")
        else:
            steps.append(_column_step("+".join(map(str, terms)), value, k == width - 1))
        carry = value // 10
    return steps


def _subtraction_steps(a: int, b: int) -> list[str]:
    da, db = _digits(a), _digits(b)
    steps, borrow = [], 0
    for k, top in enumerate(da):
        bottom = db[k] if k < len(db) else 0
        top_expr = f"{top}-1" if borrow else f"{top}"
        if top - borrow < bottom:
            value = top - borrow + 10 - bottom
            steps.append(f"{top - borrow + 10}-{bottom}={value}, borrow 1.")
            borrow = 1
        elif k < len(db):
            steps.append(f"{top_expr}-{bottom}={top - borrow - bottom}.")
            borrow = 0
        elif borrow:
            steps.append(f"{top_expr}={top - 1}.")
            borrow = 0
        else:
            steps.append(f"bring down {top}.")
    return steps


def _multiplication_steps(a: int, b: int) -> list[str]:
    da = _digits(a)
    steps, carry = [], 0
    for k, d in enumerate(da):
        value = d * b + carry
        expr = f"{d}*{b}" + (f"+{carry}" if carry else "")
        steps.append(_column_step(expr, value, k == len(da) - 1))
        carry = value // 10
    return steps


# --- word problems ------------------------------------------------------------------------

_PEOPLE = (
    ("Ana", "She", "she"),
    ("Ben", "He", "he"),
    ("Mia", "She", "she"),
    ("Leo", "He", "he"),
    ("Sara", "She", "she"),
    ("Omar", "He", "he"),
)
_ITEMS = ("apples", "pencils", "marbles", "stickers", "cookies", "cards")


@dataclass(frozen=True)
class _Template:
    """One kind of word problem: operands, wording, answer and worked lines from (a, b, c)."""

    operands: Callable[[random.Random], tuple[int, int, int]]
    prompt: str  # str.format fields: name, He, he, items, a, b, c
    answer: Callable[[int, int, int], int]
    lines: Callable[[int, int, int], list[str]]


def _split_operands(rng: random.Random) -> tuple[int, int, int]:
    boxes, each = rng.randint(2, 6), rng.randint(2, 9)
    return boxes * each, boxes, rng.randint(1, 9)  # divisible, so every answer is whole


def _leftover_operands(rng: random.Random) -> tuple[int, int, int]:
    per_box = rng.randint(3, 9)
    return rng.randint(1, per_box - 1), rng.randint(2, 9), per_box


def _give_operands(rng: random.Random) -> tuple[int, int, int]:
    a = rng.randint(10, 40)
    return a, rng.randint(1, a - 1), rng.randint(1, 20)


_TEMPLATES = (
    _Template(
        operands=lambda rng: (rng.randint(1, 20), rng.randint(2, 5), rng.randint(2, 9)),
        prompt="{name} has {a} {items}. {He} buys {b} bags of {c} {items}. "
        "How many {items} does {he} have now?",
        answer=lambda a, b, c: a + b * c,
        lines=lambda a, b, c: [f"{b} bags of {c}: {b}*{c}={b * c}.", f"{a}+{b * c}={a + b * c}."],
    ),
    _Template(
        operands=_give_operands,
        prompt="{name} has {a} {items}. {He} gives {b} to a friend and then buys {c} more. "
        "How many {items} does {he} have now?",
        answer=lambda a, b, c: a - b + c,
        lines=lambda a, b, c: [f"{a}-{b}={a - b}.", f"{a - b}+{c}={a - b + c}."],
    ),
    _Template(
        operands=_split_operands,
        prompt="{name} puts {a} {items} equally into {b} boxes. Then {he} adds {c} more "
        "{items} to each box. How many {items} are in each box?",
        answer=lambda a, b, c: a // b + c,
        lines=lambda a, b, c: [f"{a}/{b}={a // b}.", f"{a // b}+{c}={a // b + c}."],
    ),
    _Template(
        operands=_leftover_operands,
        prompt="Each box holds {c} {items}. {name} fills {b} boxes and has {a} {items} left "
        "over. How many {items} does {he} have?",
        answer=lambda a, b, c: b * c + a,
        lines=lambda a, b, c: [f"{b}*{c}={b * c}.", f"{b * c}+{a}={b * c + a}."],
    ),
)


def _reasoning_draw(problem_id: str) -> tuple[_Template, tuple[int, int, int], str]:
    rng = random.Random(problem_id)
    template = rng.choice(_TEMPLATES)
    name, he_cap, he = rng.choice(_PEOPLE)
    items = rng.choice(_ITEMS)
    a, b, c = template.operands(rng)
    prompt = template.prompt.format(name=name, He=he_cap, he=he, items=items, a=a, b=b, c=c)
    return template, (a, b, c), prompt


def _reasoning_task(seed: int, i: int) -> Task:
    problem_id = f"{REASON_PREFIX}-{seed}-{i}"
    template, operands, prompt = _reasoning_draw(problem_id)
    return _math_task(problem_id, prompt, template.answer(*operands))


def _reasoning_lines(task: Task) -> list[str]:
    template, operands, _ = _reasoning_draw(task.problem_id)
    return template.lines(*operands)
