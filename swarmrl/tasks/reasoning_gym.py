"""Tasks from reasoning-gym (procedural, offline), scored by that library's own scorers.

A task's verification_info is ``{"dataset": name, "entry": entry}``: the
dataset's name and the entry reasoning-gym generated (question, answer,
metadata), which its ``score_answer`` reads. The answer scored is what follows
the reasoning: the last ``\\boxed{}`` after ``</think>``, else all of that text.
Only the datasets named in ``DATASETS`` are read: their scorers compare strings
and numbers, nothing in an entry is executed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from swarmrl.tasks.format import Task, answer_text
from swarmrl.tasks.math import MAX_ANSWER_CHARS, last_boxed

# Small enough for the embedded model's context and skills; simple scorers.
DATASETS = ("basic_arithmetic", "chain_sum", "letter_counting")
# Each dataset's smallest problems: a tiny model can only learn on what it can sometimes solve.
_CONFIGS: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "letter_counting": {"min_words": 3, "max_words": 6},
}
INSTRUCTION = "Put the final answer in \\boxed{}."


def parse_source(source: str) -> list[str]:
    """The datasets of ``reasoning-gym:<name>[,<name>...]``; ValueError if unknown."""
    prefix = "reasoning-gym:"
    if not source.startswith(prefix) or not source[len(prefix) :]:
        raise ValueError(
            f"--source must be 'demo' or 'reasoning-gym:<dataset>[,<dataset>...]', got {source!r}"
        )
    names = source[len(prefix) :].split(",")
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise ValueError(
            f"unknown reasoning-gym dataset {unknown[0]!r}; known: {', '.join(DATASETS)}"
        )
    # A dataset named twice would draw the same tasks twice, under the same problem ids.
    repeated = [n for i, n in enumerate(names) if n in names[:i]]
    if repeated:
        raise ValueError(f"reasoning-gym dataset {repeated[0]!r} is named twice in --source")
    return names


def generate(names: Sequence[str], n: int, seed: int) -> list[Task]:
    """``n`` tasks, drawn in turn from each dataset, reproducible from ``seed``."""
    import reasoning_gym as rg

    per = [n // len(names) + (i < n % len(names)) for i in range(len(names))]
    tasks = []
    for name, count in zip(names, per, strict=True):
        if count == 0:
            continue
        dataset = rg.create_dataset(name, size=count, seed=seed, **_CONFIGS[name])
        for i, entry in enumerate(dataset):
            tasks.append(
                Task(
                    problem_id=f"rg-{name}-{seed}-{i}",
                    task_type="reasoning_gym",
                    prompt=f"{entry['question']}\n{INSTRUCTION}",
                    verification_info={"dataset": name, "entry": _plain(entry)},
                )
            )
    return tasks


def check_info(info: Any) -> None:
    """ValueError naming what is wrong, unless ``info`` is a task reasoning-gym can score."""
    if not isinstance(info, dict):
        raise ValueError("reasoning_gym verification_info must be an object")
    if info.get("dataset") not in DATASETS:
        raise ValueError(f"dataset must be one of {', '.join(DATASETS)}")
    entry = info.get("entry")
    if not (
        isinstance(entry, dict)
        and isinstance(entry.get("question"), str)
        and isinstance(entry.get("answer"), str)
        and isinstance(entry.get("metadata", {}), dict)
    ):
        raise ValueError("entry must be an object with string 'question' and 'answer'")


def score(completion: str, info: dict[str, Any]) -> float:
    """reasoning-gym's score of the completion's final answer, in [0, 1]."""
    import reasoning_gym as rg

    check_info(info)
    final = answer_text(completion, "reasoning_gym") or ""
    answer = last_boxed(final) if "\\boxed" in final else final.strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return 0.0
    value = rg.get_score_answer_fn(info["dataset"])(answer, info["entry"])
    return min(1.0, max(0.0, float(value)))


def _plain(value: Any) -> Any:
    """An entry as JSON holds it (reasoning-gym's metadata has tuples)."""
    return json.loads(json.dumps(value))
