"""The task format both roles read: one problem a policy is asked to solve.

Modelled on INTELLECT-2's RL dataset: ``problem_id, task_type, prompt,
verification_info, solve_rate``; a file of that dataset loads as it is
published. ``verification_info`` is what the task's verifier needs; files hold
it as a JSON string so that every task type fits one column. The task types:

- ``math`` and INTELLECT-2's ``verifiable_math``: ``{"ground_truth": ...}``, a
  string, a number or a list of them (any one matches), possibly in ``\\boxed{}``.
- ``code``: ``{"tests": [{"stdin": "...", "stdout": "..."}], "time_limit_s": 2.0}``.
- INTELLECT-2's ``prime_rl_code``: ``{"test_cases": ...}``, the APPS layout
  ``{"inputs": [...], "outputs": [...], "fn_name": ...}`` as JSON text or an
  object: stdin/stdout cases, or function calls when ``fn_name`` is given.
- ``reasoning_gym``: ``{"dataset": name, "entry": {...}}``, scored by that
  library's own ``score_answer``.

Where a completion's answer is read depends on the task type (``answer_text``):
INTELLECT-2's types (``verifiable_math``, ``prime_rl_code``) as INTELLECT-2's
verifiers read them, after the first ``</think>`` (up to a second), and a
completion without one, whose reasoning never ended, has no answer; our own
types after the last ``</think>``, or all of a completion without one.

INTELLECT-2's solve-rate column ``solve_rate_qwen_r1_distill_7b`` is read as
``solve_rate``; other extra columns are ignored. Files are parquet
(``.parquet``) or JSON lines (``.jsonl``), chosen by suffix.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, get_args

import pydantic_core
from pydantic import Field, ValidationError

from swarmrl.files import check_input_file, check_output_path, replacing
from swarmrl.schema import Strict, error_location

TaskType = Literal["math", "code", "verifiable_math", "prime_rl_code", "reasoning_gym"]
TASK_TYPES: tuple[str, ...] = get_args(TaskType)
# The end of a completion's reasoning; its answer follows.
THINK_END = "</think>"
# The task types of INTELLECT-2's dataset, whose verifiers read the answer only after
# the reasoning ended: a completion without THINK_END scores 0 there.
ENDED_REASONING_TYPES: frozenset[str] = frozenset({"verifiable_math", "prime_rl_code"})
# Another dataset's name for a column of ours.
COLUMN_ALIASES = {"solve_rate_qwen_r1_distill_7b": "solve_rate"}
COLUMNS = ("problem_id", "task_type", "prompt", "verification_info", "solve_rate")

# Bounds on what one untrusted file may make us hold per task.
MAX_PROMPT_CHARS = 64_000
MAX_VERIFICATION_INFO_CHARS = 4_000_000


class Task(Strict):
    """One problem: what the policy sees and what its verifier checks."""

    problem_id: str = Field(min_length=1, max_length=256)
    task_type: TaskType
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    verification_info: dict[str, Any]
    solve_rate: float | None = Field(default=None, ge=0.0, le=1.0)

    def row(self) -> dict[str, Any]:
        """The task as a file row: verification_info as canonical JSON."""
        return {
            "problem_id": self.problem_id,
            "task_type": self.task_type,
            "prompt": self.prompt,
            "verification_info": json.dumps(
                self.verification_info, sort_keys=True, separators=(",", ":")
            ),
            "solve_rate": self.solve_rate,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        """A task from a file row; ValueError with one sentence if it is malformed.

        Columns under another dataset's name are read as ours; other extra columns
        are ignored. ``verification_info`` is checked for the task's type.
        """
        row = {COLUMN_ALIASES.get(k, k): v for k, v in row.items()}
        row = {k: row[k] for k in COLUMNS if k in row}
        if isinstance(row.get("solve_rate"), float) and math.isnan(row["solve_rate"]):
            row["solve_rate"] = None  # a dataset's "not measured"
        info = row.get("verification_info")
        if isinstance(info, str):
            if len(info) > MAX_VERIFICATION_INFO_CHARS:
                raise ValueError("verification_info is too large")
            try:
                info = pydantic_core.from_json(info)
            except ValueError as e:
                raise ValueError(f"verification_info is not valid JSON ({e})") from None
        try:
            task = cls(**{**row, "verification_info": info})
        except (ValidationError, TypeError) as e:
            raise ValueError(first_error(e)) from None
        # Here, not at the top: the verifiers' modules import this one for Task.
        from swarmrl.tasks.rewards import check_verification_info

        check_verification_info(task)
        return task


def answer_text(completion: str, task_type: TaskType) -> str | None:
    """The part of a completion its verifier reads the answer from, or None when it has
    none by its task type's rule: for INTELLECT-2's types, the text after the first
    ``</think>`` up to a second one (a completion whose reasoning never ended has no
    answer); for ours, the text after the last ``</think>``, or all of it."""
    if task_type in ENDED_REASONING_TYPES:
        parts = completion.split(THINK_END, 2)
        return parts[1] if len(parts) > 1 else None
    return completion.rpartition(THINK_END)[2]


def first_error(e: Exception) -> str:
    """A validation error as one sentence: the first problem and where it is."""
    if isinstance(e, ValidationError):
        return f"{error_location(e, 'row')}: {e.errors()[0]['msg'].lower()}"
    return str(e)


def read_tasks(path: Path) -> list[Task]:
    """Every task in a parquet or JSONL file; ValueError naming the bad row, or saying
    that the file holds none (an empty task set is a mistake, never a result)."""
    path = Path(path)
    check_input_file(path)
    rows = _read_rows(path)
    if not rows:
        raise ValueError(f"{path} holds no tasks")
    tasks = []
    seen: set[str] = set()
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {i} is not an object")
        try:
            task = Task.from_row(row)
        except ValueError as e:
            raise ValueError(f"{path}: row {i}: {e}") from None
        if task.problem_id in seen:
            raise ValueError(f"{path}: row {i}: duplicate problem_id {task.problem_id!r}")
        seen.add(task.problem_id)
        tasks.append(task)
    return tasks


def read_json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) for each non-blank line of a UTF-8 JSON lines file (a byte
    order mark is allowed); ValueError naming the line that is not UTF-8 or not JSON."""
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path}: line {n} is not UTF-8 text") from None
            if line.strip():
                try:
                    yield n, pydantic_core.from_json(line)
                except ValueError:
                    raise ValueError(f"{path}: line {n} is not valid JSON") from None


def _read_rows(path: Path) -> list[Any]:
    if path.suffix == ".jsonl":
        return [row for _, row in read_json_lines(path)]
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows: list[Any] = pq.read_table(path).to_pylist()
            return rows
        except (pa.ArrowException, OSError):
            # Arrow's own words name its internals, not the user's file.
            raise ValueError(f"{path} is not a readable parquet file") from None
    raise ValueError(f"{path}: tasks are read from .parquet or .jsonl files")


def check_task_output(path: Path) -> None:
    """ValueError (one sentence) unless ``path`` is a task file name that can be written:
    checked before the work whose result it holds."""
    path = Path(path)
    check_output_path(path)
    if path.suffix not in (".jsonl", ".parquet"):
        raise ValueError(f"{path}: tasks are written as .parquet or .jsonl files")


def write_tasks(tasks: Iterable[Task], path: Path) -> None:
    """Write tasks as parquet or JSONL (by suffix), replacing the file atomically."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".parquet"):
        raise ValueError(f"{path}: tasks are written as .parquet or .jsonl files")
    rows = [t.row() for t in tasks]
    with replacing(path) as tmp:
        if path.suffix == ".jsonl":
            with tmp.open("w") as f:
                f.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = pa.schema(
                [
                    ("problem_id", pa.string()),
                    ("task_type", pa.string()),
                    ("prompt", pa.string()),
                    ("verification_info", pa.string()),
                    ("solve_rate", pa.float64()),
                ]
            )
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)


def budget_prompt(prompt: str, target_len: int) -> str:
    """The prompt with its thinking budget, as INTELLECT-2 states it to the model."""
    return f"{prompt}\nThink for {target_len} tokens before giving a response."


# INTELLECT-2's length-penalty weight.
LENGTH_ALPHA = 3e-4


def length_penalty(target_len: int, output_len: int, alpha: float = LENGTH_ALPHA) -> float:
    """INTELLECT-2's length term: ``alpha * |target_len - output_len|``."""
    return alpha * abs(target_len - output_len)
