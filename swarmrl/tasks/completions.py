"""Completions to score: ``{"problem_id": ..., "completion": ...}`` per JSON line."""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path

from swarmrl.files import check_input_file
from swarmrl.tasks.format import read_json_lines

MAX_COMPLETION_CHARS = 1_000_000


def read_completions(path: Path, *, known: Container[str]) -> list[tuple[int, str, str]]:
    """(line number, problem_id, completion) per line; ValueError naming the bad line."""
    path = Path(path)
    check_input_file(path)
    items = []
    for n, row in read_json_lines(path):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {n} is not an object")
        problem_id, text = row.get("problem_id"), row.get("completion")
        if not isinstance(problem_id, str):
            raise ValueError(f"{path}: line {n}: problem_id must be a string")
        if not isinstance(text, str) or len(text) > MAX_COMPLETION_CHARS:
            raise ValueError(
                f"{path}: line {n}: completion must be a string of at most "
                f"{MAX_COMPLETION_CHARS} characters"
            )
        if problem_id not in known:
            raise ValueError(f"{path}: line {n}: no task has problem_id {problem_id!r}")
        items.append((n, problem_id, text))
    if not items:
        raise ValueError(f"{path} holds no completions")
    return items
