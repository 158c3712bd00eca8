"""Tasks, as both roles read and score them.

- ``format``: the task record and its files (parquet or JSONL), including
  INTELLECT-2's RL dataset as it is published; the thinking-budget prompt and
  the length penalty.
- ``math``: the final answer after the reasoning, compared with the ground truth.
- ``code``: candidate programs run against their tests in a sandbox.
- ``rewards``: the task reward of a completion, whatever its task type, and the
  choice of a node's thinking budget.

Nodes score their own completions with these and validators re-score them with
the same code, so a verdict never depends on which role computed it.
"""

from swarmrl.tasks.format import (
    MAX_PROMPT_CHARS,
    TASK_TYPES,
    Task,
    TaskType,
    budget_prompt,
    check_task_output,
    first_error,
    length_penalty,
    read_tasks,
    write_tasks,
)

__all__ = [
    "MAX_PROMPT_CHARS",
    "TASK_TYPES",
    "Task",
    "TaskType",
    "budget_prompt",
    "check_task_output",
    "first_error",
    "length_penalty",
    "read_tasks",
    "write_tasks",
]
